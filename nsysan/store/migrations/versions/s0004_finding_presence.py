"""Schema 4: findings outlive the analysis that stops finding them. ``findings.present`` (true while
the latest analysis of the trace found it) and ``findings.missing_since`` (when an analysis first did
not); every finding stored before was found by its trace's latest analysis.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("findings") as findings:
        findings.add_column(sa.Column("present", sa.Boolean, nullable=False, server_default=sa.true()))
        findings.add_column(sa.Column("missing_since", sa.DateTime(timezone=True)))
    op.execute(sa.text("UPDATE nsysan_meta SET value = '4' WHERE key = 'schema_version'"))
