"""comm_compute_slowdown: compute kernels that run longer while communication shares the GPU.

NCCL kernels take SMs and memory bandwidth; peer and host copies take memory bandwidth. Tools
report how much communication *overlaps* compute; this measures what the overlap *costs*.

Definition
----------
An instance of a compute kernel is *slowed by* a class of communication when

- the class covers at least ``overlap_share`` of its duration (classes, never pooled: NCCL
  kernel, peer copy (Peer-to-Peer), host copy (Host-to-Device / Device-to-Host); an instance two
  classes each cover that much belongs to the combined class, e.g. "NCCL kernel + host copy");
- its duration, divided by its step's clock factor, is at least ``min_ratio`` x the *expected*
  duration and more than ``clean_margin`` above the largest clean duration (the 90th percentile
  beyond 10 clean instances), where expected is the mean of the CLEAN instances (no
  communication at all) of the same kernel at the same program position, clock-corrected, after
  dropping the lowest and highest tenth (their agreement is checked first, so the mean is safe
  and has less noise than the median).

"The same kernel" is the demangled name + grid + block (short names are shared by unrelated
kernels: every PyTorch elementwise functor is ``vectorized_elementwise_kernel``, apex's Adam and a
unary functor are both ``multi_tensor_apply_kernel``). "The same program position" is the path
of NVTX push/pop ranges (other than NCCL's own) enclosing the kernel's launch call on its thread,
digits replaced by ``#`` ("step 12/backward" -> "step #/backward"), plus the kernel's ordinal
among the kernels of its signature and path within its step (a wgrad GEMM in "backward" does
more work than the forward GEMM of the same name and shape). A *step* is the outermost
enclosing range instance whose path occurs more than once on its thread ("step 12"; a wrapper
seen once, like "Epoch 2" or "Jacobi Solve", is not a step). Kernels launched outside any step
(or traces without NVTX) are compared by signature alone, over the whole trace as one step.

A baseline is valid with as few as ``min_samples`` (2) clean instances when they agree: their
spread (90th - 10th percentile; max - min up to 10 samples) is at most ``baseline_spread`` of
expected. That lets once-per-step kernels be judged, and refuses positions whose clean instances
do different amounts of work.

Clock factor: per step, the interquartile mean of duration / expected over its clean kernels
(expected first from raw medians, then once more from the corrected baselines); a power- or
thermal-capped step runs every kernel slower, including those under NCCL, and dividing by the
factor keeps it from being blamed on communication. It is applied only when the step has
``clock_kernels`` such kernels whose ratios agree (interquartile spread within
``baseline_spread``: a cap slows everything alike, data-dependent durations do not) and it is
more than ``clock_tolerance`` from 1 (closer is jitter).

One finding per *episode*: consecutive slowed instances of one signature and cause in one step
(any other instance of the signature in between ends the episode). The cause is the first class
of an instance (NCCL before peer before host copies): a kernel slowed under NCCL, some instances
with a host copy too, is one group with one fix, its classes counted in the evidence. Window = first slowed start
to last slowed end. Impact = sum of (actual - expected x clock factor), in real ns. Episodes of
the same (rank, device, kernel, cause) share a group key; severity comes from the group's total
(``common.grade``).

Thresholds, and why
-------------------
``min_ratio`` 1.15 and ``clean_margin`` 5%: kernel jitter is a few percent; a slowdown both 15%
above expected and clearly above every clean instance is not jitter. ``overlap_share`` 0.5: a
64 KB metrics all-reduce touching a tenth of a GEMM neither slows it measurably nor says what
the rest of its time did; such partly covered instances are neither clean nor judged.
``baseline_spread`` 10%: wider than jitter, narrower than forward vs backward work.
``min_samples`` 2: two clean instances that agree within ``baseline_spread`` are a baseline; more
are not needed when they agree, and once-per-step kernels rarely have more per position.
``clock_kernels`` 8 and ``clock_tolerance`` 3%: fewer kernels, or a smaller deviation, cannot be
told from jitter. ``min_impact_ns`` 10 us: an episode costing less is below what anyone would
act on.

Blind spots
-----------
A position with no clean instance (communication always overlaps it, as a DDP bucket may) falls
back to the same kernel's clean instances at other ordinals of its NVTX path, then (kernels whose
launch shape fixes their work only) at any other position, then to the rank's contention factor;
where none applies it is not judged; nor are kernels whose clean instances disagree. Without NVTX, kernels
of one signature doing different work are pooled; the spread check then usually refuses them.
An instance under communication that compute on another stream (or a graph node beside it) also
shared the GPU with for ``overlap_share`` of its time or more is not judged: either could have
slowed it (a DALI kernel beside the training stream is not NCCL's doing); its time is reported as
unjudged. Contention with other compute streams and with device-to-device copies is not separated
from "clean". Iteration numbers are removed with all other digits of a range name, so ranges that
differ only by numbers (tensor sizes in emit_nvtx names) share a path. Launches on a thread
other than the one holding the step ranges (PyTorch's autograd thread) fall back to signature.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from nsysan.arrays import distinct
from nsysan.detect.common import SeverityParams, grade, run_ns, share_text
from nsysan.detect.registry import Verdicts, param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.frames import per_distinct_text, unpack_shape
from nsysan.ingest.nccl import NCCL_COLUMNS, NCCL_DOMAIN, is_communication
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_arrays, union_arrays

KIND = "comm_compute_slowdown"
CLASSES = ("NCCL kernel", "peer copy", "host copy")  # bit i of an instance's class mask
_COPY_CLASS = {"Peer-to-Peer": 1, "Host-to-Device": 2, "Device-to-Host": 2}
_COLUMNS = ("pid", "device", "correlation_id", "start_ns", "end_ns", "name", "short_name", "grid", "block")
_EVIDENCE_INSTANCES = 20
# NVTX nesting levels a program position tells apart; deeper ranges fold into the last level.
MAX_PATH_DEPTH = 64
_ADVICE = {
    0: ("NCCL kernels are taking SMs and memory bandwidth from this kernel. Cap NCCL's share while it "
        "overlaps compute (NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS, fewer NCCL_NCHANNELS_PER_NET_PEER), move "
        "point-to-point traffic to copy engines (cudaMemcpyPeerAsync, nsysan's P2P transport), or time the "
        "buckets (DDP bucket_cap_mb, FSDP prefetch) so communication overlaps memory-light compute."),
    1: ("Peer copies are competing for memory (HBM/NVLink) bandwidth with this kernel. Send in smaller "
        "chunks, schedule the copies beside compute-bound kernels, or delay them to an idle window."),
    2: ("Host copies are competing for memory bandwidth with this kernel. Prefetch from pinned memory "
        "beside compute-bound kernels (DataLoader pin_memory, non_blocking=True at a quieter point), or "
        "batch small copies."),
}  # fmt: skip


@dataclass(frozen=True)
class Params(SeverityParams):
    overlap_share: float = param(0.5, "share of a kernel's time one class of communication must cover to count it")
    min_samples: int = param(2, "clean instances needed at a program position for a baseline (they must also agree)")
    baseline_spread: float = param(
        0.10, "largest spread of a position's clean durations (share of expected) for a baseline"
    )
    min_ratio: float = param(1.15, "clock-corrected duration / expected needed to call an overlapped instance slowed")
    clean_margin: float = param(0.05, "how far above the largest clean duration a slowed instance must be")
    clock_tolerance: float = param(0.03, "a step's clock factor this close to 1 is jitter and is not applied")
    clock_kernels: int = param(8, "clean kernels with a baseline a step needs before its clock factor is applied")
    min_impact_ns: int = param(10_000, "smallest episode impact (ns) to report")


# -- communication and coverage ------------------------------------------------------------------


def _communication(trace: Trace, kernels: pd.DataFrame) -> pd.DataFrame:
    """(export, device, cls, start_ns, end_ns, what) of every NCCL kernel and peer/host copy; a peer
    copy counts on both its source and destination device (it loads both memories)."""
    nccl = kernels[is_communication(kernels)]
    parts = [pd.DataFrame({"export": nccl["export"], "device": nccl["device"], "cls": 0, "start_ns": nccl["start_ns"],
                           "end_ns": nccl["end_ns"], "what": nccl["short_name"].astype(str)})]  # fmt: skip
    m = trace.memcpy
    if len(m):
        kind = m["copy_kind"].astype(str)
        copies = m[kind.isin(_COPY_CLASS)]
        kind = kind[copies.index]
        base = {"export": copies["export"], "cls": kind.map(_COPY_CLASS), "start_ns": copies["start_ns"],
                "end_ns": copies["end_ns"], "what": kind + " copy"}  # fmt: skip
        parts.append(pd.DataFrame({**base, "device": copies["device"]}))
        peer = kind == "Peer-to-Peer"
        for side in ("src_device", "dst_device"):
            other = copies[side].where((peer & (copies[side] != copies["device"])).fillna(False).astype(bool))
            parts.append(pd.DataFrame({**base, "device": other}))
    comm = pd.concat(parts, ignore_index=True).dropna(subset=["device", "start_ns", "end_ns"])
    return comm.astype({"device": "int64", "cls": "int64", "start_ns": "int64", "end_ns": "int64"})


def _coverage(compute: pd.DataFrame, comm: pd.DataFrame) -> np.ndarray:
    """ns of each compute kernel covered by each class of communication on its device: (n, 3)."""
    covered = np.zeros((len(compute), len(CLASSES)), dtype=np.int64)
    if comm.empty:
        return covered
    starts, ends = compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy()
    where = compute.groupby(["export", "device"]).indices
    for key, g in comm.groupby(["export", "device", "cls"]):  # a few per device
        export, device, cls = cast(tuple[int, int, int], key)
        idx = where.get((export, device))
        if idx is not None:
            lo, hi = union_arrays(g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
            covered[idx, cls] = covered_arrays(starts[idx], ends[idx], lo, hi)
    return covered


def _beside_compute(compute: pd.DataFrame) -> np.ndarray:
    """ns of each compute kernel during which another compute kernel ran on its device too (another
    stream, or graph nodes running side by side): the time where SMs were shared with compute."""
    out = np.zeros(len(compute), dtype=np.int64)
    starts, ends = compute["start_ns"].to_numpy(np.int64), compute["end_ns"].to_numpy(np.int64)
    for idx in compute.groupby(["export", "device"]).indices.values():
        s, e = starts[idx], ends[idx]
        t = np.concatenate([s, e])
        step = np.concatenate([np.ones(len(s), np.int64), -np.ones(len(e), np.int64)])
        order = np.lexsort((step, t))  # at one instant, ends before starts: touching is not sharing
        t, depth = t[order], np.cumsum(step[order])
        two = (depth[:-1] >= 2) & (t[1:] > t[:-1])  # [t[i], t[i + 1]) with two or more kernels running
        out[idx] = covered_arrays(s, e, t[:-1][two], t[1:][two])
    return out


# -- program position from NVTX ------------------------------------------------------------------


def _positions(trace: Trace, compute: pd.DataFrame) -> pd.DataFrame:
    """Per compute kernel: ``step`` (id of the step range enclosing its launch call, -1 when none),
    ``step_text`` and ``path`` (range names from the outermost down to the innermost range
    enclosing the launch, digits as '#'; "" when none).

    Texts are object columns and ``path`` a categorical in sorted order: a million kernels share a
    few hundred texts, and grouping by a path's code gives the groups in the order of its text.
    """
    n = len(compute)
    out = pd.DataFrame({"step": np.full(n, -1, dtype=np.int64), "step_text": pd.Series(np.full(n, "", dtype=object), dtype=object),
                        "path": _sorted_categorical(np.zeros(n, dtype=np.int64), np.array([""], dtype=object))})  # fmt: skip
    v = trace.nvtx
    if v.empty:
        return out
    # NCCL's own ranges wrap its API calls, which launch only NCCL kernels: they never enclose a
    # compute launch, and a capture without user ranges then needs no launch call read at all
    r = v[(v["event_type"] == "push_pop") & (v["domain"] != NCCL_DOMAIN) & v["start_ns"].notna() & v["end_ns"].notna()]
    r = r[r["end_ns"] > r["start_ns"]]
    if r.empty or "correlation_id" not in compute:
        return out
    calls = trace.launch_calls(
        compute[["export", "pid", "correlation_id"]].dropna(), columns=("tid", "start_ns", "end_ns")
    )
    calls = _one_per_launch(calls.dropna(subset=["start_ns", "correlation_id"]))
    launch = compute[["export", "pid", "correlation_id"]].merge(
        calls[["export", "pid", "correlation_id", "tid", "start_ns"]],
        how="left",
        on=["export", "pid", "correlation_id"],
    )
    del calls
    r = r.assign(**_texts(r["text"]))
    step = out["step"].to_numpy().copy()
    step_text = np.full(n, "", dtype=object)
    path = np.full(n, -1, dtype=np.int64)  # into the threads' path texts, one after the other
    texts: list[np.ndarray] = []
    offset = 0
    points = launch.dropna(subset=["tid", "start_ns"])
    del launch
    by_thread = points.groupby(["export", "pid", "tid"]).indices
    next_id = 0
    for key, ranges in r.groupby(["export", "pid", "tid"]):  # threads with ranges: a handful
        idx = by_thread.get(key)
        if idx is None:
            continue
        rows = points.index.to_numpy()[idx]
        found = _enclosing(ranges, points["start_ns"].to_numpy(dtype=np.int64)[idx])
        inside = found["top"] >= 0
        rows = rows[inside]
        step[rows] = next_id + found["top"][inside]
        step_text[rows] = found["top_text"][inside]
        path[rows] = offset + found["path"].codes[inside].astype(np.int64)
        texts.append(found["path"].categories.to_numpy(dtype=object))
        offset += len(texts[-1])
        next_id += len(ranges)
    path[path < 0] = offset  # "", after every thread's texts
    paths = _sorted_categorical(path, np.concatenate([*texts, np.array([""], dtype=object)]))
    return pd.DataFrame({"step": step, "step_text": pd.Series(step_text, dtype=object), "path": paths})


def _one_per_launch(calls: pd.DataFrame) -> pd.DataFrame:
    """``calls`` with one row per (export, pid, correlation id), the first. Launches are almost
    always unique already: that is checked on one packed key, id first, sorted in numpy (calls
    come nearly in id order, which a stable sort runs through: 0.03 s for 8M), and only
    duplicates pay for pandas' three-column hashing (0.8 s for 8M)."""
    keys = ["export", "pid", "correlation_id"]
    export, pid, cid = (calls[c].to_numpy(dtype=np.int64, na_value=-1) for c in keys)
    packable = len(calls) > 0 and bool((export == export[0]).all())
    packable = packable and pid.min() >= 0 and pid.max() < 2**31 and cid.min() >= 0 and cid.max() < 2**32
    if packable:
        key = np.sort(cid * 2**31 + pid, kind="stable")  # at most 2**63 - 1
        if not (key[1:] == key[:-1]).any():
            return calls
    return calls.drop_duplicates(keys)


