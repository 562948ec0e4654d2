"""Schema 3, the baseline of the hand-written migrations: ``comments`` (on a finding) and
``trace_notes`` (on a trace), two tables of one shape, become ``remarks`` (``kind`` ``comment`` or
``note``), their rows copied in their order; the old tables go.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    remarks = op.create_table(
        "remarks",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id", ondelete="CASCADE"), nullable=False),
        sa.Column("finding_id", sa.Integer, sa.ForeignKey("findings.id", ondelete="CASCADE")),
        sa.Column("author", sa.String(128), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "(kind = 'comment' AND finding_id IS NOT NULL) OR (kind = 'note' AND finding_id IS NULL)",
            name="remark_kind_names_its_subject",
        ),
    )
    op.create_index("ix_remarks_trace_id", "remarks", ["trace_id"])
    op.create_index("ix_remarks_finding_id", "remarks", ["finding_id"])
    columns = ("kind", "trace_id", "finding_id", "author", "body", "created_at")
    comments = sa.table("comments", *map(sa.column, ("id", "finding_id", "author", "body", "created_at")))
    notes = sa.table("trace_notes", *map(sa.column, ("id", "trace_id", "author", "body", "created_at")))
    findings = sa.table("findings", sa.column("id"), sa.column("trace_id"))
    op.execute(remarks.insert().from_select(columns, sa.select(
        sa.literal("comment"), findings.c.trace_id, comments.c.finding_id, comments.c.author, comments.c.body,
        comments.c.created_at,
    ).join_from(comments, findings, comments.c.finding_id == findings.c.id).order_by(comments.c.id)))  # fmt: skip
    op.execute(remarks.insert().from_select(columns, sa.select(
        sa.literal("note"), notes.c.trace_id, sa.cast(sa.null(), sa.Integer), notes.c.author, notes.c.body,
        notes.c.created_at,
    ).order_by(notes.c.id)))  # fmt: skip
    op.drop_table("comments")
    op.drop_table("trace_notes")
    op.execute(sa.text("UPDATE nsysan_meta SET value = '3' WHERE key = 'schema_version'"))
