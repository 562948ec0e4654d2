"""The host side of a rank's GPU timeline: which call launched each GPU operation, which calls
blocked the host until GPU work finished, and what the host was doing while its GPU idled.

A *blocking call* returns only when GPU work has finished: ``cudaStreamSynchronize``,
``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy`` (a tensor's
``.item()`` or ``.cpu()``), ``cudaFree``; and a launch that waited for room in a full launch queue
(a "Command Buffer Full" overhead record). Such a call *awaited* the operation whose end it
returned after: the latest-ending GPU operation of its process that ended while it ran, at most
``RETURN_TOLERANCE_NS`` before it returned. Calls that returned without waiting are host work like
any other. Between two blocking calls a thread runs at its own pace, so they split each thread's
time into *epochs*: the host times of one epoch move together when the GPU work the epoch's first
call awaited finishes earlier (:mod:`nsysan.attribution.graph`).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from nsysan.arrays import distinct
from nsysan.ingest.frames import NVTX_RANGE_TYPES, per_distinct_text
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_arrays, union_arrays

# names of calls that may block the host on GPU work (SQL LIKE); calls that did not wait are dropped
SYNC_PATTERNS = ("%ynchroniz%", "cudaMemcpy%", "cuMemcpy%", "cudaFree%", "cuMemFree%")
RETURN_TOLERANCE_NS = 50_000
MIN_WAIT_NS = 5_000  # a call shorter than this did not wait for the GPU in any way that matters
COMMAND_BUFFER_FULL = "command buffer full"
# NVTX ranges that say a thread is loading data (DataLoader, DALI, a user's "data load" range)
DATA_RANGES = re.compile(r"(?i)data|load|batch|prefetch|dali|collate|fetch|input|read")
IDLE_CAUSES = ("launch", "sync", "data_loading", "blocked_launch", "dependency", "unknown")
_CALL_COLUMNS = ["export", "pid", "tid", "start_ns", "end_ns", "correlation_id"]


def launches(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``ops`` (export, pid, correlation_id): the launching call's ``tid``, ``launch_ns``
    (its start) and ``launched_ns`` (its end), -1 where the capture has no such call. Graph kernels
    share their ``cudaGraphLaunch``'s correlation id, so they all get its times."""
    calls = trace.api_calls(("tid", "start_ns", "end_ns", "correlation_id"))
    calls = calls.dropna(subset=["correlation_id", "tid", "start_ns", "end_ns"])
    out = {c: np.full(len(ops), -1, dtype=np.int64) for c in ("tid", "launch_ns", "launched_ns")}
    # per export, one int64 key per (pid, correlation id), looked up by binary search: a merge of a
    # million launches on three columns costs 5x more
    c_export, o_export = calls["export"].to_numpy(dtype=np.int64), ops["export"].to_numpy(dtype=np.int64)
    for export in distinct(o_export).tolist():
        mine, theirs = np.flatnonzero(c_export == export), np.flatnonzero(o_export == export)
        if not len(mine):
            continue
        key = _call_key(calls, mine)
        order = np.argsort(key, kind="stable")  # the first call of a key wins, as drop_duplicates would
        sorted_key = key[order]
        want = _call_key(ops, theirs)
        at = np.minimum(np.searchsorted(sorted_key, want), len(key) - 1)
        hit = (sorted_key[at] == want) & (ops["correlation_id"].to_numpy(dtype=np.int64)[theirs] >= 0)
        row = mine[order[at[hit]]]
        for name, source in (("tid", "tid"), ("launch_ns", "start_ns"), ("launched_ns", "end_ns")):
            out[name][theirs[hit]] = calls[source].to_numpy(dtype=np.int64)[row]
    return pd.DataFrame(out)


