"""ReviewStore: traces, findings and the team's review of them, in a real database.

The store only persists: it neither reads traces nor runs the analysis. Its callers (the
dashboard's background queue, the tests) validate exports, analyse them and hand it the report
document (:meth:`ReviewStore.save_analysis`).

A SQLite file by default, PostgreSQL when given a URL (``postgresql+psycopg://...``); the schema is
created on first use and its version recorded. Every edit of a finding names the version it was
based on; an edit based on a stale version is refused (:class:`StaleEdit`), so two people editing
the same finding never silently overwrite each other. No SQL is built from user text: everything
goes through SQLAlchemy with bound parameters.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from nsysan.errors import InputError, NsysanError
from nsysan.store.models import (
    FINDING_STATUSES,
    SCHEMA_VERSION,
    Base,
    FindingRecord,
    Meta,
    RemarkRecord,
    TraceRecord,
)


class StaleEdit(NsysanError):
    """Someone changed the finding since this edit's author loaded it."""

    exit_code = 1


class NotFound(InputError):
    pass


class StoreUnavailable(InputError):
    """The store named by ``--db`` cannot be opened: a missing driver, a wrong URL or password, a
    server that does not answer, a SQLite file in a directory that does not exist."""


# SQLAlchemy dialect -> the extra that installs its driver
_DRIVER_EXTRAS = {"postgresql": "postgres"}


def store_url(url_or_path: str | os.PathLike[str] | None) -> str:
    """A SQLAlchemy URL: given as one, or a SQLite file path (default ``nsysan-review.sqlite``)."""
    text = str(url_or_path or "nsysan-review.sqlite")
    return text if "://" in text else f"sqlite:///{Path(text).resolve()}"


