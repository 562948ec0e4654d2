"""The Finding: what every detector returns and every renderer, the UI and CI gates consume.

The JSON form is the findings contract (docs/report.md); ``Finding.to_dict`` writes exactly its keys.
``impact_ns`` is the time the episode lost where it happened; ``recoverable_ns`` what the job's wall
time would shrink by without its cause, from replaying the job's dependency graph with the
``cause`` removed (:mod:`nsysan.attribution.whatif`).

A finding is atomic: one episode, with a window tight around the time it lost. Findings that are
the same problem (the same kernel slowed by the same communication, the same late peer stalling the
same stream) share a ``group`` key, so the report and the dashboard can fold them into one headline;
a finding's severity is its group's, from the group's total impact (see ``detect.common.grade``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
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
class Edit:
    """One change to the job's dependency graph (:mod:`nsysan.attribution.whatif` applies it).

    ``action`` is one of :data:`EDIT_ACTIONS`; it applies to graph nodes (``nodes``) or, from a
    detector that runs before the graph exists, to GPU operations named by ``(device, start_ns)``
    in ``ops`` or host calls named by ``(pid, tid, start_ns)`` in ``calls``, which the attribution
    resolves to their nodes. ``amounts`` gives per node (or op) the ns to take away ("shorten",
    "no_gap", "earlier_launch", "earlier_host") or the share of work that remains ("scale": compute, then copy factor, as pairs).
    """

    action: str
    nodes: tuple[int, ...] = ()
    ops: tuple[tuple[int, int], ...] = ()
    calls: tuple[tuple[int, int, int], ...] = ()
    amounts: tuple[float, ...] = ()


EDIT_ACTIONS = (
    "shorten",  # the node's work takes this many ns less (a slowed kernel at its expected time)
    "scale",  # the node's compute and copy work scaled by (compute factor, copy factor)
    "no_launch_wait",  # the GPU never waits for the host to launch the node's work
    "earlier_launch",  # the node's work is launched this many ns earlier
    "earlier_host",  # the host reaches this blocking call (an epoch node) this many ns earlier
    "no_stream_order",  # the node no longer waits for the previous op on its stream
    "unblock",  # the blocking call no longer waits for the GPU (an epoch node)
    "no_transfer",  # the NCCL operation's transfer takes no time (an end node)
    "no_gap",  # the gap before the node's work shrinks by this many ns
)


@dataclass(frozen=True)
class Cause:
    """What removing a finding's cause would change: graph edits. Findings of one ``family`` are
    the same cause in several places (the same slowed kernel on every rank), replayed together to
    know what fixing the cause saves, and shared among them."""

    family: str
    edits: tuple[Edit, ...] = ()
    export: int = -1  # the export whose graph the node ids number (the map's), or -1: the job's


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
    recoverable_ns: int = 0
    cause: Cause | None = field(default=None, compare=False, repr=False)

    def in_export(self, index: int) -> Finding:
        """This finding with its cause's graph nodes numbered in export ``index`` (a map's are its
        export's, numbered from 0)."""
        if self.cause is None or self.cause.export < 0:
            return self
        return dataclasses.replace(self, cause=dataclasses.replace(self.cause, export=index))

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in _CONTRACT}
        d["evidence"] = _copied(self.evidence)
        d["severity"] = self.severity.value
        return d


def _copied(value: Any) -> Any:
    """A deep copy of evidence (dicts, lists, scalars) that copies a list of scalars in one call:
    ``copy.deepcopy`` visits each of a per-step list's thousands of numbers."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        if any(isinstance(v, (dict, list)) for v in value):
            return [_copied(v) for v in value]
        return value.copy()
    return value


_CONTRACT = ("kind", "group", "severity", "rank", "device", "pid", "start_ns", "end_ns", "impact_ns", "recoverable_ns",
             "title", "evidence", "advice")  # fmt: skip
