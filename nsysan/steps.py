"""Training steps: per rank, the windows of GPU time that make up each step.

One implementation for the report, ``nsysan diff`` and the dashboard. Two sources, best first:

1. **NVTX step ranges** (``step 12``, ``train_step``, ``iteration 3``, ``ProfilerStep#7``; a
   case-insensitive regular expression, ``--step-pattern``): the outermost matching push/pop
   ranges of one thread per rank (the thread with the most of them). A range is a span of *host*
   time; the GPU runs its work later, when the host runs ahead. So each range is projected onto
   the GPU: CUDA API calls are numbered in call order (correlation ids), the first call made
   inside the range numbers the step's first launch, and the GPU work with ids from there up to
   the next step's first id is the step's work, launched from any thread of the process
   (PyTorch's backward is launched by its autograd thread).
2. **The repeating kernel sequence**, without NVTX steps: per rank, the compute kernels in start
   order (NCCL kernels run on other streams and interleave), the smallest period after which
   their signatures (demangled name, grid, block) repeat, stretched to a whole number of NCCL
   periods when NCCL kernels repeat on a longer cycle, and one anchor kernel that occurs once per
   period; a step runs from one anchor to the next.

Windows tile each rank's GPU timeline: a step starts where its first GPU operation starts, on any
stream, and ends where the next step's starts; the last step ends with its last op. So a step's categories of GPU time sum to its length, and the idle
time between two steps belongs to the step it precedes. Times are each export's own clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from nsysan.errors import InputError
from nsysan.ingest.frames import NVTX_RANGE_TYPES, concat_frames, per_distinct_text
from nsysan.ingest.nccl import NCCL_DOMAIN, is_communication
from nsysan.ingest.trace import Trace

DEFAULT_STEP_PATTERN = r"^\s*(train[_ ]?)?(step|iter|iteration)\b|^ProfilerStep#"
"""NVTX range names that mark one training step (case-insensitive regular expression)."""

MIN_PERIOD_MATCH = 0.9  # share of kernels that must repeat one period later for a kernel-sequence step
_CANDIDATE_PERIODS = 24
_MAX_REPEATS_PER_PERIOD = 8  # a period is found when some kernel occurs at most this often in it
WINDOW_COLUMNS = ["export", "rank", "step", "start_ns", "end_ns"]


@dataclass(frozen=True)
class Steps:
    """The steps of a trace: ``windows`` (export, rank, step, start_ns, end_ns; ``step`` counts
    from 0 per rank; export clock), where they came from (``source``: "nvtx", "kernel_sequence",
    "capture" when neither found any, None without GPU work) and in words (``detail``)."""

    source: str | None
    detail: str | None
    windows: pd.DataFrame


def check_pattern(step_pattern: str) -> None:
    try:
        re.compile(step_pattern)
    except re.error as exc:
        raise InputError(f"--step-pattern {step_pattern!r}: not a regular expression ({exc})") from None


def gpu_ops(trace: Trace) -> pd.DataFrame:
    """Every kernel, memcpy and memset of known rank: export, rank, pid, device, stream,
    correlation_id, start_ns, end_ns, short_name and nccl_kind (kernels'), bytes, pageable and copy_kind
    (copies': the memcpy kind's label, or "memset"), ``graph`` (run by a CUDA graph launch) and ``what`` (0 compute, 1 NCCL, 2 copy
    or memset), sorted by (export, rank, start)."""
    k = trace.kernel_columns(("pid", "device", "stream", "correlation_id", "start_ns", "end_ns", "short_name",
                              "graph_node_id"))  # fmt: skip
    cols = ["export", "rank", "pid", "device", "stream", "correlation_id", "start_ns", "end_ns"]
    parts = [k[[*cols, "short_name", "nccl_kind"]].assign(what=np.where(is_communication(k).to_numpy(), 1, 0)
                                                            .astype(np.int8), bytes=0, pageable=False,
                                                            copy_kind="", graph=k["graph_node_id"].notna())]  # fmt: skip
    for frame, label in ((trace.memcpy, None), (trace.memset, "memset")):
        if len(frame):
            none = pd.Categorical([None] * len(frame))
            kind = frame["copy_kind"].astype(str) if label is None else label
            pageable = np.zeros(len(frame), dtype=bool)
            for side in ("src_kind", "dst_kind"):
                if side in frame:
                    pageable |= frame[side].astype(str).str.lower().str.contains("pageable", regex=False).to_numpy()
            parts.append(frame[cols].assign(short_name=none, nccl_kind=none, what=np.int8(2), copy_kind=kind,
                                            bytes=frame["bytes"].fillna(0).astype("int64"), pageable=pageable,
                                            graph=frame["graph_node_id"].notna()))  # fmt: skip
    ops = concat_frames(parts)
    ops["copy_kind"] = ops["copy_kind"].astype("category")
    ops = ops[ops["rank"].notna() & ops["device"].notna() & ops["stream"].notna()]
    ops = ops.astype({"rank": "int64", "device": "int64", "stream": "int64", "pid": "int64"})
    ops["correlation_id"] = ops["correlation_id"].fillna(-1).astype("int64")
    return ops.sort_values(["export", "rank", "start_ns"], kind="stable").reset_index(drop=True)


def find_steps(trace: Trace, step_pattern: str, ops: pd.DataFrame | None = None) -> Steps:
    """The step windows of ``trace``: NVTX step ranges projected onto the GPU when any rank has
    them, else the repeating kernel sequence (see the module docstring), else each rank's GPU
    activity as one step (source "capture"). ``ops``: :func:`gpu_ops` when the caller has it."""
    check_pattern(step_pattern)
    ops = gpu_ops(trace) if ops is None else ops
    ranges = nvtx_step_ranges(trace, step_pattern)
    if len(ranges):
        windows = _project(trace, ranges, ops)
        if len(windows):
            return Steps("nvtx", f"NVTX ranges matching '{step_pattern}', projected onto the GPU", windows)
    windows, anchors = sequence_steps(trace, ops)
    if len(windows):
        detail = "; ".join(dict.fromkeys(text for _, text in sorted(anchors)))
        return Steps("kernel_sequence", detail, windows)
    if ops.empty:
        return Steps(None, None, _empty())
    # neither: each rank's GPU activity as one step, so its time is still accounted for
    spans = ops.groupby(["export", "rank"]).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max")).reset_index()
    return Steps("capture", "no NVTX step ranges and no repeating kernel sequence: each rank's GPU activity is one "
                 "step", _number(spans.assign(step=0)))  # fmt: skip


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in WINDOW_COLUMNS})


def nvtx_step_ranges(trace: Trace, step_pattern: str) -> pd.DataFrame:
    """Outermost NVTX ranges whose name matches ``step_pattern``, on the thread of each rank that
    has the most of them: export, rank, pid, tid, start_ns, end_ns (host time), text."""
    v = trace.nvtx
    cols = ["export", "rank", "pid", "tid", "start_ns", "end_ns", "text"]
    if v.empty:
        return pd.DataFrame(columns=cols)
    ranges = v[v["event_type"].isin(NVTX_RANGE_TYPES) & v["end_ns"].notna() & v["rank"].notna()]
    ranges = ranges[ranges["domain"].astype(str) != NCCL_DOMAIN]
    rx = re.compile(step_pattern, re.IGNORECASE)
    hits = per_distinct_text(ranges["text"], lambda texts: np.array([bool(rx.search(t)) for t in texts], dtype=bool))
    r = ranges[hits].sort_values(["export", "rank", "pid", "tid", "start_ns"], kind="stable")
    if r.empty:
        return pd.DataFrame(columns=cols)
    # a step range inside another one (same thread) is a sub-step: keep the outermost
    prev_end = r.groupby(["export", "pid", "tid"])["end_ns"].transform(lambda e: e.cummax().shift(1))
    r = r[prev_end.isna() | (r["start_ns"] >= prev_end)]
    counts = r.groupby(["export", "rank", "pid", "tid"]).size().rename("n").reset_index()
    best = counts.sort_values("n", ascending=False, kind="stable").drop_duplicates(["export", "rank"])
    r = r.merge(best[["export", "rank", "pid", "tid"]], on=["export", "rank", "pid", "tid"])
    r = r.astype({"rank": "int64", "pid": "int64", "tid": "int64", "start_ns": "int64", "end_ns": "int64"})
    return r[cols].sort_values(["export", "rank", "start_ns"], kind="stable").reset_index(drop=True)


def _project(trace: Trace, ranges: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Host step ranges onto the GPU, by the correlation ids of the calls made inside them."""
    calls = trace.api_calls(("start_ns", "correlation_id"))
    calls = calls.dropna(subset=["correlation_id"])
    out = []
    for (export, rank, pid), r in ranges.groupby(["export", "rank", "pid"], sort=True):
        mine = calls[(calls["export"] == export) & (calls["pid"] == pid)]
        if mine.empty:
            continue
        order = np.argsort(mine["start_ns"].to_numpy(), kind="stable")
        t = mine["start_ns"].to_numpy()[order]
        cid = mine["correlation_id"].to_numpy(dtype=np.int64)[order]
        # the smallest id of the calls from each point on: ids grow with call order per thread,
        # and a process's threads interleave, so take the minimum over the suffix
        suffix_min = np.minimum.accumulate(cid[::-1])[::-1]
        at = np.searchsorted(t, r["start_ns"].to_numpy(), side="left")
        first = np.where(at < len(t), suffix_min[np.minimum(at, len(t) - 1)], np.iinfo(np.int64).max)
        after = np.searchsorted(t, r["end_ns"].to_numpy(), side="left")
        last = np.where(after < len(t), suffix_min[np.minimum(after, len(t) - 1)], np.iinfo(np.int64).max)
        g = ops[(ops["export"] == export) & (ops["rank"] == rank)]
        g = g[g["pid"] == pid] if (g["pid"] == pid).any() else g
        if g.empty:
            continue
        bounds = np.maximum.accumulate(first)  # step k: ids in [bounds[k], bounds[k+1]), the last up to its range's end
        upper = np.append(bounds[1:], max(int(last[-1]), int(bounds[-1])))
        corr = g["correlation_id"].to_numpy()
        step = np.searchsorted(bounds, corr, side="right") - 1
        inside = step >= 0
        inside[inside] = corr[inside] < upper[step[inside]]
        windows = _tile(g[inside], step[inside], len(r))
        if len(windows):
            out.append(windows.assign(export=int(cast(int, export)), rank=int(cast(int, rank))))
    if not out:
        return _empty()
    return _number(pd.concat(out, ignore_index=True))


def _tile(g: pd.DataFrame, step: np.ndarray, n: int) -> pd.DataFrame:
    """Windows that tile a rank's GPU time from its ops' step numbers: step k starts with its first
    op, on any stream, and ends where the next step starts (never before it starts)."""
    if not len(g):
        return pd.DataFrame(columns=["step", "start_ns", "end_ns"])
    start = g["start_ns"].to_numpy()
    end = g["end_ns"].to_numpy()
    big = np.iinfo(np.int64).max
    first = np.full(n, big, dtype=np.int64)
    np.minimum.at(first, step, start)
    last_end = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_end, step, end)
    has = first < big
    begin = first[has]
    stop = last_end[has]
    begin = np.maximum.accumulate(begin)
    finish = np.append(begin[1:], max(int(stop[-1]), int(begin[-1])))
    return pd.DataFrame({"step": np.flatnonzero(has), "start_ns": begin, "end_ns": finish})


