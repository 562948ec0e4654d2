"""Schema 5: ``review_events``, the history of a finding's review: one row per change of its status
or assignee (who, when, the field, from and to, the version the change made). A new table, so no
existing table is altered (no batch mode needed); nothing to copy: a store of an earlier schema kept
no history, so its findings start with none.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "review_events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id", ondelete="CASCADE"), nullable=False),
        sa.Column("finding_id", sa.Integer, sa.ForeignKey("findings.id", ondelete="CASCADE"), nullable=False),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("field", sa.String(16), nullable=False),
        sa.Column("old_value", sa.String(128)),
        sa.Column("new_value", sa.String(128)),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("field IN ('status', 'assignee')", name="review_event_field"),
    )
    op.create_index("ix_review_events_trace_id", "review_events", ["trace_id"])
    op.create_index("ix_review_events_finding_id", "review_events", ["finding_id"])
    op.execute(sa.text("UPDATE nsysan_meta SET value = '5' WHERE key = 'schema_version'"))
