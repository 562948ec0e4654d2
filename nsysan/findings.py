"""The Finding: what every detector returns and every renderer, the UI and CI gates consume.

The JSON form is the findings contract (docs/report.md); ``Finding.to_dict`` writes exactly its keys.

A finding is atomic: one episode, with a window tight around the time it lost. Findings that are
the same problem (the same kernel slowed by the same communication, the same late peer stalling the
same stream) share a ``group`` key, so the report and the dashboard can fold them into one headline;
a finding's severity is its group's, from the group's total impact (see ``detect.common.grade``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _ORDER[self]


_ORDER = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: Severity
    title: str
    advice: str
    start_ns: int
    end_ns: int
    impact_ns: int
    rank: int | None = None
    device: int | None = None
    pid: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    group: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        order = ("kind", "group", "severity", "rank", "device", "pid", "start_ns", "end_ns", "impact_ns",
                 "title", "evidence", "advice")  # fmt: skip
        return {key: d[key] for key in order}
