"""Schema 8: uploads have owners. ``traces.owner`` (who uploaded it; NULL for a trace registered from
the traces directory, or uploaded without login, and for every trace stored before, whose uploader
was never recorded), ``traces.upload_bytes`` (the size of an upload's files, for quotas; NULL: not
an upload, or stored before) and ``trace_deletions``, who deleted which trace when, with how much
review went with it.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("traces") as traces:
        traces.add_column(sa.Column("owner", sa.String(128)))
        traces.add_column(sa.Column("upload_bytes", sa.BigInteger))
    op.create_table(
        "trace_deletions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("trace_id", sa.Integer, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("owner", sa.String(128)),
        sa.Column("deleted_by", sa.String(128), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("findings", sa.Integer, nullable=False),
        sa.Column("remarks", sa.Integer, nullable=False),
    )
    op.execute(sa.text("UPDATE nsysan_meta SET value = '8' WHERE key = 'schema_version'"))
