"""The map of the attribution: what one export contributes, as compact tables.

:func:`map_attribution` reads the export's GPU operations, their launches, the host's blocking
calls and data loading, the CUDA events, and the step windows, and returns an
:class:`AttributionPart`: per (rank, step) the breakdown of GPU time, the exposed pieces of NCCL
operations, the idle gaps with their causes, the NCCL operations table, the communicators' members
and the export's part of the dependency graph. Nothing in it has a row per kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from nsysan.attribution import comm as comm_table
from nsysan.attribution.breakdown import GAP_COLUMNS, MAP_COLUMNS, PIECE_COLUMNS, rank_breakdown
from nsysan.attribution.events import event_edges, graph_edges
from nsysan.attribution.graph import GraphPart, build_part
from nsysan.attribution.host import blocking_calls, data_loading, launches, queue_full_rows
from nsysan.findings import Cause, Edit, Finding
from nsysan.ingest.frames import concat_frames
from nsysan.ingest.trace import Trace
from nsysan.steps import WINDOW_COLUMNS, find_steps, gpu_ops


@dataclass
class AttributionPart:
    """One export's share of the attribution (picklable; see the module docstring). ``comm`` rows
    are numbered by ``op`` (their place in this part), which ``pieces`` and the graph's nodes use."""

    source: str | None
    detail: str | None
    windows: pd.DataFrame
    breakdown: pd.DataFrame
    pieces: pd.DataFrame
    gaps: pd.DataFrame
    comm: pd.DataFrame
    legs: pd.DataFrame  # NCCL kernels that did several calls' work: one row per call (op, comm_id, comm_rank, peer)
    members: pd.DataFrame
    graph: GraphPart
    notes: list[str] = field(default_factory=list)

    def with_export(self, index: int) -> AttributionPart:
        """The same part with every ``export`` column set to ``index``, the export's place in the job."""
        tables = {name: getattr(self, name).assign(export=np.int32(index))  # narrow: the reduce holds every op
                  for name in ("windows", "breakdown", "pieces", "gaps", "comm", "legs", "members")}  # fmt: skip
        return dataclasses.replace(self, **tables)

    @classmethod
    def combine_slices(cls, parts: list[AttributionPart]) -> AttributionPart:
        """One export's part from its slices' (no two share a GPU or a process): tables joined,
        NCCL operations and graph nodes renumbered."""
        if len(parts) == 1:
            return parts[0]
        comm, legs, pieces, gaps, nodes_base, ops_base = [], [], [], [], 0, 0
        graphs = []
        for p in parts:
            c = p.comm.assign(op=p.comm["op"].to_numpy() + ops_base) if len(p.comm) else p.comm
            comm.append(c)
            legs.append(p.legs.assign(op=p.legs["op"].to_numpy() + ops_base))
            pieces.append(p.pieces.assign(op=p.pieces["op"].to_numpy() + ops_base))
            gaps.append(p.gaps.assign(node=np.where(p.gaps["node"] >= 0, p.gaps["node"] + nodes_base, -1)))
            g = p.graph
            nodes = g.nodes.assign(comm=np.where(g.nodes["comm"] >= 0, g.nodes["comm"] + ops_base, -1))
            graphs.append(GraphPart(nodes, g.edges))
            nodes_base += len(g.nodes)
            ops_base += len(p.comm)
        sources = {p.source for p in parts if p.source}
        return cls(
            source=sorted(sources)[0] if sources else None,
            detail="; ".join(dict.fromkeys(p.detail for p in parts if p.detail)) or None,
            windows=concat_frames([p.windows for p in parts]),
            breakdown=concat_frames([p.breakdown for p in parts]),
            pieces=concat_frames(pieces),
            gaps=concat_frames(gaps),
            comm=concat_frames(comm),
            legs=concat_frames(legs),
            members=concat_frames([p.members for p in parts]),
            graph=GraphPart.concat(graphs),
            notes=[n for p in parts for n in p.notes],
        )


