"""What several detectors need: parameters every detector has, severity from impact, run length."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from nsysan.detect.registry import param
from nsysan.findings import Severity
from nsysan.ingest.trace import Trace


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
    """Per export: the span of its GPU activity (kernels), else of its NVTX, in ns."""
    k = trace.kernel_columns(("start_ns", "end_ns"))
    spans = k.groupby("export").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    out = (spans["last"] - spans["first"]).reindex(range(len(trace.exports)))
    if out.isna().any():
        v = trace.nvtx.dropna(subset=["start_ns"])
        ends = v["end_ns"].fillna(v["start_ns"])
        nv = (ends.groupby(v["export"]).max() - v.groupby("export")["start_ns"].min()).reindex(out.index)
        out = out.fillna(nv)
    return out.fillna(0).astype("int64")


def share_text(impact_ns: int, run: int) -> str:
    return f"{100.0 * impact_ns / run:.1f}% of the run" if run > 0 else "run length unknown"
