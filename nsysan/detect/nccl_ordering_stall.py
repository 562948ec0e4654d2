"""nccl_ordering_stall: an NCCL op that was ready, and whose peers were ready, but waited behind an
earlier op of the same stream or communicator that was waiting for a late rank.

NCCL runs the operations of a stream in order, and the operations of one communicator in order even
across streams. If op A waits for a late peer L, op B queued behind it waits too, although B's
input and B's own peers were ready: head-of-line blocking (pipeline sends to two stages on one
stream, or two communicators sharing a stream). Everything here is measured on the device:

1. **Readiness** of B: when its input was ready on the GPU (:mod:`nsysan.detect.readiness`: the
   event its stream waited on, recorded after the producing work), and not before its launch call
   returned. Without event rows in the capture, the launch return alone, and the finding says so.
2. **Participants** of each op (:mod:`nsysan.detect.nccl_participants`): from NCCL's payloads
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
reported (precision first); readiness cannot see host-side dependencies that are not CUDA events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.detect import nccl_participants
from nsysan.detect.common import SeverityParams, as_int, as_optional_int, share_text
from nsysan.detect.readiness import device_ready
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Finding, Severity
from nsysan.ingest.nccl import (
    COMMUNICATOR_COLUMNS,
    EDGE_COLUMNS,
    NCCL_COLUMNS,
    is_communication,
    is_point_to_point,
    participants_by_communicator,
    same_as_previous,
)
from nsysan.ingest.trace import Trace
from nsysan.memory import release_freed_memory

KIND = "nccl_ordering_stall"
_COLUMNS = ("pid", "device", "stream", "correlation_id", "start_ns", "end_ns", "short_name")
_MAX_CASCADE = 32
_CHUNK = 1 << 20  # ops per block where a pass over every op needs several temporary arrays
# what the map reads but the reduce does not need: left out of the compact table sent to it
_MAP_ONLY = ("launch_ns", "launched_ns", "tid")
# integer columns of the compact table stored in the smallest type that holds their values: the
# coordinator holds every op of the job (10M at 1,024 ranks), at about 60 bytes each
_SMALL_INTEGERS = ("pid", "device", "stream", "correlation_id", "rank", "iteration", "comm_rank", "peer")


@dataclass(frozen=True)
class Params(SeverityParams):
    min_stall_ns: int = param(50_000, "B must lose at least this much, and be ready this long before A ended")
    min_wait_ns: int = param(50_000, "A must have waited at least this long for its late peer")
    match_tolerance_ns: int = param(20_000, "participants of one NCCL op end within this of each other ...")
    match_tolerance_share: float = param(0.02, "... or within this share of the op's duration")
    min_iterations: int = param(2, "iterations whose ends must all agree to infer participants without payloads")
    queue_tolerance_ns: int = param(20_000, "B counts as queued behind A if it started within this after A ended")
    max_candidates: int = param(
        64, "nearest NCCL ops (by end time) examined as participants of each op (at least 2 x ranks)"
    )
    max_position_pairs: int = param(
        100_000_000, "without payloads, ops x candidates beyond which participants are not inferred (memory)"
    )


def _ops(trace: Trace, with_communicator: pd.DataFrame) -> pd.DataFrame:
    """NCCL kernels of known rank and device, with launch call, iteration, readiness (export clock)
    and communicator (from ``with_communicator``, :func:`_calls_with_communicator`): the compact
    table one export sends to the reduce."""
    k = trace.kernel_columns(_COLUMNS)
    ops = k[is_communication(k) & k["rank"].notna() & k["device"].notna()].reset_index(drop=True)
    ops = ops.assign(rank=ops["rank"].astype("int64"), p2p=is_point_to_point(ops))
    calls = trace.launch_calls(ops)[["export", "pid", "correlation_id", "start_ns", "end_ns", "tid"]]
    calls = calls.drop_duplicates(["export", "pid", "correlation_id"]).rename(
        columns={"start_ns": "launch_ns", "end_ns": "launched_ns"}
    )
    ops = ops.merge(calls, on=["export", "pid", "correlation_id"], how="left")
    ops["iteration"] = nccl_participants.iterations(trace, ops)
    ready = device_ready(trace, ops)
    device = ready["device_ready_ns"]
    ops["ready_local"] = np.fmax(ops["launched_ns"].astype("float64"), device.astype("float64"))
    ops["ready_from"] = np.where(device.notna(), "device", np.where(ready["events_known"], "launch", "launch_only"))
    ops = ops.join(_communicators(ops, with_communicator)).drop(columns=[*_MAP_ONLY, *NCCL_COLUMNS])
    return compact(ops.astype({"ready_from": "category"}))


def compact(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` with its small integer columns in the smallest type that holds their values."""
    return ops.assign(**{c: pd.to_numeric(ops[c], downcast="integer") for c in _SMALL_INTEGERS if c in ops})