def _number(windows: pd.DataFrame) -> pd.DataFrame:
    """Windows with ``step`` renumbered 0.. per rank, in the column order of WINDOW_COLUMNS."""
    w = windows.sort_values(["export", "rank", "start_ns"], kind="stable").reset_index(drop=True)
    w["step"] = w.groupby(["export", "rank"]).cumcount()
    return w[WINDOW_COLUMNS].astype("int64")


# -- steps from the repeating kernel sequence -------------------------------------------------------


def _period(codes: np.ndarray) -> int | None:
    """The smallest number of kernels after which the sequence repeats itself (>= 90% of positions
    equal one period later), or None. Candidates come from the gaps between repeats of each
    kernel, so only a few lengths are tested, each in one vectorised comparison."""
    n = len(codes)
    if n < 6:
        return None
    order = np.argsort(codes, kind="stable")  # positions grouped by signature, ascending within each
    sorted_codes = codes[order]
    spans = []
    for c in range(1, _MAX_REPEATS_PER_PERIOD + 1):  # a kernel run c times per period recurs c positions later
        same = sorted_codes[c:] == sorted_codes[:-c]
        spans.append((order[c:] - order[:-c])[same])
    counts = np.bincount(np.concatenate(spans), minlength=1)  # spans are 1..n-1: counted, not sorted
    values = np.flatnonzero(counts)
    counts = counts[values]
    keep = (values >= 2) & (values * 3 <= n)
    best = values[keep][np.argsort(-counts[keep], kind="stable")][:_CANDIDATE_PERIODS]
    for p in np.sort(best):
        if np.mean(codes[p:] == codes[:-p]) >= MIN_PERIOD_MATCH:
            return int(p)
    return None


