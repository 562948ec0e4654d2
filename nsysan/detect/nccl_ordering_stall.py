"""nccl_ordering_stall: an NCCL op that was ready, and whose peers were ready, but waited behind an
earlier op of the same stream or communicator that was waiting for a late rank.

NCCL runs the operations of a stream in order, and the operations of one communicator in order even
across streams. If op A waits for a late peer L, op B queued behind it waits too, although B's
input and B's own peers were ready: head-of-line blocking (pipeline sends to two stages on one
stream, or two communicators sharing a stream). Everything here is measured on the device:

1. **Readiness** of B: when its input was ready on the GPU (:mod:`nsysan.attribution.events`: the
   event its stream waited on, recorded after the producing work), and not before its launch call
   returned. Without event rows in the capture, the launch return alone, and the finding says so.
2. **Participants** of each op (:mod:`nsysan.attribution.comm`): from NCCL's payloads
   (communicator, sequence, peer) where the export has them, else from program position: never
   "some op on another rank ended at about the same time".
3. **A**: the op before B on the same stream, or on the same communicator when it is known; B is
   queued behind A when B started within ``queue_tolerance_ns`` of A's end.
4. A **waited for L**: A's latest-starting participant (rank L) started at least ``min_wait_ns`` after A.
5. **Impact** = B.start - max(B's readiness, the latest start of B's own participants): if B's
   peers arrived late themselves, the order cost nothing. B is a stall when the impact is at least
   ``min_stall_ns`` and B was ready at least that long before A ended. Window: from that max to
   B.start, tight around the lost time.
6. **Cascades**: when L's op was itself stalled, B is one more link of L's episode, not a new
   finding: the episode is reported once, at its first stall, blaming the root rank
   (``evidence.late_rank``), with every link in ``evidence.cascade``.

Group: (rank, stream, late rank), so the same late peer stalling the same stream every step is one
headline. Blind spots: without payloads and without NVTX step ranges, participants rest on one
agreement at the same program position; an op whose participants cannot be matched is never
reported (precision first), but one held in the queue behind an op whose wait cannot be judged is
counted in ``steps.unjudged`` with the time it could have lost, per rank; readiness cannot see host-side dependencies that are not CUDA events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from nsysan.attribution import comm as comm_table
from nsysan.detect.common import SeverityParams, as_int, as_optional_int, operations, share_text, unjudged_waits
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.nccl import same_as_previous
from nsysan.ingest.trace import Trace
from nsysan.memory import release_freed_memory

KIND = "nccl_ordering_stall"
_MAX_CASCADE = 32
_CHUNK = 1 << 20  # ops per block where a pass over every op needs several temporary arrays


@dataclass(frozen=True)
class Params(SeverityParams):
    min_stall_ns: int = param(50_000, "B must lose at least this much, and be ready this long before A ended")
    min_wait_ns: int = param(50_000, "A must have waited at least this long for its late peer")
    match_tolerance_ns: int = param(20_000, "participants of one NCCL op end within this of each other ...")
    match_tolerance_share: float = param(0.02, "... or within this share of the op's duration")
    match_tolerance_p2p_ns: int = param(50_000, "... or, for send/recv, within this (a receiver ends after its sender)")
    min_iterations: int = param(2, "iterations whose ends must all agree to infer participants without payloads")
    queue_tolerance_ns: int = param(20_000, "B counts as queued behind A if it started within this after A ended")
    max_candidates: int = param(
        64, "nearest NCCL ops (by end time) examined as participants of each op (at least 2 x ranks)", limit=True
    )
    max_position_pairs: int = param(
        100_000_000,
        "without payloads, ops x candidates beyond which participants are not inferred (memory)",
        limit=True,
    )


def predecessor(ops: pd.DataFrame) -> np.ndarray:
    """Per op, the position of the op it was queued behind: the previous op of its stream, or of its
    communicator when that ended later (-1: none). Sorts plain arrays (10M ops at 1,024 ranks)."""
    prev = np.full(len(ops), -1, dtype="int64")
    if not len(ops):
        return prev
    end = ops["end_ns"].to_numpy()
    for keys in (["export", "pid", "device", "stream"], ["export", "pid", "comm_id"]):
        known = np.logical_and.reduce([ops[k].notna().to_numpy() for k in keys])
        rows = None if known.all() else np.flatnonzero(known)
        del known
        if rows is not None and not len(rows):
            continue
        cols = [_values(ops[k], rows) for k in keys]
        start = ops["start_ns"].to_numpy()
        order = np.lexsort((start if rows is None else start[rows], *reversed(cols)))  # stable: ties keep op order
        same = same_as_previous(cols, order)
        del cols
        at = order if rows is None else rows[order]
        del order
        for lo in range(0, len(same), _CHUNK):  # bounded temporaries; each op is one chunk's cur
            hi = min(lo + _CHUNK, len(same))
            pair = same[lo:hi]
            cur, before = at[lo + 1 : hi + 1][pair], at[lo:hi][pair]
            earlier = prev[cur]
            better = end[before] > np.where(earlier >= 0, end[np.maximum(earlier, 0)], -np.inf)
            prev[cur[better]] = before[better]
    return prev


def _values(column: pd.Series, rows: np.ndarray | None) -> np.ndarray:
    """A column's values (``rows`` of them, all when None) as a plain array, in its own type when it
    has one: an int16 key sorts as fast and holds an eighth of an int64's memory."""
    dtype = column.dtype
    if isinstance(dtype, pd.api.extensions.ExtensionDtype):  # nullable: NA as -1 in its own signed type
        values = column.to_numpy(dtype=np.dtype(dtype.type) if dtype.kind == "i" else "int64", na_value=-1)
    else:
        values = column.to_numpy()
        if values.dtype == object:  # a join of exports that disagreed on the type
            values = column.to_numpy(dtype="int64", na_value=-1)
    return values if rows is None else values[rows]


