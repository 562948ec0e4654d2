"""What-if: the job's dependency graph replayed with some edge weights changed.

Every node's time is the latest of its in-edges, ``t(v) = max(t(u) + w(u, v))``, and the recorded
times are that system's solution (:mod:`.graph` fits the weights). Removing a cause lowers some
weights or drops edges; the replay recomputes the times downstream, in topological order, as
*shifts* (new time - recorded time, never positive):

    shift(v) = max over in-edges (u, v) of  shift(u) - slack(u, v),  slack = t(v) - t(u) - w

An edge with slack was not binding; it binds again only if the others move further than its
slack. A node none of whose in-edges' shifts reach it keeps its time and stops the replay there
(a launch the host issued at a fixed time pins its work: a cause upstream cannot move it).

Several scenarios (one per finding, and one per family of findings) replay together; each is a
shortest-path search (:func:`replay`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from nsysan.arrays import distinct

EPSILON_NS = 0.5


@dataclass
class _Csr:
    order: np.ndarray  # edge rows sorted by (source, destination)
    starts: np.ndarray  # where each (source, destination) pair starts in ``order``
    floor: np.ndarray  # per node, the super-source's edge: 0 for nodes with no in-edges, else its time
    slack: np.ndarray  # per edge, its recorded slack (>= 0)
    data: np.ndarray  # per matrix entry, the least slack of its pair's edges, then the floors
    pair_of: np.ndarray  # per edge, its pair (matrix entry)
    matrix: sp.csr_matrix  # the recorded graph; a scenario replaces the entries its edits touch


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
    _csr: _Csr | None = None

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

    def csr(self) -> _Csr:
        """The edges as a sparse matrix's structure, built on first use: one entry per (source,
        destination) pair (parallel edges keep the least slack), and a super-source (row ``n``)."""
        if self._csr is None:
            order = np.lexsort((self.dst, self.src))
            s, d = self.src[order], self.dst[order]
            first = np.ones(len(s), dtype=bool)
            first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
            starts = np.flatnonzero(first)
            indptr = np.concatenate([np.searchsorted(s[starts], np.arange(self.n + 1)), [len(starts) + self.n]])
            indices = np.concatenate([d[starts], np.arange(self.n)])
            has_in = np.diff(self.in_start) > 0
            floor = np.where(has_in, np.maximum(self.time, 0.0), 0.0)
            slack = np.maximum(self.slack(), 0.0)
            data = np.concatenate([np.minimum.reduceat(slack[order], starts), floor]) if len(starts) else floor
            pair_of = np.empty(len(order), dtype=np.int64)
            pair_of[order] = np.cumsum(first) - 1
            matrix = sp.csr_matrix((data, indices, indptr), shape=(self.n + 1, self.n + 1))
            self._csr = _Csr(order, starts, floor, slack, data, pair_of, matrix)
        return self._csr

    def slack(self) -> np.ndarray:
        """Per edge, how much later its destination happened than the edge required (>= 0)."""
        out: np.ndarray = self.time[self.dst] - self.time[self.src] - self.weight
        return out


def replay(topo: Topology, edits: list[dict[int, float]], nodes: np.ndarray) -> np.ndarray:
    """The shifts (new time - recorded time, <= 0) of ``nodes`` (nodes x scenarios).

    ``edits``: per scenario, {edge row: new weight} (-inf drops the edge).

    How far a node moves, ``d = -shift``, is the least, over its in-edges, of how far the source
    moved plus the edge's slack: ``d(v) = min(d(u) + slack(u, v))``, a shortest path whose edge
    costs (the slacks) are never negative, because edits only lower weights. So each scenario is one
    Dijkstra from a super-source (scipy's, in C): an edge to every node that has no in-edges costs 0
    (it does not move), and one to every other node costs its time (nothing moves before the job's
    origin). A vectorised frontier relaxation took one numpy round per node along a chain of moves:
    150k rounds, 319 s, on the 1M-kernel benchmark; this takes 0.1 s per scenario there.
    """
    g = len(edits)
    out = np.zeros((len(nodes), g))
    if g == 0 or not len(nodes):
        return out
    csr = topo.csr()
    bounds = np.append(csr.starts, len(csr.order))
    for k, scenario in enumerate(edits):
        if not scenario:
            continue
        rows = np.fromiter(scenario.keys(), dtype=np.int64, count=len(scenario))
        weight = np.fromiter(scenario.values(), dtype=np.float64, count=len(scenario))
        slack = csr.slack.copy()
        slack[rows] = np.where(
            np.isneginf(weight), np.inf, np.maximum(topo.time[topo.dst[rows]] - topo.time[topo.src[rows]] - weight, 0)
        )
        # only the entries of the pairs the edits touch change: the least slack of each one's edges
        touched = distinct(csr.pair_of[rows])
        lo, hi = bounds[touched], bounds[touched + 1]
        n = hi - lo
        at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
        data = csr.data.copy()
        data[touched] = np.minimum.reduceat(slack[csr.order[at]], np.cumsum(n) - n)
        csr.matrix.data = data
        moved = np.asarray(dijkstra(csr.matrix, directed=True, indices=topo.n), dtype=np.float64)[: topo.n]
        shift = -np.minimum(moved[nodes], csr.floor[nodes])
        out[:, k] = np.where(shift < -EPSILON_NS, shift, 0.0)
    return out
