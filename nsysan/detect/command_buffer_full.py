"""command_buffer_full: CPU launch calls blocked because the GPU launch queue was full.

CUPTI records the time a launch call spends waiting for room in the command buffer as an overhead
record of type "Command Buffer Full" (nsys: ``CUPTI_ACTIVITY_KIND_OVERHEAD.overheadType`` ->
``ENUM_CUPTI_OVERHEAD_TYPE``, looked up by name at run time; older exports: the row's name).

Algorithm:

1. Keep overhead rows whose type or name says "command buffer full".
2. Per thread, cluster them in time: a gap above ``cluster_gap_ns`` starts a new cluster.
3. Per cluster: CPU time blocked (union of the rows), the launch calls of that thread inside the
   window, the kernels they launched (through correlation ids), and how busy the kernels' device
   was meanwhile (busy: the CPU ran ahead of a saturated GPU; idle: launches are the bottleneck).
4. Report clusters blocking at least ``min_blocked_ns``; severity from blocked time / run length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, run_ns, severity, share_text
from nsysan.detect.registry import param, register
from nsysan.findings import Finding
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_ns, merge

KIND = "command_buffer_full"
_NO_INTERVALS = pd.DataFrame({"start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64")})
_LABEL = "command buffer full"


@dataclass(frozen=True)
class Params(SeverityParams):
    cluster_gap_ns: int = param(1_000_000, "overhead rows of one thread further apart than this start a new stall")
    min_blocked_ns: int = param(100_000, "report a stall only if launch calls were blocked at least this long")
    busy_share: float = param(0.9, "device busy share during the stall above which the GPU counts as saturated")


def _rows(trace: Trace) -> pd.DataFrame:
    o = trace.overhead
    if o.empty:
        return o
    text = o["overhead_type"].astype(object).fillna("").astype(str) + " " + o["name"].astype(object).fillna("").astype(str)
    return o[text.str.lower().str.contains(_LABEL, regex=False)]


def _clusters(rows: pd.DataFrame, gap_ns: int) -> pd.DataFrame:
    keys = ["export", "pid", "tid"]
    d = rows.sort_values([*keys, "start_ns"], kind="stable").reset_index(drop=True)
    reach = d.groupby(keys, sort=False)["end_ns"].cummax()
    previous = reach.groupby([d[k] for k in keys], sort=False).shift()
    d["cluster"] = (previous.isna() | (d["start_ns"] - previous > gap_ns)).cumsum() - 1
    blocked = merge(d, ["cluster"])
    blocked_ns = (blocked["end_ns"] - blocked["start_ns"]).groupby(blocked["cluster"]).sum()
    c = d.groupby("cluster").agg(
        export=("export", "first"), pid=("pid", "first"), tid=("tid", "first"), rank=("rank", "first"),
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), rows=("start_ns", "size"),
        source=("source", "first"),
    )  # fmt: skip
    c["blocked_ns"] = blocked_ns
    return c


def _launches(trace: Trace, clusters: pd.DataFrame) -> pd.DataFrame:
    """Launch calls of each cluster's thread inside its window, tagged with the cluster id."""
    api = trace.cuda_api
    keys = ["export", "pid", "tid"]
    calls = api[api["name"].astype(str).str.contains("Launch", regex=False)]
    if calls.empty:
        return calls.assign(cluster=pd.Series(dtype="int64"))
    bounds = clusters.reset_index()[["cluster", *keys, "start_ns", "end_ns"]].rename(
        columns={"start_ns": "c_start", "end_ns": "c_end"}
    )
    calls = calls.astype({"tid": "int64", "pid": "int64"}).sort_values("end_ns")
    bounds = bounds.astype({"tid": "int64", "pid": "int64"}).sort_values("c_start")
    hit = pd.merge_asof(calls, bounds, left_on="end_ns", right_on="c_start", by=keys, direction="backward")
    return hit[hit["cluster"].notna() & (hit["start_ns"] <= hit["c_end"])].astype({"cluster": "int64"})


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> list[Finding]:
    """CPU launch calls blocked because the GPU launch queue (command buffer) was full."""
    rows = _rows(trace)
    if rows.empty:
        return []
    clusters = _clusters(rows, p.cluster_gap_ns)
    clusters = clusters[clusters["blocked_ns"] >= p.min_blocked_ns]
    if clusters.empty:
        return []
    launches = _launches(trace, clusters)
    kernels = trace.kernel_columns(("pid", "device", "correlation_id", "start_ns", "end_ns", "short_name"))
    launched = launches.merge(
        kernels.rename(columns={"start_ns": "k_start", "end_ns": "k_end"}), on=["export", "pid", "correlation_id"]
    )
    busy = {key: g for key, g in merge(kernels.dropna(subset=["device"]), ["export", "device"]).groupby(["export", "device"])}
    calls_by_cluster = dict(tuple(launches.groupby("cluster")))
    launched_by_cluster = dict(tuple(launched.groupby("cluster")))
    nothing = launched.iloc[0:0]
    threads = trace.threads.set_index(["export", "pid", "tid"])["name"].astype(object)
    threads = threads[~threads.index.duplicated()]
    runs = run_ns(trace)

    findings = []
    for cluster, c in clusters.iterrows():  # one iteration per stall cluster, not per row
        calls = calls_by_cluster.get(cluster, launches.iloc[0:0])
        mine = launched_by_cluster.get(cluster, nothing)
        top = mine["short_name"].astype(str).value_counts().head(5)
        device = int(mine["device"].mode().iloc[0]) if len(mine) else None
        window = max(int(c["end_ns"] - c["start_ns"]), 1)
        busy_pct = None
        if device is not None:
            on_device = busy.get((c["export"], device), _NO_INTERVALS)
            busy_pct = 100.0 * covered_ns(np.array([c["start_ns"]]), np.array([c["end_ns"]]), on_device)[0] / window
        saturated = busy_pct is not None and busy_pct >= 100 * p.busy_share
        run = int(runs.get(c["export"], 0))
        blocked = int(c["blocked_ns"])
        thread_name = threads.get((c["export"], c["pid"], c["tid"]), "")
        known = int(c["pid"]) != 0  # globalTid NULL decodes to pid 0: the thread is unknown
        gpu = (
            f"device {device} stayed {busy_pct:.0f}% busy: the CPU ran ahead of a saturated GPU"
            if saturated
            else f"device {device} was busy only {busy_pct:.0f}% of the window: launches are the bottleneck"
            if busy_pct is not None
            else "the launched kernels are not in the trace"
        )
        findings.append(
            Finding(
                kind=KIND,
                severity=severity(blocked, run, p),
                title=(f"Launch queue full: thread {int(c['tid']) if known else '(unknown)'} blocked "
                       f"{blocked / 1e6:.2f} ms in {len(calls)} launch calls"),  # fmt: skip
                advice=(
                    "Launch fewer, larger kernels: capture the launch-heavy section as a CUDA graph "
                    "(torch.cuda.CUDAGraph, or torch.compile(mode='reduce-overhead')), fuse small kernels "
                    "(torch.compile), or enlarge the launch queue with CUDA_SCALE_LAUNCH_QUEUES=4x. "
                    + ("The GPU was saturated, so the cost is CPU time the thread could spend preparing "
                       "the next step (data loading, communication)." if saturated else
                       "The GPU went idle while the CPU was blocked: the launches themselves limit throughput.")
                ),  # fmt: skip
                start_ns=int(c["start_ns"]),
                end_ns=int(c["end_ns"]),
                impact_ns=blocked,
                rank=None if pd.isna(c["rank"]) or not known else int(c["rank"]),
                device=device,
                pid=int(c["pid"]) if known else None,
                evidence={
                    "thread": int(c["tid"]) if known else "unknown (overhead rows without globalTid)",
                    "thread_name": str(thread_name),
                    "overhead_rows": int(c["rows"]),
                    "overhead_table": str(c["source"]),
                    "blocked_ns": blocked,
                    "share_of_run": share_text(blocked, run),
                    "launch_calls": len(calls),
                    "correlation_ids": [int(calls["correlation_id"].min()), int(calls["correlation_id"].max())]
                    if len(calls) else [],
                    "kernels_queued": [{"kernel": k, "count": int(n)} for k, n in top.items()],
                    "gpu": gpu,
                    "gpu_busy_pct": None if busy_pct is None else round(busy_pct, 1),
                },  # fmt: skip
            )
        )
    return findings