def _calls_with_communicator(trace: Trace) -> pd.DataFrame:
    """NCCL calls whose payload names their communicator, with the process's rank in it where a
    call of the process says (ncclCommInitRank)."""
    calls = trace.nccl_calls
    c = calls.dropna(subset=["comm_id"])[["export", "pid", "tid", "rank", "start_ns", "end_ns", "comm_id", "comm_rank",
                                          "peer"]].copy()  # fmt: skip
    c["comm_rank"] = c.groupby(["export", "pid", "comm_id"])["comm_rank"].transform("first")
    return c


def _communicators(ops: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """comm_id (NCCL's 64-bit hash), comm_rank and peer per op from NCCL's NVTX payloads (NA where
    the export has none). comm_rank stays NA where no call of the process gave it: the reduce
    fills it from the communicator's members across the job."""
    out = pd.DataFrame(index=ops.index, data={"comm_id": pd.NA, "comm_rank": pd.NA, "peer": pd.NA}, dtype="Int64")
    out["comm_id"] = out["comm_id"].astype("UInt64")
    if calls.empty:
        return out
    c = calls.drop(columns="rank")
    c = c.sort_values("start_ns").rename(columns={"start_ns": "c_start", "end_ns": "c_end"})
    q = ops[["export", "pid", "tid", "launch_ns"]].dropna().astype("int64").reset_index().sort_values("launch_ns")
    hit = pd.merge_asof(q, c.astype({"export": "int64", "pid": "int64", "tid": "int64"}), left_on="launch_ns",
                        right_on="c_start", by=["export", "pid", "tid"], direction="backward")  # fmt: skip
    hit = hit[hit["c_end"].notna() & (hit["launch_ns"] <= hit["c_end"])]
    where = pd.Index(hit["index"])
    out.loc[where, "comm_id"] = hit["comm_id"].astype("UInt64").array
    for column in ("comm_rank", "peer"):
        out.loc[where, column] = hit[column].astype("Int64").array
    return out


def _members(calls: pd.DataFrame) -> pd.DataFrame:
    """(comm_id, rank) of every communicator a process of this export made calls on."""
    if calls.empty:
        return pd.DataFrame({"export": pd.Series(dtype="int64"), "comm_id": pd.Series(dtype="UInt64"),
                             "rank": pd.Series(dtype="Int64")})  # fmt: skip
    m = calls.dropna(subset=["rank"]).drop_duplicates(["comm_id", "rank"])[["export", "comm_id", "rank"]]
    return m.astype({"export": "int64", "comm_id": "UInt64", "rank": "Int64"}).reset_index(drop=True)


def _on_job(ops: pd.DataFrame, members: pd.DataFrame, job: JobFacts) -> pd.DataFrame:
    """The compact tables of every export as one frame on the job clock, with each op's rank in its
    communicator (from the call, else its position among the members by global rank, as
    torch.distributed.new_group numbers them) and communicators numbered (hashes use all 64 bits)."""
    offset = _offsets(job, ops["export"].to_numpy())
    ops = ops.assign(a_start=ops["start_ns"].to_numpy(dtype="int64") + offset,
                     a_end=ops["end_ns"].to_numpy(dtype="int64") + offset,
                     ready=ops["ready_local"].to_numpy(dtype="float64") + offset).drop(columns="ready_local")  # fmt: skip
    del offset
    members = members.dropna().drop_duplicates(["comm_id", "rank"]).sort_values("rank")
    position = members.assign(pos=members.groupby("comm_id").cumcount()).set_index(["comm_id", "rank"])["pos"]
    known = ops["comm_id"].notna()
    if known.any():
        guess = (known & ops["comm_rank"].isna()).to_numpy()  # processes whose calls did not say
        if guess.any():
            keys = pd.MultiIndex.from_arrays([ops.loc[guess, "comm_id"], ops.loc[guess, "rank"]])
            at = pd.array(position.reindex(keys).to_numpy(), dtype="Int64")
            ops["comm_rank"] = ops["comm_rank"].astype("Int64")
            ops.loc[guess, "comm_rank"] = at
        codes = pd.factorize(ops["comm_id"])[0]
        ops["comm_id"] = pd.arrays.IntegerArray(codes.astype(np.int32), codes < 0)
    return ops


def _offsets(job: JobFacts, export: np.ndarray) -> np.ndarray:
    """Each row's export's offset to the job clock (0 for an export the job has no clock for)."""
    clock = np.zeros(max(len(job.clock), int(export.max(initial=0)) + 1), dtype=np.int64)
    clock[: len(job.clock)] = job.clock
    out: np.ndarray = clock[export]
    return out


@dataclass(frozen=True)
class Participants:
    """Who takes part in each op: ``group`` (per op, its collective's group number, -1: none; the
    other members are its participants) and ``edges`` (i, j) for the rest."""

    group: pd.Series
    edges: pd.DataFrame
    method: str

    def ranks_of(self, ops: pd.DataFrame, heads: np.ndarray) -> dict[int, list[int]]:
        """The ranks of each op in ``heads``' participants (for the evidence of reported ops), in
        one pass over the groups and edges whatever the number of heads."""
        rank = ops["rank"].to_numpy()
        group = self.group.to_numpy()
        wanted = np.unique(group[heads][group[heads] >= 0])
        members = np.flatnonzero(np.isin(group, wanted))
        by_group = pd.Series(rank[members]).groupby(group[members]).agg(list).to_dict() if len(members) else {}
        e = self.edges[self.edges["i"].isin(heads)]
        by_edge = pd.Series(rank[e["j"].to_numpy()]).groupby(e["i"].to_numpy()).agg(list).to_dict() if len(e) else {}
        out = {}
        for i in heads:  # one per reported op
            own = int(rank[i])
            mates = [r for r in by_group.get(group[i], []) if r != own] if group[i] >= 0 else []
            out[int(i)] = sorted({int(r) for r in [*mates, *by_edge.get(i, [])]})
        return out


def _participants(ops: pd.DataFrame, p: Params, notes: list[str]) -> Participants:
    """Participants and the method: payloads for ops that have them, position for the rest.

    Position matching compares every op with its ``reach`` nearest, so its memory grows with ops x
    ranks (about 2 GiB at 64 ranks x 10,000 ops); past ``max_position_pairs`` it is not attempted
    and ``notes`` says so: those ops are never reported rather than the report running out of memory.
    """
    with_comm = ops["comm_id"].notna()
    by_position = ~with_comm
    reach = max(int(p.max_candidates), 2 * ops["rank"].nunique())
    pairs = int(by_position.sum()) * reach
    if pairs > p.max_position_pairs:
        notes.append(
            f"Ordering stalls not looked for among {int(by_position.sum()):,} NCCL operations without communicator "
            f"payloads: matching them by program position across {ops['rank'].nunique():,} ranks would compare "
            f"{pairs:,} pairs (limit nccl_ordering_stall.max_position_pairs={p.max_position_pairs:,}). Capture with "
            "NCCL's NVTX payloads (docs/scale.md), or raise the limit with --set if memory allows."
        )
        by_position = by_position & False
    group = pd.Series(-1, index=ops.index, dtype="int64")
    parts, methods = [pd.DataFrame(columns=EDGE_COLUMNS, dtype="int64")], []
    if with_comm.any():
        by_comm, edges = participants_by_communicator(ops[list(COMMUNICATOR_COLUMNS)])
        group = by_comm
        parts.append(edges)
        methods.append("NCCL communicator payloads")
    if by_position.any():
        parts.append(nccl_participants.by_position(ops[by_position], p.match_tolerance_ns, p.match_tolerance_share,
                                                   int(p.min_iterations), reach))  # fmt: skip
        methods.append("program position (kernels ending together in every iteration)")
    return Participants(group, pd.concat(parts, ignore_index=True).astype("int64"), " and ".join(methods))


def _latest_peer(ops: pd.DataFrame, parts: Participants) -> np.ndarray:
    """Per op: the position of its participant that started last (-1: none known); among equal
    starts, the one of the highest op index. Sorts plain arrays (10M ops at 1,024 ranks)."""
    start = ops["a_start"].to_numpy()
    late = np.full(len(ops), -1, dtype="int64")
    i, j = parts.edges["i"].to_numpy(dtype="int64"), parts.edges["j"].to_numpy(dtype="int64")
    if len(i):
        order = np.lexsort((j, start[j], i))  # by i, then the partner's start, then the partner
        i, j = i[order], j[order]
        del order
        last = np.append(i[1:] != i[:-1], True)  # each i's latest partner ends its run
        late[i[last]] = j[last]
        del i, j, last
    # a collective's latest other member: its group's last member, or the one before when that is itself
    group = parts.group.to_numpy()
    op = np.flatnonzero(group >= 0)
    if len(op):
        op = op[np.lexsort((op, start[op], group[op]))]  # by group, start, op
        g = group[op]
        last_of = np.append(g[1:] != g[:-1], True)
        ends = np.flatnonzero(last_of)  # position of each group's last member
        del last_of
        top_at = np.repeat(ends, np.diff(np.r_[-1, ends]))  # every member's group's last position
        runner_up_at = np.maximum(top_at - 1, 0)
        has_runner_up = (top_at >= 1) & (g[runner_up_at] == g)
        del g
        top = op[top_at]
        del top_at
        late[op] = np.where(top == op, np.where(has_runner_up, op[runner_up_at], -1), top)
    return late


def _predecessor(ops: pd.DataFrame) -> np.ndarray:
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


def stalls(ops: pd.DataFrame, parts: Participants, p: Params) -> pd.DataFrame:
    """The stalls, indexed by op position (as B): its predecessor A, what A waited for, B's lost time,
    and whether B is the first of its episode (``parent`` -1) or a link of another stall's episode
    (``parent``, ``root``). Only the ops queued behind another are examined past the first test, and
    only the stalls kept: the per-op arrays are 10M long at 1,024 ranks."""
    late = _latest_peer(ops, parts)
    release_freed_memory()
    a = _predecessor(ops)
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
    ok = ((a_wait >= p.min_wait_ns) & (ops["a_end"].to_numpy()[ab] - ready[b] >= p.min_stall_ns)
          & ~np.isnan(b_peers_ready) & (impact >= p.min_stall_ns))  # fmt: skip
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


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """The stalls of the whole job, from every export's NCCL ops and communicator members."""
    ops = _on_job(tables.pop("ops"), tables["members"], job)  # taken: the columns it replaces are freed
    if ops["rank"].nunique() < 2:
        return []
    release_freed_memory()  # each stage's temporaries, before the next stage's (10M ops at 1,024 ranks)
    parts = _participants(ops, p, job.notes)
    release_freed_memory()
    method = parts.method
    st = stalls(ops, parts, p)
    heads = st.index[st["parent"] < 0].to_numpy()
    links = st[st["parent"] >= 0]
    chain_of = {as_int(r): [int(c) for c in g.index] for r, g in links.groupby("root")}  # one entry per episode
    graded = []
    participants_of = parts.ranks_of(ops, heads)
    for i in heads:  # one iteration per reported episode
        stall = st.loc[i]
        b, prev = ops.iloc[i], ops.iloc[int(stall["a"])]
        late = as_int(stall["late_rank_of_a"])
        lost = int(stall["impact"])
        off = int(_offsets(job, np.array([as_int(b["export"])]))[0])
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
    calls = _calls_with_communicator(trace)
    return {"ops": _ops(trace, calls), "members": _members(calls)}
