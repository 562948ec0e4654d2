"""The analysis pipeline: a trace through the detectors and the overview into a report document.

What ``nsysan report``, ``nsysan diff`` and the dashboard's background queue all run; the report
package only builds and renders documents, so it stays importable without the detectors.
"""

from __future__ import annotations

from typing import Any

from nsysan.detect import run_detectors
from nsysan.ingest import Trace
from nsysan.overview import build_overview
from nsysan.report.document import build_document


def analyse(trace: Trace, settings: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Ingest -> detect -> document. ``settings`` overrides detector parameters: {kind: {param: value}}."""
    return build_document(build_overview(trace), run_detectors(trace, settings))


def capture_start_utc_ns(trace: Trace) -> int | None:
    """When the job's capture began (the earliest export's session start, UTC), if the exports say."""
    starts = [e.session_start_utc_ns for e in trace.exports if e.session_start_utc_ns]
    return min(starts) if starts else None