def map_attribution(
    trace: Trace, step_pattern: str, findings: dict[str, list[Finding]] | None = None, graph_budget: int | None = None
) -> tuple[AttributionPart, dict[str, list[Finding]]]:
    """The attribution's part of ``trace`` (one export, index 0), and ``findings`` (the per-export
    detectors', by kind) with their causes' operations resolved to graph nodes. A graph of more
    than ``graph_budget`` nodes is not sent (the reduce then replays nothing and says so)."""
    ops = gpu_ops(trace)
    ops["row"] = np.arange(len(ops))
    steps = find_steps(trace, step_pattern, ops)
    windows = steps.windows
    launch = launches(trace, ops)
    blocking = blocking_calls(trace, ops)
    full = queue_full_rows(trace)
    host = {"blocking": blocking, "loading": data_loading(trace),
            "queue_full": full[["export", "pid", "tid", "start_ns", "end_ns"]].dropna().astype("int64")
            if len(full) else pd.DataFrame(columns=["export", "pid", "tid", "start_ns", "end_ns"])}  # fmt: skip

    # each op's step: the window of its rank holding its start (-1: outside every step)
    step_of = np.full(len(ops), -1, dtype=np.int64)
    tables, pieces, gaps = [], [], []
    # the breakdown's columns only: a rank's rows of every column (names included) cost 10x more to take
    slim = ops[
        ["export", "pid", "device", "stream", "start_ns", "end_ns", "what", "bytes", "pageable", "copy_kind", "row"]
    ]
    by_rank = ops.groupby("rank").indices
    for rank, at_rows in windows.groupby("rank").indices.items():
        rank = int(cast(int, rank))
        rows = by_rank.get(rank)
        if rows is None:
            continue
        w = windows.iloc[at_rows].sort_values("start_ns")
        starts, ends = w["start_ns"].to_numpy(), w["end_ns"].to_numpy()
        at = np.searchsorted(starts, ops["start_ns"].to_numpy()[rows], side="right") - 1
        inside = (at >= 0) & (ops["start_ns"].to_numpy()[rows] < ends[np.maximum(at, 0)])
        step_of[rows[inside]] = w["step"].to_numpy()[at[inside]]
        t, pc, gp = rank_breakdown(slim.iloc[rows], w, launch.iloc[rows], host)
        tables.append(t.assign(export=0, rank=rank))
        pieces.append(pc.assign(export=0, rank=rank))
        gaps.append(gp.assign(export=0, rank=rank))

    nccl_rows = np.flatnonzero(ops["what"].to_numpy() == 1)
    comm_of = np.full(len(ops), -1, dtype=np.int64)
    comm_of[nccl_rows] = np.arange(len(nccl_rows))
    nccl = ops.iloc[nccl_rows][["export", "rank", "pid", "device", "stream", "correlation_id", "start_ns", "end_ns",
                                "short_name", "nccl_kind", "row"]]  # fmt: skip
    nccl = nccl.assign(**{c: launch[c].to_numpy()[nccl_rows] for c in ("tid", "launch_ns", "launched_ns")})
    comm, legs = comm_table.comm_ops(trace, nccl)
    comm = comm.assign(op=np.arange(len(nccl_rows)))
    members = comm_table.members(comm_table.calls_with_communicator(trace))

    events = event_edges(trace, ops)
    replays = graph_edges(ops)  # the CUDA graphs' own dependencies, where no event says more
    events = pd.concat([events, replays[~replays["consumer"].isin(events["consumer"])]], ignore_index=True)
    # a launch that blocked on a full queue enqueued its work only when it returned
    keys = ["export", "pid", "correlation_id"]
    ret = blocking[(blocking["correlation_id"] >= 0) & (blocking["kind"] == "blocked_launch")][[*keys, "end_ns"]]
    if len(ret):
        hit = ops[keys].astype("int64").merge(ret.drop_duplicates(keys), on=keys, how="left")["end_ns"].to_numpy()
        late = ~np.isnan(hit)
        launch.loc[late, "launch_ns"] = hit[late].astype(np.int64)
    graph, op_node, call_node = build_part(ops, launch, blocking, events, step_of, comm_of)
    notes = []
    if graph_budget is not None and len(graph.nodes) > graph_budget:
        notes.append(f"What-if replay skipped: this export's dependency graph has {len(graph.nodes):,} nodes, past its "
                     f"share ({graph_budget:,}) of the job's limit; recoverable_ns is 0 for every finding.")  # fmt: skip
        graph, op_node = GraphPart.empty(), np.full(len(op_node), -1, dtype=np.int64)
        call_node = call_node.iloc[0:0]

    breakdown = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=MAP_COLUMNS)
    piece_table = pd.concat(pieces, ignore_index=True) if pieces else pd.DataFrame(columns=PIECE_COLUMNS)
    piece_table = piece_table.assign(op=comm_of[piece_table["row"].to_numpy(dtype=np.int64)]
                                     if len(piece_table) else np.empty(0, dtype=np.int64)).drop(columns="row")  # fmt: skip
    gap_table = pd.concat(gaps, ignore_index=True) if gaps else pd.DataFrame(columns=GAP_COLUMNS)
    nxt = gap_table["next_row"].to_numpy(dtype=np.int64) if len(gap_table) else np.empty(0, dtype=np.int64)
    gap_table = gap_table.assign(node=np.where(nxt >= 0, op_node[np.maximum(nxt, 0)], -1) if len(nxt) else nxt)
    gap_table = gap_table.drop(columns="next_row")
    part = AttributionPart(
        source=steps.source, detail=steps.detail, windows=windows[WINDOW_COLUMNS], breakdown=breakdown,
        pieces=piece_table, gaps=gap_table, comm=comm, legs=legs, members=members, graph=graph, notes=notes,
    )  # fmt: skip
    resolver = _Resolver(ops, op_node, call_node)
    resolved = {kind: [resolver.finding(f) for f in found] for kind, found in (findings or {}).items()}
    return part, resolved


