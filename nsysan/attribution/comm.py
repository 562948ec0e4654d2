"""The job's NCCL operations: one compact table per export, joined across ranks in the reduce.

The map (:func:`comm_ops`) keeps, per NCCL kernel of known rank and device: where it ran, its
launch call, the step (NVTX ``step N`` range) it was launched in, when its input was ready on the
device (:mod:`nsysan.attribution.events`, else the launch call's return) and its communicator,
rank in it and peer from NCCL's NVTX payloads where the export has them. About 60 bytes per
operation: the coordinator of a 1,024-rank job holds ten million of them.

The reduce puts the tables on the job clock (:func:`on_job`) and finds each operation's
participants on the other ranks (:func:`participants`): from the payloads (communicator and
sequence, NCCL's own rule) where they exist, else from program position
(:mod:`nsysan.attribution.participants`). The step attribution and the ordering-stall detector
both read the result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from nsysan.arrays import distinct
from nsysan.attribution import participants as by_program
from nsysan.attribution.events import device_ready
from nsysan.ingest.nccl import (
    COMMUNICATOR_COLUMNS,
    EDGE_COLUMNS,
    is_point_to_point,
    participants_by_communicator,
)
from nsysan.ingest.trace import Trace

# what the map reads but the reduce does not need: left out of the compact table sent to it
_MAP_ONLY = ("launch_ns", "launched_ns", "tid")
# integer columns of the compact table stored in the smallest type that holds their values: the
# coordinator holds every op of the job (10M at 1,024 ranks), at about 60 bytes each
_SMALL_INTEGERS = ("pid", "device", "stream", "correlation_id", "rank", "iteration", "comm_rank", "peer", "row")


@dataclass(frozen=True)
class Matching:
    """How participants are matched without payloads (the ordering detector's parameters)."""

    tolerance_ns: int = 20_000
    tolerance_share: float = 0.02
    p2p_tolerance_ns: int = 50_000
    min_iterations: int = 2
    max_candidates: int = 64
    max_position_pairs: int = 100_000_000


def comm_ops(trace: Trace, nccl: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The compact table of one export's NCCL kernels ``nccl`` (export, rank, pid, device, stream,
    correlation_id, start_ns, end_ns, short_name, row: the kernel's place in the export's GPU
    operations; tid, launch_ns and launched_ns: its launch call's, -1 unknown), with iteration,
    readiness (export clock) and communicator (its first call's); and the legs (:func:`_legs`) of
    the kernels that did several calls' work (a group of sends and receives), whose participants
    come from every leg."""
    ops = nccl.reset_index(drop=True)
    ops = ops.assign(rank=ops["rank"].astype("int64"), p2p=is_point_to_point(ops))
    for column in ("tid", "launch_ns", "launched_ns"):  # unknown: NaN, as a merge with no call leaves it
        values = ops[column].to_numpy(dtype=np.int64)
        ops[column] = np.where(values >= 0, values.astype(np.float64), np.nan)
    ops["iteration"] = by_program.iterations(trace, ops)
    ready = device_ready(trace, ops)
    device = ready["device_ready_ns"]
    ops["ready_local"] = np.fmax(ops["launched_ns"].astype("float64"), device.astype("float64"))
    ops["ready_from"] = np.where(device.notna(), "device", np.where(ready["events_known"], "launch", "launch_only"))
    legs = _legs(ops, trace.nccl_calls)
    first = legs.drop_duplicates("op").set_index("op")
    out = pd.DataFrame(index=ops.index, data={"comm_id": pd.NA, "comm_rank": pd.NA, "peer": pd.NA}, dtype="Int64")
    out["comm_id"] = out["comm_id"].astype("UInt64")
    for column in ("comm_id", "comm_rank", "peer"):
        out.loc[first.index, column] = first[column].array
    ops = ops.join(out).drop(columns=[*_MAP_ONLY, "nccl_kind"], errors="ignore")
    ops = compact(ops.astype({"ready_from": "category"}))
    several = legs["op"].duplicated(keep=False).to_numpy()
    return ops, legs[several].reset_index(drop=True)


def compact(ops: pd.DataFrame) -> pd.DataFrame:
    """``ops`` with its small integer columns in the smallest type that holds their values."""
    return ops.assign(**{c: pd.to_numeric(ops[c], downcast="integer") for c in _SMALL_INTEGERS if c in ops})


def calls_with_communicator(trace: Trace) -> pd.DataFrame:
    """NCCL calls whose payload names their communicator, with the process's rank in it where a
    call of the process says (ncclCommInitRank)."""
    calls = trace.nccl_calls
    c = calls.dropna(subset=["comm_id"])[["export", "pid", "tid", "rank", "start_ns", "end_ns", "comm_id", "comm_rank",
                                          "peer"]].copy()  # fmt: skip
    c["comm_rank"] = c.groupby(["export", "pid", "comm_id"])["comm_rank"].transform("first")
    return c


def _legs(ops: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """The NCCL calls behind each kernel, from NCCL's NVTX payloads: one row (a *leg*: op,
    comm_id, comm_rank, peer) per call. A collective's kernel is launched inside its call's range.
    Point-to-point calls are grouped (``ncclGroupStart``, ``ncclSend``/``ncclRecv``...,
    ``ncclGroupEnd``; PyTorch's send, recv and batch_isend_irecv all are), and the kernel, which does
    every send and receive of the group, is launched inside ``ncclGroupEnd``: its legs are the
    group's calls that carry a communicator. comm_rank stays NA where no call of the process gave
    it: the reduce fills it from the communicator's members across the job."""
    cols = ["op", "comm_id", "comm_rank", "peer"]
    empty = pd.DataFrame({"op": pd.Series(dtype="int64"), "comm_id": pd.Series(dtype="UInt64"),
                          "comm_rank": pd.Series(dtype="Int64"), "peer": pd.Series(dtype="Int64")})  # fmt: skip
    if calls.empty or ops.empty:
        return empty
    keys = ["export", "pid", "tid"]
    c = calls.dropna(subset=["pid", "tid", "start_ns", "end_ns"]).astype(dict.fromkeys(keys, "int64"))
    c = c.assign(comm_rank=c["comm_rank"].astype("Int64"))
    c["comm_rank"] = c.groupby(["export", "pid", "comm_id"])["comm_rank"].transform("first")
    c = c.sort_values("start_ns", kind="stable").reset_index(drop=True)
    c["call_row"] = np.arange(len(c))
    q = ops[[*keys, "launch_ns"]].dropna().astype("int64").reset_index(names="op").sort_values("launch_ns")
    hit = pd.merge_asof(q, c[[*keys, "start_ns", "end_ns", "call", "call_row"]], left_on="launch_ns",
                        right_on="start_ns", by=keys, direction="backward")  # fmt: skip
    hit = hit[hit["end_ns"].notna() & (hit["launch_ns"] <= hit["end_ns"])]
    own = hit[c["comm_id"].notna().to_numpy()[hit["call_row"].to_numpy(dtype=np.int64)]]
    parts = [pd.DataFrame({"op": own["op"].to_numpy(), "call_row": own["call_row"].to_numpy(dtype=np.int64)})]
    ends = hit[hit["call"].astype(str) == "ncclGroupEnd"]
    if len(ends):
        starts = c[c["call"].astype(str) == "ncclGroupStart"][[*keys, "start_ns"]].rename(columns={"start_ns": "g"})
        e = pd.merge_asof(ends[["op", *keys, "start_ns"]].sort_values("start_ns"), starts.sort_values("g"),
                          left_on="start_ns", right_on="g", by=keys, direction="backward")  # fmt: skip
        e["g"] = e["g"].fillna(e["start_ns"])
        member = c[c["comm_id"].notna()]
        by_thread = member.groupby(keys).indices
        for key, rows in e.groupby(keys).indices.items():  # threads: a handful per export
            idx = by_thread.get(key)
            if idx is None:
                continue
            t = member["start_ns"].to_numpy()[idx]
            lo = np.searchsorted(t, e["g"].to_numpy()[rows], side="left")
            hi = np.searchsorted(t, e["start_ns"].to_numpy()[rows], side="right")
            n = hi - lo
            which = np.repeat(rows, n)
            at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
            parts.append(pd.DataFrame({"op": e["op"].to_numpy()[which],
                                       "call_row": member["call_row"].to_numpy()[idx[at]]}))  # fmt: skip
    legs = pd.concat(parts, ignore_index=True).sort_values(["op", "call_row"], kind="stable")
    if legs.empty:
        return empty
    chosen = c.iloc[legs["call_row"].to_numpy()]
    out = pd.DataFrame({"op": legs["op"].to_numpy(dtype=np.int64),
                        "comm_id": chosen["comm_id"].astype("UInt64").array,
                        "comm_rank": chosen["comm_rank"].astype("Int64").array,
                        "peer": chosen["peer"].astype("Int64").array})  # fmt: skip
    return out[cols].reset_index(drop=True)


def members(calls: pd.DataFrame) -> pd.DataFrame:
    """(comm_id, rank) of every communicator a process of this export made calls on."""
    if calls.empty:
        return pd.DataFrame({"export": pd.Series(dtype="int64"), "comm_id": pd.Series(dtype="UInt64"),
                             "rank": pd.Series(dtype="Int64")})  # fmt: skip
    m = calls.dropna(subset=["rank"]).drop_duplicates(["comm_id", "rank"])[["export", "comm_id", "rank"]]
    return m.astype({"export": "int64", "comm_id": "UInt64", "rank": "Int64"}).reset_index(drop=True)


def offsets(clock: list[int], export: np.ndarray) -> np.ndarray:
    """Each row's export's offset to the job clock (0 for an export the job has no clock for)."""
    table = np.zeros(max(len(clock), int(export.max(initial=0)) + 1), dtype=np.int64)
    table[: len(clock)] = clock
    out: np.ndarray = table[export]
    return out


def on_job(ops: pd.DataFrame, member_table: pd.DataFrame, clock: list[int]) -> pd.DataFrame:
    """The compact tables of every export as one frame on the job clock, with each op's rank in its
    communicator (from the call, else its position among the members by global rank, as
    torch.distributed.new_group numbers them) and communicators numbered (hashes use all 64 bits)."""
    offset = offsets(clock, ops["export"].to_numpy())
    ops = ops.assign(a_start=ops["start_ns"].to_numpy(dtype="int64") + offset,
                     a_end=ops["end_ns"].to_numpy(dtype="int64") + offset,
                     ready=ops["ready_local"].to_numpy(dtype="float64") + offset).drop(columns="ready_local")  # fmt: skip
    del offset
    m = member_table.dropna().drop_duplicates(["comm_id", "rank"]).sort_values("rank")
    position = m.assign(pos=m.groupby("comm_id").cumcount()).set_index(["comm_id", "rank"])["pos"]
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


@dataclass(frozen=True)
class Participants:
    """Who takes part in each op: ``group`` (per op, its collective's group number, -1: none; the
    other members are its participants) and ``edges`` (i, j) for the rest."""

    group: pd.Series
    edges: pd.DataFrame
    method: str
    _partners: pd.DataFrame | None = dataclasses.field(default=None, repr=False, compare=False)

    def ranks_of(self, ops: pd.DataFrame, heads: np.ndarray) -> dict[int, list[int]]:
        """The ranks of each op in ``heads``' participants (for the evidence of reported ops), in
        one pass over the groups and edges whatever the number of heads."""
        rank = ops["rank"].to_numpy()
        group = self.group.to_numpy()
        wanted = distinct(group[heads][group[heads] >= 0])
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

    def partners(self) -> pd.DataFrame:
        """The point-to-point participants as edges (i, j) in both directions, once each, sorted
        (computed once: several detectors ask)."""
        if self._partners is None:
            i = self.edges["i"].to_numpy(dtype=np.int64)
            j = self.edges["j"].to_numpy(dtype=np.int64)
            a, b = np.concatenate([i, j]), np.concatenate([j, i])
            keep = a != b
            width = int(max(a.max(initial=0), b.max(initial=0))) + 1
            key = distinct(a[keep] * width + b[keep])
            object.__setattr__(self, "_partners", pd.DataFrame({"i": key // width, "j": key % width}))
        assert self._partners is not None
        return self._partners

    def matched(self) -> np.ndarray:
        """Per op, whether any participant on another rank is known."""
        out = self.group.to_numpy() >= 0
        out[self.edges["i"].to_numpy(dtype=np.int64)] = True
        out[self.edges["j"].to_numpy(dtype=np.int64)] = True
        return out

    def clock_groups(self, p2p: np.ndarray) -> np.ndarray:
        """Per op, a number shared with the ops that end with it (-1: none): its collective's group
        (from payloads, or for collectives matched by program position, the connected ops), or for a
        send/recv kernel (``p2p``) with exactly one partner, the pair's."""
        group = self.group.to_numpy().astype(np.int64).copy()
        p = self.partners()
        if not len(p):
            return group
        i, j = p["i"].to_numpy(), p["j"].to_numpy()
        base = int(group.max(initial=-1)) + 1
        coll = ~p2p[i] & ~p2p[j] & (group[i] < 0) & (group[j] < 0)
        if coll.any():
            n = len(group)
            graph = sp.coo_matrix((np.ones(int(coll.sum())), (i[coll], j[coll])), shape=(n, n)).tocsr()
            _, label = connected_components(graph, directed=False)
            touched = np.zeros(n, dtype=bool)
            touched[i[coll]] = True
            group[touched] = base + label[touched]
            base = int(group.max(initial=-1)) + 1
        count = np.bincount(i, minlength=len(group))
        one = p2p[i] & (count[i] == 1) & (count[j] == 1) & (i < j)
        ids = base + np.arange(int(one.sum()))
        group[i[one]] = ids
        group[j[one]] = ids
        return group


def participants(ops: pd.DataFrame, m: Matching, notes: list[str], legs: pd.DataFrame | None = None) -> Participants:
    """Participants and the method: payloads for ops that have them, position for the rest.

    Position matching compares every op with its ``reach`` nearest, so its memory grows with ops x
    ranks (about 2 GiB at 64 ranks x 10,000 ops); past ``max_position_pairs`` it is not attempted
    and ``notes`` says so: those ops are never matched rather than the report running out of memory.
    """
    with_comm = ops["comm_id"].notna()
    by_position = ~with_comm
    reach = max(int(m.max_candidates), 2 * ops["rank"].nunique())
    pairs = int(by_position.sum()) * reach
    if pairs > m.max_position_pairs:
        notes.append(
            f"NCCL operations not matched across ranks: {int(by_position.sum()):,} operations without communicator "
            f"payloads across {ops['rank'].nunique():,} ranks would compare {pairs:,} pairs by program position "
            f"(limit nccl_ordering_stall.max_position_pairs={m.max_position_pairs:,}). Capture with NCCL's NVTX "
            "payloads (docs/scale.md), or raise the limit with --set if memory allows."
        )
        by_position = by_position & False
    group = pd.Series(-1, index=ops.index, dtype="int64")
    parts, methods = [pd.DataFrame(columns=EDGE_COLUMNS, dtype="int64")], []
    if with_comm.any():
        table = ops[list(COMMUNICATOR_COLUMNS)]
        several = legs is not None and len(legs) > 0
        if several:  # kernels of several calls: one row per call, edges mapped back to kernels
            assert legs is not None
            multi = distinct(legs["op"].to_numpy())
            single = table.drop(index=pd.Index(multi))
            extra = legs.assign(rank=ops["rank"].to_numpy()[legs["op"].to_numpy()],
                                a_start=ops["a_start"].to_numpy()[legs["op"].to_numpy()])  # fmt: skip
            owner = np.concatenate([single.index.to_numpy(), legs["op"].to_numpy()])
            table = pd.concat([single.reset_index(drop=True), extra[list(COMMUNICATOR_COLUMNS)]], ignore_index=True)
        by_comm, edges = participants_by_communicator(table)
        if several:
            g = by_comm.to_numpy()
            numbers = np.full(len(ops), -1, dtype=np.int64)  # (a Series' to_numpy() is read-only in pandas 3)
            numbers[owner[g >= 0]] = g[g >= 0]
            group = pd.Series(numbers, index=ops.index)
            edges = pd.DataFrame({"i": owner[edges["i"].to_numpy()], "j": owner[edges["j"].to_numpy()]})
            edges = edges[edges["i"] != edges["j"]].drop_duplicates()
        else:
            group = by_comm
        parts.append(edges)
        methods.append("NCCL communicator payloads")
    if by_position.any():
        parts.append(by_program.by_position(ops[by_position], m.tolerance_ns, m.tolerance_share,
                                            int(m.min_iterations), reach, m.p2p_tolerance_ns))  # fmt: skip
        methods.append("program position (kernels ending together in every iteration)")
    return Participants(group, pd.concat(parts, ignore_index=True).astype("int64"), " and ".join(methods))


def latest_peer(ops: pd.DataFrame, parts: Participants, key: str = "a_start") -> np.ndarray:
    """Per op: the position of its participant that started last (-1: none known); among equal
    starts, the one of the highest op index. ``key``: another time to rank them by (``ready``: the
    participant that was ready last). Sorts plain arrays (10M ops at 1,024 ranks)."""
    start = ops[key].to_numpy()
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


def communicator_signature(ops: pd.DataFrame, parts: Participants) -> np.ndarray:
    """Per op, a number equal for two ops of one communicator and, with high probability, different
    otherwise: NCCL's communicator where payloads name it (point-to-point to different peers on one
    communicator is one communicator: NCCL orders its operations whatever the stream); else the set
    of ranks taking part (a collective's members; a send or receive's own rank and its partners',
    as PyTorch gives each pair of peers a communicator of its own). Two communicators over the same
    ranks look like one: an op queued behind another of the same ranks is then taken as ordered by
    NCCL anyway. An op whose participants are unknown gets a number of its own."""
    n = len(ops)
    rank = ops["rank"].to_numpy(dtype=np.int64)
    code = np.random.default_rng(20261128).integers(1, 2**62, size=int(rank.max(initial=0)) + 1, dtype=np.int64)
    sig = -np.arange(1, n + 1, dtype=np.int64)  # unknown: its own
    group = parts.group.to_numpy()
    members = np.flatnonzero(group >= 0)
    if len(members):
        pairs = pd.DataFrame({"g": group[members], "r": rank[members]}).drop_duplicates()
        per_group = pd.Series(code[pairs["r"].to_numpy()]).groupby(pairs["g"].to_numpy()).sum()
        sig[members] = per_group.reindex(group[members]).to_numpy()
    e = parts.partners()
    if len(e):
        pairs = pd.DataFrame({"i": e["i"].to_numpy(), "r": rank[e["j"].to_numpy()]}).drop_duplicates()
        per_op = pd.Series(code[pairs["r"].to_numpy()]).groupby(pairs["i"].to_numpy()).sum()
        at = per_op.index.to_numpy()
        sig[at] = per_op.to_numpy() + code[rank[at]]
    if "comm_id" in ops:  # NCCL's own communicator, where its payloads name it: that alone
        comm = ops["comm_id"].to_numpy(dtype=np.int64, na_value=-1)
        named = comm >= 0
        sig[named] = comm[named] + 2**62  # apart from the rank-set numbers' usual range
    return sig
