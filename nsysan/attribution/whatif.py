"""What-if: the job's dependency graph replayed with some edge weights changed.

Every node's time is the latest of its in-edges, ``t(v) = max(t(u) + w(u, v))``, and the recorded
times are that system's solution (:mod:`.graph` fits the weights). Removing a cause lowers some
weights or drops edges; the replay recomputes the times downstream, in topological order, as
*shifts* (new time - recorded time, never positive):

    shift(v) = max over in-edges (u, v) of  shift(u) - slack(u, v),  slack = t(v) - t(u) - w

An edge with slack was not binding; it binds again only if the others move further than its
slack. A node none of whose in-edges' shifts reach it keeps its time and stops the replay there
(a launch the host issued at a fixed time pins its work: a cause upstream cannot move it).

Several scenarios (one per finding, and one per family of findings) replay together: a shift is a
vector over scenarios, and only nodes whose shift is below zero in some scenario are visited. A
sorted queue of topological positions does the visiting; a node is computed once, after every
predecessor that moved.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

EPSILON_NS = 0.5


@dataclass
class Topology:
    """Edges by destination in topological order, and by source, for replays."""

    n: int
    time: np.ndarray  # per node, the recorded time (float64)
    src: np.ndarray
    dst: np.ndarray
    weight: np.ndarray
    position: np.ndarray  # per node, its place in a topological order
    in_start: np.ndarray  # in-edges of node v: rows in_start[v]:in_start[v+1] of the edges sorted by dst
    in_rows: np.ndarray
    out_start: np.ndarray
    out_rows: np.ndarray

    @classmethod
    def build(cls, time: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> Topology:
        """``src`` -> ``dst`` edges with ``weight``; every edge goes forward in ``time`` (the graph
        builder drops any that does not). A topological order: by time, and among equal times by
        the length of the chain of zero-length edges leading to the node."""
        n = len(time)
        depth = np.zeros(n, dtype=np.int64)
        flat = (time[dst] == time[src]) & (src != dst)
        fs, fd = src[flat], dst[flat]
        for _ in range(64):  # chains of zero-length edges are short (arrival -> join -> end)
            new = depth.copy()
            np.maximum.at(new, fd, depth[fs] + 1)
            if np.array_equal(new, depth):
                break
            depth = new
        order = np.lexsort((np.arange(n), depth, time))
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        in_rows = np.argsort(dst, kind="stable")
        in_start = np.searchsorted(dst[in_rows], np.arange(n + 1), side="left")
        out_rows = np.argsort(src, kind="stable")
        out_start = np.searchsorted(src[out_rows], np.arange(n + 1), side="left")
        return cls(n, time, src, dst, weight, position, in_start, in_rows, out_start, out_rows)

    def slack(self) -> np.ndarray:
        """Per edge, how much later its destination happened than the edge required (>= 0)."""
        return self.time[self.dst] - self.time[self.src] - self.weight


def replay(topo: Topology, edits: list[dict[int, float]]) -> dict[int, np.ndarray]:
    """The shifts (new time - recorded time, <= 0) of every node that moved in some scenario.

    ``edits``: per scenario, {edge row: new weight} (-inf drops the edge). Returns {node: shifts
    over the scenarios}; nodes absent did not move in any."""
    g = len(edits)
    if g == 0:
        return {}
    edited: dict[int, np.ndarray] = {}
    for k, scenario in enumerate(edits):
        for edge, w in scenario.items():
            if edge not in edited:
                edited[edge] = np.full(g, topo.weight[edge])
            edited[edge][k] = w
    shifts: dict[int, np.ndarray] = {}
    queue: list[tuple[int, int]] = []
    queued: set[int] = set()
    for edge in edited:
        v = int(topo.dst[edge])
        if v not in queued:
            queued.add(v)
            heapq.heappush(queue, (int(topo.position[v]), v))
    time, src, weight = topo.time, topo.src, topo.weight
    zero = np.zeros(g)
    while queue:
        _, v = heapq.heappop(queue)
        rows = topo.in_rows[topo.in_start[v] : topo.in_start[v + 1]]
        best = np.full(g, -np.inf)
        for r in rows.tolist():
            u = int(src[r])
            w = edited.get(r)
            shift_u = shifts.get(u, zero)
            if w is None:
                np.maximum(best, shift_u - (time[v] - time[u] - weight[r]), out=best)
            else:
                np.maximum(best, shift_u - (time[v] - time[u] - w), out=best)
        best = np.minimum(best, 0.0)
        best = np.maximum(best, -time[v])  # nothing moves before the job's origin
        if (best < -EPSILON_NS).any():
            shifts[v] = best
            for r in topo.out_rows[topo.out_start[v] : topo.out_start[v + 1]].tolist():
                d = int(topo.dst[r])
                if d not in queued:
                    queued.add(d)
                    heapq.heappush(queue, (int(topo.position[d]), d))
    return shifts
