"""The analysis pipeline: a job's exports through the detectors and the overview into a report document.

It is a map over exports and a reduce over the job. :func:`map_export` needs one export's frames
and returns an :class:`ExportResult` of compact tables (grouped overview figures, per-export
findings, the ordering stall's NCCL ops); :func:`reduce_job` needs only those. :func:`analyse`
runs both in this process, one export at a time; :mod:`nsysan.engine` runs the same two on Dask
workers, so both give the same document. The report package only builds and renders documents, so
it stays importable without the detectors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pandas as pd

from nsysan.detect import DetectorParts, map_detectors, reduce_detectors
from nsysan.ingest import Trace
from nsysan.ingest.trace import ExportInfo, job_clock_offsets
from nsysan.overview import OverviewPart, merge_overview, overview_part
from nsysan.report.document import build_document

Settings = dict[str, dict[str, float]]


@dataclass
class ExportResult:
    """What the map of one export sends to the reduce: picklable and small (no per-kernel rows)."""

    info: ExportInfo
    overview: OverviewPart
    detectors: DetectorParts
    profile: dict[str, Any] | None = None  # the diff profile's part, when asked (nsysan.diff.profile)


def map_export(trace: Trace, index: int, settings: Settings | None = None) -> ExportResult:
    """The map: ``trace`` holds one export, the job's export number ``index``."""
    return ExportResult(
        info=dataclasses.replace(trace.exports[0], index=index),
        overview=overview_part(trace).with_export(index),
        detectors=map_detectors(trace, settings).with_export(index),
    )


def reduce_job(
    results: list[ExportResult], ranks: pd.DataFrame, input_notes: list[str], settings: Settings | None = None
) -> dict[str, Any]:
    """The reduce: the report document of the job from every export's result (in export order)."""
    exports = [r.info for r in results]
    overview = merge_overview([r.overview for r in results], ranks, exports, input_notes)
    clock = [int(c) for c in job_clock_offsets([e.session_start_utc_ns for e in exports])]
    notes: list[str] = []
    findings = reduce_detectors([r.detectors for r in results], clock, settings, notes)
    overview.limitations.extend(notes)
    return build_document(overview, findings)


def analyse(trace: Trace, settings: Settings | None = None) -> dict[str, Any]:
    """Ingest -> detect -> document, in this process. ``settings`` overrides detector parameters:
    {kind: {param: value}}. Each export's frames are read, mapped and dropped before the next."""
    results = []
    for index in range(len(trace.exports)):
        with trace.export_alone(index) as one:
            results.append(map_export(one, index, settings))
    return reduce_job(results, trace.ranks, trace.input_notes, settings)


def capture_start_utc_ns(trace: Trace) -> int | None:
    """When the job's capture began (the earliest export's session start, UTC), if the exports say."""
    starts = [e.session_start_utc_ns for e in trace.exports if e.session_start_utc_ns]
    return min(starts) if starts else None