def _call_key(frame: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """(pid, correlation id) of ``rows`` as one int64 (31 bits of pid, 32 of id: CUPTI's ids are 32-bit)."""
    pid = frame["pid"].to_numpy(dtype=np.int64)[rows]
    corr = frame["correlation_id"].to_numpy(dtype=np.int64)[rows]
    key: np.ndarray = ((pid & 0x7FFFFFFF) << 32) | (corr & 0xFFFFFFFF)
    return key


def blocking_calls(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """Calls that blocked the host until GPU work finished (see the module docstring):
    export, pid, tid, start_ns, end_ns, correlation_id, kind ("sync" or "blocked_launch") and
    ``awaited`` (row of ``ops``, sorted by export, rank, start)."""
    named = trace.calls_named(SYNC_PATTERNS)
    named = named[~named["name"].astype(str).str.contains("Async", regex=False)]
    parts = [named.assign(kind="sync")[[*_CALL_COLUMNS, "kind"]]]
    full = queue_full_rows(trace)
    if len(full):
        calls = trace.api_calls(("tid", "start_ns", "end_ns", "correlation_id"))
        ids = full[["export", "pid", "correlation_id"]].dropna().astype("int64").drop_duplicates()
        blocked = calls.merge(ids, on=["export", "pid", "correlation_id"])
        parts.append(blocked.assign(kind="blocked_launch")[[*_CALL_COLUMNS, "kind"]])
    calls = pd.concat(parts, ignore_index=True).dropna(subset=["pid", "tid", "start_ns", "end_ns"])
    calls = calls[(calls["end_ns"] - calls["start_ns"]) >= MIN_WAIT_NS]
    out_cols = [*_CALL_COLUMNS, "kind", "awaited"]
    if calls.empty or ops.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in out_cols})
    calls = calls.astype({"export": "int64", "pid": "int64", "tid": "int64", "start_ns": "int64", "end_ns": "int64"})
    calls["correlation_id"] = calls["correlation_id"].fillna(-1).astype("int64")
    calls = calls.drop_duplicates(["export", "pid", "tid", "start_ns"]).reset_index(drop=True)
    awaited = np.full(len(calls), -1, dtype=np.int64)
    by_process = ops.groupby(["export", "pid"]).indices
    for process, rows in calls.groupby(["export", "pid"]).indices.items():
        mine = by_process.get(process)
        if mine is None:
            continue
        ends = ops["end_ns"].to_numpy()[mine]
        order = np.argsort(ends, kind="stable")
        sorted_ends = ends[order]
        c_end = calls["end_ns"].to_numpy()[rows]
        c_start = calls["start_ns"].to_numpy()[rows]
        at = np.searchsorted(sorted_ends, c_end, side="right") - 1
        ok = at >= 0
        e = np.where(ok, sorted_ends[np.maximum(at, 0)], -1)
        ok &= (e >= c_start) & (c_end - e <= RETURN_TOLERANCE_NS)
        awaited[rows[ok]] = mine[order[at[ok]]]
    calls["awaited"] = awaited
    return calls[calls["awaited"] >= 0][out_cols].reset_index(drop=True)


def queue_full_rows(trace: Trace) -> pd.DataFrame:
    """Overhead rows of the "Command Buffer Full" kind (by the enum's label or the row's name)."""
    o = trace.overhead
    if o.empty:
        return o
    label = o["overhead_type"].astype(str).str.lower() if "overhead_type" in o else pd.Series("", index=o.index)
    name = o["name"].astype(str).str.lower()
    return o[label.str.contains(COMMAND_BUFFER_FULL, regex=False) | name.str.contains(COMMAND_BUFFER_FULL, regex=False)]


def data_loading(trace: Trace) -> pd.DataFrame:
    """Host intervals spent loading data, per thread: OS runtime calls (reads, waits on
    DataLoader workers) and NVTX ranges named like data loading. export, pid, tid, start_ns, end_ns."""
    cols = ["export", "pid", "tid", "start_ns", "end_ns"]
    parts = []
    o = trace.osrt
    if len(o):
        parts.append(o[cols])
    v = trace.nvtx
    if len(v):
        r = v[v["event_type"].isin(NVTX_RANGE_TYPES) & v["end_ns"].notna()]
        named = per_distinct_text(r["text"], lambda t: np.array([bool(DATA_RANGES.search(x)) for x in t], dtype=bool))
        parts.append(r[named][cols])
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    return pd.concat(parts, ignore_index=True).dropna().astype("int64")


