"""The Finding: what every detector returns and every renderer, the UI and CI gates consume.

The JSON form is the findings contract (docs/report.md); ``Finding.to_dict`` writes exactly its keys.
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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        order = ("kind", "severity", "rank", "device", "pid", "start_ns", "end_ns", "impact_ns",
                 "title", "evidence", "advice")  # fmt: skip
        return {key: d[key] for key in order}

