"""Schema 1: traces, findings, comments on findings, notes on traces, and ``nsysan_meta``.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "nsysan_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )
    op.create_table(
        "traces",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("paths", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("ranks", sa.JSON, nullable=False),
        sa.Column("devices", sa.JSON, nullable=False),
        sa.Column("captured_utc_ns", sa.BigInteger),
        sa.Column("summary", sa.JSON, nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("rank", sa.Integer),
        sa.Column("device", sa.Integer),
        sa.Column("pid", sa.Integer),
        sa.Column("start_ns", sa.BigInteger, nullable=False),
        sa.Column("end_ns", sa.BigInteger, nullable=False),
        sa.Column("impact_ns", sa.BigInteger, nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("advice", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("assignee", sa.String(128)),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_index("ix_findings_trace_id", "findings", ["trace_id"])
    op.create_table(
        "trace_notes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id", ondelete="CASCADE"), nullable=False),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_trace_notes_trace_id", "trace_notes", ["trace_id"])
    op.create_table(
        "comments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("finding_id", sa.Integer, sa.ForeignKey("findings.id", ondelete="CASCADE"), nullable=False),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_comments_finding_id", "comments", ["finding_id"])
    op.bulk_insert(meta, [{"key": "schema_version", "value": "1"}])
