"""The reduce of the attribution: the job's steps, clock, collectives, breakdown and graph.

:func:`reduce_attribution` takes every export's :class:`~.part.AttributionPart` and returns a
:class:`JobAttribution`: the exports on one clock (:mod:`.clock`), each NCCL operation matched with
its participants on the other ranks and its last arrival, each step's communication split into
waiting for a peer and transfer, and the job's dependency graph (:mod:`.graph`), whose replay with
a cause removed (:meth:`JobAttribution.savings`) is what fixing the cause would save. Detectors of
the problems no single export shows (late ranks, idle GPUs, copy-bound steps, exposed
communication) read it; so does the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from nsysan.arrays import distinct, rows_by
from nsysan.attribution import clock as clocks
from nsysan.attribution import comm as comm_table
from nsysan.attribution.breakdown import CATEGORIES, COPY_COLUMNS
from nsysan.attribution.graph import EDGE, KIND, GraphPart
from nsysan.attribution.host import IDLE_CAUSES
from nsysan.attribution.part import AttributionPart
from nsysan.attribution.whatif import Topology, replay
from nsysan.findings import Cause, Edit
from nsysan.ingest.frames import concat_frames
from nsysan.intervals import union_ns

STEPS_VERSION = 1
_CHUNK = 64  # scenarios replayed together
MAX_GRAPH_NODES = 4_000_000  # beyond this the job is not replayed (memory); the report says so


@dataclass
class JobGraph:
    """The job's graph: its nodes (with kind, rank, step, work) and the topology replays walk."""

    nodes: pd.DataFrame
    edges: pd.DataFrame
    topo: Topology
    node_base: list[int]  # per export, the id of its first node
    end_nodes: np.ndarray  # the nodes of each rank's last step: the job ends with the latest of them
    start_nodes: np.ndarray  # per rank, what its first operation's start moves with (its launch's epoch; 0: fixed)
    start_lead: np.ndarray  # per start node, its time less its rank's first step's start
    origin_ns: int  # the job-clock time of the graph's time 0

    def job_times(self) -> np.ndarray:
        """Every node's recorded time on the job clock."""
        return self.topo.time + self.origin_ns


