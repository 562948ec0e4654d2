"""nccl_ordering_stall: an NCCL op that was ready but waited behind an earlier op stuck on a late peer.

NCCL runs the operations of one stream in order. If op A waits for a late peer, op B queued behind
it waits too, even when B's own peers are ready: head-of-line blocking, the cost of NCCL's total
order (pipeline sends to two stages, or two communicators sharing a stream).

Algorithm:

1. NCCL kernels of every rank on one clock (each export's session start aligns per-rank files).
2. Matching across ranks by completion: the participants of one operation (all members of a
   collective, or sender and receiver) finish it within ``match_tolerance_ns`` (or
   ``match_tolerance_share`` of its duration) of each other. Among another rank's NCCL kernels that
   overlap op A and end with it, the one that started last is A's *late peer*; A waited
   ``late start - A start`` for it.
3. B, the op after A on the same stream, is *ready* when its launch call returned. B is stalled by
   ordering when it started as A ended, was ready at least ``min_stall_ns`` before A ended, A waited
   at least ``min_wait_ns`` for its late peer, and that peer is not one of B's own participants
   (if B needed the late rank too, nothing was lost to the order).
4. Impact = A's end - max(B ready, A start); blame = A's late peer.

Blind spots: unrelated concurrent NCCL ops that end within the tolerance can be taken as
participants; readiness is the launch call's return (an input produced later on another stream is
not seen).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, run_ns, severity, share_text
from nsysan.detect.registry import param, register
from nsysan.findings import Finding
from nsysan.ingest.trace import Trace

KIND = "nccl_ordering_stall"
_COLUMNS = ("pid", "device", "stream", "correlation_id", "start_ns", "end_ns", "short_name")


@dataclass(frozen=True)
class Params(SeverityParams):
    min_stall_ns: int = param(50_000, "B must have been ready at least this long before A ended")
    min_wait_ns: int = param(50_000, "A must have waited at least this long for its late peer")
    match_tolerance_ns: int = param(20_000, "participants of one NCCL op end within this of each other ...")
    match_tolerance_share: float = param(0.02, "... or within this share of the op's duration")
    queue_tolerance_ns: int = param(20_000, "B counts as queued behind A if it started within this after A ended")
    max_candidates: int = param(64, "nearest NCCL ops (by end time) examined as participants of each op (at least 2 x ranks)")


class _Neighbours:
    """NCCL ops in end-time order, compared with their neighbours: a bounded number of vectorised
    passes (``max_candidates`` each way), never a loop over ops."""

    def __init__(self, ops: pd.DataFrame, p: Params) -> None:
        self.order = np.argsort(ops["a_end"].to_numpy(), kind="stable")
        self.end = ops["a_end"].to_numpy()[self.order]
        self.start = ops["a_start"].to_numpy()[self.order]
        self.rank = ops["rank"].to_numpy()[self.order]
        self.tol = np.maximum(p.match_tolerance_ns, p.match_tolerance_share * (self.end - self.start))
        self.back = np.empty(len(self.order), dtype=np.int64)
        self.back[self.order] = np.arange(len(self.order))
        # a collective's participants can sit up to (ranks - 1) places apart in end order
        reach = max(p.max_candidates, 2 * len(np.unique(self.rank)))
        self.shifts = range(1, min(reach, len(self.order) - 1) + 1)

    def _matches(self):  # yields (partner index, match mask) per pass
        n = len(self.order)
        for shift in self.shifts:
            for sign in (1, -1):
                idx = np.arange(n) + sign * shift
                other = np.clip(idx, 0, n - 1)
                e, s = self.end, self.start
                yield other, ((idx >= 0) & (idx < n) & (np.abs(e[other] - e) <= self.tol)
                              & (self.rank[other] != self.rank) & (s[other] < e) & (s < e[other]))  # fmt: skip

    def late_peer(self) -> tuple[np.ndarray, np.ndarray]:
        """Per op (input order): the rank of the participant that started last (-1: none), its start."""
        late_rank = np.full(len(self.order), -1, dtype=np.int64)
        late_start = self.start.copy()
        for other, match in self._matches():
            later = match & (self.start[other] > late_start)
            late_start = np.where(later, self.start[other], late_start)
            late_rank = np.where(later, self.rank[other], late_rank)
        return late_rank[self.back], late_start[self.back]

    def has_participant(self, ranks: np.ndarray) -> np.ndarray:
        """Per op (input order): whether rank ``ranks[i]`` took part in op i."""
        target = ranks[self.order]
        found = np.zeros(len(self.order), dtype=bool)
        for other, match in self._matches():
            found |= match & (self.rank[other] == target)
        return found[self.back]

    def participants(self, i: int) -> list[int]:
        """The ranks matched with op ``i`` (input order): for the evidence of a few findings."""
        j = self.back[i]
        near = np.abs(self.end - self.end[j]) <= self.tol[j]
        overlap = (self.start < self.end[j]) & (self.start[j] < self.end)
        return sorted(int(r) for r in set(self.rank[near & overlap]))


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> list[Finding]:
    """NCCL ops that were ready but queued behind an op waiting for a late peer (head-of-line blocking)."""
    k = trace.kernel_columns(_COLUMNS)
    ops = k[k["nccl_kind"].notna() & k["rank"].notna() & k["device"].notna()].copy()
    if ops["rank"].nunique() < 2:
        return []
    offset = trace.job_clock()
    ops["a_start"] = ops["start_ns"] + ops["export"].map(offset)
    ops["a_end"] = ops["end_ns"] + ops["export"].map(offset)
    calls = trace.launch_calls(ops)[["export", "pid", "correlation_id", "end_ns"]].rename(columns={"end_ns": "ready_ns"})
    ops = ops.reset_index(drop=True).merge(calls.drop_duplicates(["export", "pid", "correlation_id"]),
                                            on=["export", "pid", "correlation_id"], how="left")  # fmt: skip
    ops["rank"] = ops["rank"].astype("int64")
    neighbours = _Neighbours(ops, p)
    late_rank, late_start = neighbours.late_peer()
    ops["late_rank"] = late_rank
    ops["wait_ns"] = np.where(late_rank >= 0, late_start - ops["a_start"].to_numpy(), 0)

    # A = the op before B on the same stream of the same process
    stream = [ops[c] for c in ("export", "pid", "device", "stream")]
    order = ops.sort_values(["export", "pid", "device", "stream", "start_ns"], kind="stable").index
    prev = ops.loc[order].groupby([c.loc[order] for c in stream], sort=False).shift(1).reindex(ops.index)
    prev_late = prev["late_rank"].fillna(-1).astype("int64").to_numpy()
    late_needed_by_b = neighbours.has_participant(prev_late)
    queued = (ops["start_ns"] - prev["end_ns"]).between(-p.queue_tolerance_ns, p.queue_tolerance_ns)
    ready = ops["ready_ns"].astype("float64")  # NaN where the launch call is not in the trace
    stall_ns = prev["end_ns"].astype("float64") - np.maximum(ready, prev["start_ns"].astype("float64"))
    hit = (queued & ready.notna() & (stall_ns >= p.min_stall_ns) & (prev["wait_ns"] >= p.min_wait_ns)
           & (prev_late >= 0) & ~late_needed_by_b)  # fmt: skip

    runs = run_ns(trace)
    findings = []
    for i in np.flatnonzero(hit.to_numpy()):
        b, a = ops.iloc[i], prev.iloc[i]
        impact = int(stall_ns.iloc[i])
        run = int(runs.get(b["export"], 0))
        late = int(a["late_rank"])
        findings.append(
            Finding(
                kind=KIND,
                severity=severity(impact, run, p),
                title=(f"{b['short_name']} on rank {int(b['rank'])} waited {impact / 1e3:.0f} us behind "
                       f"{a['short_name']}, which was waiting for late rank {late}"),  # fmt: skip
                advice=(
                    f"NCCL runs a stream's operations in order, so the op queued behind the one waiting for rank {late} "
                    "waited too. Put operations with different peers on different communicators (e.g. one process "
                    "group per peer pair with torch.distributed.new_group), issue the operation whose peer is ready "
                    "first, or use a transport without a total order for point-to-point (nsysan's P2P transport); "
                    f"and find out why rank {late} arrived late."
                ),
                start_ns=int(min(b["ready_ns"], b["start_ns"])),
                end_ns=int(b["start_ns"]),
                impact_ns=impact,
                rank=int(b["rank"]),
                device=int(b["device"]),
                pid=int(b["pid"]),
                evidence={
                    "stream": int(b["stream"]),
                    "blocked_op": {"kernel": str(b["short_name"]), "correlation_id": _int(b["correlation_id"]),
                                   "ready_ns": int(b["ready_ns"]), "start_ns": int(b["start_ns"]),
                                   "participants": neighbours.participants(i)},
                    "blocking_op": {"kernel": str(a["short_name"]), "correlation_id": _int(a["correlation_id"]),
                                    "start_ns": int(a["start_ns"]), "end_ns": int(a["end_ns"]),
                                    "waited_for_peer_ns": int(a["wait_ns"])},
                    "late_rank": late,
                    "share_of_run": share_text(impact, run),
                },  # fmt: skip
            )
        )
    return findings


def _int(value: object) -> int | None:
    return None if pd.isna(value) else int(value)
