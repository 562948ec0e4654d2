"""Schema 2: ``findings.group``, the key findings that are one problem share (``''``: a group of one).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("findings") as findings:
        findings.add_column(sa.Column("group", sa.Text, nullable=False, server_default=""))
    op.execute(sa.text("UPDATE nsysan_meta SET value = '2' WHERE key = 'schema_version'"))