class ReviewStore:
    def __init__(self, url: str | os.PathLike[str] | None = None) -> None:
        self.url = store_url(url)
        shown = _shown(self.url)
        try:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True)
        except ImportError as exc:  # the dialect's driver (psycopg) is not installed
            dialect = shown.split(":", 1)[0].split("+", 1)[0]
            extra = _DRIVER_EXTRAS.get(dialect)
            fix = f'pip install "nsysan[{extra}]"' if extra else f"install the {exc.name or 'database'} driver"
            raise StoreUnavailable(
                f"{shown}: its database driver is not installed ({exc.name or exc}); {fix}"
            ) from None
        except (sa.exc.ArgumentError, ValueError) as exc:
            # a parse error's text repeats the URL, password included: only a missing dialect is named
            why = f" ({exc})" if isinstance(exc, sa.exc.NoSuchModuleError) else ""
            raise StoreUnavailable(f"{shown}: not a store URL{why}; give a SQLite file or a URL such as "
                                   "postgresql+psycopg://user:password@host/db") from None  # fmt: skip
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        try:
            self._migrate()
        except sa.exc.OperationalError as exc:
            raise StoreUnavailable(f"{shown}: cannot open the store ({_reason(exc, self.url)})") from None

    def _migrate(self) -> None:
        """Create a new store's tables, or bring a store written by an older nsysan up to
        SCHEMA_VERSION one step at a time (:data:`MIGRATIONS`), refusing one from a newer nsysan."""
        Base.metadata.create_all(self.engine, tables=[Meta.__table__])  # type: ignore[list-item]
        with self._session.begin() as s:
            row = s.get(Meta, "schema_version")
            if row is None:  # a new store: today's tables (an old one gains its new tables in its migrations)
                Base.metadata.create_all(s.connection())
                s.add(Meta(key="schema_version", value=str(SCHEMA_VERSION)))
                return
            version = int(row.value)
        if version > SCHEMA_VERSION:
            raise InputError(f"{self.url}: store schema {version} is newer than this nsysan ({SCHEMA_VERSION})")
        for step in range(version, SCHEMA_VERSION):
            with self.engine.begin() as conn:
                # Bump the version first, as a compare-and-set: of two servers starting on one old store,
                # one migrates and the other waits on its lock, then finds nothing to do. Being the first
                # statement it also opens the transaction on SQLite (pysqlite begins one only before DML),
                # so the DDL after it commits or rolls back with it.
                bumped = conn.execute(
                    sa.update(Meta)
                    .where(Meta.key == "schema_version", Meta.value == str(step))
                    .values(value=str(step + 1))
                )
                if bumped.rowcount == 1:
                    MIGRATIONS[step](conn)

    def session(self) -> Session:
        return self._session()

    # -- traces ---------------------------------------------------------------------------------

    def register(self, paths: Sequence[str | os.PathLike[str]], name: str | None = None) -> int:
        """Record a trace: export files on the server that the caller has already validated as nsys
        exports (the store never opens a trace)."""
        files = [str(Path(p).resolve()) for p in paths]
        with self._session.begin() as s:
            record = TraceRecord(name=name or Path(files[0]).stem, paths=files)
            s.add(record)
            s.flush()
            return record.id

    def start_analysis(self, trace_id: int) -> list[str]:
        """Mark a trace as being analysed; returns its files, for the caller to analyse."""
        with self._session.begin() as s:
            record = self._trace(s, trace_id)
            record.status = "analysing"
            return list(record.paths)

    def save_analysis(self, trace_id: int, document: dict[str, Any], captured_utc_ns: int | None = None) -> None:
        """Store a trace's report document (``nsysan.analysis.analyse``): its findings replace the
        earlier ones (and their comments), its summary feeds the library, and the trace is ready."""
        with self._session.begin() as s:
            record = self._trace(s, trace_id)
            record.findings.clear()
            record.findings.extend(FindingRecord(**f) for f in document["findings"])
            record.summary = document["summary"]
            record.ranks = sorted({r for t in document["traces"] for r in t["ranks"]})
            record.devices = sorted({d for t in document["traces"] for d in t["devices"]})
            record.captured_utc_ns = captured_utc_ns
            record.status, record.error = "ready", None

    def mark_failed(self, trace_id: int, error: str) -> None:
        with self._session.begin() as s:
            record = self._trace(s, trace_id)
            record.status, record.error = "failed", error

    def trace(self, trace_id: int) -> dict[str, Any]:
        """One trace's library row (see :meth:`traces`)."""
        for row in self.traces(trace_id):
            return row
        raise NotFound(f"no trace {trace_id}")

    def trace_paths(self, trace_id: int) -> list[str]:
        """The server-side files of a trace: for the server only, never sent to a browser."""
        with self.session() as s:
            return list(self._trace(s, trace_id).paths)

    def registered_paths(self) -> set[tuple[str, ...]]:
        with self.session() as s:
            return {tuple(p) for p in s.scalars(sa.select(TraceRecord.paths))}

    def traces(self, only: int | None = None) -> list[dict[str, Any]]:
        """The library: every trace with its finding counts by severity."""
        with self.session() as s:
            counts = dict.fromkeys(("info", "warning", "critical"), 0)
            counted = sa.select(FindingRecord.trace_id, FindingRecord.severity, sa.func.count())
            listed = sa.select(TraceRecord).order_by(TraceRecord.id)
            if only is not None:
                counted, listed = counted.where(FindingRecord.trace_id == only), listed.where(TraceRecord.id == only)
            rows = s.execute(counted.group_by(FindingRecord.trace_id, FindingRecord.severity)).all()
            by_trace: dict[int, dict[str, int]] = {}
            for trace_id, severity, n in rows:
                by_trace.setdefault(trace_id, dict(counts))[severity] = n
            return [
                {"id": t.id, "name": t.name, "status": t.status, "error": t.error, "ranks": t.ranks,
                 "devices": t.devices, "captured_utc_ns": t.captured_utc_ns,
                 "findings": by_trace.get(t.id, dict(counts)), "step_ns": _step_ns(t.summary or {})}
                for t in s.scalars(listed)
            ]  # fmt: skip

    def _trace(self, s: Session, trace_id: int) -> TraceRecord:
        record = s.get(TraceRecord, trace_id)
        if record is None:
            raise NotFound(f"no trace {trace_id}")
        return record

    # -- findings and review --------------------------------------------------------------------

    def findings(self, trace_id: int, *, kind: str | None = None, severity: str | None = None,
                 rank: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
        query = sa.select(FindingRecord).where(FindingRecord.trace_id == trace_id)
        for column, value in (
            (FindingRecord.kind, kind),
            (FindingRecord.severity, severity),
            (FindingRecord.rank, rank),
        ):
            if value is not None:
                query = query.where(column == value)
        with self.session() as s:
            return [_finding(f) for f in s.scalars(query.order_by(FindingRecord.impact_ns.desc(), FindingRecord.id))]

    def finding(self, finding_id: int) -> dict[str, Any]:
        with self.session() as s:
            record = s.get(FindingRecord, finding_id)
            if record is None:
                raise NotFound(f"no finding {finding_id}")
            return _finding(record) | {"comments": [_remark(c) for c in record.comments]}

    def update_finding(self, finding_id: int, *, based_on_version: int, status: str | None = None,
                       assignee: str | None = None) -> int:  # fmt: skip
        """Change status and/or assignee; returns the new version. Refuses stale edits."""
        changes: dict[str, Any] = {}
        if status is not None:
            if status not in FINDING_STATUSES:
                raise InputError(f"status {status!r}: one of {', '.join(FINDING_STATUSES)}")
            changes["status"] = status
        if assignee is not None:
            changes["assignee"] = assignee.strip() or None
        with self._session.begin() as s:
            # one statement: compare-and-set on the version, atomic in SQLite and PostgreSQL alike
            result = cast(
                sa.CursorResult[Any],
                s.execute(
                    sa.update(FindingRecord)
                    .where(FindingRecord.id == finding_id, FindingRecord.version == based_on_version)
                    .values(**changes, version=FindingRecord.version + 1)
                ),
            )
            if result.rowcount == 1:
                return based_on_version + 1
            current = s.get(FindingRecord, finding_id)
        if current is None:
            raise NotFound(f"no finding {finding_id}")
        raise StaleEdit(
            f"finding {finding_id} was changed by someone else (now version {current.version}, status "
            f"{current.status!r}, assignee {current.assignee!r}); reload it and apply your change again"
        )

    def comment(self, finding_id: int, author: str, body: str) -> int:
        """Add a comment to a finding's thread."""
        if not body.strip():
            raise InputError("an empty comment")
        with self._session.begin() as s:
            finding = s.get(FindingRecord, finding_id)
            if finding is None:
                raise NotFound(f"no finding {finding_id}")
            return self._remark(s, "comment", finding.trace_id, author, body, finding_id=finding_id)

    def note(self, trace_id: int, author: str, body: str) -> int:
        """Add a note on a whole trace."""
        with self._session.begin() as s:
            self._trace(s, trace_id)
            return self._remark(s, "note", trace_id, author, body)

    def notes(self, trace_id: int) -> list[dict[str, Any]]:
        query = sa.select(RemarkRecord).where(RemarkRecord.trace_id == trace_id, RemarkRecord.kind == "note")
        with self.session() as s:
            return [_remark(n) for n in s.scalars(query.order_by(RemarkRecord.id))]

    def _remark(self, s: Session, kind: str, trace_id: int, author: str, body: str,
                finding_id: int | None = None) -> int:  # fmt: skip
        record = RemarkRecord(kind=kind, trace_id=trace_id, finding_id=finding_id, author=author, body=body)
        s.add(record)
        s.flush()
        return record.id


def _shown(url: str) -> str:
    """The URL as it may be printed: without its password."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return "the store URL"


def _reason(exc: sa.exc.OperationalError, url: str) -> str:
    """The driver's first line, and for SQLite the usual cause of "unable to open"."""
    first = (str(exc.orig) if exc.orig is not None else str(exc)).strip().splitlines()[0]
    database = sa.engine.make_url(url).database
    if url.startswith("sqlite") and database and not Path(database).parent.is_dir():
        return f"{first}: the directory {Path(database).parent} does not exist; create it or choose another --db"
    return first


def _add_column(conn: sa.Connection, column: sa.Column[Any]) -> None:
    """``ALTER TABLE ... ADD COLUMN`` for a column of the current models, in the connection's dialect."""
    table = conn.dialect.identifier_preparer.format_table(column.table)
    conn.execute(
        sa.DDL(f"ALTER TABLE {table} ADD COLUMN {sa.schema.CreateColumn(column).compile(dialect=conn.dialect)}")
    )


def _merge_comments_and_notes(conn: sa.Connection) -> None:
    """Schema 3: a finding's comments (``comments``) and a trace's notes (``trace_notes``), two
    tables of one shape, become the rows of ``remarks``, in their order; the old tables go."""
    remarks = Base.metadata.tables["remarks"]
    remarks.create(conn)
    columns = ("kind", "trace_id", "finding_id", "author", "body", "created_at")
    comments = sa.table("comments", *map(sa.column, ("id", "finding_id", "author", "body", "created_at")))
    notes = sa.table("trace_notes", *map(sa.column, ("id", "trace_id", "author", "body", "created_at")))
    findings = sa.table("findings", sa.column("id"), sa.column("trace_id"))
    conn.execute(remarks.insert().from_select(columns, sa.select(
        sa.literal("comment"), findings.c.trace_id, comments.c.finding_id, comments.c.author, comments.c.body,
        comments.c.created_at,
    ).join_from(comments, findings, comments.c.finding_id == findings.c.id).order_by(comments.c.id)))  # fmt: skip
    conn.execute(remarks.insert().from_select(columns, sa.select(
        sa.literal("note"), notes.c.trace_id, sa.cast(sa.null(), sa.Integer), notes.c.author, notes.c.body,
        notes.c.created_at,
    ).order_by(notes.c.id)))  # fmt: skip
    for old in ("comments", "trace_notes"):
        sa.Table(old, sa.MetaData()).drop(conn)


MIGRATIONS: dict[int, Callable[[sa.Connection], None]] = {
    1: lambda conn: _add_column(conn, Base.metadata.tables["findings"].c["group"]),
    2: _merge_comments_and_notes,
}
"""Schema version -> the step that brings a store from it to the next, run in one transaction."""


def _step_ns(summary: dict[str, Any]) -> float | None:
    """Mean duration of NVTX ranges called ``step ...``, the job's step time, when it has them."""
    rows = [r for r in summary.get("nvtx_ranges", []) if str(r.get("range", "")).lower().startswith("step")]
    count = sum(r["count"] for r in rows)
    return sum(r["total_ns"] for r in rows) / count if count else None


def _finding(f: FindingRecord) -> dict[str, Any]:
    return {c: getattr(f, c) for c in ("id", "trace_id", "kind", "group", "severity", "rank", "device", "pid", "start_ns", "end_ns",
                                        "impact_ns", "title", "evidence", "advice", "status", "assignee", "version")}  # fmt: skip


def _remark(c: RemarkRecord) -> dict[str, Any]:
    return {"id": c.id, "author": c.author, "body": c.body, "created_at": c.created_at.isoformat()}