def _sorted_categorical(codes: np.ndarray, texts: np.ndarray) -> pd.Categorical:
    """``texts[codes]`` as a categorical whose categories are the distinct texts in sorted order."""
    distinct, where = np.unique(texts, return_inverse=True)
    return pd.Categorical.from_codes(where[codes], categories=pd.Index(distinct, dtype=object))


def _texts(text: pd.Series) -> dict[str, pd.Series]:
    """``raw`` (the range's text, "nan" where it has none) and ``norm`` (digits as '#') of each
    range, as object columns (not pandas' string type: a million strings would be copied into
    Arrow and out again). Worked out once per distinct text and taken by code: a million ranges of
    a PyTorch capture hold a few hundred texts."""
    codes, uniques = pd.factorize(text.astype(object), use_na_sentinel=False)
    raw = np.array([str(u) for u in uniques], dtype=object)
    norm = np.array([re.sub(r"\d+", "#", u) for u in raw], dtype=object)
    return {name: pd.Series(texts.take(codes), index=text.index, dtype=object)
            for name, texts in (("norm", norm), ("raw", raw))}  # fmt: skip


def _enclosing(ranges: pd.DataFrame, t: np.ndarray) -> dict[str, Any]:
    """For points ``t`` on one thread: the step range containing each (index in start order, -1 if
    none), its raw text, and the normalised path down to the innermost range containing it.

    The step is the outermost enclosing range whose path occurs more than once on the thread: a
    range seen once ("Epoch 2", "Jacobi Solve") wraps the run and is not a step, and counting
    kernels from its start would give every kernel its own position.

    Push/pop ranges nest, so a range's depth is how many earlier ranges are still open at its start,
    and the range at depth d enclosing anything after range i is the last range of depth d started
    at or before i: one running maximum per depth level, no loop over rows.

    Levels stop at :data:`MAX_PATH_DEPTH`: ranges nested deeper (pushes without pops, an ordinary
    instrumentation slip) are folded into their ancestor at the last level, whose path gets "/…"
    and whose step they share. Work is then at most that many passes over the ranges, and no path
    text grows with the nesting (20k unpopped pushes took 3.3 GB and quadratic time before).
    """
    start = ranges["start_ns"].to_numpy(dtype=np.int64)
    end = ranges["end_ns"].to_numpy(dtype=np.int64)
    by_start = np.lexsort((-end, start))  # start, then the longer (outer) first; stable
    start, end = start[by_start], end[by_start]
    norm = ranges["norm"].to_numpy(dtype=object)[by_start]
    raw = ranges["raw"].to_numpy(dtype=object)[by_start]
    order = np.arange(len(start))
    ends = np.sort(end)
    depth = np.maximum(order - np.searchsorted(ends, start, side="right"), 0)
    latest = np.searchsorted(start, t, side="right") - 1  # last range started at or before t
    open_now = latest + 1 - np.searchsorted(ends, t, side="right")  # ranges with start <= t < end
    safe = np.maximum(latest, 0)
    # Paths as ids into ``texts``, one id per distinct path text: each level joins (parent's path,
    # own name) pairs, of which a thread has a few hundred, not a string per range.
    name, names = pd.factorize(norm)
    width = len(names)
    texts = [str(n) for n in names]
    known = {text: i for i, text in enumerate(texts)}  # names are distinct: ids 0..width-1
    path = name.astype(np.int64)
    parent = np.full(len(start), -1, dtype=np.int64)
    inner = np.full(len(t), -1, dtype=np.int64)
    deepest = min(int(depth.max()), MAX_PATH_DEPTH - 1)
    levels = range(deepest + 1)  # nesting levels, not rows
    deep = depth > deepest  # folded into their ancestor at the last level
    for d in levels:
        last_d = np.maximum.accumulate(np.where(depth == d, order, -1))
        child = np.flatnonzero(depth == d + 1) if d < deepest else np.flatnonzero(deep)
        parent[child] = last_d[child]
        ok = child[parent[child] >= 0]
        # a folded range's path is its ancestor's with "/…" (the name index ``width`` stands for it)
        pairs, which = np.unique(path[parent[ok]] * (width + 1) + np.where(deep[ok], width, name[ok]),
                                 return_inverse=True)  # fmt: skip
        ids = []
        for p in pairs.tolist():
            text = texts[p // (width + 1)] + "/" + (texts[p % (width + 1)] if p % (width + 1) < width else "…")
            if text not in known:
                known[text] = len(texts)
                texts.append(text)
            ids.append(known[text])
        path[ok] = np.array(ids, dtype=np.int64)[which]
        hit = ((open_now - 1 == d) | ((open_now - 1 > d) & (d == deepest))) & (latest >= 0)
        inner[hit] = last_d[safe[hit]]
        if d == deepest:  # a point inside folded ranges is inside the folded path
            folded = hit & (open_now - 1 > d)
            inner[folded] = np.maximum.accumulate(np.where(deep, order, -1))[safe[folded]]
    if "" not in known:  # the path of a point in no range
        known[""] = len(texts)
        texts.append("")
    paths = pd.Index(np.array(texts, dtype=object), dtype=object)
    repeats = np.bincount(path)[path] > 1
    step = np.where(repeats & ~deep, order, -1)
    for d in [*levels[1:], deepest + 1]:  # parents before children: a repeating ancestor wins
        at = np.flatnonzero((depth == d) & (parent >= 0)) if d <= deepest else np.flatnonzero(deep & (parent >= 0))
        above = step[parent[at]]
        step[at] = np.where(above >= 0, above, step[at])
    found = inner >= 0
    top = np.where(found, step[np.maximum(inner, 0)], -1)
    placed = top >= 0
    return {
        "top": top,
        "top_text": np.where(placed, raw[np.maximum(top, 0)], ""),
        "path": pd.Categorical.from_codes(np.where(placed, path[np.maximum(inner, 0)], known[""]), categories=paths),
    }


# -- baselines, clock factors, decisions -----------------------------------------------------------


def _clean_stats(clean: pd.DataFrame, value: str) -> pd.DataFrame:
    """Per position: n, lo/hi (10th/90th percentile; min/max up to 10 samples) and the mean of the
    values within [lo, hi]."""
    g = clean.groupby("pos")[value]
    stats = pd.DataFrame({"n": g.size(), "lo": g.quantile(0.1, interpolation="lower"),
                          "hi": g.quantile(0.9, interpolation="higher")})  # fmt: skip
    band = clean[["pos", value]].join(stats[["lo", "hi"]], on="pos")
    inside = band[(band[value] >= band["lo"]) & (band[value] <= band["hi"])]
    stats["expected"] = inside.groupby("pos")[value].mean()
    return stats


def _clock_factors(k: pd.DataFrame, p: Params, expected: pd.Series) -> pd.Series:
    """Per kernel: its step's clock factor, the interquartile mean of actual / ``expected`` (per
    position) over the step's clean kernels (as robust as the median, half its noise under jitter);
    1 where the step has too few of them or they disagree."""
    clean = k.loc[k["clean"], ["dur", "pos", "stepkey"]]  # the columns only: k is wide
    ratio = (clean["dur"] / _lookup(expected, clean["pos"].to_numpy())).dropna()
    step = clean.loc[ratio.index, "stepkey"]
    g = ratio.groupby(step)
    lower, upper = g.quantile(0.25), g.quantile(0.75)
    steps = step.to_numpy()
    inside = (ratio.to_numpy() >= _lookup(lower, steps)) & (ratio.to_numpy() <= _lookup(upper, steps))
    factor = ratio[inside].groupby(step[inside]).mean()
    spread = (upper - lower) / g.median()
    # a clock cap slows every kernel of the step alike; ratios that disagree are data, not clocks
    trusted = (g.size() >= p.clock_kernels) & (spread <= p.baseline_spread) & ((factor - 1).abs() > p.clock_tolerance)
    factor = factor.where(trusted, 1.0)
    by_step = _lookup(factor, k["stepkey"].to_numpy())
    return pd.Series(np.where(np.isnan(by_step), 1.0, by_step), index=k.index)


def _lookup(values: pd.Series, keys: np.ndarray) -> np.ndarray:
    """``values`` (indexed by non-negative ints: positions, steps) at ``keys`` as float64, NaN
    where it has none: ``Series.map`` through a dense array, a million keys in one take."""
    if keys.dtype.kind != "i" or (len(keys) and keys.min() < 0) or (len(values) and values.index.min() < 0):
        # not positions or step numbers: mapped the general way
        mapped: np.ndarray = pd.Series(keys).map(values).to_numpy(dtype=np.float64)
        return mapped
    top = int(max(values.index.max() if len(values) else -1, keys.max() if len(keys) else -1)) + 1
    dense = np.full(top, np.nan)
    dense[values.index.to_numpy(dtype=np.int64)] = values.to_numpy(dtype=np.float64)
    out: np.ndarray = dense[keys]
    return out


_GRID = np.linspace(0.0, 0.8, 81)  # share of speed lost under NCCL: 1 - 1 / contention factor


def _contention_baselines(k: pd.DataFrame, p: Params) -> None:
    """Baselines for positions NCCL overlaps every time, from the rank's own contention factor.

    Under NCCL a kernel progresses at 1/f of its speed, so an instance with share ``o`` of its time
    under NCCL lasts ``w / (1 - c o)`` with ``c = 1 - 1/f`` and ``w`` its clean duration. Positions
    whose instances ran under NCCL for different shares of their time show ``c`` (the ``c`` that makes
    their ``d (1 - c o)`` agree best); per (export, rank), over at least ``_MIN_FIT`` such instances,
    and only when that fit is clearly better than no slowdown at all; a rank without such kernels
    takes the median ``c`` of its export's other ranks. Positions always under NCCL (and nothing
    else) then get ``w = median(d (1 - c o))`` as their expected duration. In place."""
    blind = ((k["cls"] & 1) > 0) & k["expected"].isna() & (k["other_share"] == 0)
    if not blind.any():
        return
    pure = (k["other_share"] == 0) & (k["step"] >= 0)
    o_span = k[pure].groupby("pos")["nccl_share"].agg(lambda o: o.max() - o.min())
    size = k[pure].groupby("pos")["nccl_share"].size()
    varying = o_span.index[(o_span >= 0.2) & (size >= 3)]
    fit = k[pure & k["pos"].isin(varying)]
    found: dict[tuple[int, int], float] = {}
    for (export, rank), g in fit.groupby(["export", "rank"], dropna=True):
        if len(g) < _MIN_FIT:
            continue
        d = g["dur"].to_numpy(dtype=np.float64)
        o = g["nccl_share"].to_numpy()
        pos = g["pos"].to_numpy()
        residual = []
        for c in _GRID:
            w = d * (1 - c * o)
            mean = pd.Series(w).groupby(pos).transform("mean").to_numpy()
            residual.append(float(np.sum((w / mean - 1) ** 2)))
        best = int(np.argmin(residual))
        if _GRID[best] >= 0.05 and residual[best] <= 0.5 * residual[0]:
            found[(int(export), int(rank))] = float(_GRID[best])  # type: ignore[call-overload]
    if not found:
        return
    # ranks of the export whose own kernels never showed it: the median of the others' (same job,
    # same kind of GPU, same communication)
    for (export, rank), _rows in k[blind].groupby(["export", "rank"], dropna=True):
        key = (int(export), int(rank))  # type: ignore[call-overload]
        others = [c for (e, _), c in found.items() if e == key[0]]
        if key not in found and not others:
            continue
        c = found.get(key, float(np.median(others)))
        rows = blind & (k["export"] == export) & (k["rank"] == rank)
        w = k.loc[rows, "dur"] * (1 - c * k.loc[rows, "nccl_share"])
        stats = w.groupby(k.loc[rows, "pos"]).agg(["median", "max", "size"])
        stats = stats[stats["size"] >= p.min_samples]
        at = k.index[rows][k.loc[rows, "pos"].isin(stats.index).to_numpy()]
        k.loc[at, "expected"] = k.loc[at, "pos"].map(stats["median"]).to_numpy()
        k.loc[at, "hi"] = k.loc[at, "pos"].map(stats["median"]).to_numpy()
        k.loc[at, "baseline"] = _CONTENTION
        k.loc[at, "contention"] = 1 / (1 - c)


# kernels whose launch shape (grid, block) fixes the work they do: cuDNN's layout transforms (the
# grid follows the tensor's dimensions) and PyTorch's contiguous elementwise kernels (vectorized /
# unrolled: the grid follows the element count, every element read and written once; the generic
# elementwise_kernel serves strided tensors, whose traffic the grid does not tell)
_SHAPE_FIXES_WORK = r"nchwToNhwc|nhwcToNchw|vectorized_elementwise_kernel|unrolled_elementwise_kernel"


def _signature_baselines(k: pd.DataFrame, p: Params) -> None:
    """Baselines for positions communication overlaps every time, from the same kernel's clean
    instances at the other program positions of its device, whatever their NVTX path (a layout
    transform that runs clean in the forward pass and under NCCL in the backward one, launched by
    autograd's thread outside any range; NERSC's DDP ``nchwToNhwcKernel``).

    Only for kernels whose launch shape fixes their work (:data:`_SHAPE_FIXES_WORK`), and only
    where the signature's clean instances come from at least two program positions and agree within
    ``baseline_spread``. A GEMM or convolution of one grid does different work for different
    reduction sizes (NERSC's ``strided_dgrad``: 4.9 us clean in the forward pass, 5-52 us in the
    backward one), and a strided elementwise kernel different memory traffic for different strides:
    those stay unjudged. In place, after the kin baselines."""
    rows = np.flatnonzero(((k["cls"] > 0) & k["expected"].isna()).to_numpy())
    if not len(rows):
        return
    # the names matched once each (a 1M-kernel trace has a few hundred), the blind rows only
    shaped = per_distinct_text(k["name"].iloc[rows], lambda t: t.str.contains(_SHAPE_FIXES_WORK).to_numpy())
    rows = rows[shaped]
    if not len(rows):
        return
    sig = k["sig"].to_numpy()
    fixed = k["clean"].to_numpy() & np.isin(sig, distinct(sig[rows]))
    clean = k.loc[fixed, ["export", "device", "sig", "pos", "corrected"]]
    group = clean.groupby(["export", "device", "sig"], observed=True).ngroup().rename("pos")
    stats = _clean_stats(pd.concat([group, clean["corrected"]], axis=1), "corrected")
    positions = clean.groupby(group)["pos"].nunique()
    keep = (stats["n"] >= max(p.min_samples, 3)) & (positions.reindex(stats.index) >= 2)
    keep &= stats["hi"] - stats["lo"] <= p.baseline_spread * stats["expected"]
    stats = stats[keep]
    if stats.empty:
        return
    key = pd.concat([clean[["export", "device", "sig"]], group], axis=1).drop_duplicates(["export", "device", "sig"])
    table = key.join(stats[["expected", "hi"]], on="pos").dropna(subset=["expected"])
    fill = k.iloc[rows][["export", "device", "sig"]].merge(table, on=["export", "device", "sig"], how="left")
    fill.index = k.index[rows]
    found = fill["expected"].notna()
    rows = fill.index[found]
    k.loc[rows, "expected"] = fill.loc[found, "expected"].to_numpy()
    k.loc[rows, "hi"] = fill.loc[found, "hi"].to_numpy()
    k.loc[rows, "baseline"] = _SIGNATURE


_MIN_FIT = 4
# where a kernel's expected duration came from (column baseline)
_NONE, _POSITION, _KIN, _CONTENTION, _SIGNATURE = 0, 1, 2, 3, 4


def _baseline_text(first: pd.Series) -> str:
    if first["baseline"] == _POSITION:
        return "clean instances at the same program position"
    if first["baseline"] == _KIN:
        return ("clean instances of the same kernel (name, grid, block, NVTX path) elsewhere in the step: "
                "communication overlaps this position every time")  # fmt: skip
    if first["baseline"] == _SIGNATURE:
        return ("clean instances of the same kernel (name, grid, block) at two or more other program positions "
                "that agree (its launch shape fixes its work): communication overlaps this position every time")  # fmt: skip
    return (
        f"the rank's contention factor {float(first['contention']):.2f} under NCCL, measured on kernels NCCL "
        "overlapped for varying shares of their time, applied to this position, which NCCL overlaps every time"
    )


def _class_label(mask: int) -> str:
    return " + ".join(CLASSES[i] for i in range(len(CLASSES)) if mask >> i & 1)


def _primary(mask: np.ndarray) -> np.ndarray:
    """The cause an instance is grouped by: the first of its classes (NCCL before copies). A kernel
    slowed under NCCL, sometimes with a host copy too, is one problem with one fix: the classes
    are evidence (``classes``), not separate groups that each stay below the warning share."""
    m = np.asarray(mask, dtype=np.int64)
    return np.bitwise_and(m, -m)


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> Verdicts:
    """Compute kernels slower while NCCL kernels or peer/host copies run on the same GPU."""
    k = judge(trace, p)
    if k is None:
        return Verdicts([])
    unjudged = _unjudged(k, p)
    if not k["slowed"].any():
        return Verdicts([], unjudged)
    comm = _communication(trace, trace.kernel_columns(_COLUMNS).dropna(subset=["device"]))
    return Verdicts(_episodes(trace, k, comm, p), unjudged)


def _unjudged(k: pd.DataFrame, p: Params) -> list[dict[str, object]]:
    """Per rank, the compute time that ran under communication but could not be judged: no clean
    instance of the kernel at its program position agreed enough to be a baseline, or compute on
    another stream shared the GPU with it for ``overlap_share`` of its time or more (either could
    be the cause)."""
    out: list[dict[str, object]] = []
    under = (k["cls"] > 0) & k["rank"].notna()
    reasons = (
        (under & k["ambiguous"], "ran under communication while compute on another stream shared the GPU for "
                                 f"{p.overlap_share:.0%} of their time or more: the two causes cannot be told apart, "
                                 "so their slowdown is not judged"),
        (under & ~k["ambiguous"] & k["expected"].isna(), "ran under communication with no clean instance at their "
                                                         "program position to compare with (no baseline): their "
                                                         "slowdown is not judged"),
    )  # fmt: skip
    for rows, why in reasons:
        part = k[rows]
        per = part.groupby(part["rank"].astype("int64"))["dur"].agg(["sum", "size"])
        out += [{"rank": int(r), "ns": int(row["sum"]), "why": f"{int(row['size'])} compute kernels {why}"}  # type: ignore[call-overload]
                for r, row in per.iterrows()]  # fmt: skip
    return out


def judge(trace: Trace, p: Params) -> pd.DataFrame | None:
    """Every compute kernel with its class mask (``cls``), program position (``pos``, ``path``,
    ``ordinal``, ``step``), clock ``factor``, baseline (``expected``, ``hi``; NaN when invalid) and
    verdict (``slowed``); None when the trace has no compute or no communication. Public so the
    verdicts can be inspected on a real trace."""
    kernels = trace.kernel_columns(_COLUMNS).dropna(subset=["device", "start_ns", "end_ns"])
    if kernels.empty:
        return None
    kernels = kernels.astype({"device": "int64"})
    comm = _communication(trace, kernels)
    # compute kernels without the NCCL columns, and the whole frame let go: each copy of a
    # 1M-kernel frame below is ~100 MiB, and the detector's peak is the copies alive at once
    own = [c for c in kernels.columns if c not in NCCL_COLUMNS]
    compute = kernels.loc[~is_communication(kernels), own].reset_index(drop=True)
    del kernels
    if comm.empty or compute.empty:
        return None
    dur = (compute["end_ns"] - compute["start_ns"]).to_numpy(dtype=np.int64)
    covered = _coverage(compute, comm)
    share = covered / np.maximum(dur, 1)[:, None]
    mask = np.zeros(len(dur), dtype=np.int64)
    for bit in range(len(CLASSES)):  # a column at a time: a (kernels, classes) sum is strided
        mask |= (share[:, bit] >= p.overlap_share).astype(np.int64) << bit
    positions = _positions(trace, compute)
    beside = _beside_compute(compute) / np.maximum(dur, 1)
    k = compute.assign(dur=dur, clean=covered.sum(axis=1) == 0, cls=mask, nccl_share=np.minimum(share[:, 0], 1.0),
                       other_share=share[:, 1:].sum(axis=1), compute_share=np.minimum(beside, 1.0),
                       grid=compute["grid"].fillna(-1), block=compute["block"].fillna(-1))  # fmt: skip
    del compute, covered, share
    k = pd.concat([k, positions], axis=1)
    k["sig"] = k.groupby(["name", "grid", "block"], observed=True, dropna=False).ngroup()
    k = k.sort_values(["export", "device", "start_ns"], kind="stable")
    placed = k["step"] >= 0
    k["ordinal"] = np.where(placed, k.groupby(["export", "device", "sig", "step", "path"]).cumcount(), -1)
    k["kin"] = k.groupby(["export", "device", "sig", "path"], observed=True).ngroup()  # the same kernel, any ordinal
    k["pos"] = k.groupby(["kin", "ordinal"]).ngroup()
    k["stepkey"] = k.groupby(["export", "device", "step"]).ngroup()

    # clock factors against raw medians (a capped step's own instance cannot move a median of 3),
    # then once more against the baselines those factors give
    clean = k.loc[k["clean"], ["pos", "dur"]].groupby("pos")["dur"]
    k["factor"] = _clock_factors(k, p, clean.median()[clean.size() >= max(p.min_samples, 3)])
    k["corrected"] = k["dur"] / k["factor"]
    first = _clean_stats(k.loc[k["clean"], ["pos", "corrected"]], "corrected")
    k["factor"] = _clock_factors(k, p, first["expected"][first["n"] >= max(p.min_samples, 3)])
    k["corrected"] = k["dur"] / k["factor"]
    stats = _clean_stats(k.loc[k["clean"], ["pos", "corrected"]], "corrected")
    stats = stats[(stats["n"] >= p.min_samples) & (stats["hi"] - stats["lo"] <= p.baseline_spread * stats["expected"])]
    k = k.join(stats[["expected", "hi"]], on="pos")
    k["baseline"] = np.where(k["expected"].notna(), _POSITION, _NONE).astype(np.int8)
    # a position communication always overlaps (a DDP bucket's backward) has no clean instance: the
    # same kernel doing the same job elsewhere in the step (another layer: same signature and NVTX
    # path, another ordinal) is its baseline, when those clean instances agree as closely
    blind = (k["cls"] > 0) & k["expected"].isna()
    if blind.any():
        kin = _clean_stats(k.loc[k["clean"], ["kin", "corrected"]].rename(columns={"kin": "pos"}), "corrected")
        kin = kin[(kin["n"] >= max(p.min_samples, 3)) & (kin["hi"] - kin["lo"] <= p.baseline_spread * kin["expected"])]
        fill = k.loc[blind, ["kin"]].join(kin[["expected", "hi"]], on="kin")
        found = fill["expected"].notna()
        rows = fill.index[found]
        k.loc[rows, "expected"] = fill.loc[found, "expected"]
        k.loc[rows, "hi"] = fill.loc[found, "hi"]
        k.loc[rows, "baseline"] = _KIN
        _signature_baselines(k, p)
    _contention_baselines(k, p)
    # under communication and, for half its time or more, beside compute on another stream: either
    # could have slowed it, and nothing here tells them apart, so it is not judged (see _unjudged)
    k["ambiguous"] = (k["cls"] > 0) & (k["compute_share"] >= p.overlap_share)
    judged = (k["cls"] > 0) & k["expected"].notna() & ~k["ambiguous"]
    above = (k["corrected"] >= p.min_ratio * k["expected"]) & (k["corrected"] > k["hi"] * (1 + p.clean_margin))
    k["slowed"] = judged & above
    return k


def _episodes(trace: Trace, k: pd.DataFrame, comm: pd.DataFrame, p: Params) -> list[Finding]:
    """Fold consecutive slowed instances of one signature and class in one step into findings."""
    k = k.sort_values(["export", "device", "sig", "step", "start_ns"], kind="stable")
    key = np.where(k["slowed"], _primary(k["cls"].to_numpy()), -1)
    same = k[["export", "device", "sig", "step"]].eq(k[["export", "device", "sig", "step"]].shift()).all(axis=1)
    k["episode"] = (~same | (key != np.roll(key, 1))).cumsum()
    s = k[k["slowed"]].copy()
    s["extra"] = s["dur"] - s["expected"] * s["factor"]
    s = s.join(_overlapping(s, comm), how="left")
    runs = run_ns(trace)
    out = []
    for _, e in s.groupby("episode", sort=False):  # one per finding
        impact = round(float(e["extra"].sum()))
        if impact >= p.min_impact_ns:
            run = int(runs.get(int(e["export"].iloc[0]), 0))
            out.append((_finding(e, impact, run), run))
    return grade(out, p)


def _overlapping(s: pd.DataFrame, comm: pd.DataFrame) -> pd.Series:
    """Per slowed instance: what covered it (the latest-starting item of its class that overlaps it)."""
    parts = []
    for bit in range(len(CLASSES)):
        rows = s[(s["cls"].to_numpy() >> bit & 1) == 1]
        c = comm[comm["cls"] == bit]
        if rows.empty or c.empty:
            continue
        q = pd.DataFrame({"export": rows["export"].to_numpy(), "device": rows["device"].to_numpy(),
                          "t": rows["end_ns"].to_numpy(), "start": rows["start_ns"].to_numpy(), "row": rows.index})  # fmt: skip
        c = c.rename(columns={"start_ns": "t"}).sort_values("t")
        hit = pd.merge_asof(q.sort_values("t"), c[["export", "device", "t", "end_ns", "what"]], on="t",
                            by=["export", "device"], direction="backward")  # fmt: skip
        hit = hit[hit["end_ns"] > hit["start"]]
        parts.append(hit.set_index("row")["what"])
    what = pd.concat(parts) if parts else pd.Series(dtype=object)
    return what.groupby(level=0).agg(lambda w: ", ".join(sorted(set(w)))).rename("what")


def _finding(e: pd.DataFrame, impact: int, run: int) -> Finding:
    first = e.iloc[0]
    name, mask = str(first["name"]), int(np.bitwise_or.reduce(e["cls"].to_numpy()))
    cause_label = _class_label(int(_primary(np.array([mask]))[0]))
    by_class = e["cls"].map(_class_label).value_counts()
    grid, block = (
        unpack_shape(first["grid"], first["block"]) if first["grid"] >= 0 and first["block"] >= 0 else (None, None)
    )
    cls = _class_label(mask)
    per_instance = (e["expected"] * e["factor"]).head(_EVIDENCE_INSTANCES)
    expected = float((e["expected"] * e["factor"]).mean())
    actual = float(e["dur"].mean())
    rank = first["rank"]
    rank_text = None if pd.isna(rank) else int(rank)
    step = str(first["step_text"]) or "the trace (no NVTX step)"
    label = name if len(name) <= 120 else name[:117] + "..."
    shape = f"grid {grid} block {block}" if grid else "launch shape unknown"
    whats = sorted({w for ws in e["what"].dropna() for w in ws.split(", ")})
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=(
            f"{label} ({shape}) {actual / expected:.2f}x slower while {cls} runs: {len(e)} instance(s) in "
            f"{step}, {actual / 1e3:.0f} us vs {expected / 1e3:.0f} us expected"
        ),
        advice=" ".join(_ADVICE[i] for i in range(len(CLASSES)) if mask >> i & 1),
        start_ns=int(e["start_ns"].min()),
        end_ns=int(e["end_ns"].max()),
        impact_ns=impact,
        rank=rank_text,
        device=int(first["device"]),
        pid=int(first["pid"]),
        group=f"{KIND}|rank {rank_text}|device {int(first['device'])}|{name}|grid {grid}|block {block}|{cause_label}",
        # removed: each slowed instance back at its expected time; one family per kernel and class on every rank
        cause=Cause(
            f"{KIND}|{name}|grid {grid}|block {block}|{cause_label}",
            (
                Edit(
                    "shorten",
                    ops=tuple(zip(e["device"].astype(int).tolist(), e["start_ns"].astype(int).tolist(), strict=True)),
                    amounts=tuple(np.asarray(e["extra"].clip(lower=0), dtype=np.float64).tolist()),
                ),
            ),
        ),
        evidence={
            "kernel": name,
            "short_name": str(first["short_name"]),
            "grid": grid,
            "block": block,
            "communication_class": cause_label,
            "classes": {str(c): int(n) for c, n in by_class.items()},
            "overlapping_communication": whats,
            "step": step,
            "nvtx_path": str(first["path"]) or None,
            "clock_factor": round(float(first["factor"]), 3),
            "baseline": _baseline_text(first),
            "expected_ns": round(expected),
            "actual_ns": [int(d) for d in e["dur"].head(_EVIDENCE_INSTANCES)],
            "expected_per_instance_ns": [round(float(x)) for x in per_instance],
            "instances": len(e),
            "correlation_ids": [int(c) for c in e["correlation_id"].dropna().head(_EVIDENCE_INSTANCES)],
            "starts_ns": [int(t) for t in e["start_ns"].head(_EVIDENCE_INSTANCES)],
            "share_of_run": share_text(impact, run),
        },
    )
