"""Analysis in the background, and the timelines the server keeps in memory.

Registering a trace returns at once; a single worker thread runs the report on it (so a big
trace never blocks the pages), hands the document to the store, and then prepares its timeline,
the one slow step of drawing it. Progress is kept per trace for the library page to show.

A timeline the server does not hold (after a restart, or pushed out of the cache) is built the
same way, off the request thread: :meth:`TimelineCache.prepare` starts it in the background and
:meth:`TimelineCache.peek` tells a page whether it is there yet, so the overview shows "building the
timeline…" and polls instead of holding a request (and a blank page) for the whole build.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dashboards.timeline import TimelineData
from nsysan.analysis import analyse, capture_start_utc_ns
from nsysan.errors import InputError, NsysanError
from nsysan.ingest import load_trace
from nsysan.store import NotFound, ReviewStore

log = logging.getLogger(__name__)


class NotReady(InputError):
    pass


def analyse_stored_trace(store: ReviewStore, trace_id: int) -> None:
    """Run the report on a registered trace, with the detector settings it was last asked for
    (``ReviewStore.request_analysis``), and store its findings, matched to those of its earlier
    analysis (a finding found again keeps its id and review, one no longer found is kept and marked,
    see ``ReviewStore.save_analysis``); a trace that cannot be read is marked failed, with the reason,
    before the error goes on."""
    job = store.start_analysis(trace_id)
    try:
        with load_trace(job.paths) as trace:
            document = analyse(trace, job.settings or None)
            captured_utc_ns = capture_start_utc_ns(trace)
    except NsysanError as exc:
        store.mark_failed(trace_id, str(exc))
        raise
    store.save_analysis(trace_id, document, captured_utc_ns, job.settings)


def stored_steps(store: ReviewStore, trace_id: int) -> dict[str, Any] | None:
    """The stored ``steps`` section of a trace's latest analysis (``ReviewStore.steps``), for the
    overview's chart and the compare page (None: analysed by an nsysan without it, or no such trace)."""
    try:
        steps = store.steps(trace_id)
    except NotFound:
        return None
    return steps if isinstance(steps, dict) else None


@dataclass
class Progress:
    stage: str  # queued | analysing | preparing timeline | done | failed
    since: float

    @property
    def active(self) -> bool:
        return self.stage not in ("done", "failed")

    def describe(self) -> str:
        return f"{self.stage} ({time.monotonic() - self.since:.0f} s)"


