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

from nsysan.attribution.job import JobAttribution, reduce_attribution
from nsysan.attribution.part import map_attribution
from nsysan.detect.common import SeverityParams, grade, run_ns
from nsysan.detect.registry import JobFacts, Verdicts, registered
from nsysan.findings import Cause, Finding, Severity
from nsysan.ingest.frames import concat_frames
from nsysan.ingest.trace import Trace
from nsysan.memory import release_freed_memory
from nsysan.steps import DEFAULT_STEP_PATTERN

Settings = dict[str, dict[str, float]]


@dataclass
class DetectorParts:
    """One export's share of the detectors' work (picklable: frames, findings and numbers)."""

    run_ns: int
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # per-export detectors, by kind
    tables: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)  # cross-rank detectors, by kind
    unjudged: list[dict[str, Any]] = field(default_factory=list)  # time a detector could not judge, and why

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
        unjudged = [u for part in parts for u in part.unjudged]
        return cls(run_ns=parts[0].run_ns, findings=findings, tables=joined, unjudged=unjudged)


def map_detectors(trace: Trace, settings: Settings | None = None) -> DetectorParts:
    """Every registered detector on ``trace``, which holds one export (its index is 0)."""
    if len(trace.exports) != 1:
        raise ValueError(f"map_detectors takes a trace of one export, not {len(trace.exports)}")
    settings = settings or {}
    parts = DetectorParts(run_ns=int(run_ns(trace).iloc[0]))
    for spec in registered().values():
        out = spec.run(trace, spec.params(**settings.get(spec.kind, {})))
        if isinstance(out, Verdicts):
            parts.unjudged += [{"detector": spec.kind, **u} for u in out.unjudged]
            out = out.findings
        if spec.reduce is None:
            parts.findings[spec.kind] = list(out)
        else:
            parts.tables[spec.kind] = dict(out)
    return parts


def reduce_detectors(
    parts: list[DetectorParts],
    clock: list[int],
    settings: Settings | None = None,
    notes: list[str] | None = None,
    attribution: JobAttribution | None = None,
) -> list[Finding]:
    """The job's findings, worst first, from every export's :class:`DetectorParts` (in export order)
    and each export's job-clock offset. Severity is graded here, over the whole job, because a
    group (one problem) may have occurrences on several ranks: with the job's ``attribution``,
    from what removing the group's cause would save of the job's wall time (:func:`assess`), else
    from the time it lost where it happened. What a detector could not do is added to ``notes``
    (the report's limitations). The parts' tables are consumed (see :func:`_take_tables`); their
    findings are not."""
    settings = settings or {}
    params = {spec.kind: spec.params(**settings.get(spec.kind, {})) for spec in registered().values()}
    job = JobFacts(runs=[p.run_ns for p in parts], clock=list(clock), attribution=attribution, params=params)
    graded: list[tuple[Finding, int, Any]] = []
    for spec in registered().values():
        p = params[spec.kind]
        if spec.reduce is None:
            pairs = [(f, part.run_ns) for part in parts for f in part.findings.get(spec.kind, [])]
        else:
            frames = _take_tables(parts, spec.kind)
            release_freed_memory()  # the parts' tables, freed once joined
            pairs = spec.reduce(frames, job, p)
            del frames
        graded += [(f, run, p) for f, run in pairs]
    if notes is not None:
        notes.extend(job.notes)
    if attribution is not None:
        attribution.unjudged.extend(u for part in parts for u in part.unjudged)
        attribution.unjudged.extend(job.unjudged)
    findings = assess(graded, attribution)
    return sorted(findings, key=_worst_first(list(registered())))


def assess(graded: list[tuple[Finding, int, Any]], attribution: JobAttribution | None) -> list[Finding]:
    """Every finding's ``recoverable_ns`` and severity.

    A finding's cause belongs to a *family* (the same slowed kernel on every rank, the same late
    rank in every step): the job's graph is replayed with each finding's cause removed alone and
    with its family's removed together. The family's saving is what fixing the cause recovers:
    each finding gets what its removal saves alone (scaled down where the findings overlap, so
    that they add up to the family's), and what they save only together (causes on symmetric
    ranks, each hidden behind the others) is shared by impact. Severity then follows the
    group's recoverable share of the job's wall time; without a replayable graph, the old
    measure: the group's impact over the run.
    """
    findings = [f for f, _, _ in graded]
    wall = attribution.wall_ns if attribution is not None and attribution.graph is not None else 0
    if wall <= 0:
        out = []
        by_params: dict[int, list[tuple[Finding, int]]] = {}
        params = {}
        for f, run, p in graded:
            by_params.setdefault(id(p), []).append((f, run))
            params[id(p)] = p
        for params_id, pairs in by_params.items():
            p = params[params_id]
            out += grade(pairs, p) if isinstance(p, SeverityParams) else [f for f, _ in pairs]
        return out
    assert attribution is not None
    warning = min((p.warning_share for _, _, p in graded if isinstance(p, SeverityParams)), default=0.01)
    recoverable = _recoverable(findings, attribution, warning)
    totals: dict[str, float] = {}
    for f, r in zip(findings, recoverable, strict=True):
        key = f.group or f"#{id(f)}"
        totals[key] = totals.get(key, 0.0) + r
    out = []
    for (f, _, p), r in zip(graded, recoverable, strict=True):
        share = totals[f.group or f"#{id(f)}"] / wall
        if not isinstance(p, SeverityParams):
            sev = f.severity
        elif share >= p.critical_share:
            sev = Severity.CRITICAL
        elif share >= p.warning_share:
            sev = Severity.WARNING
        else:
            sev = Severity.INFO
        out.append(dataclasses.replace(f, severity=sev, recoverable_ns=round(r)))
    return out


