"""command_buffer_full: CPU launch calls blocked because the GPU launch queue was full.

Definition. CUPTI records the time a CUDA call spends waiting for room in the command buffer (the
launch queue) as an overhead record of type "Command Buffer Full" (nsys:
``CUPTI_ACTIVITY_KIND_OVERHEAD.overheadType`` -> ``ENUM_CUPTI_OVERHEAD_TYPE``, looked up by name or
label at run time, e.g. ``8, OVERHEAD_COMMAND_BUFFER_FULL, Command buffer full (CUDA)`` in real
2026 exports; older exports: the row's name). Only those rows count: a long launch call without
one (lazy loading, driver JIT, a slow host) is not a full queue, and other overhead types (buffer
flush, JIT) are not either. Per thread, rows closer than ``cluster_gap_ns`` form one stall; a
finding per stall, grouped per (process, thread), impact = CPU time blocked (union of the rows).

Why. A full queue means the CPU is ahead of the GPU: the thread waits for the GPU to drain work
before it can queue more. Whether that costs step time depends on the GPU, so each finding says
what the rows show about it:

- the blocked calls are found by the rows' correlation ids (or, without them, the calls of the
  thread that contain the row); the work they queued (kernels, copies, memsets with the same
  correlation id) gives the device;
- busy share = union of that device's kernels, memcpys and memsets over the stall window (copies
  count: a GPU draining Host-to-Device copies is busy even with few kernels);
- ``busy_share`` (0.9) or more: the GPU was saturated and the blocked time is CPU time; less: the
  queued work was waiting (events, other streams, peers, the host), not running, unless the device
  idled mostly in many short gaps between kernels (at least ``launch_bound_gaps`` gaps of at most
  ``launch_gap_ns``, half its idle time or more): then it was launch-bound, running short kernels
  back to back, and fewer launches (CUDA graphs, fusion) is the fix;
- none of the queued work in the export: the kernels these launches queued fall outside the
  capture window; GPU state unknown (a window cut from a longer capture ends while the queue is
  full). The verdict is then "unknown", never "idle".

Thresholds. ``cluster_gap_ns`` 1 ms: blocked calls of one burst follow each other within a few us
to a ms; bursts of separate steps are further apart. ``min_blocked_ns`` 100 us: below it a stall
is a handful of blocked launches, not worth a finding (the real 2x H100 stalls are 4-120 ms).
Severity from the group's total blocked time over the run (``common.grade``).

Blind spots. Rows without a thread (``globalTid`` NULL) cannot be tied to calls or to a process.
The busy share says the engines were busy, not that the blocked thread's own work was what kept
them busy. 2022.4 exports have no CUPTI overhead table; there the rows must come from
``PROFILER_OVERHEAD`` by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, grade, run_ns, share_text
from nsysan.detect.registry import param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_ns, merge, segment_ids

KIND = "command_buffer_full"
_LABEL = "command buffer full"
_KEYS = ["export", "pid", "tid"]
_WORK = ["export", "pid", "device", "correlation_id", "start_ns", "end_ns", "work"]
OUTSIDE = "the kernels these launches queued fall outside the capture window; GPU state unknown"


@dataclass(frozen=True)
class Params(SeverityParams):
    cluster_gap_ns: int = param(1_000_000, "overhead rows of one thread further apart than this start a new stall")
    min_blocked_ns: int = param(100_000, "report a stall only if calls were blocked at least this long")
    busy_share: float = param(0.9, "device busy share during the stall at or above which the GPU counts as saturated")
    launch_gap_ns: int = param(
        5_000, "a gap between a device's kernels at most this long is launch overhead, not a wait"
    )
    launch_bound_gaps: int = param(
        32, "short gaps in a stall needed to call a device that is not saturated launch-bound"
    )


def _rows(trace: Trace) -> pd.DataFrame:
    """Overhead rows whose type label or name says Command Buffer Full."""
    o = trace.overhead
    if o.empty:
        return o
    text = (
        o["overhead_type"].astype(object).fillna("").astype(str) + " " + o["name"].astype(object).fillna("").astype(str)
    )
    text = text.str.lower().str.replace("_", " ", regex=False)
    rows = o[text.str.contains(_LABEL, regex=False)]
    return rows.astype({"start_ns": "int64", "end_ns": "int64", "pid": "int64", "tid": "int64"})


def _clusters(rows: pd.DataFrame, gap_ns: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows tagged with a cluster id per thread, and one line per cluster."""
    d = rows.sort_values([*_KEYS, "start_ns"], kind="stable").reset_index(drop=True)
    d["cluster"] = segment_ids(d, _KEYS, gap_ns)
    blocked = merge(d, ["cluster"])
    c = d.groupby("cluster").agg(
        export=("export", "first"), pid=("pid", "first"), tid=("tid", "first"), rank=("rank", "first"),
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), rows=("start_ns", "size"), source=("source", "first"),
    )  # fmt: skip
    c["blocked_ns"] = (blocked["end_ns"] - blocked["start_ns"]).groupby(blocked["cluster"]).sum()
    return d, c


