"""ReviewStore: traces, findings and the team's review of them, in a real database.

The store only persists: it neither reads traces nor runs the analysis. Its callers (the
dashboard's background queue, the tests) validate exports, analyse them and hand it the report
document (:meth:`ReviewStore.save_analysis`).

A SQLite file by default, PostgreSQL when given a URL (``postgresql+psycopg://...``); the schema is
created on first use and kept up to date by Alembic revisions (:mod:`nsysan.store.schema`). Every
edit of a finding names the version it was based on; an edit based on a stale version is refused
(:class:`StaleEdit`), so two people editing the same finding never silently overwrite each other. No SQL is built from user text: everything
goes through SQLAlchemy with bound parameters.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from nsysan.errors import InputError, NsysanError
from nsysan.store import identity, schema
from nsysan.store.models import (
    FINDING_STATUSES,
    OPEN_STATUSES,
    FindingRecord,
    RemarkRecord,
    ReviewEventRecord,
    StepsRecord,
    TraceDeletionRecord,
    TraceRecord,
    _now,
)

log = logging.getLogger(__name__)

# What a reviewer types, at most (characters): held here, whatever the caller, since SQLite does not
# enforce a column's length and PostgreSQL would fail the whole save on a too-long name.
MAX_TEXT_CHARS = 10_000  # a comment or a note
MAX_NAME_CHARS = 128  # an author or an assignee (the columns' width)


def _check_length(what: str, value: str | None, most: int) -> None:
    if value is not None and len(value) > most:
        raise InputError(f"the {what} is too long ({len(value):,} characters; at most {most:,})")


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
            schema.upgrade(self.url, shown)  # Alembic: a new store's tables, an older store's missing revisions
        except sa.exc.OperationalError as exc:
            raise StoreUnavailable(f"{shown}: cannot open the store ({_reason(exc, self.url)})") from None

    def session(self) -> Session:
        return self._session()

    # -- traces ---------------------------------------------------------------------------------

    def register(self, paths: Sequence[str | os.PathLike[str]], name: str | None = None, *,
                 owner: str | None = None, upload_bytes: int | None = None) -> int:  # fmt: skip
        """Record a trace: export files on the server that the caller has already validated as nsys
        exports (the store never opens a trace); an upload with its ``owner`` and size."""
        files = [str(Path(p).resolve()) for p in paths]
        with self._session.begin() as s:
            record = TraceRecord(name=name or Path(files[0]).stem, paths=files, owner=owner, upload_bytes=upload_bytes)
            s.add(record)
            s.flush()
            return record.id

    def request_analysis(self, trace_id: int, settings: dict[str, dict[str, float]]) -> None:
        """Ask for the trace to be analysed again, with these detector settings ({kind: {param:
        value}}; {} for the defaults): recorded before any work starts, so a server stopped before or
        during the analysis resumes it with them (the trace is ``registered`` until it starts).
        Refused (InputError) while the trace is queued or being analysed: one statement checks and
        sets, so two requests at once never queue it twice or swap its settings under a running analysis."""
        with self._session.begin() as s:
            done: sa.CursorResult[Any] = s.execute(  # type: ignore[assignment]
                sa.update(TraceRecord)
                .where(TraceRecord.id == trace_id, TraceRecord.status.in_(("ready", "failed")))
                .values(settings=settings, status="registered", error=None)
            )
            if done.rowcount == 0:
                self._trace(s, trace_id)  # NotFound when there is no such trace
                raise InputError("the trace is being analysed already; try again when it is done")

    def start_analysis(self, trace_id: int) -> AnalysisJob:
        """Mark a trace as being analysed; returns its files and the settings to analyse it with."""
        with self._session.begin() as s:
            record = self._trace(s, trace_id)
            record.status = "analysing"
            return AnalysisJob(list(record.paths), dict(record.settings or {}))

    def save_analysis(self, trace_id: int, document: dict[str, Any], captured_utc_ns: int | None = None,
                      settings: dict[str, Any] | None = None) -> None:  # fmt: skip
        """Store a trace's report document (``nsysan.analysis.analyse``): its summary feeds the library,
        its ``steps`` section (if it has one) replaces the trace's stored one (:meth:`steps`), and the
        trace is ready. Its findings are matched to the stored ones (:mod:`nsysan.store.identity`):
        a stored finding found again keeps its id, status, assignee, version and comments and takes the
        new analysis's window, severity, impact, recoverable time, title, evidence and advice; one not
        found again is kept, marked not present (``missing_since``); a new one is added.

        Of a finding, the store keeps the fields of the findings contract (:data:`DOCUMENT_FIELDS`); a
        key it does not know (a newer contract's, a caller's own) is left out and named in the log,
        never an error. A finding without ``recoverable_ns`` (a report before version 2) has None. ``settings``: those
        the analysis ran with (``start_analysis``'s), named in what it writes into findings' threads."""
        found = [_from_document(f) for f in document["findings"]]
        ignored = sorted({k for f in document["findings"] for k in f} - set(DOCUMENT_FIELDS))
        if ignored:
            log.warning("trace %s: finding fields the store does not keep, left out: %s", trace_id, ", ".join(ignored))
        steps = document.get("steps")
        with self._session.begin() as s:
            # write the trace's row first (a no-op), locking it: two analyses of one trace match in turn
            s.execute(sa.update(TraceRecord).where(TraceRecord.id == trace_id).values(status=TraceRecord.status))
            record = self._trace(s, trace_id)
            stored = list(s.scalars(sa.select(FindingRecord).where(FindingRecord.trace_id == trace_id)
                                    .order_by(FindingRecord.id)))  # fmt: skip
            matched = identity.match([_finding(f) for f in stored], found)
            again = set(matched.values())
            now = _now()
            said = _settings_text(record.settings or {} if settings is None else settings)
            for i, old in enumerate(stored):
                if i not in again and old.present:
                    old.present, old.missing_since = False, now
                    s.add(_analysis_remark(old, f"No longer found by the re-analysis ({said}).", now))
            for j, new in enumerate(found):
                if j in matched:
                    old = stored[matched[j]]
                    changes = _changes(old, new, was_present=old.present)
                    for key in _ANALYSED:
                        if key in new:
                            setattr(old, key, new[key])
                    old.present, old.missing_since = True, None
                    if changes:
                        s.add(_analysis_remark(old, f"Re-analysis ({said}): {'; '.join(changes)}.", now))
                else:
                    s.add(FindingRecord(**new, trace_id=trace_id))
            # replaced, not merged: the old section is never read back (it can be large)
            s.execute(sa.delete(StepsRecord).where(StepsRecord.trace_id == trace_id))
            if steps is not None:
                s.add(StepsRecord(trace_id=trace_id, steps=steps))
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

    def delete_trace(self, trace_id: int, by: str = "anonymous") -> None:
        """Remove a trace with its findings, remarks, review events and steps (NotFound when there is none),
        recorded (:meth:`deletions`) in the same transaction. Deleted explicitly, child tables first:
        SQLite enforces no ON DELETE CASCADE unless a connection turns foreign keys on, and this works
        the same on PostgreSQL."""
        with self._session.begin() as s:
            record = self._trace(s, trace_id)
            count = sa.select(sa.func.count())
            s.add(TraceDeletionRecord(
                trace_id=trace_id, name=record.name, owner=record.owner, deleted_by=by,
                findings=s.scalar(count.select_from(FindingRecord).where(FindingRecord.trace_id == trace_id)) or 0,
                remarks=s.scalar(count.select_from(RemarkRecord).where(RemarkRecord.trace_id == trace_id)) or 0,
            ))  # fmt: skip
            for table in (ReviewEventRecord, RemarkRecord, FindingRecord, StepsRecord):
                s.execute(sa.delete(table).where(table.trace_id == trace_id))
            gone: sa.CursorResult[Any] = s.execute(sa.delete(TraceRecord).where(TraceRecord.id == trace_id))  # type: ignore[assignment]
            if gone.rowcount == 0:  # deleted meanwhile by someone else: their record stands, not a second one
                raise NotFound(f"no trace {trace_id}")

    def deletions(self, limit: int = 20) -> list[dict[str, Any]]:
        """The latest deleted traces: which, whose, by whom, when, and how much review went with them."""
        with self.session() as s:
            rows = s.scalars(sa.select(TraceDeletionRecord).order_by(TraceDeletionRecord.id.desc()).limit(limit))
            return [{"trace_id": d.trace_id, "name": d.name, "owner": d.owner, "deleted_by": d.deleted_by,
                     "deleted_at": _utc(d.deleted_at).isoformat(), "findings": d.findings, "remarks": d.remarks}
                    for d in rows]  # fmt: skip

    def uploaded_bytes(self, owner: str | None) -> int:
        """What an uploader's traces take on disk (``None``: the uploads of no one, made without login)."""
        where = TraceRecord.owner.is_(None) if owner is None else TraceRecord.owner == owner
        with self.session() as s:
            return int(
                s.scalar(sa.select(sa.func.coalesce(sa.func.sum(TraceRecord.upload_bytes), 0)).where(where)) or 0
            )

    def steps(self, trace_id: int) -> dict[str, Any] | None:
        """The ``steps`` section of the trace's latest analysis (where each rank's step time went,
        docs/report.md); None when it has none: not analysed yet, or analysed by an nsysan before
        report version 2 (or stored before schema 6). Kept apart from the library's rows
        (:meth:`traces` never reads it); NotFound when there is no such trace."""
        query = (
            sa.select(TraceRecord.id, StepsRecord.steps)
            .outerjoin(StepsRecord, StepsRecord.trace_id == TraceRecord.id)
            .where(TraceRecord.id == trace_id)
        )
        with self.session() as s:
            row = s.execute(query).one_or_none()
        if row is None:
            raise NotFound(f"no trace {trace_id}")
        return cast("dict[str, Any] | None", row.steps)

    def trace_paths(self, trace_id: int) -> list[str]:
        """The server-side files of a trace: for the server only, never sent to a browser."""
        with self.session() as s:
            return list(self._trace(s, trace_id).paths)

    def registered_paths(self) -> set[tuple[str, ...]]:
        with self.session() as s:
            return {tuple(p) for p in s.scalars(sa.select(TraceRecord.paths))}

    def traces(self, only: int | None = None) -> list[dict[str, Any]]:
        """The library: every trace with its finding counts (of its latest analysis) by severity, by
        review status (``review``) and, per assignee, of those still to do (``to_do``: open or
        confirmed), so a team sees its progress without opening each trace."""
        with self.session() as s:
            counts = dict.fromkeys(("info", "warning", "critical"), 0)
            counted = sa.select(FindingRecord.trace_id, FindingRecord.severity, sa.func.count()).where(
                FindingRecord.present
            )
            listed = sa.select(TraceRecord).order_by(TraceRecord.id)
            if only is not None:
                counted, listed = counted.where(FindingRecord.trace_id == only), listed.where(TraceRecord.id == only)
            rows = s.execute(counted.group_by(FindingRecord.trace_id, FindingRecord.severity)).all()
            by_trace: dict[int, dict[str, int]] = {}
            for trace_id, severity, n in rows:
                by_trace.setdefault(trace_id, dict(counts))[severity] = n
            reviewed = sa.select(FindingRecord.trace_id, FindingRecord.status, FindingRecord.assignee,
                                 sa.func.count()).where(FindingRecord.present)  # fmt: skip
            if only is not None:
                reviewed = reviewed.where(FindingRecord.trace_id == only)
            review: dict[int, dict[str, int]] = {}
            to_do: dict[int, dict[str, int]] = {}
            grouped = reviewed.group_by(FindingRecord.trace_id, FindingRecord.status, FindingRecord.assignee)
            for trace_id, status, assignee, n in s.execute(grouped).all():
                mine = review.setdefault(trace_id, dict.fromkeys(FINDING_STATUSES, 0))
                mine[status] = mine.get(status, 0) + n
                if assignee and status in OPEN_STATUSES:
                    who = to_do.setdefault(trace_id, {})
                    who[assignee] = who.get(assignee, 0) + n
            return [
                {"id": t.id, "name": t.name, "status": t.status, "error": t.error, "ranks": t.ranks,
                 "devices": t.devices, "captured_utc_ns": t.captured_utc_ns,
                 "findings": by_trace.get(t.id, dict(counts)), "step_ns": _step_ns(t.summary or {}),
                 "review": review.get(t.id, dict.fromkeys(FINDING_STATUSES, 0)), "to_do": to_do.get(t.id, {}),
                 "settings": t.settings or {}, "owner": t.owner}
                for t in s.scalars(listed)
            ]  # fmt: skip

    def _trace(self, s: Session, trace_id: int) -> TraceRecord:
        record = s.get(TraceRecord, trace_id)
        if record is None:
            raise NotFound(f"no trace {trace_id}")
        return record

    # -- findings and review --------------------------------------------------------------------

    def findings(self, trace_id: int, *, kind: str | None = None, severity: str | None = None,
                 rank: int | None = None, include_missing: bool = False) -> list[dict[str, Any]]:  # fmt: skip
        """The trace's findings of its latest analysis, largest impact first; with ``include_missing``
        also those an earlier analysis found and the latest did not (``present`` False)."""
        query = sa.select(FindingRecord).where(FindingRecord.trace_id == trace_id)
        if not include_missing:
            query = query.where(FindingRecord.present)
        for column, value in (
            (FindingRecord.kind, kind),
            (FindingRecord.severity, severity),
            (FindingRecord.rank, rank),
        ):
            if value is not None:
                query = query.where(column == value)
        with self.session() as s:
            return [_finding(f) for f in s.scalars(query.order_by(FindingRecord.impact_ns.desc(), FindingRecord.id))]

    def finding_ids(self, trace_id: int) -> set[int]:
        """The ids of all the trace's findings (those the latest analysis lacks too): cheap, for
        checking ids a page sends back."""
        with self.session() as s:
            return set(s.scalars(sa.select(FindingRecord.id).where(FindingRecord.trace_id == trace_id)))

    def finding(self, finding_id: int) -> dict[str, Any]:
        """One finding with its review: ``comments``, ``events`` (status and assignee changes) and
        ``thread``, both in the order they happened."""
        with self.session() as s:
            record = s.get(FindingRecord, finding_id)
            if record is None:
                raise NotFound(f"no finding {finding_id}")
            comments = [_remark(c) for c in record.comments]
            events = [_event(e) for e in record.events]
            return _finding(record) | {"comments": comments, "events": events, "thread": _thread(comments, events)}

    def review_state(self, finding_id: int) -> dict[str, Any]:
        """What an open page polls (cheap: no evidence): the finding's version, status and assignee,
        and how many comments and events its thread has."""
        with self.session() as s:
            row = s.execute(
                sa.select(FindingRecord.version, FindingRecord.status, FindingRecord.assignee).where(
                    FindingRecord.id == finding_id
                )
            ).one_or_none()
            if row is None:
                raise NotFound(f"no finding {finding_id}")
            count = sa.select(sa.func.count())
            comments = s.scalar(count.select_from(RemarkRecord).where(RemarkRecord.finding_id == finding_id))
            events = s.scalar(count.select_from(ReviewEventRecord).where(ReviewEventRecord.finding_id == finding_id))
        return {"version": row.version, "status": row.status, "assignee": row.assignee,
                "comments": comments or 0, "events": events or 0}  # fmt: skip

    def update_finding(self, finding_id: int, *, based_on_version: int, status: str | None = None,
                       assignee: str | None = None, author: str = "anonymous") -> int:  # fmt: skip
        """Change status and/or assignee; returns the finding's version after it. Each field that
        changes is recorded as a review event by ``author``; a save that changes nothing (the finding
        already has these values) writes nothing and keeps the version, whatever version it was
        based on. Refuses a stale edit: one that would change a finding someone else saved since
        ``based_on_version``."""
        return self._update(finding_id, based_on_version, status, assignee, author)[0]

    def _update(self, finding_id: int, based_on_version: int, status: str | None, assignee: str | None,
                author: str) -> tuple[int, bool]:  # fmt: skip
        """:meth:`update_finding`'s work: (the version after it, whether anything changed)."""
        wanted: dict[str, Any] = {}
        if status is not None:
            if status not in FINDING_STATUSES:
                raise InputError(f"status {status!r}: one of {', '.join(FINDING_STATUSES)}")
            wanted["status"] = status
        if assignee is not None:
            _check_length("assignee", assignee.strip(), MAX_NAME_CHARS)
            wanted["assignee"] = assignee.strip() or None
        _check_length("author", author, MAX_NAME_CHARS)
        with self._session.begin() as s:
            current = s.execute(
                sa.select(FindingRecord.trace_id, FindingRecord.version, FindingRecord.status, FindingRecord.assignee)
                .where(FindingRecord.id == finding_id)
            ).one_or_none()  # fmt: skip
            if current is None:
                raise NotFound(f"no finding {finding_id}")
            changes = {k: v for k, v in wanted.items() if getattr(current, k) != v}
            if not changes:
                return int(current.version), False  # nothing to save: no event, no new version
            if current.version == based_on_version:
                # one statement: compare-and-set on the version, atomic in SQLite and PostgreSQL alike;
                # the values read above are those of this version, so they are the events' "from"
                result = cast(
                    sa.CursorResult[Any],
                    s.execute(
                        sa.update(FindingRecord)
                        .where(FindingRecord.id == finding_id, FindingRecord.version == based_on_version)
                        .values(**changes, version=FindingRecord.version + 1)
                    ),
                )
                if result.rowcount == 1:
                    now = _now()
                    s.add_all(ReviewEventRecord(trace_id=current.trace_id, finding_id=finding_id, author=author,
                                                field=k, old_value=getattr(current, k), new_value=v,
                                                version=based_on_version + 1, created_at=now)
                              for k, v in changes.items())  # fmt: skip
                    return based_on_version + 1, True
            now_at = s.get(FindingRecord, finding_id, populate_existing=True)
        if now_at is None:
            raise NotFound(f"no finding {finding_id}")
        raise StaleEdit(
            f"finding {finding_id} was changed by someone else (now version {now_at.version}, status "
            f"{now_at.status!r}, assignee {now_at.assignee!r}); reload it and apply your change again"
        )

    def update_findings(self, versions: dict[int, int], *, status: str | None = None, assignee: str | None = None,
                        author: str = "anonymous") -> dict[str, list[int]]:  # fmt: skip
        """A group triaged in one action: each finding of ``versions`` (id -> the version the
        reviewer saw) changed as :meth:`update_finding` changes one, each on its own compare-and-set.
        Returns the ids ``changed``, ``unchanged`` (they had these values already), ``stale``
        (someone else saved them since: left as they are, for the reviewer to look at) and ``gone``
        (deleted since), so a concurrent edit of one occurrence is never overwritten by the group's
        and what was saved is always said."""
        out: dict[str, list[int]] = {"changed": [], "unchanged": [], "stale": [], "gone": []}
        for finding_id, version in sorted(versions.items()):
            try:
                changed = self._update(finding_id, version, status, assignee, author)[1]
            except StaleEdit:
                out["stale"].append(finding_id)
                continue
            except NotFound:
                out["gone"].append(finding_id)
                continue
            out["changed" if changed else "unchanged"].append(finding_id)
        return out

    def review(self, trace_id: int) -> dict[str, Any]:
        """A trace's whole review, for export (:mod:`nsysan.store.export`): the trace, its notes, and
        every finding (those the latest analysis no longer found too) with its thread."""
        trace = self.trace(trace_id)
        findings = self.findings(trace_id, include_missing=True)
        with self.session() as s:
            comments = s.scalars(sa.select(RemarkRecord).where(RemarkRecord.trace_id == trace_id,
                                                               RemarkRecord.kind == "comment")
                                 .order_by(RemarkRecord.id)).all()  # fmt: skip
            events = s.scalars(sa.select(ReviewEventRecord).where(ReviewEventRecord.trace_id == trace_id)
                               .order_by(ReviewEventRecord.id)).all()  # fmt: skip
            by_finding: dict[int, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
            for c in comments:
                by_finding.setdefault(c.finding_id or 0, ([], []))[0].append(_remark(c))
            for e in events:
                by_finding.setdefault(e.finding_id, ([], []))[1].append(_event(e))
        for f in findings:
            f["thread"] = _thread(*by_finding.get(f["id"], ([], [])))
        return {"trace": {k: trace[k] for k in ("id", "name", "status", "ranks", "devices", "captured_utc_ns")},
                "notes": self.notes(trace_id), "findings": findings}  # fmt: skip

    def search_findings(self, text: str, limit: int = 200) -> list[dict[str, Any]]:
        """Findings of every trace (of their latest analyses) whose title, kind, group key or evidence
        (kernel names, say) contains ``text``, case-insensitively; largest impact first, each with its
        trace's name as ``trace_name``."""
        needle = text.strip().lower()
        if not needle:
            return []
        searched = [
            FindingRecord.title,
            FindingRecord.kind,
            FindingRecord.group,
            sa.cast(FindingRecord.evidence, sa.Text),
        ]
        query = (
            sa.select(FindingRecord, TraceRecord.name)
            .join(TraceRecord, TraceRecord.id == FindingRecord.trace_id)
            .where(
                FindingRecord.present, sa.or_(*(sa.func.lower(c).contains(needle, autoescape=True) for c in searched))
            )
            .order_by(FindingRecord.impact_ns.desc(), FindingRecord.id)
            .limit(limit)
        )
        with self.session() as s:
            return [_finding(f) | {"trace_name": name} for f, name in s.execute(query)]

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
        _check_length(kind, body, MAX_TEXT_CHARS)
        _check_length("author", author, MAX_NAME_CHARS)
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


def _step_ns(summary: dict[str, Any]) -> float | None:
    """Mean duration of NVTX ranges called ``step ...``, the job's step time, when it has them."""
    rows = [r for r in summary.get("nvtx_ranges", []) if str(r.get("range", "")).lower().startswith("step")]
    count = sum(r["count"] for r in rows)
    return sum(r["total_ns"] for r in rows) / count if count else None


# what an analysis says about a finding, taken from the new analysis when a stored finding is found again
_ANALYSED = ("group", "severity", "pid", "start_ns", "end_ns", "impact_ns", "recoverable_ns", "title", "evidence",
             "advice")  # fmt: skip
# the fields of a report document's finding the store keeps (the findings contract, report version 2):
# the identity (nsysan.store.identity) and what the analysis says; any other key is left out
DOCUMENT_FIELDS = ("kind", "rank", "device", *_ANALYSED)


def _from_document(finding: dict[str, Any]) -> dict[str, Any]:
    """A report document's finding as the store keeps it: the contract's fields it has, and
    ``recoverable_ns`` always (None when it has none: a report before version 2 did not compute it)."""
    kept = {k: finding[k] for k in DOCUMENT_FIELDS if k in finding}
    return kept | {"recoverable_ns": finding.get("recoverable_ns")}


def _finding(f: FindingRecord) -> dict[str, Any]:
    d = {c: getattr(f, c) for c in ("id", "trace_id", "kind", "group", "severity", "rank", "device", "pid", "start_ns",
                                    "end_ns", "impact_ns", "recoverable_ns", "title", "evidence", "advice", "status",
                                    "assignee", "version", "present")}  # fmt: skip
    return d | {"missing_since": _utc(f.missing_since).isoformat() if f.missing_since else None}


def _utc(when: dt.datetime) -> dt.datetime:
    """In UTC (SQLite gives back the naive UTC time stored; PostgreSQL the session's time zone)."""
    return when.replace(tzinfo=dt.timezone.utc) if when.tzinfo is None else when.astimezone(dt.timezone.utc)


def _remark(c: RemarkRecord) -> dict[str, Any]:
    return {"id": c.id, "author": c.author, "body": c.body, "created_at": _utc(c.created_at).isoformat()}


class AnalysisJob(NamedTuple):
    """What :meth:`ReviewStore.start_analysis` hands the analyser: the trace's files and its settings."""

    paths: list[str]
    settings: dict[str, Any]


ANALYSIS_AUTHOR = "nsysan"  # the author of what a re-analysis writes into a finding's thread


def _settings_text(settings: dict[str, Any]) -> str:
    """Settings as ``nsysan report --set`` takes them, or "default settings"."""
    pairs = [
        f"{kind}.{param}={value}"
        for kind, params in sorted(settings.items())
        for param, value in sorted(params.items())
    ]
    return "settings " + ", ".join(pairs) if pairs else "default settings"


def _changes(old: FindingRecord, new: dict[str, Any], was_present: bool) -> list[str]:
    """What a re-analysis changed of a finding a reviewer sees: its title (which carries its figures),
    severity and recoverable time, or that it is found again (a finding changing silently under its
    review is how a reviewed "122 ms in 5 calls" became "206.9 ms in 29 calls" unnoticed)."""
    out = [] if was_present else ["found again"]
    if new.get("title", old.title) != old.title:
        out.append(f"title was “{old.title}”, now “{new['title']}”")
    if new.get("severity", old.severity) != old.severity:
        out.append(f"severity {old.severity} → {new['severity']}")
    recoverable = new.get("recoverable_ns", old.recoverable_ns)
    if old.recoverable_ns is not None and recoverable is not None:
        was, now = _ms(old.recoverable_ns), _ms(recoverable)
        if was != now:
            out.append(f"recoverable {was} → {now}")
    return out


def _ms(ns: int) -> str:
    """A recoverable time as a thread says it: ms to the µs, so a change of a microsecond shows."""
    return f"{ns / 1e6:,.3f} ms"


def _analysis_remark(finding: FindingRecord, body: str, when: dt.datetime) -> RemarkRecord:
    return RemarkRecord(kind="comment", trace_id=finding.trace_id, finding=finding, author=ANALYSIS_AUTHOR,
                        body=body, created_at=when)  # fmt: skip


def _event(e: ReviewEventRecord) -> dict[str, Any]:
    return {"id": e.id, "author": e.author, "field": e.field, "from": e.old_value, "to": e.new_value,
            "version": e.version, "created_at": _utc(e.created_at).isoformat()}  # fmt: skip


def _thread(comments: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Comments and events in one list, in the order they happened (``kind`` says which)."""
    merged = [c | {"kind": "comment"} for c in comments] + [e | {"kind": "event"} for e in events]
    return sorted(merged, key=lambda entry: entry["created_at"])  # stable: each kind stays in its own order