def _nccl_period(compute_before: np.ndarray) -> int | None:
    """How many compute kernels one cycle of NCCL kernels spans, from the number of compute
    kernels started before each NCCL kernel, when that repeats (None otherwise)."""
    if len(compute_before) < 3:
        return None
    gaps = np.diff(compute_before)
    for cycle in range(1, min(16, len(gaps) // 2) + 1):
        spans = compute_before[cycle:] - compute_before[:-cycle]
        if len(spans) and spans[0] > 0 and np.mean(spans == spans[0]) >= MIN_PERIOD_MATCH:
            return int(spans[0])
    return None


def sequence_steps(trace: Trace, ops: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[int, str]]]:
    """Steps from a repeating kernel sequence (see the module docstring): windows and, per rank,
    the anchor kernel in words."""
    k = trace.kernel_columns(("pid", "start_ns", "end_ns", "name", "short_name", "grid", "block"))
    k = k[k["rank"].notna()]
    if k.empty:
        return _empty(), []
    nccl = is_communication(k).to_numpy()
    name = k["name"].astype("category").cat.codes.to_numpy(dtype=np.int64)
    short = k["short_name"].astype("category").cat.codes.to_numpy(dtype=np.int64)
    grid = k["grid"].fillna(0).to_numpy(dtype=np.int64)
    block = k["block"].fillna(0).to_numpy(dtype=np.int64)
    sig = (
        pd.DataFrame({"n": name, "s": short, "g": grid, "b": block}).groupby(["n", "s", "g", "b"], sort=False).ngroup()
    )
    frame = pd.DataFrame({"export": k["export"].to_numpy(), "rank": k["rank"].astype("int64").to_numpy(),
                          "start_ns": k["start_ns"].to_numpy(), "end_ns": k["end_ns"].to_numpy(),
                          "sig": sig.to_numpy(), "nccl": nccl, "row": np.arange(len(k))})  # fmt: skip
    frame = frame.sort_values(["export", "rank", "start_ns"], kind="stable")
    rows, anchors = [], []
    for (export, rank), g in frame.groupby(["export", "rank"], sort=True):
        comp = g[~g["nccl"].to_numpy()]
        codes, uniques = pd.factorize(comp["sig"])
        p = _period(codes)
        if p is None:
            continue
        coll = g["nccl"].to_numpy()
        if coll.any():  # NCCL kernels on a longer cycle: a step holds whole cycles of both
            before = np.cumsum(~coll)[coll]
            cycle = _nccl_period(before)
            # a cycle longer than the compute period spans several of them (the all-reduce every
            # other micro-batch); a shorter one repeats inside the step (a pipeline's sends and
            # receives every few kernels) and says nothing about where steps begin
            if cycle is not None and cycle > p:
                p = int(np.lcm(p, cycle))
            if p * 3 > len(codes):
                continue
        counts = np.bincount(codes, minlength=len(uniques))
        once = [c for c in dict.fromkeys(codes[:p]) if abs(counts[c] * p - len(codes)) <= p]
        if once:  # the heaviest kernel that runs once per period marks where a step starts
            dur = np.bincount(codes, weights=(comp["end_ns"] - comp["start_ns"]).to_numpy(), minlength=len(uniques))
            idx = np.flatnonzero(codes == max(once, key=lambda c: dur[c]))
        else:  # every kernel repeats within the period: start periods where the sequence agrees best
            table = codes[: len(codes) // p * p].reshape(-1, p)
            if len(table) < 2:
                continue
            offset = int(np.argmax((table == table[1]).mean(axis=0)))  # row 1: a prologue may spoil row 0
            idx = np.arange(offset, len(codes), p)
            idx = idx[codes[idx] == table[1, offset]]
        starts = comp["start_ns"].to_numpy()[idx]
        regular = np.diff(idx) == p  # a missing or extra kernel breaks that step: leave it out
        if regular.sum() < 2:
            continue
        # steps tile the rank's timeline from the first regular anchor to the end of its last step
        keep = np.flatnonzero(regular)
        begin, finish = starts[keep], starts[keep + 1]
        # a gap where the sequence broke: the step before it ends where the broken stretch starts
        rows.append(pd.DataFrame({"export": int(export), "rank": int(rank), "step": 0, "start_ns": begin,  # type: ignore[call-overload]
                                  "end_ns": finish}))  # fmt: skip
        first = int(comp["row"].iloc[int(idx[0])])
        label = str(k["short_name"].iloc[first])
        anchors.append((int(rank),  # type: ignore[call-overload]
                        f"{label} " + (f"once every {p} compute kernels" if once else f"starting each period of {p} compute kernels")))  # fmt: skip
    if not rows:
        return _empty(), []
    return _number(pd.concat(rows, ignore_index=True)), anchors