def idle_causes(
    gaps: pd.DataFrame, blocking: pd.DataFrame, loading: pd.DataFrame, queue_full: pd.DataFrame
) -> np.ndarray:
    """The host-side cause of each idle gap (an index into IDLE_CAUSES).

    ``gaps``: export, pid, start_ns (the GPU went idle), end_ns (the next operation started), tid,
    launch_ns and launched_ns of that operation's launch call (-1: unknown). The GPU waited for the
    host when that call had not returned yet when the gap began; then what the launching thread did
    from the gap's start to the call says why: mostly loading data (``data_loading``), or it had
    been blocked in a synchronize until the GPU drained and only then went on to launch (``sync``),
    or its launches were blocked on a full queue (``blocked_launch``), else plain host work between
    launches (``launch``). A call that had returned before the gap means the operation waited for
    something else (``dependency``)."""
    n = len(gaps)
    cause = np.full(n, IDLE_CAUSES.index("unknown"), dtype=np.int64)
    if n == 0:
        return cause
    launch = gaps["launch_ns"].to_numpy()
    launched = gaps["launched_ns"].to_numpy()
    g0 = gaps["start_ns"].to_numpy()
    known = launched >= 0
    cause[known & (launched <= g0)] = IDLE_CAUSES.index("dependency")
    host = np.flatnonzero(known & (launched > g0))
    if not len(host):
        return cause
    cause[host] = IDLE_CAUSES.index("launch")
    h = gaps.iloc[host]
    lo, hi = g0[host], np.maximum(launch[host], g0[host] + 1)
    full = _thread_cover(h, queue_full, lo, hi)
    cause[host[full > 0]] = IDLE_CAUSES.index("blocked_launch")
    syncs = blocking[blocking["kind"] == "sync"] if len(blocking) else blocking
    returned = _thread_ended_within(h, syncs, lo - RETURN_TOLERANCE_NS, hi)
    cause[host[returned]] = IDLE_CAUSES.index("sync")
    loaded = _thread_cover(h, loading, lo, hi)
    cause[host[2 * loaded >= (hi - lo)]] = IDLE_CAUSES.index("data_loading")
    return cause


def _thread_cover(h: pd.DataFrame, intervals: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each row of ``h`` (export, pid, tid): how much of [lo, hi) its thread spent in ``intervals``."""
    out = np.zeros(len(h), dtype=np.int64)
    if intervals.empty or not len(h):
        return out
    by_thread = intervals.groupby(["export", "pid", "tid"]).indices
    keys = h[["export", "pid", "tid"]].to_numpy(dtype=np.int64)
    for key, rows in pd.DataFrame(keys).groupby([0, 1, 2]).indices.items():
        idx = by_thread.get(tuple(np.asarray(key, dtype=np.int64).tolist()))
        if idx is None:
            continue
        s, e = union_arrays(intervals["start_ns"].to_numpy()[idx], intervals["end_ns"].to_numpy()[idx])
        out[rows] = covered_arrays(lo[rows], hi[rows], s, e)
    return out


def _thread_ended_within(h: pd.DataFrame, calls: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each row of ``h``: whether a call of its thread in ``calls`` ended within [lo, hi]."""
    out = np.zeros(len(h), dtype=bool)
    if calls.empty or not len(h):
        return out
    by_thread = calls.groupby(["export", "pid", "tid"]).indices
    keys = h[["export", "pid", "tid"]].to_numpy(dtype=np.int64)
    for key, rows in pd.DataFrame(keys).groupby([0, 1, 2]).indices.items():
        idx = by_thread.get(tuple(np.asarray(key, dtype=np.int64).tolist()))
        if idx is None:
            continue
        ends = np.sort(calls["end_ns"].to_numpy()[idx])
        first = np.searchsorted(ends, lo[rows], side="left")
        out[rows] = (first < len(ends)) & (ends[np.minimum(first, len(ends) - 1)] <= hi[rows])
    return out