REPLAY_WORK = 10_000_000  # graph nodes x scenarios the replays of one report may visit (~6 s here)


def _recoverable(findings: list[Finding], attribution: JobAttribution, small: float) -> np.ndarray:
    """Per finding, its share of its family's saving (see :func:`assess`).

    Replays are bounded by ``REPLAY_WORK`` (a scenario visits every node of the graph once):
    - past as many families as that allows, each kind's families are replayed as one (the
      kind's causes removed together, shared by impact): 64 late ranks of a 64-rank job, one replay;
    - a family's members are replayed alone only while the budget lasts, largest families first,
      and only where the split matters: a family whose causes removed together save less than
      ``small`` of the job is info however it is split (eight slowdown findings worth 0.005% of
      the 1M-kernel benchmark: eight replays saved), and shares its saving by impact.
    """
    out = np.zeros(len(findings))
    with_cause = [i for i, f in enumerate(findings) if f.cause is not None and f.cause.edits]
    if not with_cause or attribution.graph is None:
        return out
    budget = max(1, REPLAY_WORK // max(attribution.graph.topo.n, 1))
    causes = {i: attribution.globalize(findings[i].cause) for i in with_cause}  # type: ignore[arg-type]
    families: dict[str, list[int]] = {}
    for i in with_cause:
        families.setdefault(causes[i].family, []).append(i)
    if len(families) > budget:
        families = {}
        for i in with_cause:
            families.setdefault(findings[i].kind, []).append(i)
    names = list(families)
    joint = [Cause(name, tuple(e for i in families[name] for e in causes[i].edits)) for name in names]
    totals = dict(zip(names, attribution.savings(joint), strict=True))
    wall, left = max(attribution.wall_ns, 1), budget - len(names)
    alone_needed: list[int] = []
    for name in sorted(names, key=lambda n: -totals[n]):
        members = families[name]
        if len(members) > 1 and totals[name] >= small * wall and len(members) <= left:
            alone_needed += members
            left -= len(members)
    alone = dict(zip(alone_needed, attribution.savings([causes[i] for i in alone_needed]), strict=True))
    for name in names:
        members, total = families[name], totals[name]
        impact = np.array([max(float(findings[i].impact_ns), 0.0) for i in members])
        impact = impact if impact.sum() > 0 else np.ones(len(members))
        own = np.array([alone.get(i, 0.0) for i in members])
        # what each removal saves alone is its own (scaled down where they overlap); what they save
        # only together (causes on symmetric ranks each hidden behind the others) is shared by impact
        alone_part = own * min(1.0, total / own.sum()) if own.sum() > 0 else own
        together = max(total - alone_part.sum(), 0.0)
        out[members] = alone_part + together * impact / impact.sum()
    return out


def _worst_first(kinds: list[str]) -> Callable[[Finding], tuple[Any, ...]]:
    """The findings' order: severity, recoverable time, impact and start, then whatever tells two
    findings apart.

    A total order, so that the findings come out the same whatever order the maps delivered them
    in: an export mapped by slices of processes (:mod:`nsysan.ingest.slices`) hands on its slices'
    findings one slice after another, not in the order one map of the whole export finds them.
    """
    place = {kind: i for i, kind in enumerate(kinds)}

    def key(f: Finding) -> tuple[Any, ...]:
        where = tuple(-1 if v is None else v for v in (f.rank, f.device, f.pid))
        return (-f.severity.rank, -f.recoverable_ns, -f.impact_ns, f.start_ns, place.get(f.kind, len(place)), f.kind,
                *where, f.end_ns, f.group, f.title, json.dumps(f.evidence, sort_keys=True, default=str))  # fmt: skip

    return key


def _take_tables(parts: list[DetectorParts], kind: str) -> dict[str, pd.DataFrame]:
    """A cross-rank detector's tables for the whole job, each the concatenation of every export's.
    The parts give their tables up (they are removed from ``parts``), so that once joined the job's
    tables are held once, not twice: about 0.7 GiB each at 1,024 ranks."""
    taken = [part.tables.pop(kind, {}) for part in parts]
    names = dict.fromkeys(name for tables in taken for name in tables)
    return {name: concat_frames([tables.pop(name) for tables in taken if name in tables]) for name in names}


def run_detectors(
    trace: Trace, settings: Settings | None = None, step_pattern: str = DEFAULT_STEP_PATTERN
) -> list[Finding]:
    """Every registered detector's findings on ``trace``, worst first: the map on each export in
    turn (the detectors', then the step attribution's), in this process, then the reduce (the
    attribution's, then the detectors', with every finding's recoverable time), as
    :func:`nsysan.analysis.analyse` does for the report."""
    from nsysan.detect.nccl_ordering_stall import matching  # the registry's detectors import this module

    parts, attribution = [], []
    for index in range(len(trace.exports)):
        with trace.export_alone(index) as one:
            part = map_detectors(one, settings)
            att, found = map_attribution(one, step_pattern, part.findings)
            part.findings = {kind: [f.in_export(index) for f in fs] for kind, fs in found.items()}
            parts.append(part.with_export(index))
            attribution.append(att.with_export(index))
    job = reduce_attribution(attribution, [int(c) for c in trace.job_clock()], matching(settings))
    return reduce_detectors(parts, job.clock.offsets, settings, attribution=job)
