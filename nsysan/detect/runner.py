"""The detectors over a job, one export at a time: a map per export, then a reduce over the job.

The map (:func:`map_detectors`) needs one export's frames and returns what is small enough to send
to a coordinator: the findings of the per-export detectors and the compact tables of the cross-rank
ones (the ordering stall's NCCL ops, about 60 bytes each). The reduce (:func:`reduce_detectors`)
needs only those, so a job of a thousand rank files never has more than one rank's frames in
memory at once. The serial path (:func:`run_detectors`) and the distributed one
(:mod:`nsysan.analysis` on Dask) run these same functions, so they give the same findings.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, grade, run_ns
from nsysan.detect.registry import JobFacts, registered
from nsysan.findings import Finding
from nsysan.ingest.frames import concat_frames
from nsysan.ingest.trace import Trace
from nsysan.memory import release_freed_memory

Settings = dict[str, dict[str, float]]


@dataclass
class DetectorParts:
    """One export's share of the detectors' work (picklable: frames, findings and numbers)."""

    run_ns: int
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # per-export detectors, by kind
    tables: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)  # cross-rank detectors, by kind

    def with_export(self, index: int) -> DetectorParts:
        """The same parts with every table's ``export`` column set to ``index``, the export's place in the job."""
        tables = {
            kind: {name: frame.assign(export=np.int32(index)) for name, frame in frames.items()}
            for kind, frames in self.tables.items()
        }
        return dataclasses.replace(self, tables=tables)

    @classmethod
    def combine_slices(cls, parts: list[DetectorParts]) -> DetectorParts:
        """One export's parts from those of its slices of processes (:mod:`nsysan.ingest.slices`),
        each mapped with the export's run length. Tables keep the slices' order of rows."""
        kinds = dict.fromkeys(kind for part in parts for kind in part.tables)
        joined = {}
        for kind in kinds:
            frames = [part.tables.get(kind, {}) for part in parts]
            names = dict.fromkeys(name for f in frames for name in f)
            joined[kind] = {name: concat_frames([f[name] for f in frames if name in f]) for name in names}
        findings: dict[str, list[Finding]] = {}
        for part in parts:
            for kind, found in part.findings.items():
                findings.setdefault(kind, []).extend(found)
        return cls(run_ns=parts[0].run_ns, findings=findings, tables=joined)


def map_detectors(trace: Trace, settings: Settings | None = None) -> DetectorParts:
    """Every registered detector on ``trace``, which holds one export (its index is 0)."""
    if len(trace.exports) != 1:
        raise ValueError(f"map_detectors takes a trace of one export, not {len(trace.exports)}")
    settings = settings or {}
    parts = DetectorParts(run_ns=int(run_ns(trace).iloc[0]))
    for spec in registered().values():
        out = spec.run(trace, spec.params(**settings.get(spec.kind, {})))
        if spec.reduce is None:
            parts.findings[spec.kind] = list(out)
        else:
            parts.tables[spec.kind] = dict(out)
    return parts


def reduce_detectors(
    parts: list[DetectorParts], clock: list[int], settings: Settings | None = None, notes: list[str] | None = None
) -> list[Finding]:
    """The job's findings, worst first, from every export's :class:`DetectorParts` (in export order)
    and each export's job-clock offset. Severity is graded here, over the whole job, because a
    group (one problem) may have occurrences on several ranks. What a detector could not do is
    added to ``notes`` (the report's limitations). The parts' tables are consumed (see
    :func:`_take_tables`); their findings are not."""
    settings = settings or {}
    job = JobFacts(runs=[p.run_ns for p in parts], clock=list(clock))
    findings: list[Finding] = []
    for spec in registered().values():
        p = spec.params(**settings.get(spec.kind, {}))
        if spec.reduce is None:
            pairs = [(f, part.run_ns) for part in parts for f in part.findings.get(spec.kind, [])]
        else:
            frames = _take_tables(parts, spec.kind)
            release_freed_memory()  # the parts' tables, freed once joined
            pairs = spec.reduce(frames, job, p) if frames else []
            del frames
        findings += grade(pairs, p) if isinstance(p, SeverityParams) else [f for f, _ in pairs]
    if notes is not None:
        notes.extend(job.notes)
    return sorted(findings, key=_worst_first(list(registered())))


def _worst_first(kinds: list[str]) -> Callable[[Finding], tuple[Any, ...]]:
    """The findings' order: severity, impact and start, then whatever tells two findings apart.

    A total order, so that the findings come out the same whatever order the maps delivered them
    in: an export mapped by slices of processes (:mod:`nsysan.ingest.slices`) hands on its slices'
    findings one slice after another, not in the order one map of the whole export finds them.
    """
    place = {kind: i for i, kind in enumerate(kinds)}

    def key(f: Finding) -> tuple[Any, ...]:
        where = tuple(-1 if v is None else v for v in (f.rank, f.device, f.pid))
        return (-f.severity.rank, -f.impact_ns, f.start_ns, place.get(f.kind, len(place)), f.kind,
                *where, f.end_ns, f.group, f.title, json.dumps(f.evidence, sort_keys=True, default=str))  # fmt: skip

    return key


def _take_tables(parts: list[DetectorParts], kind: str) -> dict[str, pd.DataFrame]:
    """A cross-rank detector's tables for the whole job, each the concatenation of every export's.
    The parts give their tables up (they are removed from ``parts``), so that once joined the job's
    tables are held once, not twice: about 0.7 GiB each at 1,024 ranks."""
    taken = [part.tables.pop(kind, {}) for part in parts]
    names = dict.fromkeys(name for tables in taken for name in tables)
    return {name: concat_frames([tables.pop(name) for tables in taken if name in tables]) for name in names}


def run_detectors(trace: Trace, settings: Settings | None = None) -> list[Finding]:
    """Every registered detector's findings on ``trace``, worst first: the map on each export in
    turn, in this process, then the reduce."""
    parts = []
    for index in range(len(trace.exports)):
        with trace.export_alone(index) as one:
            parts.append(map_detectors(one, settings).with_export(index))
    return reduce_detectors(parts, [int(c) for c in trace.job_clock()], settings)
