"""Schema 6, the report's version 2: ``findings.recoverable_ns`` (the job's wall time the finding's
fix would save; NULL for every finding stored before, as no report of theirs computed it) and
``trace_steps``, the ``steps`` section of each trace's latest analysis (where each rank's step time
went), a table of its own so that the library, which reads every trace's row, never reads it.

A trace analysed before has no steps, except where the dashboard of the last schema-5 nsysan kept
them inside the trace's summary (``summary["steps"]``): those move here, out of the summary, one
trace at a time (a summary with its steps can be large).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("findings") as findings:
        findings.add_column(sa.Column("recoverable_ns", sa.BigInteger))
    trace_steps = op.create_table(
        "trace_steps",
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("steps", sa.JSON, nullable=False),
    )
    traces = sa.table("traces", sa.column("id", sa.Integer), sa.column("summary", sa.JSON))
    connection = op.get_bind()
    for trace_id in connection.scalars(sa.select(traces.c.id).order_by(traces.c.id)).all():
        summary = connection.scalar(sa.select(traces.c.summary).where(traces.c.id == trace_id))
        if isinstance(summary, dict) and isinstance(summary.get("steps"), dict):
            steps = summary.pop("steps")
            connection.execute(trace_steps.insert().values(trace_id=trace_id, steps=steps))
            connection.execute(traces.update().where(traces.c.id == trace_id).values(summary=summary))
    op.execute(sa.text("UPDATE nsysan_meta SET value = '6' WHERE key = 'schema_version'"))