def _blocked_calls(trace: Trace, rows: pd.DataFrame) -> pd.DataFrame:
    """The API call each row blocked: by correlation id on the same thread, else the thread's call
    that contains the row. One line per (cluster, call)."""
    api = trace.cuda_api.dropna(subset=["start_ns", "end_ns"])
    api = api.astype({"pid": "int64", "tid": "int64", "start_ns": "int64", "end_ns": "int64"})
    cols = [*_KEYS, "correlation_id", "name", "start_ns", "end_ns"]
    r = rows.rename(columns={"start_ns": "o_start", "end_ns": "o_end"}).reset_index(drop=True)
    r["row"] = r.index
    with_id = r[r["correlation_id"].notna() & (r["correlation_id"] != 0)]
    hit = with_id[[*_KEYS, "correlation_id", "cluster", "row"]].merge(api[cols], on=[*_KEYS, "correlation_id"])
    rest = r[~r["row"].isin(hit["row"])]
    if len(rest) and len(api):
        q = rest[[*_KEYS, "o_start", "o_end", "cluster", "row"]].sort_values("o_start", kind="stable")
        calls = api[cols].sort_values("start_ns", kind="stable")
        inside = pd.merge_asof(q, calls, left_on="o_start", right_on="start_ns", by=_KEYS, direction="backward")
        inside = inside[inside["end_ns"].notna() & (inside["end_ns"] >= inside["o_end"])]
        hit = pd.concat([hit, inside[hit.columns]], ignore_index=True)
    return hit.drop_duplicates([*_KEYS, "correlation_id", "cluster"]).drop(columns="row")


def _work(trace: Trace) -> pd.DataFrame:
    """Kernels, memcpys and memsets: the GPU work a call can queue and what keeps a device busy."""
    k = trace.kernel_columns(("pid", "device", "correlation_id", "start_ns", "end_ns", "short_name"))
    parts = [k.assign(work=k["short_name"].astype(str))[_WORK]]
    for frame, label in ((trace.memcpy, "memcpy"), (trace.memset, "memset")):
        if len(frame):
            name = "memcpy " + frame["copy_kind"].astype(str) if label == "memcpy" else "memset"
            parts.append(frame.assign(work=name)[_WORK])
    work = pd.concat(parts, ignore_index=True).dropna(subset=["device", "start_ns", "end_ns"])
    return work.astype({"export": "int64", "pid": "int64", "device": "int64", "start_ns": "int64", "end_ns": "int64"})


