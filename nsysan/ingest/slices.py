"""An export of several processes, read one group of processes at a time.

``nsys profile torchrun ...`` writes one export holding every rank of the node. To map such an
export one rank at a time (a worker then holds one rank's frames, and the ranks of one export map
in parallel), its processes are split into *slices*: processes that share no GPU with processes of
another slice. Processes on the same GPU (two ranks on one device, or a copy from one process into
another's device) stay in one slice, because the detectors judge a device's kernels against
everything that ran on it.

A slice is read through SQLite TEMP views named as the export's tables, each holding only the
rows of the slice's processes; every reader then works unchanged. The first slice also holds the
rows no other slice does (processes without GPU work, rows without a process id), so the slices
of an export partition each table's rows exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The process id in a globalPid / globalTid (<hw:8><vm:8><pid:24><tid:24>), as frames.decode_pid takes it.
_PID_SQL = "(({column} >> 24) & 16777215)"
_OWNER_COLUMNS = ("globalPid", "globalTid")
# Tables whose rows put a process on a GPU, with the columns naming the GPUs.
_GPU_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("deviceId",),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("deviceId", "srcDeviceId", "dstDeviceId"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("deviceId",),
}


@dataclass(frozen=True)
class ProcessSlice:
    """Rows of the processes ``pids``; with ``rest``, the rows of every process *not* in ``pids``
    (and rows without a process). ``ProcessSlice((), rest=True)`` is the whole export."""

    pids: tuple[int, ...] = ()
    rest: bool = True

    @property
    def whole(self) -> bool:
        return self.rest and not self.pids

    @property
    def tag(self) -> str:
        """A short name for cache keys: '' for the whole export."""
        if self.whole:
            return ""
        return ("~" if self.rest else "") + "p" + ",".join(str(p) for p in self.pids)

    def holds(self, pids: np.ndarray) -> np.ndarray:
        """Which of ``pids`` (decoded process ids) belong to this slice."""
        inside = np.isin(pids, np.array(self.pids, dtype=np.int64))
        return ~inside if self.rest else inside

    def view_statements(self, catalogue: dict[str, tuple[str, ...]]) -> list[str]:
        """CREATE TEMP VIEW statements that shadow each table with an owner column by its rows of
        this slice (``rowid`` kept, as readers order by it)."""
        if self.whole:
            return []
        listed = ",".join(str(int(p)) for p in self.pids)
        out = []
        for table, columns in catalogue.items():
            owner = next((c for c in _OWNER_COLUMNS if c.casefold() in {n.casefold() for n in columns}), None)
            if owner is None:
                continue
            pid = _PID_SQL.format(column=f'"{owner}"')
            if self.rest:
                cond = f"{pid} IS NULL" + (f" OR {pid} NOT IN ({listed})" if listed else " OR 1")
            else:
                cond = f"{pid} IN ({listed})"
            out.append(f'CREATE TEMP VIEW "{table}" AS SELECT rowid AS rowid, * FROM main."{table}" WHERE {cond}')
        return out


def gpu_use_queries(catalogue: dict[str, tuple[str, ...]]) -> list[str]:
    """SELECTs of the distinct (pid, device) pairs of an export's GPU work (kernels, copies with
    both ends, memsets), for :func:`slices_of`; run by ``NsysExport.process_slices``."""
    pid = _PID_SQL.format(column='"globalPid"')
    out = []
    for table, device_columns in _GPU_TABLES.items():
        have = {c.casefold() for c in catalogue.get(table, ())}
        if "globalpid" not in have:
            continue
        for column in device_columns:
            if column.casefold() in have:
                out.append(f'SELECT DISTINCT {pid} AS pid, "{column}" AS device FROM "{table}" '
                           f"WHERE {pid} IS NOT NULL AND typeof(\"{column}\") = 'integer'")  # fmt: skip
    return out


def slices_of(pairs: np.ndarray) -> list[ProcessSlice]:
    """The slices of an export whose GPU work is the (pid, device) rows ``pairs``: one per group
    of processes sharing a GPU, the first also holding the rest; ``[ProcessSlice()]`` (the whole
    export) when there is at most one group."""
    groups = _components(pairs)
    if len(groups) < 2:
        return [ProcessSlice()]
    others = tuple(sorted(p for g in groups[1:] for p in g))
    return [ProcessSlice(others, rest=True), *(ProcessSlice(tuple(sorted(g)), rest=False) for g in groups[1:])]


def _components(pairs: np.ndarray) -> list[list[int]]:
    """Processes joined by the devices they share, as groups ordered by their lowest process id.
    A handful of processes and devices per export: plain union-find."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(node: tuple[str, int]) -> tuple[str, int]:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for pid, device in pairs.tolist():
        a, b = find(("p", pid)), find(("d", device))
        if a != b:
            parent[b] = a
    groups: dict[tuple[str, int], list[int]] = {}
    for node in list(parent):
        if node[0] == "p":
            groups.setdefault(find(node), []).append(node[1])
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])
