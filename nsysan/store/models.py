"""The review store's tables: traces, their findings, and what the team says about them."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# The schema's number, which every Alembic revision records in nsysan_meta for older nsysan to read
# (2: findings.group; 3: comments and notes in one table, remarks; 4: findings.present and
# missing_since, findings kept across re-analysis; 5: review_events, the history of status and
# assignee; 6: findings.recoverable_ns and trace_steps, the report's steps section; 7: traces.settings,
# the detector settings of the trace's latest analysis; 8: traces.owner and upload_bytes, trace_deletions);
# docs/store.md
SCHEMA_VERSION = 8
VERSION_TABLE = "nsysan_alembic_version"  # Alembic's, named for nsysan in case the database is shared
FINDING_STATUSES = ("open", "confirmed", "false positive", "fixed")
OPEN_STATUSES = ("open", "confirmed")  # still to do: a finding not yet judged, or judged real and not fixed
REVIEWED_FIELDS = ("status", "assignee")  # what a review event records a change of


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: sa.JSON, list[Any]: sa.JSON}


class Meta(Base):
    """One row: the schema number, so an nsysan older than its Alembic revisions refuses the store."""

    __tablename__ = "nsysan_meta"
    key: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.String(256))


# Alembic's version table (Alembic creates and fills it): declared here so that dropping the store's
# tables (Base.metadata.drop_all) drops it too, and an emptied database is a new store again
sa.Table(VERSION_TABLE, Base.metadata, sa.Column("version_num", sa.String(32), nullable=False),
         sa.PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"))  # fmt: skip


class TraceRecord(Base):
    __tablename__ = "traces"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(256))
    paths: Mapped[list[Any]] = mapped_column()  # server-side files; never taken from a browser
    status: Mapped[str] = mapped_column(sa.String(16), default="registered")  # registered|analysing|ready|failed
    error: Mapped[str | None] = mapped_column(sa.Text, default=None)
    ranks: Mapped[list[Any]] = mapped_column(default=list)
    devices: Mapped[list[Any]] = mapped_column(default=list)
    captured_utc_ns: Mapped[int | None] = mapped_column(sa.BigInteger, default=None)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # the detector settings ({kind: {param: value}}, defaults left out) of the latest analysis, asked for
    # or running: an interrupted one resumes with them
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")
    # who uploaded it (the logged-in user; None: registered from the traces directory, or uploaded
    # without login) and how many bytes its files take (None: not an upload), for deletes and quotas
    owner: Mapped[str | None] = mapped_column(sa.String(128), default=None)
    upload_bytes: Mapped[int | None] = mapped_column(sa.BigInteger, default=None)
    registered_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True), default=_now)
    findings: Mapped[list[FindingRecord]] = relationship(back_populates="trace", cascade="all, delete-orphan")
    remarks: Mapped[list[RemarkRecord]] = relationship(back_populates="trace", cascade="all, delete-orphan")


class FindingRecord(Base):
    __tablename__ = "findings"
    id: Mapped[int] = mapped_column(primary_key=True)
    trace_id: Mapped[int] = mapped_column(sa.ForeignKey("traces.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(sa.String(64))
    # findings that are one problem share it ("" = a group of one); server_default lets a migration add it to filled tables
    group: Mapped[str] = mapped_column(sa.Text, default="", server_default="")
    severity: Mapped[str] = mapped_column(sa.String(16))
    rank: Mapped[int | None] = mapped_column(default=None)
    device: Mapped[int | None] = mapped_column(default=None)
    pid: Mapped[int | None] = mapped_column(default=None)
    start_ns: Mapped[int] = mapped_column(sa.BigInteger)
    end_ns: Mapped[int] = mapped_column(sa.BigInteger)
    impact_ns: Mapped[int] = mapped_column(sa.BigInteger)
    # the job's wall time its fix would save (report version 2); None: stored before schema 6, or
    # saved from a report that did not compute it
    recoverable_ns: Mapped[int | None] = mapped_column(sa.BigInteger, default=None)
    title: Mapped[str] = mapped_column(sa.Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    advice: Mapped[str] = mapped_column(sa.Text)
    status: Mapped[str] = mapped_column(sa.String(16), default="open")
    assignee: Mapped[str | None] = mapped_column(sa.String(128), default=None)
    version: Mapped[int] = mapped_column(default=1)  # optimistic concurrency: every edit names the version it saw
    # False once an analysis of the trace no longer finds it (kept, with its review, never deleted)
    present: Mapped[bool] = mapped_column(default=True, server_default=sa.true())
    missing_since: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True), default=None)
    trace: Mapped[TraceRecord] = relationship(back_populates="findings")
    comments: Mapped[list[RemarkRecord]] = relationship(back_populates="finding", cascade="all, delete-orphan",
                                                        order_by="RemarkRecord.id")  # fmt: skip
    events: Mapped[list[ReviewEventRecord]] = relationship(back_populates="finding", cascade="all, delete-orphan",
                                                           order_by="ReviewEventRecord.id")  # fmt: skip


class StepsRecord(Base):
    """The ``steps`` section of a trace's latest analysis (where each rank's step time went): one row
    per trace, replaced by each analysis, none when the analysis had no such section.

    A table of its own, not a field of ``traces.summary``: it grows with ranks times steps (thirteen
    numbers a rank a step), and the library, which reads every trace's row on each
    poll, never needs it; only the trace's page and the compare page read it (``ReviewStore.steps``).
    """

    __tablename__ = "trace_steps"
    trace_id: Mapped[int] = mapped_column(sa.ForeignKey("traces.id", ondelete="CASCADE"), primary_key=True)
    steps: Mapped[dict[str, Any]] = mapped_column()


class RemarkRecord(Base):
    """What a reviewer wrote: a comment on a finding, or a note on a whole trace (``kind``).

    One table for both, as they are the same thing said about different subjects; every remark
    names its trace, so a trace's remarks of either kind are one query.
    """

    __tablename__ = "remarks"
    __table_args__ = (
        sa.CheckConstraint(
            "(kind = 'comment' AND finding_id IS NOT NULL) OR (kind = 'note' AND finding_id IS NULL)",
            name="remark_kind_names_its_subject",
        ),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(16))
    trace_id: Mapped[int] = mapped_column(sa.ForeignKey("traces.id", ondelete="CASCADE"), index=True)
    finding_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("findings.id", ondelete="CASCADE"), index=True, default=None
    )
    author: Mapped[str] = mapped_column(sa.String(128))
    body: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True), default=_now)
    trace: Mapped[TraceRecord] = relationship(back_populates="remarks")
    finding: Mapped[FindingRecord | None] = relationship(back_populates="comments")


class ReviewEventRecord(Base):
    """One change of a finding's status or assignee: who, when, from what to what (``None``: no assignee).

    A table of its own rather than a kind of remark: an event has a field and two values where a
    remark has a text, and every row here is one saved change (a save that changes both fields
    writes two rows, with one time and one ``version``, the finding's version the save made).
    """

    __tablename__ = "review_events"
    __table_args__ = (sa.CheckConstraint("field IN ('status', 'assignee')", name="review_event_field"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    trace_id: Mapped[int] = mapped_column(sa.ForeignKey("traces.id", ondelete="CASCADE"), index=True)
    finding_id: Mapped[int] = mapped_column(sa.ForeignKey("findings.id", ondelete="CASCADE"), index=True)
    author: Mapped[str] = mapped_column(sa.String(128))
    field: Mapped[str] = mapped_column(sa.String(16))
    old_value: Mapped[str | None] = mapped_column(sa.String(128), default=None)
    new_value: Mapped[str | None] = mapped_column(sa.String(128), default=None)
    version: Mapped[int] = mapped_column()  # the finding's version this change made
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True), default=_now)
    finding: Mapped[FindingRecord] = relationship(back_populates="events")


class TraceDeletionRecord(Base):
    """A deleted trace, remembered: deleting removes the trace with its whole review, so who did it,
    when, and how much review went with it is kept here (no foreign key: the trace is gone)."""

    __tablename__ = "trace_deletions"
    id: Mapped[int] = mapped_column(primary_key=True)
    trace_id: Mapped[int] = mapped_column()
    name: Mapped[str] = mapped_column(sa.String(256))
    owner: Mapped[str | None] = mapped_column(sa.String(128), default=None)
    deleted_by: Mapped[str] = mapped_column(sa.String(128))
    deleted_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True), default=_now)
    findings: Mapped[int] = mapped_column(default=0)
    remarks: Mapped[int] = mapped_column(default=0)