def _short_gaps(
    starts: np.ndarray, ends: np.ndarray, merged: pd.DataFrame, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each window [start, end), the total length and number of the gaps of at most ``limit`` ns
    between consecutive disjoint sorted intervals ``merged`` that lie inside it: a device running
    tiny kernels back to back idles in many such gaps, one waiting on a dependency in one long one."""
    lo = merged["start_ns"].to_numpy(dtype=np.int64)
    hi = merged["end_ns"].to_numpy(dtype=np.int64)
    if len(lo) < 2 or len(starts) == 0:
        return np.zeros(len(starts), dtype=np.int64), np.zeros(len(starts), dtype=np.int64)
    gaps = lo[1:] - hi[:-1]  # gap i lies between interval i's end and interval i + 1's start
    short = gaps <= limit
    ns = np.concatenate([[0], np.cumsum(np.where(short, gaps, 0))])
    count = np.concatenate([[0], np.cumsum(short)])
    first = np.searchsorted(hi, starts, side="left")  # the first gap starting at or after the window's start
    last = np.clip(np.searchsorted(lo, ends, side="right") - 1, 0, None)  # gaps before the last interval starting in it
    last = np.maximum(last, first)
    return ns[last] - ns[first], count[last] - count[first]


def _busy(work: pd.DataFrame, stalls: pd.DataFrame, launch_gap_ns: int) -> pd.DataFrame:
    """Per stall (index of ``stalls``: export, device, start_ns, end_ns), the share of its window its
    device ran anything ("all") and each kind of work (kernels, each copy kind, memset), and the
    share it idled in short gaps between kernels ("short_gaps", with their number "short_gap_count").
    Intervals are merged once per (export, device, kind); each stall costs two binary searches per kind."""
    kind = np.where(work["work"].str.startswith(("memcpy", "memset")), work["work"], "kernels")
    per_kind = pd.concat([work.assign(kind=kind), work.assign(kind="all")], ignore_index=True)
    merged = merge(per_kind, ["export", "device", "kind"])
    span = (stalls["end_ns"] - stalls["start_ns"]).clip(lower=1).astype(float)
    parts = []
    for (export, device, what), m in merged.groupby(["export", "device", "kind"]):
        mine = stalls[(stalls["export"] == export) & (stalls["device"] == device)]
        covered = covered_ns(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy(), m)
        parts.append(pd.DataFrame({"stall": mine.index, "kind": what, "share": covered / span[mine.index].to_numpy()}))
        if what == "all":
            ns, count = _short_gaps(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy(), m, launch_gap_ns)
            parts.append(
                pd.DataFrame({"stall": mine.index, "kind": "short_gaps", "share": ns / span[mine.index].to_numpy()})
            )
            parts.append(pd.DataFrame({"stall": mine.index, "kind": "short_gap_count", "share": count.astype(float)}))
    if not parts:
        return pd.DataFrame(index=stalls.index)
    return pd.concat(parts).pivot(index="stall", columns="kind", values="share").reindex(stalls.index)


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> list[Finding]:
    """CPU calls blocked because the GPU launch queue (command buffer) was full, and the GPU state meanwhile."""
    rows = _rows(trace)
    if rows.empty:
        return []
    rows, clusters = _clusters(rows, p.cluster_gap_ns)
    clusters = clusters[clusters["blocked_ns"] >= p.min_blocked_ns]
    if clusters.empty:
        return []
    rows = rows[rows["cluster"].isin(clusters.index)]
    calls = _blocked_calls(trace, rows)
    work = _work(trace)
    queued = calls[["export", "pid", "correlation_id", "cluster", "end_ns"]].rename(columns={"end_ns": "call_end"}).merge(
        work, on=["export", "pid", "correlation_id"])  # fmt: skip
    calls_by: dict[int, pd.DataFrame] = {cast(int, k): g for k, g in calls.groupby("cluster")}
    queued_by: dict[int, pd.DataFrame] = {cast(int, k): g for k, g in queued.groupby("cluster")}
    device = queued.groupby("cluster")["device"].agg(lambda d: d.mode().iloc[0]).reindex(clusters.index)
    stalls = clusters.assign(device=device).dropna(subset=["device"]).astype({"device": "int64"})
    busy = _busy(work, stalls[["export", "device", "start_ns", "end_ns"]], p.launch_gap_ns)
    has_gpu = set(zip(work["export"], work["pid"], strict=True))
    threads = trace.threads.drop_duplicates(_KEYS).set_index(_KEYS)["name"].astype(object)
    runs = run_ns(trace)
    graded = []
    for key, c in clusters.iterrows():  # one iteration per stall, not per row
        cluster = cast(int, key)
        row = busy.loc[cluster].dropna().to_dict() if cluster in busy.index else {}
        shares = {str(k): float(v) for k, v in row.items()}
        f = _finding(c, calls_by.get(cluster, calls.iloc[0:0]), queued_by.get(cluster, queued.iloc[0:0]), shares,
                     (c["export"], c["pid"]) in has_gpu, threads, int(runs.get(c["export"], 0)), p)  # fmt: skip
        graded.append((f, int(runs.get(c["export"], 0))))
    return grade(graded, p)


def _finding(
    c: pd.Series,
    calls: pd.DataFrame,
    queued: pd.DataFrame,
    shares: dict[str, float],
    process_on_gpu: bool,
    threads: pd.Series,
    run: int,
    p: Params,
) -> Finding:
    export, pid, tid = int(c["export"]), int(c["pid"]), int(c["tid"])
    start, end, blocked = int(c["start_ns"]), int(c["end_ns"]), int(c["blocked_ns"])
    known = pid != 0  # globalTid NULL decodes to pid 0: the thread is unknown
    with_work = queued["correlation_id"].nunique()
    outside = len(calls) - with_work
    device = int(queued["device"].mode().iloc[0]) if len(queued) else None
    busy, verdict = None, "unknown"
    short_share, short_count = shares.pop("short_gaps", 0.0), int(shares.pop("short_gap_count", 0))
    by_kind = {str(k): float(v) for k, v in shares.items() if k != "all"}
    if device is not None:
        busy = float(shares.get("all", 0.0))
        verdict = "saturated" if busy >= p.busy_share else "waiting"
        # not saturated, but idle mostly in many short gaps between kernels: the launches are the limit
        if verdict == "waiting" and short_count >= p.launch_bound_gaps and short_share >= 0.5 * (1.0 - busy):
            verdict = "launch_bound"
    delay = float((queued["start_ns"] - queued["call_end"]).median()) if len(queued) else None
    top = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])[:3] if v >= 0.005)
    if verdict == "unknown":
        gpu = (OUTSIDE if process_on_gpu and len(calls)
               else "overhead rows without a thread: the blocked calls and their kernels cannot be found; GPU state unknown"
               if not known else "no GPU work of this process is in the trace; GPU state unknown")  # fmt: skip
    else:
        assert busy is not None and delay is not None, "a known device means queued work, so a busy share and a delay"
        gpu = (f"device {device} was {100 * busy:.0f}% busy during the stall ({top or 'nothing ran'}); "
               f"the queued work started a median {delay / 1e6:.2f} ms after its call returned")  # fmt: skip
        if outside:
            gpu += f"; the work of {outside} of {len(calls)} blocked calls falls outside the capture window"
    mostly = f" (mostly {max(by_kind, key=lambda k: by_kind[k])})" if by_kind else ""
    why = {
        "saturated": f"The GPU was busy through the stall{mostly}, so the queue filled because the GPU is behind, not "
        "because launching is slow: the step is GPU-bound and the blocked time is CPU time the thread could spend on "
        "other work (data loading, host-side communication). To free it, queue fewer entries (capture the section as "
        "a CUDA graph: torch.cuda.CUDAGraph or torch.compile(mode='reduce-overhead'); fuse small kernels) or enlarge "
        "the queue with CUDA_SCALE_LAUNCH_QUEUES=4x; to shorten the step, make the GPU work itself cheaper.",
        "waiting": f"Device {device} ran work only {100 * (busy or 0):.0f}% of the time its launch queue was full: the "
        "queued work was waiting (on events, other streams, a peer or the host), so more queue space or fewer "
        "launches will not help; find what the streams waited on (cudaStreamWaitEvent, NCCL peers, host syncs). "
        "CUDA_SCALE_LAUNCH_QUEUES=4x only lets the CPU run further ahead.",
        "launch_bound": f"Device {device} was {100 * (busy or 0):.0f}% busy and spent most of the rest in "
        f"{short_count} gaps of at most {p.launch_gap_ns / 1e3:.0f} us between kernels: it runs many short kernels back "
        "to back and each launch costs more than the kernel, so the launches bound the step, not queue space or a "
        "dependency. Fewer launches is the fix: capture the section as a CUDA graph (torch.cuda.CUDAGraph or "
        "torch.compile(mode='reduce-overhead')) or fuse the small kernels; CUDA_SCALE_LAUNCH_QUEUES=4x only lets the "
        "CPU run further ahead.",
        "unknown": f"{gpu[0].upper()}{gpu[1:]}. Capture a window that extends past these launches (nsys --duration, "
        "or a later stop) to see whether the GPU was saturated. A full queue means the CPU ran ahead of the GPU; "
        "CUDA_SCALE_LAUNCH_QUEUES=4x or fewer launches (CUDA graphs, fused kernels) only stop the thread from blocking.",
    }[verdict]
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=(
            f"Launch queue full: thread {tid if known else '(unknown)'} blocked {blocked / 1e6:.2f} ms "
            f"in {len(calls)} calls"
        ),
        advice=why,
        start_ns=start,
        end_ns=end,
        impact_ns=blocked,
        rank=None if pd.isna(c["rank"]) or not known else int(c["rank"]),
        device=device,
        pid=pid if known else None,
        group=f"{KIND}|rank {c['rank'] if known and pd.notna(c['rank']) else '?'}|pid {pid if known else '?'}"
        f"|thread {tid if known else '?'}",
        # removed: the blocked launches return at once instead of waiting for the GPU to drain the queue
        cause=Cause(
            KIND,
            (
                Edit(
                    "unblock",
                    calls=tuple((pid, tid, int(t)) for t in calls["start_ns"].dropna().astype("int64").tolist()),
                ),
            ),
        )
        if known
        else None,
        evidence={
            "thread": tid if known else "unknown (overhead rows without globalTid)",
            "thread_name": str(threads.get((export, pid, tid), "")),
            "overhead_rows": int(c["rows"]),
            "overhead_table": str(c["source"]),
            "blocked_ns": blocked,
            "share_of_run": share_text(blocked, run),
            "launch_calls": len(calls),
            "blocked_calls": {str(k): int(v) for k, v in calls["name"].astype(str).value_counts().items()},
            "correlation_ids": [int(calls["correlation_id"].min()), int(calls["correlation_id"].max())]
            if len(calls)
            else [],
            "calls_with_work_in_capture": int(with_work),
            "kernels_queued": [
                {"kernel": k, "count": int(n)} for k, n in queued["work"].astype(str).value_counts().head(5).items()
            ],
            "gpu_state": verdict,
            "gpu": gpu,
            "gpu_busy_pct": None if busy is None else round(100 * busy, 1),
            "gpu_busy_by_kind_pct": {k: round(100 * v, 1) for k, v in by_kind.items()},
            "short_gaps": {
                "count": short_count,
                "pct_of_stall": round(100 * short_share, 1),
                "max_gap_ns": p.launch_gap_ns,
            },
            "queue_delay_ns_median": None if delay is None else round(delay),
        },
    )
