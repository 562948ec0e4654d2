"""The dependency graph of a job: what each piece of GPU and host time had to wait for.

Nodes are points in time; an edge (u, v, w) says "v cannot happen before u + w". The time of every
node is the latest of its in-edges, ``t(v) = max(t(u) + w)``, a longest-path (max-plus) system, so
removing a cause is changing some weights and recomputing the maxima (:mod:`.whatif`).

Nodes (``KIND``):

- ``segment``: the end of a run of GPU operations on one stream that nothing outside the stream
  and the launching thread gates: kernels, copies and memsets launched by one thread in one
  epoch (below), within one step, with no event wait, no NCCL kernel and no operation another
  stream or a blocking call waits on. Its in-edges summarise the run exactly (max-plus
  composition): from the previous segment's end on the stream (the ops back to back, with the
  gaps the GPU really left), from the thread's epoch (each op no earlier than its launch call
  plus the launch latency), from the producer of an event it waited on.
- ``arrival`` / ``end``: an NCCL kernel's start (its rank's arrival at the operation) and end. In
  the reduce the arrivals of one operation's participants meet in a ``join`` node (the last
  arrival); each participant's end follows the join by its transfer time.
- ``epoch``: the end of a *blocking call* (:mod:`.host`): it returns after the GPU work it
  awaited has finished and after the host work before it, so the thread's later launches are
  timed from it.
- the source (node 0, time 0): fixed times (the first launches of a thread, work whose cause the
  capture does not show).

The weights are fitted so that the recorded times are exactly the longest paths: a constraint's
natural weight (0 for stream order and events, the process's launch latency for a launch), and
the rest of the recorded gap (``residual``) added to the constraint that bound. Times here are the
export's clock (the map) and the job clock less its origin (the reduce).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from nsysan.arrays import distinct

KIND = {"source": 0, "segment": 1, "arrival": 2, "end": 3, "epoch": 4, "join": 5}
EDGE = {"stream": 0, "launch": 1, "event": 2, "sync": 3, "host": 4, "transfer": 5, "fixed": 6, "arrive": 7}
NONE = -1
DEFAULT_LAUNCH_LATENCY_NS = 5_000
MAX_STEP_SPLITS = 256
_MAX_LATENCY_NS = 100_000
NODE_COLUMNS = ["kind", "time_ns", "rank", "pid", "device", "stream", "step", "comm", "work_ns", "compute_ns",
                "copy_ns", "first_ns", "launch_bound"]  # fmt: skip
EDGE_COLUMNS = ["src", "dst", "weight", "kind"]


@dataclass
class GraphPart:
    """One export's nodes and edges (``src`` -1: the source; other ids index ``nodes``)."""

    nodes: pd.DataFrame
    edges: pd.DataFrame

    @classmethod
    def empty(cls) -> GraphPart:
        return cls(pd.DataFrame({c: pd.Series(dtype="int64") for c in NODE_COLUMNS}),
                   pd.DataFrame({"src": pd.Series(dtype="int64"), "dst": pd.Series(dtype="int64"),
                                 "weight": pd.Series(dtype="float64"), "kind": pd.Series(dtype="int8")}))  # fmt: skip

    @classmethod
    def concat(cls, parts: list[GraphPart]) -> GraphPart:
        """Parts of one export (its slices of processes) as one: node ids renumbered."""
        nodes, edges, base = [], [], 0
        for p in parts:
            nodes.append(p.nodes)
            e = p.edges.copy()
            e["dst"] += base
            e.loc[e["src"] >= 0, "src"] += base
            edges.append(e)
            base += len(p.nodes)
        if not nodes:
            return cls.empty()
        return cls(pd.concat(nodes, ignore_index=True), pd.concat(edges, ignore_index=True))


