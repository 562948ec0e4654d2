"""What several detectors need: parameters every detector has, severity from impact, run length."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nsysan.detect.registry import param
from nsysan.findings import Finding, Severity
from nsysan.ingest.export import NsysExport
from nsysan.ingest.frames import read_frame
from nsysan.ingest.trace import Trace
from nsysan.intervals import merge


@dataclass(frozen=True)
class SeverityParams:
    """Severity follows impact as a share of the run (the rank's GPU activity span)."""

    warning_share: float = param(0.01, "impact / run length at which a finding becomes a warning")
    critical_share: float = param(0.05, "impact / run length at which a finding becomes critical")


def severity(impact_ns: float, run_ns: float, p: SeverityParams) -> Severity:
    share = impact_ns / run_ns if run_ns > 0 else 0.0
    if share >= p.critical_share:
        return Severity.CRITICAL
    if share >= p.warning_share:
        return Severity.WARNING
    return Severity.INFO


def run_ns(trace: Trace) -> pd.Series:
    """Per export: the span of its GPU activity (kernels), else of its NVTX, in ns. A trace of a
    slice of an export's processes knows its export's (``Trace.known_runs``)."""
    if trace.known_runs is not None:
        return pd.Series(trace.known_runs, dtype="int64")
    return _spans(trace.kernel_columns(("start_ns", "end_ns")), lambda: trace.nvtx, len(trace.exports))


def export_run_ns(path: Path) -> int:
    """:func:`run_ns` of the whole export at ``path``, reading no more than it needs: the kernels'
    times (and names, which a kernel row needs to be read at all), NVTX only without kernels."""
    with NsysExport(path) as x:
        k = read_frame(x, "kernels", columns=("start_ns", "end_ns", "short_name")).assign(export=0)
        return int(_spans(k, lambda: read_frame(x, "nvtx").assign(export=0), 1).iloc[0])


def _spans(k: pd.DataFrame, nvtx: Callable[[], pd.DataFrame], exports: int) -> pd.Series:
    spans = k.groupby("export").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    out = (spans["last"] - spans["first"]).reindex(range(exports))
    if out.isna().any():
        v = nvtx().dropna(subset=["start_ns"])
        ends = v["end_ns"].fillna(v["start_ns"])
        nv = (ends.groupby(v["export"]).max() - v.groupby("export")["start_ns"].min()).reindex(out.index)
        out = out.fillna(nv)
    return out.fillna(0).astype("int64")


def as_int(value: Any) -> int:
    """A scalar read out of a frame (numpy or Python number) as an int for a finding.

    ``Any``: pandas-stubs types such scalars as a union of every cell type, which int() refuses.
    """
    return int(value)


def as_optional_int(value: Any) -> int | None:
    """:func:`as_int`, or None for a missing value (NA, NaN, None)."""
    return None if pd.isna(value) else int(value)


def share_text(impact_ns: int, run: int) -> float | None:
    """Evidence ``share_of_run``: the impact as a percentage of the run (57.1 is 57.1%), rounded to
    0.1; None when the run length is unknown. A number, so tools can compare it; the renderers
    write "57.1% of the run"."""
    return round(100.0 * impact_ns / run, 1) if run > 0 else None


def grade(findings: list[tuple[Finding, int]], p: SeverityParams) -> list[Finding]:
    """Give every finding its group's severity: the group's total impact over the longest run
    among its members. Fifty info-sized episodes of one problem worth 4% together are a warning.

    ``findings``: (finding, run length in ns of the export it came from). Findings without a
    group key are graded alone.
    """
    totals: dict[str, int] = {}
    runs: dict[str, int] = {}
    for f, run in findings:
        if f.group:
            totals[f.group] = totals.get(f.group, 0) + f.impact_ns
            runs[f.group] = max(runs.get(f.group, 0), run)
    out = []
    for f, run in findings:
        impact, span = (totals[f.group], runs[f.group]) if f.group else (f.impact_ns, run)
        out.append(dataclasses.replace(f, severity=severity(impact, span, p)))
    return out


def step_runs(table: pd.DataFrame, flag: np.ndarray) -> pd.Series:
    """Per row of ``table`` (rank, step; one row per rank and step), the number of the run of
    consecutive flagged steps of its rank it belongs to (-1 where not flagged): an episode that
    lasts several steps is one finding, a steady state one finding for the whole capture."""
    t = table[["rank", "step"]].reset_index(drop=True)
    order = np.lexsort((t["step"].to_numpy(), t["rank"].to_numpy()))
    r, s, f = t["rank"].to_numpy()[order], t["step"].to_numpy()[order], np.asarray(flag, dtype=bool)[order]
    new = f & ~(np.concatenate([[False], f[:-1]]) & (np.concatenate([[-1], r[:-1]]) == r)
                & (np.concatenate([[-2], s[:-1]]) == s - 1))  # fmt: skip
    run = np.where(f, np.cumsum(new) - 1, -1)
    out = np.empty(len(t), dtype=np.int64)
    out[order] = run
    return pd.Series(out, index=table.index)


def step_episodes(breakdown: pd.DataFrame, amount: np.ndarray, min_ns: float, min_share: float) -> list[pd.DataFrame]:
    """Runs of consecutive steps of a rank (rows of the attribution's ``breakdown``) where
    ``amount`` is at least ``min_ns`` and ``min_share`` of the step: one frame per episode, its rows
    with ``amount`` added."""
    if breakdown.empty:
        return []
    length = (breakdown["end_ns"] - breakdown["start_ns"]).to_numpy(dtype=np.float64)
    flag = (amount >= min_ns) & (amount >= min_share * length)
    run = step_runs(breakdown, flag)
    b = breakdown.assign(amount=amount, run=run.to_numpy())
    return [g for _, g in b[b["run"] >= 0].groupby("run", sort=True)]


def unjudged_waits(
    detector: str, rank: np.ndarray, stream: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray,
    why: Callable[[int], str],
) -> list[dict[str, object]]:  # fmt: skip
    """Per rank, how long queued NCCL operations waited where a detector cannot judge why, as
    ``steps.unjudged`` entries (``why(count)`` says why, for that rank's count of operations).

    Operations queued one behind another on a stream wait through the same time: the union per
    (rank, stream) is counted, not the sum."""
    waits = pd.DataFrame({"rank": rank, "stream": stream, "start_ns": start_ns, "end_ns": end_ns})
    merged = merge(waits, ["rank", "stream"])
    total = (merged["end_ns"] - merged["start_ns"]).groupby(merged["rank"]).sum()
    count = waits.groupby("rank").size()
    return [{"detector": detector, "rank": int(r), "ns": int(total[r]), "why": why(int(count[r]))} for r in total.index]


def operations(count: int) -> str:
    """The count in words, singular or plural: the reasons above are read as sentences."""
    return f"{count} NCCL operation{'s' if count > 1 else ''}"
