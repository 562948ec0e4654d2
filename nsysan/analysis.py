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
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from nsysan.attribution.job import MAX_GRAPH_NODES, reduce_attribution
from nsysan.attribution.part import AttributionPart, map_attribution
from nsysan.detect import DetectorParts, map_detectors, reduce_detectors
from nsysan.detect.common import export_run_ns
from nsysan.detect.nccl_ordering_stall import matching
from nsysan.findings import Finding
from nsysan.ingest import Trace
from nsysan.ingest.slices import ProcessSlice
from nsysan.ingest.trace import ExportInfo, job_clock_offsets
from nsysan.overview import OverviewPart, merge_overview, overview_part
from nsysan.report.document import build_document
from nsysan.steps import DEFAULT_STEP_PATTERN

Settings = dict[str, dict[str, float]]


@dataclass
class ExportResult:
    """What the map of one export sends to the reduce: picklable and small (no per-kernel rows)."""

    info: ExportInfo
    overview: OverviewPart
    detectors: DetectorParts
    attribution: AttributionPart
    profiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the diff profile's parts, when asked


def map_export(
    trace: Trace,
    index: int,
    settings: Settings | None = None,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    graph_budget: int | None = None,
) -> ExportResult:
    """The map: ``trace`` holds one export, the job's export number ``index``. The per-export
    detectors run first; the attribution then names the graph nodes their findings' causes touch.
    ``graph_budget``: this map's share of the job's graph (:func:`graph_budget`)."""
    detectors = map_detectors(trace, settings)
    attribution, detectors.findings = map_attribution(trace, step_pattern, detectors.findings, graph_budget)
    detectors.findings = {kind: [f.in_export(index) for f in found] for kind, found in detectors.findings.items()}
    return ExportResult(
        info=dataclasses.replace(trace.exports[0], index=index),
        overview=overview_part(trace).with_export(index),
        detectors=detectors.with_export(index),
        attribution=attribution.with_export(index),
    )


def reduce_job(
    results: list[ExportResult], ranks: pd.DataFrame, input_notes: list[str], settings: Settings | None = None
) -> dict[str, Any]:
    """The reduce: the report document of the job from every export's result (in export order)."""
    exports = [r.info for r in results]
    overview = merge_overview([r.overview for r in results], ranks, exports, input_notes)
    utc = [int(c) for c in job_clock_offsets([e.session_start_utc_ns for e in exports])]
    notes: list[str] = []
    job = reduce_attribution([r.attribution for r in results], utc, matching(settings), notes)
    findings = reduce_detectors([r.detectors for r in results], job.clock.offsets, settings, notes, attribution=job)
    overview.limitations.extend(notes)
    return build_document(overview, findings, steps=job.document())


def combine_slices(results: list[ExportResult]) -> ExportResult:
    """One export's result from the results of its slices of processes (see
    :mod:`nsysan.ingest.slices`), each mapped with the export's run length; the findings' causes
    renumbered into the combined graph."""
    if len(results) == 1:
        return results[0]
    base = 0
    detectors = []
    for r in results:
        findings = {kind: [_shift_nodes(f, base) for f in found] for kind, found in r.detectors.findings.items()}
        detectors.append(dataclasses.replace(r.detectors, findings=findings))
        base += len(r.attribution.graph.nodes)
    return ExportResult(
        info=results[0].info,
        overview=OverviewPart.combine_slices([r.overview for r in results]),
        detectors=DetectorParts.combine_slices(detectors),
        attribution=AttributionPart.combine_slices([r.attribution for r in results]),
        profiles=[p for r in results for p in r.profiles],
    )


def _shift_nodes(f: Finding, base: int) -> Finding:
    if f.cause is None or base == 0:
        return f
    edits = tuple(dataclasses.replace(e, nodes=tuple(n + base for n in e.nodes)) for e in f.cause.edits)
    return dataclasses.replace(f, cause=dataclasses.replace(f.cause, edits=edits))


def slice_in_process(path: Path) -> bool:
    """Whether this process maps the export at ``path`` by slices of its processes rather than
    whole. Both give the same document; slices hold one slice's frames at a time but scan
    every table once per slice (8 slices of an 8M-kernel export: 1.65x the CPU, 0.25x the peak
    RSS, docs/scale.md). A whole export's frames peak near 4x the file, so it is mapped whole up to an
    eighth of this machine's memory. A Dask cluster always maps by slices: they run in parallel."""
    try:
        size = path.stat().st_size
    except OSError:
        return False  # its map says what is wrong with it
    return size * 8 > psutil.virtual_memory().total


def graph_budget(exports: int, slices: int) -> int:
    """The graph nodes one map may send: the job's limit (``MAX_GRAPH_NODES``) shared evenly over
    its exports and an export's slices. A map past it sends no graph: the reduce would not replay
    a job that large anyway, and 1,024 exports' graphs would hold gigabytes at the coordinator."""
    return MAX_GRAPH_NODES // max(exports, 1) // max(slices, 1)


def analyse(
    trace: Trace,
    settings: Settings | None = None,
    by_slices: bool | None = None,
    step_pattern: str = DEFAULT_STEP_PATTERN,
) -> dict[str, Any]:
    """Ingest -> detect -> document, in this process. ``settings`` overrides detector parameters:
    {kind: {param: value}}. Each export's frames are read, mapped and dropped before the next; an
    export of several processes one slice of them at a time when ``by_slices`` (None: when it is
    large, see :func:`slice_in_process`)."""
    results = []
    for index, info in enumerate(trace.exports):
        split = slice_in_process(info.path) if by_slices is None else by_slices
        slices = trace.export_slices(index) if split else [ProcessSlice()]
        run = export_run_ns(info.path) if len(slices) > 1 else None
        parts = []
        for part in slices:
            with trace.export_alone(index, part, run) as one:
                parts.append(
                    map_export(one, index, settings, step_pattern, graph_budget(len(trace.exports), len(slices)))
                )
        results.append(combine_slices(parts))
    return reduce_job(results, trace.ranks, trace.input_notes, settings)


def capture_start_utc_ns(trace: Trace) -> int | None:
    """When the job's capture began (the earliest export's session start, UTC), if the exports say."""
    starts = [e.session_start_utc_ns for e in trace.exports if e.session_start_utc_ns]
    return min(starts) if starts else None
