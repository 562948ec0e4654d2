"""Schema 7: ``traces.settings``, the detector settings ({kind: {param: value}}) a trace's latest
analysis was asked for with, so that an analysis a restart interrupted resumes with them rather than
with the defaults. Every trace stored before was analysed with the defaults: ``{}``.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("traces") as traces:
        traces.add_column(sa.Column("settings", sa.JSON, nullable=False, server_default="{}"))
    op.execute(sa.text("UPDATE nsysan_meta SET value = '7' WHERE key = 'schema_version'"))