def stalls(
    ops: pd.DataFrame,
    parts: comm_table.Participants,
    p: Params,
    blind: list[np.ndarray] | None = None,
    known: tuple[np.ndarray, np.ndarray] | None = None,
) -> pd.DataFrame:
    """The stalls, indexed by op position (as B): its predecessor A, what A waited for, B's lost time,
    and whether B is the first of its episode (``parent`` -1) or a link of another stall's episode
    (``parent``, ``root``). Only the ops queued behind another are examined past the first test, and
    only the stalls kept: the per-op arrays are 10M long at 1,024 ranks. ``blind`` receives the ops
    that could have stalled but whose participants are unknown, and the time each could have lost.
    ``known``: (:func:`comm_table.latest_peer`, :func:`predecessor`) of these ops, where the caller
    has them already."""
    if known is not None:
        late, a = known
    else:
        late = comm_table.latest_peer(ops, parts)
        release_freed_memory()
        a = predecessor(ops)
        release_freed_memory()
    queued = ops["end_ns"].to_numpy()[np.maximum(a, 0)]  # A's end, on B's clock
    np.subtract(ops["start_ns"].to_numpy(), queued, out=queued)
    np.abs(queued, out=queued)
    b = np.flatnonzero((queued <= p.queue_tolerance_ns) & (a >= 0))  # B queued behind an A
    del queued
    a_start = ops["a_start"].to_numpy()
    ready = ops["ready"].to_numpy()

    def late_start(x: np.ndarray) -> np.ndarray:  # the start of x's latest participant; NaN: none known
        return np.where(late[x] >= 0, a_start[np.maximum(late[x], 0)], np.nan)

    ab = a[b]
    a_wait = late_start(ab) - a_start[ab]
    b_peers_ready = late_start(b)  # NaN: B's participants unknown, never reported
    free_at = np.fmax(ready[b], b_peers_ready)
    impact = a_start[b] - free_at
    held = ops["a_end"].to_numpy()[ab] - ready[b] >= p.min_stall_ns  # B ready well before A ended
    ok = held & (a_wait >= p.min_wait_ns) & ~np.isnan(b_peers_ready) & (impact >= p.min_stall_ns)
    # B held in the queue behind A, where A's participants are unknown (did A wait for a late
    # rank?) or A waited for one and B's are unknown (were B's own peers late?): not judged, and
    # said so with the time it could have lost (ready to start)
    if blind is not None:
        unsure = np.isnan(a_wait) | ((a_wait >= p.min_wait_ns) & np.isnan(b_peers_ready))
        unknown = b[held & unsure & (a_start[b] - ready[b] >= p.min_stall_ns)]
        blind += [unknown, ready[unknown].astype(np.int64), a_start[unknown].astype(np.int64)]
    rows, ab, a_wait, free_at, impact = b[ok], ab[ok], a_wait[ok], free_at[ok], impact[ok]
    # cascades: B whose A's late op was itself stalled belongs to that op's episode
    late_of_a = late[ab]
    up = np.searchsorted(rows, late_of_a)  # the stall row of A's late op, where it is one
    is_link = (late_of_a >= 0) & (up < len(rows)) & (rows[np.minimum(up, len(rows) - 1)] == late_of_a)
    parent_at = np.where(is_link, up, -1)
    root_at = np.where(is_link, up, np.arange(len(rows)))
    for _ in range(_MAX_CASCADE):
        above = parent_at[root_at]
        if not (above >= 0).any():
            break
        root_at = np.where(above >= 0, above, root_at)
    rank = ops["rank"].to_numpy()
    late_rank_of_a = np.where(late_of_a >= 0, rank[np.maximum(late_of_a, 0)], -1)
    return pd.DataFrame({"a": ab, "a_wait": a_wait, "late_rank_of_a": late_rank_of_a, "free_at": free_at,
                         "impact": impact, "parent": np.where(is_link, late_of_a, -1), "root": rows[root_at]},
                        index=rows)  # fmt: skip