def _fit(s: np.ndarray, bases: list[np.ndarray], natural: list[float | np.ndarray]) -> list[np.ndarray]:
    """Weights for constraints ``bases`` (-inf: absent) on times ``s``: natural ones, then the
    recorded gap added to the binding constraint, and any constraint that would be later than
    ``s`` pulled back to it, so that max(base + weight) == s wherever a constraint exists."""
    weights = [np.where(np.isfinite(b), np.broadcast_to(np.asarray(n, dtype=np.float64), b.shape), -np.inf)
               for b, n in zip(bases, natural, strict=True)]  # fmt: skip
    values = [b + w for b, w in zip(bases, weights, strict=True)]
    best, top = values[0].copy(), np.zeros(len(s), dtype=np.int8)  # the first binding constraint on ties
    for c in range(1, len(values)):
        later = values[c] > best
        best[later] = values[c][later]
        top[later] = c
    gap = s - best
    grows = np.isfinite(best) & (gap > 0)
    for c, w in enumerate(weights):
        over = np.isfinite(bases[c]) & (values[c] > s)
        w[over] = (s - bases[c])[over]
        add = grows & (top == c)
        w[add] += gap[add]
    return weights


def build_part(
    ops: pd.DataFrame,
    launch: pd.DataFrame,
    blocking: pd.DataFrame,
    events: pd.DataFrame,
    step_of: np.ndarray,
    comm_of: np.ndarray,
) -> tuple[GraphPart, np.ndarray, pd.DataFrame]:
    """The graph of one export (see the module docstring).

    ``ops``: the export's GPU operations (rank, pid, device, stream, start_ns, end_ns, what: 0
    compute, 1 NCCL, 2 copy); ``launch``: per op, tid and launch_ns (-1 unknown); ``blocking``:
    blocking calls (pid, tid, start_ns, end_ns, awaited: an op's row); ``events``: (producer,
    consumer) rows; ``step_of``: per op, its step (-1 outside steps); ``comm_of``: per op, its row
    in the export's NCCL table (-1 for other ops). Returns the part, per op the node whose in-edges
    gate it (its segment's end; an NCCL kernel's arrival), and the blocking calls' epoch nodes
    (pid, tid, start_ns, node).
    """
    n = len(ops)
    if n == 0:
        return GraphPart.empty(), np.empty(0, dtype=np.int64), pd.DataFrame(columns=["pid", "tid", "start_ns", "node"])
    s = ops["start_ns"].to_numpy(dtype=np.int64)
    e = ops["end_ns"].to_numpy(dtype=np.int64)
    what = ops["what"].to_numpy()
    pid = ops["pid"].to_numpy(dtype=np.int64)
    tid = launch["tid"].to_numpy(dtype=np.int64)
    lnch = launch["launch_ns"].to_numpy(dtype=np.int64)
    # (pid, device, stream) as one int64: 22 bits of pid (Linux's pid_max), 8 of device, 32 of stream
    stream_key = ((pid & 0x3FFFFF) << 40) | ((ops["device"].to_numpy(dtype=np.int64) & 0xFF) << 32) | (
        ops["stream"].to_numpy(dtype=np.int64) & 0xFFFFFFFF)  # fmt: skip
    chain = np.lexsort((s, stream_key))
    first = np.ones(n, dtype=bool)
    first[1:] = stream_key[chain][1:] != stream_key[chain][:-1]
    prev = np.full(n, NONE, dtype=np.int64)
    prev[chain[~first]] = chain[np.flatnonzero(~first) - 1]

    producer = np.full(n, NONE, dtype=np.int64)
    if len(events):
        producer[events["consumer"].to_numpy()] = events["producer"].to_numpy()

    # epochs: per thread, the number of its blocking calls that ended at or before each launch
    epoch = np.zeros(n, dtype=np.int64)
    epoch_node: dict[tuple[int, int, int], int] = {}
    calls = blocking.sort_values(["pid", "tid", "end_ns"], kind="stable").reset_index(drop=True)
    if len(calls):
        for thread, rows in calls.groupby(["pid", "tid"]).indices.items():
            p, t = cast(tuple[int, int], thread)  # grouped by two columns
            ends = calls["end_ns"].to_numpy()[rows]
            mine = np.flatnonzero((pid == p) & (tid == t) & (lnch >= 0))
            epoch[mine] = np.searchsorted(ends, lnch[mine], side="right")

    needed = np.zeros(n, dtype=bool)  # ops whose end another node waits on
    needed[producer[producer >= 0]] = True
    if len(calls):
        needed[calls["awaited"].to_numpy()] = True
    comm = what == 1
    # steps split segments so that edits can name a step's work; a rank with very many steps
    # (a short repeating kernel sequence) keeps only its last step apart (where the job ends)
    rank_code, _ = pd.factorize(ops["rank"].to_numpy())
    last_step = np.full(int(rank_code.max(initial=-1)) + 1, -1, dtype=np.int64)
    np.maximum.at(last_step, rank_code, step_of)
    steps_of_rank = last_step[rank_code]
    split_steps = np.where(steps_of_rank > MAX_STEP_SPLITS, step_of == steps_of_rank, step_of)
    boundary = np.ones(n, dtype=bool)
    j, p_ = chain[~first], prev[chain[~first]]
    boundary[j] = (comm[j] | comm[p_] | (producer[j] >= 0) | needed[p_] | (split_steps[j] != split_steps[p_])
                   | (tid[j] != tid[p_]) | (epoch[j] != epoch[p_]) | ((lnch[j] < 0) != (lnch[p_] < 0)))  # fmt: skip
    seg_in_chain = np.cumsum(boundary[chain]) - 1
    seg = np.empty(n, dtype=np.int64)
    seg[chain] = seg_in_chain

    # per-op constraint weights, fitted to the recorded starts
    latency = _launch_latency(s, e, prev, lnch, pid)
    neg = np.full(n, -np.inf)
    base_stream = np.where(prev >= 0, e[np.maximum(prev, 0)].astype(np.float64), neg)
    base_launch = np.where(lnch >= 0, lnch.astype(np.float64), neg)
    base_event = np.where(producer >= 0, e[np.maximum(producer, 0)].astype(np.float64), neg)
    gs, gl, gw = _fit(s.astype(np.float64), [base_stream, base_launch, base_event], [0.0, latency, 0.0])
    fixed = ~np.isfinite(base_stream) & ~np.isfinite(base_launch) & ~np.isfinite(base_event)
    # the launch alone decided when the op started: the GPU (this stream) waited for the host
    with np.errstate(invalid="ignore"):
        bound_by_launch = (base_launch + gl >= s) & ~(base_stream + gs >= s) & ~(base_event + gw >= s)

    # segments: contiguous runs in chain order
    starts_at = np.flatnonzero(boundary[chain])  # positions in chain order
    n_seg = len(starts_at)
    c_gs = np.where(np.isfinite(gs), gs, 0.0)[chain]
    d = (e - s).astype(np.float64)[chain]
    q = c_gs + d
    # suffix sums within each segment: total of the segment minus the prefix before each op
    seg_total = np.add.reduceat(q, starts_at)
    prefix = np.cumsum(q) - q  # sum before each position (global)
    seg_prefix = prefix - np.repeat(prefix[starts_at], np.diff(np.append(starts_at, n)))
    suffix = np.repeat(seg_total, np.diff(np.append(starts_at, n))) - seg_prefix  # Q_j: this op on
    head = chain[starts_at]  # first op of each segment
    last = chain[np.append(starts_at[1:], n) - 1]  # last op of each segment

    # nodes: one per plain segment; arrival + end per NCCL kernel; one per epoch
    is_comm_seg = comm[head]
    seg_node = np.cumsum(np.where(is_comm_seg, 2, 1)) - np.where(is_comm_seg, 2, 1)  # arrival for comm
    end_node = seg_node + is_comm_seg  # the node holding the segment's end
    n_gpu_nodes = int(end_node[-1]) + 1 if n_seg else 0
    op_end_node = end_node[seg]  # per op: the node of its segment's end

    work_q = np.add.reduceat(d, starts_at)
    compute_ns = np.add.reduceat(np.where(what[chain] == 0, d, 0.0), starts_at)
    copy_ns = np.add.reduceat(np.where(what[chain] == 2, d, 0.0), starts_at)
    rank = ops["rank"].to_numpy(dtype=np.int64)
    node_frames = []
    kinds = np.where(is_comm_seg, KIND["arrival"], KIND["segment"])
    gpu = pd.DataFrame({
        "kind": kinds, "time_ns": np.where(is_comm_seg, s[head], e[last]), "rank": rank[head], "pid": pid[head],
        "device": ops["device"].to_numpy(dtype=np.int64)[head], "stream": ops["stream"].to_numpy(dtype=np.int64)[head],
        "step": step_of[head], "comm": np.where(is_comm_seg, comm_of[head], NONE), "work_ns": work_q,
        "compute_ns": compute_ns, "copy_ns": copy_ns, "first_ns": s[head],
        "launch_bound": bound_by_launch[head],
    }, index=seg_node)  # fmt: skip
    ends = gpu[is_comm_seg].assign(kind=KIND["end"], time_ns=e[last[is_comm_seg]])
    ends.index = end_node[is_comm_seg]
    node_frames += [gpu, ends]

    # epoch nodes
    n_epoch = len(calls)
    if n_epoch:
        ep_rank_of = dict(zip(pid.tolist(), rank.tolist(), strict=False))
        order = calls.groupby(["pid", "tid"]).cumcount().to_numpy() + 1  # epoch number of the call's end
        ids = n_gpu_nodes + np.arange(n_epoch)
        for k, (pp, tt, oo) in enumerate(zip(calls["pid"], calls["tid"], order, strict=True)):
            epoch_node[(int(pp), int(tt), int(oo))] = int(ids[k])
        node_frames.append(pd.DataFrame({
            "kind": KIND["epoch"], "time_ns": calls["end_ns"].to_numpy(), "rank": [ep_rank_of.get(int(x), -1)
                                                                               for x in calls["pid"]],
            "pid": calls["pid"].to_numpy(), "device": NONE, "stream": NONE, "step": NONE, "comm": NONE,
            "work_ns": 0.0, "compute_ns": 0.0, "copy_ns": 0.0, "first_ns": calls["start_ns"].to_numpy(),
            "launch_bound": False}, index=ids))  # fmt: skip
    nodes = pd.concat(node_frames).sort_index()
    nodes = nodes.reindex(columns=NODE_COLUMNS)

    # edges into each segment (into the arrival for NCCL kernels, which then add their duration)
    edge_frames = []
    into = seg_node  # per segment, where its in-edges go
    head_dur = np.where(is_comm_seg, 0.0, seg_total)  # arrival: constraints on the start only
    s_head = s[head].astype(np.float64)
    # stream
    has_prev = prev[head] >= 0
    edge_frames.append(_edges(op_end_node[prev[head][has_prev]], into[has_prev],
                              (np.where(is_comm_seg, gs[head], head_dur))[has_prev], EDGE["stream"]))  # fmt: skip
    # launch, from the epoch (the source for a thread's first epoch: absolute times)
    launched_ops = chain[np.isfinite(gl[chain])]
    if len(launched_ops):
        q_chain = np.empty(n)
        q_chain[chain] = suffix
        gs_op = np.where(np.isfinite(gs), gs, 0.0)
        cand = lnch[launched_ops] + gl[launched_ops] + np.where(is_comm_seg[seg[launched_ops]], 0.0,
                                                                q_chain[launched_ops] - gs_op[launched_ops])  # fmt: skip
        # per segment, its latest candidate (the last in a stable sort by candidate), in that order
        by_cand = np.argsort(cand, kind="stable")
        seg_by_cand = seg[launched_ops][by_cand]
        _, last_reversed = np.unique(seg_by_cand[::-1], return_index=True)
        pick = by_cand[np.sort(len(by_cand) - 1 - last_reversed)]
        best, best_cand = launched_ops[pick], cand[pick]
        src = np.array([epoch_node.get((int(a), int(b), int(c)), NONE) if c > 0 else NONE
                        for a, b, c in zip(pid[best], tid[best], epoch[best], strict=True)], dtype=np.int64)  # fmt: skip
        origin = np.where(src >= 0, nodes["time_ns"].to_numpy()[np.maximum(src, 0)], 0).astype(np.float64)
        edge_frames.append(_edges(src, into[seg[best]], best_cand - origin, EDGE["launch"]))
    # event
    has_ev = producer[head] >= 0
    gs_head = np.where(np.isfinite(gs[head]), gs[head], 0.0)
    edge_frames.append(_edges(op_end_node[producer[head][has_ev]], into[has_ev],
                              np.where(is_comm_seg, gw[head], gw[head] - gs_head + head_dur)[has_ev],
                              EDGE["event"]))  # fmt: skip
    # nothing known gates the segment's first op: its start is fixed
    unbound = fixed[head]
    edge_frames.append(
        _edges(
            np.full(int(unbound.sum()), NONE),
            into[unbound],
            (s_head + np.where(is_comm_seg, 0.0, seg_total - gs_head))[unbound],
            EDGE["fixed"],
        )
    )
    # NCCL kernels: arrival -> end by the kernel's duration (the reduce replaces it by the join)
    edge_frames.append(_edges(seg_node[is_comm_seg], end_node[is_comm_seg], (e - s)[head[is_comm_seg]].astype(float),
                              EDGE["transfer"]))  # fmt: skip
    # epochs: after the previous epoch's host work, and after the awaited op's end
    if n_epoch:
        ids = n_gpu_nodes + np.arange(n_epoch)
        order = calls.groupby(["pid", "tid"]).cumcount().to_numpy()
        prev_node = np.where(order > 0, ids - 1, NONE)
        prev_time = np.where(order > 0, calls["end_ns"].to_numpy()[np.maximum(np.arange(n_epoch) - 1, 0)], 0)
        c_start, c_end = calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy().astype(np.float64)
        base = np.minimum(c_end - c_start, float(DEFAULT_LAUNCH_LATENCY_NS))
        awaited_end = e[calls["awaited"].to_numpy()].astype(np.float64)
        w_host, w_sync = _fit(c_end, [prev_time.astype(np.float64), awaited_end],
                              [c_start - prev_time + base, np.zeros(n_epoch)])  # fmt: skip
        edge_frames.append(_edges(prev_node, ids, w_host, EDGE["host"]))
        edge_frames.append(_edges(op_end_node[calls["awaited"].to_numpy()], ids, w_sync, EDGE["sync"]))
    edges = pd.concat(edge_frames, ignore_index=True)
    edges = edges[np.isfinite(edges["weight"].to_numpy())].reset_index(drop=True)
    call_node = calls[["pid", "tid", "start_ns"]].assign(node=n_gpu_nodes + np.arange(n_epoch))
    return GraphPart(nodes.reset_index(drop=True), edges), seg_node[seg], call_node


def _edges(src: np.ndarray, dst: np.ndarray, weight: np.ndarray, kind: int) -> pd.DataFrame:
    return pd.DataFrame({"src": np.asarray(src, dtype=np.int64), "dst": np.asarray(dst, dtype=np.int64),
                         "weight": np.asarray(weight, dtype=np.float64), "kind": np.int8(kind)})  # fmt: skip


def _launch_latency(s: np.ndarray, e: np.ndarray, prev: np.ndarray, lnch: np.ndarray, pid: np.ndarray) -> np.ndarray:
    """Per op, its process's launch latency: the median time from a launch call's start to its
    operation's start, over operations the launch gated (the stream was free before the call)."""
    out = np.full(len(s), float(DEFAULT_LAUNCH_LATENCY_NS))
    free = (lnch >= 0) & ((prev < 0) | (e[np.maximum(prev, 0)] <= lnch))
    lat = s - lnch
    ok = free & (lat >= 0) & (lat <= _MAX_LATENCY_NS)
    if not ok.any():
        return out
    for p in distinct(pid[ok]).tolist():  # a handful of processes per export
        out[pid == p] = float(np.median(lat[ok & (pid == p)]))
    return out