class TimelineCache:
    """The last few traces' timelines (a 1M-kernel one holds about 50 MB)."""

    def __init__(self, store: ReviewStore, capacity: int = 4) -> None:
        self._store = store
        self._capacity = capacity
        self._items: OrderedDict[int, TimelineData] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[int, threading.Lock] = {}
        self._failed: dict[int, str] = {}  # why a background build failed, until it is asked for again
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nsysan-timeline")
        self._queued: set[int] = set()

    def peek(self, trace_id: int) -> TimelineData | None:
        """The trace's timeline if it is built, without building it."""
        with self._lock:
            data = self._items.get(trace_id)
            if data is not None:
                self._items.move_to_end(trace_id)
            return data

    def prepare(self, trace_id: int) -> None:
        """Build the trace's timeline in the background (once, however often asked); :meth:`peek`
        has it when done, :meth:`failure` says why not."""
        with self._lock:
            if trace_id in self._items or trace_id in self._queued:
                return
            self._queued.add(trace_id)
            self._failed.pop(trace_id, None)
        self._background.submit(self._prepare, trace_id)

    def forget(self, trace_id: int) -> None:
        """Drop a deleted trace's timeline: SQLite may give its id to the next trace registered."""
        with self._lock:
            self._items.pop(trace_id, None)
            self._failed.pop(trace_id, None)

    def building(self, trace_id: int) -> bool:
        with self._lock:
            return trace_id in self._queued

    def failure(self, trace_id: int) -> str | None:
        """Why the last background build of this trace's timeline failed (None: it did not)."""
        with self._lock:
            return self._failed.get(trace_id)

    def shutdown(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)

    def _prepare(self, trace_id: int) -> None:
        try:
            self.get(trace_id)
        except InputError as exc:
            with self._lock:
                self._failed[trace_id] = str(exc)
        except Exception:
            log.exception("trace %s: timeline failed", trace_id)
            with self._lock:
                self._failed[trace_id] = "building the timeline failed; see the server log"
        finally:
            with self._lock:
                self._queued.discard(trace_id)

    def get(self, trace_id: int) -> TimelineData:
        with self._lock:
            if trace_id in self._items:
                self._items.move_to_end(trace_id)
                return self._items[trace_id]
            building = self._building.setdefault(trace_id, threading.Lock())
        with building:  # one build per trace, however many pages ask at once
            with self._lock:
                if trace_id in self._items:
                    return self._items[trace_id]
            try:
                data = self._build(trace_id)
            finally:
                with self._lock:
                    self._building.pop(trace_id, None)
            with self._lock:
                self._items[trace_id] = data
                while len(self._items) > self._capacity:
                    self._items.popitem(last=False)
            return data

    def _build(self, trace_id: int) -> TimelineData:
        if self._store.trace(trace_id)["status"] != "ready":
            raise NotReady(f"trace {trace_id} is not analysed yet")
        with load_trace(self._store.trace_paths(trace_id)) as trace:
            return TimelineData.from_trace(trace)


class AnalysisQueue:
    def __init__(self, store: ReviewStore, timelines: TimelineCache) -> None:
        self._store = store
        self._timelines = timelines
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nsysan-analysis")
        self._progress: dict[int, Progress] = {}
        self._lock = threading.Lock()

    def submit(self, trace_id: int) -> None:
        self._set(trace_id, "queued")
        self._pool.submit(self._run, trace_id)

    def reanalyse(self, trace_id: int, settings: dict[str, dict[str, float]]) -> None:
        """Analyse a trace again with these detector settings (recorded first: a restart resumes the
        analysis with them); what changes of each finding goes into its thread."""
        self._store.request_analysis(trace_id, settings)
        self.submit(trace_id)

    def resume(self) -> int:
        """Queue every trace a previous server left unanalysed (or stopped in the middle of), each
        with the settings it was asked for."""
        pending = [t["id"] for t in self._store.traces() if t["status"] in ("registered", "analysing")]
        for trace_id in pending:
            self.submit(trace_id)
        return len(pending)

    def working(self, trace_id: int) -> Progress | None:
        """The trace's progress while it is queued, analysed or its timeline prepared; else None."""
        with self._lock:
            progress = self._progress.get(trace_id)
        return progress if progress is not None and progress.active else None

    def busy(self) -> bool:
        with self._lock:
            return any(p.active for p in self._progress.values())

    def wait(self, timeout: float = 60.0) -> bool:
        """Until nothing is queued or running (for tests and scripts)."""
        deadline = time.monotonic() + timeout
        while self.busy():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._timelines.shutdown()

    def _set(self, trace_id: int, stage: str) -> None:
        with self._lock:
            self._progress[trace_id] = Progress(stage, time.monotonic())

    def _run(self, trace_id: int) -> None:
        try:
            self._set(trace_id, "analysing")
            analyse_stored_trace(self._store, trace_id)
            self._set(trace_id, "preparing timeline")
            self._timelines.get(trace_id)
            self._set(trace_id, "done")
        except NsysanError as exc:  # the store has recorded the error for the library page
            log.warning("trace %s: %s", trace_id, exc)
            self._set(trace_id, "failed")
        except Exception:
            log.exception("trace %s: analysis failed", trace_id)
            self._store.mark_failed(trace_id, "analysis failed unexpectedly; see the server log")
            self._set(trace_id, "failed")