@dataclass
class JobAttribution:
    """Where the job's step time went, and what-if replays (see the module docstring)."""

    source: str | None
    detail: str | None
    clock: clocks.Clock
    windows: pd.DataFrame  # export, rank, step, start_ns, end_ns (export clock), a_start, a_end (job clock)
    breakdown: pd.DataFrame  # per (export, rank, step): CATEGORIES in ns, idle_<cause>_ns
    comm: pd.DataFrame  # the NCCL operations on the job clock, with group, arrival_ns, waited_ns, late_op
    participants: comm_table.Participants | None
    graph: JobGraph | None
    job_start_ns: int
    job_end_ns: int
    unjudged: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gaps: pd.DataFrame = field(default_factory=pd.DataFrame)  # idle gaps: rank, step, start/end, cause, node
    _gap_index: dict[Any, np.ndarray] | None = field(default=None, repr=False, compare=False)
    _by_group: tuple[np.ndarray, ...] | None = field(default=None, repr=False, compare=False)
    _host_links: tuple[np.ndarray, pd.Series] | None = field(default=None, repr=False, compare=False)
    _comm_of_rank: dict[int, np.ndarray] | None = field(default=None, repr=False, compare=False)
    _node_of_comm: dict[str, pd.Series] = field(default_factory=dict, repr=False, compare=False)
    _rows_of_group: dict[int, np.ndarray] | None = field(default=None, repr=False, compare=False)
    _nodes_by_time: dict[int, tuple[np.ndarray, np.ndarray]] | None = field(default=None, repr=False, compare=False)

    @property
    def wall_ns(self) -> int:
        """The job's wall time: first step start to last step end, over every rank (job clock)."""
        return max(self.job_end_ns - self.job_start_ns, 0)

    def globalize(self, cause: Cause) -> Cause:
        """``cause`` with its nodes numbered in the job's graph (an export's map numbers its own)."""
        if cause.export < 0:
            return cause
        if self.graph is None or cause.export >= len(self.graph.node_base):
            return Cause(cause.family)
        base = self.graph.node_base[cause.export]
        edits = tuple(Edit(e.action, nodes=tuple(int(n) + base for n in e.nodes), amounts=e.amounts)
                      for e in cause.edits)  # fmt: skip
        return Cause(cause.family, edits)

    def nodes_of(self, cause: Cause) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """The cause's edits as (action, global node ids, amounts)."""
        cause = self.globalize(cause)
        return [(e.action, np.asarray(e.nodes, dtype=np.int64), np.asarray(e.amounts, dtype=np.float64))
                for e in cause.edits if e.nodes]  # fmt: skip

    def gaps_of(self, rank: int, steps: np.ndarray, causes: list[int]) -> pd.DataFrame:
        """The idle gaps of ``rank`` in ``steps`` with one of ``causes`` (indexes of IDLE_CAUSES),
        found through an index of the gaps by (rank, cause) built once: each finding asks."""
        if self._gap_index is None:
            g = self.gaps
            index = g.groupby([g["rank"].to_numpy(), g["cause"].to_numpy()]).indices if len(g) else {}
            self._gap_index = {k: np.asarray(v) for k, v in index.items()}
        found = [r for r in (self._gap_index.get((rank, c)) for c in causes) if r is not None]
        at = found[0] if len(found) == 1 else np.sort(np.concatenate(found)) if found else np.empty(0, int)
        step = self.gaps["step"].to_numpy()[at]
        if step.dtype.kind != "i" or step.min(initial=0) < -1 or np.min(steps, initial=0) < -1:
            keep = np.isin(step, steps)  # not step numbers as the breakdown writes them
        else:
            wanted = np.zeros(int(max(step.max(initial=-1), np.max(steps, initial=-1))) + 2, dtype=bool)
            wanted[np.asarray(steps, dtype=np.int64)] = True  # step numbers are >= 0, or -1 (the last slot)
            keep = wanted[step]
        picked: pd.DataFrame = self.gaps.iloc[at[keep]]
        return picked

    def host_catch_up(self, rank: int, steps: np.ndarray, causes: list[int]) -> tuple[Edit, ...]:
        """Edits for a host that lost no time to ``causes`` (indexes of IDLE_CAUSES) in ``steps`` of
        ``rank``: each launch made earlier by the idle of those causes that came before it in its
        host epoch (a host that did not stall there runs that far ahead), and each blocking call
        by the idle of its previous epoch."""
        if self.graph is None or self.gaps.empty:
            return ()
        gaps = self.gaps_of(rank, steps, causes)
        gaps = gaps[gaps["node"].to_numpy() >= 0]
        if gaps.empty:
            return ()
        launch_src, nxt = self._host_edges()
        times = self.graph.job_times()
        off = np.asarray(self.clock.offsets, dtype=np.int64)[gaps["export"].to_numpy(dtype=np.int64)]
        lost = pd.DataFrame({"epoch": launch_src[gaps["node"].to_numpy(dtype=np.int64)],
                             "end": gaps["end_ns"].to_numpy() + off,
                             "ns": (gaps["end_ns"] - gaps["start_ns"]).to_numpy(dtype=np.float64)})  # fmt: skip
        lost = lost[lost["epoch"] >= 0].sort_values("end", kind="stable")
        n = self.graph.nodes
        # the work launched in the epochs that lost time, whatever step it ran in: a stall at the end
        # of a step delays the next step's launches
        mine = np.flatnonzero((n["rank"].to_numpy() == rank) & np.isin(launch_src, lost["epoch"].unique()))
        shift = np.zeros(len(mine))
        done = times[mine]  # a segment's launch edge carries its last launch's: count the gaps up to its end
        for epoch, gl in lost.groupby("epoch"):
            at = np.flatnonzero(launch_src[mine] == epoch)
            cum = np.concatenate([[0.0], np.cumsum(gl["ns"].to_numpy())])
            shift[at] = cum[np.searchsorted(gl["end"].to_numpy(), done[at], side="right")]
        edits = []
        keep = shift > 0
        if keep.any():
            edits.append(Edit("earlier_launch", nodes=tuple(np.asarray(mine[keep], dtype=np.int64).tolist()),
                              amounts=tuple(np.asarray(shift[keep], dtype=np.float64).tolist())))  # fmt: skip
        # the next blocking call of each epoch with lost time: the host got there that much sooner
        per_epoch = lost.groupby("epoch")["ns"].sum()
        calls = nxt.reindex(per_epoch.index.to_numpy()).to_numpy()
        ok = ~np.isnan(calls)
        if ok.any():
            edits.append(Edit("earlier_host", nodes=tuple(np.asarray(calls[ok], dtype=np.int64).tolist()),
                              amounts=tuple(np.asarray(per_epoch.to_numpy()[ok], dtype=np.float64).tolist())))  # fmt: skip
        return tuple(edits)

    def _host_edges(self) -> tuple[np.ndarray, pd.Series]:
        """Per node, the source of its launch edge (-1: none), and per epoch node, the blocking call
        its host edge leads to: built once, every host-side finding's edits read them."""
        if self._host_links is None:
            assert self.graph is not None
            topo, kind = self.graph.topo, self.graph.edges["kind"].to_numpy()
            launch_src = np.full(topo.n, -1, dtype=np.int64)
            rows = np.flatnonzero(kind == EDGE["launch"])
            launch_src[topo.dst[rows]] = topo.src[rows]
            host_rows = np.flatnonzero(kind == EDGE["host"])
            nxt = pd.Series(topo.dst[host_rows], index=topo.src[host_rows])
            self._host_links = (launch_src, nxt[~nxt.index.duplicated()])
        return self._host_links

    def host_unblock(self, rank: int, steps: np.ndarray, causes: list[int]) -> tuple[Edit, ...]:
        """Edits for a host that never blocked where ``rank``'s GPU idled for ``causes`` (a
        synchronize, a full launch queue) in ``steps``: the blocking calls whose return the launches
        after those gaps waited for no longer wait for the GPU (their host work stays)."""
        if self.graph is None or self.gaps.empty:
            return ()
        nodes = self.gaps_of(rank, steps, causes)["node"].to_numpy(dtype=np.int64)
        nodes = nodes[nodes >= 0]
        if not len(nodes):
            return ()
        topo, kind = self.graph.topo, self.graph.edges["kind"].to_numpy()
        rows, _ = _in_edges(topo, nodes)
        epochs = distinct(topo.src[rows[kind[rows] == EDGE["launch"]]])
        epochs = epochs[self.graph.nodes["kind"].to_numpy()[epochs] == KIND["epoch"]] if len(epochs) else epochs
        return (Edit("unblock", nodes=tuple(epochs.tolist())),) if len(epochs) else ()

    def with_participants(self, ops: np.ndarray, collectives: bool = True) -> np.ndarray:
        """Rows of ``comm``: ``ops`` and every participant of their operations (the members of
        their collectives unless not ``collectives``, their send/recv partners), sorted, found by
        binary search in the groups and partners sorted once."""
        if self._by_group is None:
            group = self.comm["group"].to_numpy(dtype=np.int64) if "group" in self.comm else np.empty(0, np.int64)
            order = np.argsort(group, kind="stable")
            partners = self.participants.partners() if self.participants is not None else pd.DataFrame(
                {"i": np.empty(0, np.int64), "j": np.empty(0, np.int64)})  # fmt: skip
            self._by_group = (group, order, group[order], partners["i"].to_numpy(), partners["j"].to_numpy())
        group, order, sorted_group, pi, pj = self._by_group
        ops = np.asarray(ops, dtype=np.int64)
        wanted = distinct(group[ops][group[ops] >= 0]) if len(ops) and collectives else np.empty(0, np.int64)
        parts = [ops, _ranges(order, sorted_group, wanted), _ranges(pj, pi, distinct(ops))]
        return distinct(np.concatenate(parts))

    def comm_rows_of(self, rank: int) -> np.ndarray:
        """Rows of ``comm`` of ``rank``, ascending, indexed once: findings are built a rank at a
        time, and a pass over every operation per finding is quadratic in ranks."""
        if self._comm_of_rank is None:
            self._comm_of_rank = rows_by(self.comm["rank"].to_numpy()) if len(self.comm) else {}
        return self._comm_of_rank.get(rank, np.empty(0, dtype=np.int64))

    def group_rows(self, group: int) -> np.ndarray:
        """Rows of ``comm`` in collective ``group``, ascending, indexed once (findings ask per operation)."""
        if self._rows_of_group is None:
            self._rows_of_group = (
                rows_by(self.comm["group"].to_numpy()) if len(self.comm) and "group" in self.comm else {}
            )
        return self._rows_of_group.get(group, np.empty(0, dtype=np.int64))

    def rank_nodes_by_time(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s graph nodes sorted by their job-clock time, and those times: a window of
        them is two binary searches (each late-rank finding asks for several windows)."""
        if self._nodes_by_time is None:
            self._nodes_by_time = {}
            if self.graph is not None:
                times = self.graph.job_times()
                for r, ids in rows_by(self.graph.nodes["rank"].to_numpy()).items():
                    order = ids[np.argsort(times[ids], kind="stable")]
                    self._nodes_by_time[r] = (order, times[order])
        none = np.empty(0, dtype=np.int64)
        return self._nodes_by_time.get(rank, (none, none.astype(np.float64)))

    def comm_nodes(self, ops: np.ndarray, kind: str) -> np.ndarray:
        """The graph nodes (``kind`` "arrival" or "end") of NCCL operations ``ops`` (-1: none)."""
        out = np.full(len(ops), -1, dtype=np.int64)
        if self.graph is None or not len(ops):
            return out
        if kind not in self._node_of_comm:  # built once: findings ask one at a time
            n = self.graph.nodes
            rows = np.flatnonzero((n["kind"].to_numpy() == KIND[kind]) & (n["comm"].to_numpy() >= 0))
            self._node_of_comm[kind] = pd.Series(rows, index=n["comm"].to_numpy()[rows])
        found = self._node_of_comm[kind].reindex(np.asarray(ops, dtype=np.int64)).to_numpy()
        ok = ~np.isnan(found)
        out[ok] = found[ok].astype(np.int64)
        return out

    def savings(self, causes: list[Cause]) -> np.ndarray:
        """Per cause, how much shorter the job's wall time is when the graph is replayed without
        it (ns, >= 0). Zero for every cause when the job has no graph."""
        out = np.zeros(len(causes))
        if self.graph is None or not causes:
            return out
        g = self.graph
        end_times = g.topo.time[g.end_nodes]
        if not len(end_times):  # no step ends in the graph (every op's stream unknown, say): no wall to shorten
            return out
        start_times = g.topo.time[g.start_nodes] - g.start_lead
        actual = float(end_times.max()) - (float(start_times.min()) if len(start_times) else 0.0)
        for lo in range(0, len(causes), _CHUNK):
            chunk = causes[lo : lo + _CHUNK]
            shifts = replay(g.topo, [self._edge_edits(c) for c in chunk], np.concatenate([g.end_nodes, g.start_nodes]))
            new_end = end_times[:, None] + shifts[: len(end_times)]
            new_start = start_times[:, None] + shifts[len(end_times) :]
            wall = new_end.max(axis=0) - (new_start.min(axis=0) if len(start_times) else 0.0)
            out[lo : lo + len(chunk)] = np.maximum(actual - wall, 0.0)
        return out

    def _edge_edits(self, cause: Cause) -> dict[int, float]:
        """A cause's edits as {edge row: new weight} on the job graph, computed a whole edit at a
        time: the in-edges of its nodes gathered from the topology's CSR, their new weights in numpy."""
        assert self.graph is not None
        topo, nodes = self.graph.topo, self.graph.nodes
        kind = self.graph.edges["kind"].to_numpy()
        rows_all: list[np.ndarray] = []
        new_all: list[np.ndarray] = []
        for action, ids, amounts in self.nodes_of(cause):
            ok = (ids > 0) & (ids < topo.n)
            ids, per = ids[ok], _per_node(amounts, len(ok))[ok] if action != "scale" else None
            if action == "scale":
                pairs = amounts.reshape(-1, 2) if len(amounts) == 2 * len(ok) else np.ones((len(ok), 2))
                pairs = pairs[ok]
                per = ((1 - pairs[:, 0]) * nodes["compute_ns"].to_numpy()[ids]
                       + (1 - pairs[:, 1]) * nodes["copy_ns"].to_numpy()[ids])  # fmt: skip
            assert per is not None
            if action in ("shorten", "scale") and len(ids):
                # several operations of one segment: their shortenings add up on its node; a
                # scale is the node's own (whichever of its operations named it)
                ids, at = np.unique(ids, return_inverse=True)
                if action == "shorten":
                    per = np.bincount(at, weights=per, minlength=len(ids))
                else:
                    per_node = np.zeros(len(ids))
                    np.maximum.at(per_node, at, per)
                    per = per_node
            rows, which = _in_edges(topo, ids)
            by = per[which]
            if action in ("shorten", "scale"):
                by = np.minimum(by, nodes["work_ns"].to_numpy()[ids][which]) if action == "shorten" else by
                new = topo.weight[rows] - by
            elif action == "no_gap":
                binding = topo.time[topo.dst[rows]] - topo.time[topo.src[rows]] - topo.weight[rows] <= 0.5
                rows, new = rows[binding], (topo.weight[rows] - by)[binding]
            elif action in ("earlier_launch", "earlier_host"):
                pick = kind[rows] == EDGE["launch" if action == "earlier_launch" else "host"]
                rows, new = rows[pick], (topo.weight[rows] - by)[pick]
            elif action == "no_transfer":
                pick = kind[rows] == EDGE["transfer"]
                rows, new = rows[pick], np.minimum(topo.weight[rows][pick], 0.0)
            elif action in ("no_launch_wait", "no_stream_order", "unblock"):
                target = {"no_launch_wait": "launch", "no_stream_order": "stream", "unblock": "sync"}[action]
                pick = kind[rows] == EDGE[target]
                # a node keeps at least one constraint: only nodes with another in-edge lose this one
                others = np.bincount(which[~pick], minlength=len(ids)) > 0
                pick &= others[which]
                rows, new = rows[pick], np.full(int(pick.sum()), -np.inf)
            else:
                continue
            rows_all.append(rows)
            new_all.append(new)
        if not rows_all:
            return {}
        rows = np.concatenate(rows_all)
        new = np.concatenate(new_all)
        order = np.lexsort((new, rows))  # the lowest weight per edge wins where edits overlap
        rows, new = rows[order], new[order]
        first = np.concatenate([[True], rows[1:] != rows[:-1]])
        return dict(zip(rows[first].tolist(), new[first].tolist(), strict=True))

    def document(self) -> dict[str, Any]:
        """The report's ``steps`` section (docs/report.md)."""
        ranks: dict[str, Any] = {}
        b = self.breakdown
        # the columns as arrays once, each rank's rows picked from them: a frame per rank cost
        # seconds at 1,024 ranks (the order within a rank is sort_values("step")'s quicksort)
        step = b["step"].to_numpy()
        cols = {c: b[c].to_numpy(dtype=np.int64) for c in ("export", "start_ns", "end_ns", *CATEGORIES,
                                                         *(f"idle_{x}_ns" for x in IDLE_CAUSES))}  # fmt: skip
        for rank, rows in sorted(rows_by(b["rank"].to_numpy()).items()) if len(b) else []:
            at = rows[np.argsort(step[rows], kind="quicksort")]
            ranks[str(int(rank))] = {
                "export": int(cols["export"][at[0]]),
                "start_ns": cols["start_ns"][at].tolist(),
                "end_ns": cols["end_ns"][at].tolist(),
                "breakdown_ns": {c: cols[c][at].tolist() for c in CATEGORIES},
                "idle_causes_ns": {c: cols[f"idle_{c}_ns"][at].tolist() for c in IDLE_CAUSES},
            }
        return {
            "version": STEPS_VERSION,
            "source": self.source,
            "detail": self.detail,
            "clock": {
                "method": self.clock.method,
                "uncertainty_ns": int(self.clock.uncertainty_ns),
                "offsets_ns": [int(o) for o in self.clock.offsets],
            },
            "job": {
                "start_ns": int(self.job_start_ns),
                "end_ns": int(self.job_end_ns),
                "wall_ns": int(self.wall_ns),
                "critical_rank": self.critical_ranks(),
                "graph_nodes": 0 if self.graph is None else int(self.graph.topo.n),
            },
            "ranks": ranks,
            "unjudged": list(self.unjudged),
        }

    def critical_ranks(self) -> list[int]:
        """Per step number, the rank whose step ended last on the job clock (the one the others
        waited for at the step's end)."""
        w = self.windows
        if w.empty:
            return []
        last = w.sort_values(["step", "a_end", "rank"], kind="stable").drop_duplicates("step", keep="last")
        return [int(r) for r in last["rank"]]


def reduce_attribution(
    parts: list[AttributionPart], utc: list[int], matching: comm_table.Matching, notes: list[str] | None = None
) -> JobAttribution:
    """The job's attribution from every export's part (in export order) and each export's UTC
    offset to the job clock (``Trace.job_clock``). The parts' NCCL tables are consumed (joined)."""
    notes = notes if notes is not None else []
    unjudged: list[dict[str, Any]] = []
    sources = [p.source for p in parts if p.source]
    source = max(set(sources), key=sources.count) if sources else None
    if len(set(sources)) > 1:
        notes.append("Steps came from NVTX ranges on some ranks and from the kernel sequence on others: compare "
                     "step figures across ranks with care.")  # fmt: skip
    detail = "; ".join(dict.fromkeys(p.detail for p in parts if p.detail)) or None

    comm = concat_frames([p.comm for p in parts]) if parts else pd.DataFrame()
    comm_base = np.cumsum([0] + [len(p.comm) for p in parts])
    if len(comm):
        comm["op"] = comm["op"].to_numpy(dtype=np.int64) + comm_base[comm["export"].to_numpy(dtype=np.int64)]
        comm = comm.sort_values("op", kind="stable").reset_index(drop=True)
    members = concat_frames([p.members for p in parts]) if parts else pd.DataFrame()
    legs = concat_frames([p.legs.assign(op=p.legs["op"].to_numpy() + comm_base[i]) for i, p in enumerate(parts)
                          if len(p.legs)]) if any(len(p.legs) for p in parts) else None  # fmt: skip

    # the clock: UTC, corrected by coinciding NCCL ends, then refined on matched operations
    ends = [p.comm["end_ns"].to_numpy(dtype=np.int64) for p in parts]
    for p in parts:  # held once, by the join: 10M operations at 1,024 ranks
        p.comm = p.comm.iloc[0:0]
    # NCCL's payloads name every operation's communicator: its participants are known whatever the
    # clock, and the refinement below aligns on them; the coarse pass is for matching by position
    named = len(comm) > 0 and float(comm["comm_id"].notna().mean()) >= 0.9 if "comm_id" in comm else False
    coarse = len(parts) > 1 and not named
    offsets, _decided = clocks.coarse(ends, utc) if coarse else (list(utc), [False] * len(parts))
    participants = None
    group = np.full(len(comm), -1, dtype=np.int64)
    if len(comm):
        legs = _legs_on_job(legs, comm, members)
        on = comm_table.on_job(comm, members, offsets)
        _number_communicators(comm, legs)
        if on["rank"].nunique() >= 2:
            participants = comm_table.participants(on, matching, notes, legs)
            group = participants.clock_groups(comm["p2p"].to_numpy(dtype=bool))
        refined, uncertainty, spanning = clocks.refine(offsets, comm[["export", "end_ns"]], group)
        if len(parts) > 1 and spanning >= clocks.MIN_MATCHES:
            offsets = refined
        comm = comm_table.on_job(comm, members, offsets)
    else:
        uncertainty, spanning = 0, 0
    if len(parts) <= 1:
        method = "one export: its processes share one clock"
    elif spanning >= clocks.MIN_MATCHES:
        moved = max(abs(o - u) for o, u in zip(offsets, utc, strict=True))
        method = (f"NCCL operation ends: {spanning:,} operations matched across exports; session start times "
                  f"(UTC) corrected by up to {moved / 1e3:.0f} us")  # fmt: skip
    else:
        method = "session start times (UTC): too few NCCL operations matched across exports to align on"
        if len(parts) > 1:
            uncertainty = max(uncertainty, 1_000_000)  # NTP-grade agreement between hosts, at best
    clock = clocks.Clock([int(o) for o in offsets], method, int(uncertainty))

    # arrivals: each operation's last participant (its collective's, or its send/recv partners')
    if len(comm):
        a_start = comm["a_start"].to_numpy(dtype=np.int64)
        late = comm_table.latest_peer(comm, participants) if participants is not None else np.full(len(comm), -1)
        comm["group"] = participants.group.to_numpy() if participants is not None else -1
        comm["matched"] = participants.matched() if participants is not None else False
        comm["late_op"] = late
        comm["arrival_ns"] = np.where(late >= 0, np.maximum(a_start, a_start[np.maximum(late, 0)]), a_start)
        comm["waited_ns"] = comm["arrival_ns"].to_numpy() - a_start

    windows = concat_frames([p.windows for p in parts]) if parts else pd.DataFrame(columns=["export", "rank"])
    offset_of = np.asarray(offsets, dtype=np.int64)
    if len(windows):
        ex = windows["export"].to_numpy(dtype=np.int64)
        windows = windows.assign(a_start=windows["start_ns"].to_numpy() + offset_of[ex],
                                 a_end=windows["end_ns"].to_numpy() + offset_of[ex])  # fmt: skip
    breakdown = _split_communication(parts, comm, comm_base, offset_of, unjudged)
    if source == "capture" and len(windows):
        for rank, rows in windows.groupby("rank").indices.items():
            w = windows.iloc[rows]
            unjudged.append({"detector": "steps", "rank": int(cast(int, rank)),
                             "ns": int((w["end_ns"] - w["start_ns"]).sum()),
                             "why": "no NVTX step ranges and no repeating kernel sequence: the capture counts as one "
                                    "step (pass --step-pattern to name the step ranges)"})  # fmt: skip

    job_start = int(windows["a_start"].min()) if len(windows) else 0
    job_end = int(windows["a_end"].max()) if len(windows) else 0
    graph = _assemble(parts, comm, comm_base, offset_of, windows, notes, participants)
    gaps = concat_frames([p.gaps for p in parts]) if parts else pd.DataFrame()
    if graph is not None and len(gaps):
        base = np.asarray(graph.node_base, dtype=np.int64)
        node = gaps["node"].to_numpy(dtype=np.int64)
        gaps = gaps.assign(node=np.where(node >= 0, node + base[gaps["export"].to_numpy(dtype=np.int64)], -1))
    for p in parts:
        notes.extend(p.notes)
    return JobAttribution(source, detail, clock, windows, breakdown, comm, participants, graph, job_start, job_end,
                          unjudged, notes, gaps)  # fmt: skip


def _per_node(amounts: np.ndarray, n: int) -> np.ndarray:
    """An edit's amounts, one per node (0 where the edit gave none)."""
    out = np.zeros(n)
    out[: min(n, len(amounts))] = amounts[:n]
    return out


def _ranges(values: np.ndarray, keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """``values`` whose ``keys`` (sorted) are one of ``wanted``."""
    lo, hi = np.searchsorted(keys, wanted, side="left"), np.searchsorted(keys, wanted, side="right")
    n = hi - lo
    at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    out: np.ndarray = values[at]
    return out


def _in_edges(topo: Topology, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The in-edge rows of nodes ``ids`` and, per row, the position in ``ids`` of its node."""
    lo, hi = topo.in_start[ids], topo.in_start[ids + 1]
    n = hi - lo
    which = np.repeat(np.arange(len(ids)), n)
    at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    return topo.in_rows[at], which


def _legs_on_job(legs: pd.DataFrame | None, comm: pd.DataFrame, members: pd.DataFrame) -> pd.DataFrame | None:
    """The legs of multi-call kernels with each leg's rank in its communicator filled the way
    :func:`comm.on_job` fills an op's (its position among the members by global rank)."""
    if legs is None or not len(legs):
        return None
    m = members.dropna().drop_duplicates(["comm_id", "rank"]).sort_values("rank")
    position = m.assign(pos=m.groupby("comm_id").cumcount()).set_index(["comm_id", "rank"])["pos"]
    rank = comm["rank"].to_numpy()[legs["op"].to_numpy()]
    guess = legs["comm_rank"].isna().to_numpy()
    out = legs.copy()
    if guess.any():
        keys = pd.MultiIndex.from_arrays([legs.loc[guess, "comm_id"], rank[guess]])
        out.loc[guess, "comm_rank"] = pd.array(position.reindex(keys).to_numpy(), dtype="Int64")
    return out


def _number_communicators(raw: pd.DataFrame, legs: pd.DataFrame | None) -> None:
    """The legs' communicator hashes replaced by the numbers :func:`comm.on_job` gives the ops'
    (``raw``: the ops before it; by first appearance), new numbers for communicators only legs name."""
    if legs is None or not len(legs):
        return
    ids = pd.concat([raw["comm_id"].astype("UInt64"), legs["comm_id"].astype("UInt64")], ignore_index=True)
    codes = pd.factorize(ids)[0][len(raw) :]
    legs["comm_id"] = pd.arrays.IntegerArray(codes.astype(np.int32), codes < 0)


def _split_communication(
    parts: list[AttributionPart], comm: pd.DataFrame, comm_base: np.ndarray, offset_of: np.ndarray,
    unjudged: list[dict[str, Any]],
) -> pd.DataFrame:  # fmt: skip
    """The map's per-step breakdown with its communication split at each operation's last arrival:
    ``communication_exposed`` (some NCCL kernel transferring, nothing computing) and
    ``waiting_for_peer`` (the rest of the exposed NCCL time)."""
    frames = [p.breakdown for p in parts if len(p.breakdown)]
    if not frames:
        return pd.DataFrame(columns=["export", "rank", "step", "start_ns", "end_ns", *CATEGORIES,
                                     *(f"idle_{c}_ns" for c in IDLE_CAUSES), *COPY_COLUMNS])  # fmt: skip
    b = concat_frames(frames)
    pieces = concat_frames([p.pieces for p in parts if len(p.pieces)]) if any(len(p.pieces) for p in parts) else None
    transfer = pd.Series(0, index=pd.MultiIndex.from_frame(b[["export", "rank", "step"]]), dtype="int64")
    if pieces is not None and len(comm):
        op = pieces["op"].to_numpy(dtype=np.int64) + comm_base[pieces["export"].to_numpy(dtype=np.int64)]
        ex = pieces["export"].to_numpy(dtype=np.int64)
        arrival_local = comm["arrival_ns"].to_numpy()[op] - offset_of[ex]
        matched = comm["matched"].to_numpy()[op]
        ps, pe = pieces["start_ns"].to_numpy(dtype=np.int64), pieces["end_ns"].to_numpy(dtype=np.int64)
        ts = np.where(matched, np.maximum(ps, arrival_local), ps)
        keep = pe > ts
        per_op = np.bincount(op[keep], weights=(pe - ts)[keep], minlength=len(comm)).astype(np.int64)
        comm["exposed_ns"] = per_op
        t = pd.DataFrame({"export": ex[keep], "rank": pieces["rank"].to_numpy()[keep], "step": pieces["step"].to_numpy()[keep],
                          "start_ns": ts[keep], "end_ns": pe[keep]})  # fmt: skip
        if len(t):
            per = union_ns(t, ["export", "rank", "step"])
            transfer = per.reindex(transfer.index, fill_value=0).astype("int64")
        lost = pe[~matched] - ps[~matched]
        if lost.sum() > 0:
            unmatched = pd.Series(lost).groupby(pieces["rank"].to_numpy()[~matched]).sum()
            for rank, ns in unmatched.items():
                unjudged.append({"detector": "attribution", "rank": int(rank), "ns": int(ns),  # type: ignore[call-overload]
                                 "why": "NCCL time whose operation was matched with no participant on another rank: "
                                        "waiting for a peer cannot be told from transfer, counted as communication"})  # fmt: skip
    comm_exposed = np.minimum(transfer.to_numpy(), b["comm_ns"].to_numpy())
    out = b.assign(communication_exposed=comm_exposed, waiting_for_peer=b["comm_ns"].to_numpy() - comm_exposed,
                   compute=b["compute_ns"], copy_exposed=b["copy_ns"], idle=b["idle_ns"])  # fmt: skip
    cols = [
        "export",
        "rank",
        "step",
        "start_ns",
        "end_ns",
        *CATEGORIES,
        *(f"idle_{c}_ns" for c in IDLE_CAUSES),
        *COPY_COLUMNS,
    ]
    return out[cols].sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def _assemble(
    parts: list[AttributionPart], comm: pd.DataFrame, comm_base: np.ndarray, offset_of: np.ndarray,
    windows: pd.DataFrame, notes: list[str], participants: comm_table.Participants | None,
) -> JobGraph | None:  # fmt: skip
    """The job's graph from the exports' parts: one source, times on the job clock from its origin,
    and a join node per NCCL operation matched across ranks."""
    total = sum(len(p.graph.nodes) for p in parts)
    if total == 0 or any(len(p.graph.nodes) == 0 and len(p.windows) for p in parts):
        return None  # an export whose map sent no graph (past its budget: its note says so)
    if total > MAX_GRAPH_NODES:
        notes.append(f"What-if replay skipped: the job's dependency graph has {total:,} nodes (limit "
                     f"{MAX_GRAPH_NODES:,}); recoverable_ns is 0 for every finding and severity falls back to the "
                     "time lost where it happened.")  # fmt: skip
        return None
    node_base = [1]
    for p in parts[:-1]:
        node_base.append(node_base[-1] + len(p.graph.nodes))
    nodes = GraphPart.concat([p.graph for p in parts])  # ids 0.. over all parts; shifted by one below
    n = nodes.nodes
    export_of_node = np.repeat(np.arange(len(parts)), [len(p.graph.nodes) for p in parts])
    time_job = n["time_ns"].to_numpy(dtype=np.int64) + offset_of[export_of_node]
    origin = int(min(time_job.min(), windows["a_start"].min() if len(windows) else time_job.min()))
    time = np.concatenate([[0.0], (time_job - origin).astype(np.float64)])
    e = nodes.edges
    src = e["src"].to_numpy(dtype=np.int64)
    dst = e["dst"].to_numpy(dtype=np.int64) + 1
    weight = e["weight"].to_numpy(dtype=np.float64).copy()
    from_source = src < 0
    # edges from the source carry export-clock times: onto the job clock, from its origin
    weight[from_source] += (offset_of[export_of_node[dst[from_source] - 1]] - origin).astype(np.float64)
    src = np.where(from_source, 0, src + 1)
    kind = e["kind"].to_numpy()
    node_table = pd.concat([pd.DataFrame({"kind": [KIND["source"]], "time_ns": [origin], "rank": [-1], "pid": [-1],
                                          "device": [-1], "stream": [-1], "step": [-1], "comm": [-1],
                                          "work_ns": [0.0], "compute_ns": [0.0], "copy_ns": [0.0],
                                          "first_ns": [origin], "launch_bound": [False]}),
                            n.assign(export=export_of_node)], ignore_index=True)  # fmt: skip
    node_table["export"] = node_table["export"].fillna(-1).astype(np.int64)
    local_comm = node_table["comm"].to_numpy(dtype=np.int64)
    ex = node_table["export"].to_numpy()
    node_table["comm"] = np.where(local_comm >= 0, local_comm + comm_base[np.maximum(ex, 0)], -1)

    # joins: the arrivals of a collective's participants meet in one node, a send/recv kernel's
    # with its partners' in one of its own; each end follows its join by its transfer
    if len(comm) and comm["matched"].any():
        kinds = node_table["kind"].to_numpy()
        arrival_of = np.full(len(comm), -1, dtype=np.int64)
        end_of = np.full(len(comm), -1, dtype=np.int64)
        c = node_table["comm"].to_numpy()
        arr = np.flatnonzero(kinds == KIND["arrival"])
        arrival_of[c[arr]] = arr
        en = np.flatnonzero(kinds == KIND["end"])
        end_of[c[en]] = en
        g = comm["group"].to_numpy()
        # (join, op whose arrival feeds it) and (join, op whose end follows it), as join keys
        coll = np.flatnonzero((g >= 0) & (arrival_of >= 0) & (end_of >= 0))
        feeds = [pd.DataFrame({"key": g[coll], "op": coll})]
        follows = [pd.DataFrame({"key": g[coll], "op": coll})]
        if participants is not None and len(participants.edges):
            pairs = participants.partners()
            pairs = pairs[(arrival_of[pairs["i"].to_numpy()] >= 0) & (end_of[pairs["i"].to_numpy()] >= 0)
                          & (arrival_of[pairs["j"].to_numpy()] >= 0)]  # fmt: skip
            base = int(g.max(initial=-1)) + 1
            own = distinct(pairs["i"].to_numpy())
            feeds += [pd.DataFrame({"key": base + own, "op": own}),
                      pd.DataFrame({"key": base + pairs["i"].to_numpy(), "op": pairs["j"].to_numpy()})]  # fmt: skip
            follows.append(pd.DataFrame({"key": base + own, "op": own}))
        feed = pd.concat(feeds, ignore_index=True).drop_duplicates()
        follow = pd.concat(follows, ignore_index=True)
        size = feed.groupby("key")["op"].transform("size").to_numpy()
        feed = feed[size >= 2]
        follow = follow[follow["key"].isin(feed["key"])]
        if len(feed):
            codes, uniques = pd.factorize(feed["key"])
            jt = pd.Series(time[arrival_of[feed["op"].to_numpy()]]).groupby(codes).max().to_numpy()
            join_of_key = pd.Series(np.arange(len(uniques)), index=uniques)
            fj = join_of_key.reindex(follow["key"].to_numpy()).to_numpy()
            end_ids = end_of[follow["op"].to_numpy()]
            transfer = time[end_ids] - jt[fj]
            joinable = transfer >= 0  # an end before the last arrival: clock error; that op keeps its own duration
            drop_transfer = np.isin(dst, end_ids[joinable]) & (kind == EDGE["transfer"])
            src, dst, weight, kind = (
                src[~drop_transfer],
                dst[~drop_transfer],
                weight[~drop_transfer],
                kind[~drop_transfer],
            )
            join_id = len(node_table) + np.arange(len(uniques))
            src = np.concatenate([src, arrival_of[feed["op"].to_numpy()], join_id[fj[joinable]]])
            dst = np.concatenate([dst, join_id[codes], end_ids[joinable]])
            weight = np.concatenate([weight, np.zeros(len(feed)), transfer[joinable]])  # a join is its latest arrival
            kind = np.concatenate([kind, np.full(len(feed), EDGE["arrive"], dtype=kind.dtype),
                                   np.full(int(joinable.sum()), EDGE["transfer"], dtype=kind.dtype)])  # fmt: skip
            time = np.concatenate([time, jt])
            joins = pd.DataFrame({"kind": KIND["join"], "time_ns": (jt + origin).astype(np.int64), "rank": -1,
                                  "pid": -1, "device": -1, "stream": -1, "step": -1, "comm": -1, "work_ns": 0.0,
                                  "compute_ns": 0.0, "copy_ns": 0.0, "first_ns": (jt + origin).astype(np.int64),
                                  "launch_bound": False, "export": -1})  # fmt: skip
            node_table = pd.concat([node_table, joins], ignore_index=True)

    # every edge forward in time (a concurrent graph branch on one stream id may not be): others dropped
    backward = time[src] > time[dst] + 0.5
    if backward.any():
        src, dst, weight, kind = src[~backward], dst[~backward], weight[~backward], kind[~backward]
    has_in = np.zeros(len(time), dtype=bool)
    has_in[dst] = True
    orphan = np.flatnonzero(~has_in)
    orphan = orphan[orphan > 0]
    if len(orphan):  # a node whose only constraint went: its time is fixed
        src = np.concatenate([src, np.zeros(len(orphan), dtype=np.int64)])
        dst = np.concatenate([dst, orphan])
        weight = np.concatenate([weight, time[orphan]])
        kind = np.concatenate([kind, np.full(len(orphan), EDGE["fixed"], dtype=kind.dtype)])
    topo = Topology.build(time, src, dst, weight)
    edges = pd.DataFrame({"src": src, "dst": dst, "weight": weight, "kind": kind})
    # the nodes of each rank's last step: the job ends with the latest of them
    last_step = windows.groupby("rank")["step"].max() if len(windows) else pd.Series(dtype="int64")
    r = node_table["rank"].to_numpy()
    st = node_table["step"].to_numpy()
    want = pd.Series(r).map(last_step).to_numpy()
    end_nodes = np.flatnonzero((st >= 0) & (st == want) & np.isin(node_table["kind"].to_numpy(),
                                                                   [KIND["segment"], KIND["end"]]))  # fmt: skip
    # each rank's first node, and how long before it its first step began (the job starts with the earliest)
    first_step = windows.groupby("rank")["step"].min() if len(windows) else pd.Series(dtype="int64")
    starts = windows.sort_values("a_start").drop_duplicates("rank").set_index("rank")["a_start"] if len(windows) \
        else pd.Series(dtype="int64")  # fmt: skip
    in_first = np.flatnonzero((st >= 0) & (st == pd.Series(r).map(first_step).to_numpy()) & (r >= 0))
    by_rank = pd.DataFrame({"rank": r[in_first], "node": in_first, "t": time[in_first]}).sort_values("t")
    first_nodes = by_rank.drop_duplicates("rank")
    # a rank starts when its first operation does: when its launch let it (the launching thread's
    # epoch, which a fix upstream of the first launch moves), not when its first segment ends
    # (removing that segment's work moves the end, not the start)
    first = first_nodes["node"].to_numpy(dtype=np.int64)
    start_nodes = np.zeros(len(first), dtype=np.int64)  # the source: never moves
    rows, which = _in_edges(topo, first)
    launch = kind[rows] == EDGE["launch"]
    slack = topo.time[topo.dst[rows]] - topo.time[topo.src[rows]] - topo.weight[rows]
    order = np.lexsort((slack[launch], which[launch]))
    binding = pd.Series(topo.src[rows[launch]][order]).groupby(which[launch][order]).first()
    start_nodes[binding.index.to_numpy()] = binding.to_numpy()
    lead = time[start_nodes] - (starts.reindex(first_nodes["rank"]).to_numpy(dtype=np.float64) - origin)
    return JobGraph(node_table, edges, topo, node_base, end_nodes, start_nodes, lead, origin)
