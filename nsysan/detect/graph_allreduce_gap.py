"""graph_allreduce_gap: idle time before an all-reduce inside CUDA graph replays.

When NCCL work is captured into a CUDA graph, NCCL (by default) adds event-record / stream-wait
nodes so captured and uncaptured NCCL work can mix. In replays this can leave the GPU idle
between the kernel that produces the gradients and the all-reduce kernel; the same pair run
eagerly has no such gap. ``NCCL_GRAPH_MIXING_SUPPORT=0`` removes those nodes.

Algorithm:

1. Replay kernels are kernels with a graph node id (``--cuda-graph-trace=node``); one replay is the
   set of kernels sharing the launch's correlation id in one process.
2. For each all-reduce kernel, its producer is the kernel on the same device that ended last
   before it started (same replay for replayed ones; any eager kernel otherwise); gap = start
   of the all-reduce minus end of the producer.
3. Baseline: the median eager gap of the same (producer, all-reduce) pair on that device when
   the trace has at least ``min_samples`` of them, otherwise ``launch_floor_ns``.
4. Per (process, device, graph) (a graph: replays of the same nodes): report when the median replay gap exceeds the baseline by
   ``min_extra_ns`` and by a factor ``min_ratio``; impact is the summed excess over replays.
5. A trace taken with ``--cuda-graph-trace=graph`` has no node kernels: one ``info`` finding per
   process says the gap cannot be measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, run_ns, severity, share_text
from nsysan.detect.registry import param, register
from nsysan.findings import Finding, Severity
from nsysan.ingest.trace import Trace

KIND = "graph_allreduce_gap"
_EVENT_NODES = r"EventRecord|WaitEvent|EventWait"
_COLUMNS = ("pid", "device", "stream", "correlation_id", "start_ns", "end_ns", "short_name", "graph_node_id")


@dataclass(frozen=True)
class Params(SeverityParams):
    min_extra_ns: int = param(15_000, "median replay gap must exceed the baseline by at least this much")
    min_ratio: float = param(2.0, "... and be at least this many times the baseline")
    launch_floor_ns: int = param(5_000, "baseline gap when the trace has no eager run of the same pair")
    min_samples: int = param(3, "eager pairs needed to use them as the baseline")


def _gaps(k: pd.DataFrame, allreduce: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """For each all-reduce kernel, the latest-ending kernel in the same ``by`` group that ended
    at or before it started: its name and the gap."""
    ends = k[[*by, "end_ns", "short_name"]].rename(columns={"short_name": "producer", "end_ns": "producer_end"})
    ends = ends.sort_values("producer_end")
    queries = allreduce.reset_index()[["index", *by, "start_ns", "end_ns", "short_name"]].sort_values("start_ns")
    pairs = pd.merge_asof(queries, ends, left_on="start_ns", right_on="producer_end", by=by, direction="backward",
                          allow_exact_matches=True)  # fmt: skip
    pairs = pairs.dropna(subset=["producer_end"])
    pairs["gap_ns"] = (pairs["start_ns"] - pairs["producer_end"]).astype("int64")
    return pairs


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> list[Finding]:
    """Idle gaps before all-reduce kernels inside CUDA graph replays, against the eager baseline."""
    k = trace.kernel_columns(_COLUMNS).dropna(subset=["device"])
    replayed = k["graph_node_id"].notna() & k["correlation_id"].notna()
    traced_by_node = set(zip(k.loc[replayed, "export"], k.loc[replayed, "pid"]))
    findings: list[Finding] = _graph_mode_findings(trace, skip=traced_by_node)
    if not replayed.any():
        return findings
    is_ar = k["nccl_op"].astype(object).eq("AllReduce")
    k = k.assign(replay=k["correlation_id"].where(replayed))
    # one graph = replays made of the same nodes: key them by their first node id
    first_node = k[replayed].groupby(["export", "pid", "replay"])["graph_node_id"].transform("min")
    k = k.assign(graph=first_node.reindex(k.index).astype("Int64").fillna(-1))

    graph_pairs = _gaps(k[replayed], k[replayed & is_ar], ["export", "pid", "device", "replay"])
    eager = k[~replayed]
    eager_pairs = _gaps(eager, eager[is_ar[~replayed]], ["export", "pid", "device"])
    pair = ["export", "pid", "device", "producer", "short_name"]  # (producer, all-reduce) per device
    baseline = (
        eager_pairs.groupby(pair, observed=True)["gap_ns"].agg(["median", "size"])
        if len(eager_pairs) else pd.DataFrame(columns=["median", "size"])
    )  # fmt: skip
    graph_pairs = graph_pairs.merge(
        k[["graph", "graph_node_id"]].rename(columns={"graph_node_id": "allreduce_node"}), left_on="index", right_index=True
    )
    runs = run_ns(trace)
    nodes = trace.graph_nodes
    event_nodes = nodes[nodes["name"].astype(str).str.contains(_EVENT_NODES, regex=True)] if len(nodes) else nodes
    # one all-reduce node of one graph at a time: a graph may hold several buckets
    per_node = ["export", "pid", "device", "graph", "allreduce_node"]
    for (export, pid, device, graph, node), g in graph_pairs.groupby(per_node, observed=True):
        producer = g["producer"].mode().iloc[0]
        allreduce = str(g["short_name"].mode().iloc[0])
        key = (export, pid, device, producer, allreduce)
        eager_n = int(baseline.loc[key, "size"]) if key in baseline.index else 0
        base = float(baseline.loc[key, "median"]) if eager_n >= p.min_samples else float(p.launch_floor_ns)
        median_gap = float(g["gap_ns"].median())
        if median_gap - base < p.min_extra_ns or median_gap < p.min_ratio * max(base, 1.0):
            continue
        excess = int(np.clip(g["gap_ns"] - base, 0, None).sum())
        replays = g.sort_values("start_ns")
        run = int(runs.get(export, 0))
        mine = event_nodes[(event_nodes["export"] == export) & (event_nodes["pid"] == pid)] if len(event_nodes) else event_nodes
        rank = trace.ranks.loc[(trace.ranks["export"] == export) & (trace.ranks["pid"] == pid), "rank"]
        findings.append(
            Finding(
                kind=KIND,
                severity=severity(excess, run, p),
                title=(f"All-reduce waits {median_gap / 1e3:.0f} us after its producer in CUDA graph replays "
                       f"(eager: {base / 1e3:.0f} us)"),  # fmt: skip
                advice=(
                    "Set NCCL_GRAPH_MIXING_SUPPORT=0 to drop the event-record/stream-wait nodes NCCL adds so that "
                    "captured and uncaptured NCCL work can be outstanding together. Trade-off: with it off, a "
                    "communicator must not have a graph replay outstanding together with another replay or with "
                    "uncaptured NCCL calls (synchronize between them), or results and progress are undefined."
                ),
                start_ns=int(replays["producer_end"].min()),
                end_ns=int(replays["end_ns"].max()),
                impact_ns=excess,
                rank=int(rank.iloc[0]) if len(rank) else None,
                device=int(device),
                pid=int(pid),
                evidence={
                    "replays": int(g["replay"].nunique()),
                    "first_graph_node_id": int(graph),
                    "allreduce_graph_node_id": int(node),
                    "producer_kernel": str(producer),
                    "allreduce_kernel": allreduce,
                    "median_gap_ns": round(median_gap),
                    "baseline_gap_ns": round(base),
                    "baseline": f"median of {eager_n} eager runs" if eager_n >= p.min_samples else "launch floor",
                    "replay_correlation_ids": [int(c) for c in replays["replay"].head(5)],
                    "event_nodes": len(mine),
                    "event_node_ids": [int(n) for n in mine["graph_node_id"].head(10)],
                    "share_of_run": share_text(excess, run),
                },
            )
        )
    return findings


def _graph_mode_findings(trace: Trace, skip: set[tuple[int, int]]) -> list[Finding]:
    """Processes whose graph launches were recorded whole (``--cuda-graph-trace=graph``): say the gap
    cannot be measured there rather than stay silent. ``skip``: processes traced by node."""
    launches = trace.graph_launches
    if launches.empty:
        return []
    findings = []
    for (export, pid), g in launches.groupby(["export", "pid"]):
        if (export, pid) in skip:
            continue
        rank = g["rank"].dropna()
        findings.append(
            Finding(
                kind=KIND,
                severity=Severity.INFO,
                title=f"{len(g)} CUDA graph launches traced whole: gaps inside the graphs cannot be measured",
                advice="Re-capture with `nsys profile --cuda-graph-trace=node` (nsysan capture sets it) to see the "
                "kernels inside each replay.",
                start_ns=int(g["start_ns"].min()),
                end_ns=int(g["end_ns"].max()),
                impact_ns=0,
                rank=int(rank.iloc[0]) if len(rank) else None,
                device=int(g["device"].dropna().iloc[0]) if g["device"].notna().any() else None,
                pid=int(pid),
                evidence={"graph_launches": len(g), "graph_ids": sorted(int(i) for i in g["graph_id"].dropna().unique())[:10]},
            )
        )
    return findings
