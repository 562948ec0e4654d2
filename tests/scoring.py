"""Strict scoring of findings against planted ground truth, shared by the scenario tests.

A finding matches a planted event only when all of these hold:

- same kind and same rank;
- their windows overlap by at least half of the shorter window (a finding that merely touches the
  event, or spans a whole run around it, does not count);
- its impact is within 5% of the planted impact;
- for stalls, the blamed rank (``evidence.late_rank``) is the root late rank;
- its severity is what the planted group's total impact makes it: total / the export's GPU span
  (measured here with plain SQL, not with nsysan), warning from 1%, critical from 5%; unless the
  score is told not to (``Score(severity=False)``): findings graded by the time their fix would
  recover (the step attribution's what-if) are checked against simulated truth instead
  (tests/test_attribution_truth.py).

Each planted event matches one finding at most, so duplicates count as false positives.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fixtures.anomalies import Planted
from nsysan.findings import Finding

IMPACT_TOLERANCE = 0.05
MIN_OVERLAP = 0.5
WARNING_SHARE, CRITICAL_SHARE = 0.01, 0.05


def gpu_span(path: Path) -> int:
    """First kernel start to last kernel end of one export, in ns (what the severity is a share of)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        first, last = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    finally:
        con.close()
    return int(last - first) if first is not None else 0


def expected_severities(truths: list[Planted], paths: list[Path]) -> list[str]:
    """Per planted event, the severity of its group (``detail['group']``; alone without one)."""
    totals: dict[object, int] = defaultdict(int)
    for i, t in enumerate(truths):
        totals[t.detail.get("group", i)] += t.detail["impact_ns"]
    out = []
    for i, t in enumerate(truths):
        span = gpu_span(paths[t.export])
        share = totals[t.detail.get("group", i)] / span if span else 0.0
        out.append("critical" if share >= CRITICAL_SHARE else "warning" if share >= WARNING_SHARE else "info")
    return out


def overlap_share(a0: int, a1: int, b0: int, b1: int) -> float:
    """Overlap of two windows as a share of the shorter one (a zero-length window counts as 1 ns)."""
    inter = min(a1, b1) - max(a0, b0)
    shorter = max(min(a1 - a0, b1 - b0), 1)
    return max(inter, 0) / shorter if inter >= 0 else 0.0


def why_not(truth: Planted, severity: str | None, f: Finding) -> str | None:
    """None when ``f`` matches ``truth`` under the strict rule, else the first reason it does not."""
    if f.kind != truth.kind or f.rank != truth.rank:
        return "kind/rank"
    if overlap_share(truth.start_ns, truth.end_ns, f.start_ns, f.end_ns) < MIN_OVERLAP:
        return "window"
    planted = truth.detail["impact_ns"]
    if abs(f.impact_ns - planted) > IMPACT_TOLERANCE * planted:
        return f"impact {f.impact_ns} vs {planted}"
    if "late_rank" in truth.detail and f.evidence.get("late_rank") != truth.detail["late_rank"]:
        return f"late rank {f.evidence.get('late_rank')} vs {truth.detail['late_rank']}"
    if severity is not None and f.severity.value != severity:
        return f"severity {f.severity.value} vs {severity}"
    return None


@dataclass
class Score:
    planted: int = 0
    found: int = 0
    matched: int = 0
    severity: bool = True  # whether the severity must be the planted impact's (see the module docstring)

    @property
    def precision(self) -> float:
        return self.matched / self.found if self.found else 1.0

    @property
    def recall(self) -> float:
        return self.matched / self.planted if self.planted else 1.0

    def add(self, truths: list[Planted], paths: list[Path], findings: Iterable[Finding], kind: str) -> None:
        mine = [f for f in findings if f.kind == kind]
        planted = [t for t in truths if t.kind == kind]
        severities = expected_severities(planted, paths)
        self.planted += len(planted)
        self.found += len(mine)
        used: set[int] = set()
        for t, sev in zip(planted, severities, strict=True):
            for i, f in enumerate(mine):
                if i not in used and why_not(t, sev if self.severity else None, f) is None:
                    used.add(i)
                    self.matched += 1
                    break