def matching(settings: dict[str, dict[str, float]] | None) -> comm_table.Matching:
    """How NCCL operations are matched across ranks without payloads: this detector's parameters
    (``--set nccl_ordering_stall.match_tolerance_ns=...``), which the attribution uses too."""
    p = Params(**cast(dict[str, Any], (settings or {}).get(KIND, {})))
    return comm_table.Matching(tolerance_ns=int(p.match_tolerance_ns), tolerance_share=float(p.match_tolerance_share),
                               p2p_tolerance_ns=int(p.match_tolerance_p2p_ns), min_iterations=int(p.min_iterations),
                               max_candidates=int(p.max_candidates), max_position_pairs=int(p.max_position_pairs))  # fmt: skip


def job_operations(job: JobFacts) -> tuple[pd.DataFrame, comm_table.Participants] | None:
    """The attribution's NCCL operations of the job and their participants; None when there is no
    attribution, no operation or a single rank (nothing to wait for)."""
    att = job.attribution
    if att is None or att.participants is None or not len(att.comm) or att.comm["rank"].nunique() < 2:
        return None
    return att.comm, att.participants


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """The stalls of the whole job, from the attribution's NCCL operations and their participants."""
    found = job_operations(job)
    if found is None:
        return []
    ops, parts = found
    att = job.attribution
    method = parts.method
    blind: list[np.ndarray] = []
    st = stalls(ops, parts, p, blind)
    unknown, ready_at, started_at = blind
    if len(unknown):
        job.unjudged.extend(unjudged_waits(
            KIND, ops["rank"].to_numpy()[unknown], ops["stream"].to_numpy()[unknown], ready_at, started_at,
            lambda count: f"{operations(count)} ready well before the operation ahead of them on their stream ended, "
            "where that operation's or their own participants were not matched on another rank (no NCCL payloads "
            "and no agreeing program position): whether they stalled behind a late rank is not judged (up to this "
            "long)"))  # fmt: skip
    heads = st.index[st["parent"] < 0].to_numpy()
    links = st[st["parent"] >= 0]
    chain_of = {as_int(r): [int(c) for c in g.index] for r, g in links.groupby("root")}  # one entry per episode
    arrivals = att.comm_nodes(ops["op"].to_numpy()[heads], "arrival") if len(heads) else np.empty(0, dtype=np.int64)
    arrival_of = dict(zip(heads.tolist(), arrivals.tolist(), strict=True))
    graded = []
    participants_of = parts.ranks_of(ops, heads)
    for i in heads:  # one iteration per reported episode
        stall = st.loc[i]
        b, prev = ops.iloc[i], ops.iloc[int(stall["a"])]
        late = as_int(stall["late_rank_of_a"])
        lost = int(stall["impact"])
        off = int(comm_table.offsets(job.clock, np.array([as_int(b["export"])]))[0])
        participants = participants_of[int(i)]
        cascade = [{"rank": as_int(ops["rank"].iat[c]), "kernel": str(ops["short_name"].iat[c]),
                    "correlation_id": as_optional_int(ops["correlation_id"].iat[c]),
                    "start_ns": as_int(ops["start_ns"].iat[c]), "lost_ns": as_int(st["impact"].at[c])}
                   for c in chain_of.get(int(i), [])]  # fmt: skip
        readiness = {"device": "device: the event its stream waited on",
                     "launch": "launch call return (no event wait gated this op)",
                     "launch_only": "launch call return (no cudaEventRecord rows in this capture: record them with "
                                    "nsys profile --cuda-event-trace=true)"}[b["ready_from"]]  # fmt: skip
        run = int(job.runs[as_int(b["export"])])
        finding = Finding(
            kind=KIND,
            severity=Severity.INFO,
            title=(
                f"{b['short_name']} on rank {int(b['rank'])} waited {lost / 1e3:.0f} us behind "
                f"{prev['short_name']}, which was waiting for late rank {late}"
            ),
            advice=(
                f"NCCL runs a stream's (and a communicator's) operations in order, so the op queued behind the one "
                f"waiting for rank {late} waited too, although it and its peers were ready. Put operations with "
                "different peers on different communicators and streams (e.g. one process group per peer pair with "
                "torch.distributed.new_group), issue the operation whose peer is ready first, or use a transport "
                "without a total order for point-to-point (nsysan's P2P transport); and find out why rank "
                f"{late} arrived late."
            ),
            start_ns=int(stall["free_at"]) - off,
            end_ns=int(b["start_ns"]),
            impact_ns=lost,
            rank=int(b["rank"]),
            device=int(b["device"]),
            pid=int(b["pid"]),
            group=f"{KIND}|rank {int(b['rank'])}|stream {int(b['stream'])}|late rank {late}",
            cause=Cause(KIND, (Edit("no_stream_order", nodes=(arrival_of[int(i)],)),))
            if arrival_of.get(int(i), -1) > 0
            else None,
            evidence={
                "stream": int(b["stream"]),
                "blocked_op": {
                    "kernel": str(b["short_name"]),
                    "correlation_id": as_optional_int(b["correlation_id"]),
                    "ready_ns": int(b["ready"]) - off,
                    "start_ns": int(b["start_ns"]),
                    "participants": participants,
                },
                "readiness": readiness,
                "blocking_op": {
                    "kernel": str(prev["short_name"]),
                    "correlation_id": as_optional_int(prev["correlation_id"]),
                    "start_ns": int(prev["start_ns"]),
                    "end_ns": int(prev["end_ns"]),
                    "waited_for_peer_ns": int(stall["a_wait"]),
                },
                "late_rank": late,
                "participants_from": method,
                "share_of_run": share_text(lost, run),
            },
        )
        if cascade:
            finding.evidence["cascade"] = cascade
        graded.append((finding, run))
    return graded


@register(KIND, Params, reduce=reduce)
def detect(trace: Trace, p: Params) -> dict[str, pd.DataFrame]:
    """NCCL ops that were ready, with ready peers, but queued behind an op waiting for a late rank."""
    return {}  # the NCCL operations come from the attribution's map (nsysan.attribution.comm)