class _Resolver:
    """Turns findings' operations (device, start_ns) and host calls (pid, tid, start_ns) into graph
    nodes; the lookups are built once, on the first finding that needs them."""

    def __init__(self, ops: pd.DataFrame, op_node: np.ndarray, call_node: pd.DataFrame) -> None:
        self._ops, self._op_node, self._call_node = ops, op_node, call_node
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None
        self._calls: dict[tuple[int, int, int], int] | None = None

    def op_nodes(self, ops: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, np.ndarray]:
        """The nodes of ``ops`` found, and which of ``ops`` they are."""
        if self._sorted is None:
            key = self._ops["device"].to_numpy(dtype=np.int64) * (1 << 44) + self._ops["start_ns"].to_numpy(
                dtype=np.int64
            )
            order = np.argsort(key, kind="stable")
            self._sorted = key[order], order
        sorted_key, order = self._sorted
        want = np.array([d * (1 << 44) + s for d, s in ops], dtype=np.int64)
        at = np.searchsorted(sorted_key, want)
        ok = (at < len(sorted_key)) & (sorted_key[np.minimum(at, len(sorted_key) - 1)] == want)
        return self._op_node[order[at[ok]]], ok

    def call_nodes(self, calls: tuple[tuple[int, int, int], ...]) -> list[int]:
        if self._calls is None:
            c = self._call_node
            keys = zip(c["pid"].tolist(), c["tid"].tolist(), c["start_ns"].tolist(), strict=True)
            self._calls = dict(zip(keys, c["node"].tolist(), strict=True))
        return [self._calls[c] for c in calls if c in self._calls]

    def finding(self, f: Finding) -> Finding:
        """``f`` with its cause's operations and calls turned into graph nodes; what names nothing
        in the graph is left out."""
        if f.cause is None or not any(e.ops or e.calls for e in f.cause.edits):
            return f
        edits = []
        for e in f.cause.edits:
            if e.calls:
                edits.append(Edit(e.action, nodes=tuple(self.call_nodes(e.calls))))
                continue
            if not e.ops:
                edits.append(e)
                continue
            nodes, ok = self.op_nodes(e.ops)
            amounts = np.asarray(e.amounts, dtype=np.float64)
            amounts = amounts[ok] if len(amounts) == len(ok) else amounts
            edits.append(Edit(e.action, nodes=tuple(nodes.tolist()), amounts=tuple(amounts.tolist())))
        return dataclasses.replace(f, cause=Cause(f.cause.family, tuple(edits), export=0))
