"""The report document: the findings contract (docs/report.md) plus the overview figures.

Renderers only format this dict, so a saved JSON report re-renders without the trace.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from nsysan import __version__
from nsysan.findings import Finding, Severity
from nsysan.overview import Overview

_PLAIN_NUMBERS = {int, str}


def _plain(value: Any) -> Any:
    """numpy/pandas scalars and containers to JSON-ready Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list) and {type(v) for v in value} <= _PLAIN_NUMBERS:
        return value  # a step table's column, already plain (thousands of steps: skip the walk)
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in value]
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):  # a BLOB where the export should hold text
        return bytes(value).decode("utf-8", errors="replace")
    return value


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [_plain(row) for row in df.astype(object).to_dict("records")]


SEVERITY_RANK = {s.value: s.rank for s in Severity}  # "critical" -> 2: severities compared by rank, not by name


def fold_groups(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings (contract dicts) folded by their ``group`` key: one headline per problem.

    A headline has the group's severity, how many occurrences it has, their total impact and
    recoverable time and the index (into ``findings``) of the worst one; headlines come worst
    first: by severity, then by the time their fix would recover. A finding without a
    group key is a group of its own.
    """
    groups: dict[str, dict[str, Any]] = {}
    for i, f in enumerate(findings):
        key = f.get("group") or f"#{i}"
        g = groups.setdefault(key, {"group": f.get("group") or "", "kind": f["kind"], "severity": f["severity"],
                                    "count": 0, "impact_ns": 0, "recoverable_ns": 0, "worst": i, "findings": []})  # fmt: skip
        g["count"] += 1
        g["impact_ns"] += int(f["impact_ns"])
        g["recoverable_ns"] += int(f.get("recoverable_ns") or 0)
        g["findings"].append(i)
        if SEVERITY_RANK[f["severity"]] > SEVERITY_RANK[g["severity"]]:
            g["severity"] = f["severity"]
        if f["impact_ns"] > findings[g["worst"]]["impact_ns"]:
            g["worst"] = i
    return sorted(groups.values(),
                  key=lambda g: (-SEVERITY_RANK[g["severity"]], -g["recoverable_ns"], -g["impact_ns"], g["worst"]))  # fmt: skip


REPORT_VERSION = 2
"""The report document's contract version (docs/report.md): 2 added ``steps`` and ``recoverable_ns``."""


def build_document(overview: Overview, findings: list[Finding], steps: dict[str, Any] | None = None) -> dict[str, Any]:
    exports = overview.exports
    traces = [
        {"path": row["path"], "schema_version": row["schema_version"],
         "ranks": row["ranks"], "devices": row["devices"]}
        for row in records(exports)
    ]  # fmt: skip
    by_severity = {s.value: sum(f.severity is s for f in findings) for s in Severity}
    summary = {
        "findings_by_severity": by_severity,
        "exports": records(exports),
        "ranks": records(overview.ranks),
        "devices": records(overview.devices),
        "top_kernels": records(overview.top_kernels),
        "nccl": records(overview.nccl),
        "copies": records(overview.copies),
        "nvtx_ranges": records(overview.nvtx_ranges),
        "transfers": records(overview.transfers),
        "limitations": list(overview.limitations),
    }
    plain = [_plain(f.to_dict()) for f in findings]
    doc = {
        "report_version": REPORT_VERSION,
        "nsysan_version": __version__,
        "traces": traces,
        "findings": plain,
        "groups": fold_groups(plain),
        "summary": summary,
    }
    if steps is not None:
        doc["steps"] = _plain(steps)
    return doc
