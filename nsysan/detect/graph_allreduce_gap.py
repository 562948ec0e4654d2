"""graph_allreduce_gap: idle time before an all-reduce inside CUDA graph replays.

Definition. A *replay* is the GPU work of one ``cudaGraphLaunch``: the kernels, memcpys and
memsets with a graph node id that share the launch's correlation id in one process
(``--cuda-graph-trace=node``). The *producer* of an all-reduce kernel in a replay is the
latest-ending kernel, memcpy or memset of the same replay on the same device that ended at or
before the all-reduce started; the *gap* is the all-reduce's start minus the producer's end. A
*region* is the replays of one graph (keyed by its smallest node id) on one device of one process.

Why. When NCCL work is captured into a graph, NCCL (by default) adds event-record/stream-wait
nodes so captured and uncaptured NCCL work can mix; in replays they can keep the GPU idle between
the producer and the all-reduce. ``NCCL_GRAPH_MIXING_SUPPORT=0`` removes them. Copy and memset
nodes count as producers because a gradient bucket is often flattened by a D2D copy right before
its all-reduce: measuring from the last *kernel* would count that copy as idle time.

Baseline. The median gap before *device-bound* eager all-reduces of the same process and device:
those whose launch call (runtime/driver API row with the kernel's correlation id) returned before
their producer ended, so the GPU, not the CPU, decided when they started. Eager all-reduces
launched after their input was ready (Python hooks between launches, lazy loading of the first
launch) measure the CPU, so they never set the baseline. With fewer than ``min_samples``
device-bound ones, the baseline is ``launch_floor_ns``. Median, because one slow eager pass must
not move it.

Thresholds. An all-reduce node of a region is *delayed* when its median gap over the replays
exceeds the baseline by ``min_extra_ns`` (15 us: several times the few us of replay-to-replay
jitter; a smaller excess is not worth changing NCCL settings for) and is ``min_ratio`` times it (so
a trace whose eager gaps are already long does not flag replays that are merely as long). One finding per region with a
delayed node; impact = sum over its replays of (gap - baseline) of the delayed nodes, clipped at
0; window = first replay's producer end to last replay's all-reduce start (the idle time, not the
all-reduce itself); group key ``graph_allreduce_gap|rank R|device D|graph G`` (``pid P`` when the
rank is unknown). Severity comes from the group's total impact (``common.grade``).

Event nodes. Graph node rows (``CUDA_GRAPH_EVENTS``/``CUDA_GRAPH_NODE_EVENTS``) of the process named
like ``cudaEventRecord``/``cudaStreamWaitEvent`` (or cloned from one), created between the region's
first node creation and its first replay launch, are listed as evidence; they do not decide the
verdict, the gap does.

Blind spots. Exports carry no graph edges: with compute running beside the all-reduce in the same
graph, the latest-ending op may be a kernel the all-reduce does not depend on, hiding part of the
gap. An all-reduce that is the first op of its replay has no producer inside the graph and is not
judged. Without device-bound eager all-reduces in the trace the launch floor is a guess. A trace taken
with ``--cuda-graph-trace=graph`` has no node kernels: one ``info`` finding per process says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, as_int, grade, run_ns, share_text
from nsysan.detect.registry import param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.frames import concat_frames
from nsysan.ingest.nccl import is_allreduce
from nsysan.ingest.trace import Trace

KIND = "graph_allreduce_gap"
_EVENT_NODES = r"EventRecord|WaitEvent|EventWait"
_KERNEL_COLUMNS = ("pid", "device", "correlation_id", "start_ns", "end_ns", "short_name", "graph_node_id")
_OP_COLUMNS = ["export", "pid", "device", "correlation_id", "start_ns", "end_ns", "op", "graph_node_id", "is_ar"]


@dataclass(frozen=True)
class Params(SeverityParams):
    min_extra_ns: int = param(15_000, "median replay gap must exceed the baseline by at least this much")
    min_ratio: float = param(2.0, "... and be at least this many times the baseline")
    launch_floor_ns: int = param(5_000, "baseline gap when the trace has too few device-bound eager all-reduces")
    min_samples: int = param(3, "device-bound eager all-reduces needed to use their median as the baseline")


def _ops(trace: Trace) -> pd.DataFrame:
    """Kernels, memcpys and memsets in one frame: what can produce an all-reduce's input."""
    k = trace.kernel_columns(_KERNEL_COLUMNS)
    # ``op`` stays categorical: a million kernel names as text cost 0.4 s, and only the few
    # producers a finding names are ever read as text
    kernels = k.assign(op=k["short_name"], is_ar=is_allreduce(k))
    m, s = trace.memcpy, trace.memset
    copies = m.assign(op=pd.Categorical("memcpy " + m["copy_kind"].astype(str)), is_ar=False)
    sets = s.assign(op=pd.Categorical(["memset"] * len(s)), is_ar=False)
    parts = [p[_OP_COLUMNS] for p in (kernels, copies, sets) if len(p)]
    ops = concat_frames(parts) if parts else kernels[_OP_COLUMNS]
    ops = ops.dropna(subset=["device", "start_ns", "end_ns"])
    return ops.astype({"export": "int64", "pid": "int64", "device": "int64", "start_ns": "int64", "end_ns": "int64"})


def _producers(ops: pd.DataFrame, allreduce: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """For each all-reduce, the latest-ending op of its ``by`` group that ended at or before it
    started (the all-reduce itself never qualifies): its name, end and the gap."""
    ends = ops[[*by, "end_ns", "op"]].rename(columns={"op": "producer", "end_ns": "producer_end"})
    ends = ends.sort_values("producer_end", kind="stable")
    q = allreduce.reset_index(names="ar")[["ar", *by, "start_ns", "end_ns", "op", "correlation_id", "graph_node_id"]]
    pairs = pd.merge_asof(q.sort_values("start_ns", kind="stable"), ends, left_on="start_ns", right_on="producer_end",
                          by=by, direction="backward")  # fmt: skip
    pairs = pairs.dropna(subset=["producer_end"])
    pairs["producer_end"] = pairs["producer_end"].astype("int64")
    pairs["gap_ns"] = pairs["start_ns"] - pairs["producer_end"]
    return pairs


def _baselines(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """Per (export, pid, device): median gap of device-bound eager all-reduces, their count and
    how many eager ones were left out as host-bound."""
    eager_ar = ops[ops["is_ar"] & ops["graph_node_id"].isna()]
    cols = ["export", "pid", "device"]
    if eager_ar.empty:
        return pd.DataFrame(
            columns=["median", "device_bound", "host_bound"], index=pd.MultiIndex.from_tuples([], names=cols)
        )
    pairs = _producers(ops, eager_ar, cols)
    calls = trace.launch_calls(pairs[["export", "pid", "correlation_id"]].dropna())
    calls = calls.groupby(["export", "pid", "correlation_id"], as_index=False).agg(end_ns=("end_ns", "max"))
    pairs = pairs.merge(
        calls.rename(columns={"end_ns": "launch_end"}), on=["export", "pid", "correlation_id"], how="left"
    )
    bound = pairs["launch_end"].notna() & (pairs["launch_end"] < pairs["producer_end"])
    out = (
        pairs.assign(device_bound=bound, host_bound=~bound)
        .groupby(cols)
        .agg(device_bound=("device_bound", "sum"), host_bound=("host_bound", "sum"))
    )
    out["median"] = pairs[bound].groupby(cols)["gap_ns"].median()
    return out


def _event_nodes(trace: Trace, rep: pd.DataFrame) -> dict[tuple[int, int, int, int], pd.DataFrame]:
    """Per region, NCCL's event-record/stream-wait nodes created while it was captured: between
    its first node creation (or that of the nodes its nodes were cloned from) and its first
    replay, or the next region's capture if that starts earlier."""
    nodes = trace.graph_nodes
    if nodes.empty or rep.empty:
        return {}
    nodes = nodes.dropna(subset=["graph_node_id", "start_ns"]).astype({"graph_node_id": "int64", "start_ns": "int64"})
    nodes = nodes.assign(root=nodes["original_graph_node_id"].fillna(nodes["graph_node_id"]).astype("int64"))
    named = nodes["name"].astype(str).str.contains(_EVENT_NODES, regex=True)
    event_roots = pd.MultiIndex.from_frame(nodes.loc[named, ["export", "pid", "graph_node_id"]])
    nodes["event"] = named | pd.MultiIndex.from_frame(nodes[["export", "pid", "root"]]).isin(event_roots)
    regions = []
    for (export, pid, device, graph), r in rep.groupby(["export", "pid", "device", "graph"]):
        mine = nodes[(nodes["export"] == export) & (nodes["pid"] == pid)]
        ids = set(r["graph_node_id"])
        ids |= set(mine.loc[mine["graph_node_id"].isin(ids), "root"])
        first = mine.loc[mine["graph_node_id"].isin(ids), "start_ns"].min()
        launch = int(r["start_ns"].min())
        regions.append((export, pid, device, graph, launch if pd.isna(first) else int(first), launch))
    cap = pd.DataFrame(regions, columns=["export", "pid", "device", "graph", "first_created", "launch"])
    cap = cap.sort_values("first_created", kind="stable")
    following = cap.groupby(["export", "pid"])["first_created"].shift(-1)
    cap["until"] = np.minimum(cap["launch"], following.fillna(cap["launch"]))
    events = nodes[nodes["event"]]
    out: dict[tuple[int, int, int, int], pd.DataFrame] = {}
    captured = cap[["export", "pid", "device", "graph", "first_created", "until"]].itertuples(index=False, name=None)
    for export, pid, device, graph, first_created, until in captured:
        mine = events[(events["export"] == export) & (events["pid"] == pid)
                      & events["start_ns"].between(first_created, until)]  # fmt: skip
        out[(export, pid, device, graph)] = mine.drop_duplicates("root")
    return out


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> list[Finding]:
    """Idle gaps before all-reduce kernels inside CUDA graph replays, against device-bound eager runs."""
    ops = _ops(trace)
    replayed = ops["graph_node_id"].notna() & ops["correlation_id"].notna()
    traced_by_node = set(zip(ops.loc[replayed, "export"], ops.loc[replayed, "pid"], strict=True))
    runs = run_ns(trace)
    graded = [(f, int(runs.get(export, 0))) for f, export in _graph_mode(trace, traced_by_node)]
    if not (replayed & ops["is_ar"]).any():
        return grade(graded, p)
    rep = ops[replayed].astype({"correlation_id": "int64", "graph_node_id": "int64"})
    rep["replay"] = rep["correlation_id"]
    rep["graph"] = rep.groupby(["export", "pid", "replay"])["graph_node_id"].transform("min")
    pairs = _producers(rep, rep[rep["is_ar"]], ["export", "pid", "device", "graph", "replay"])
    base = _baselines(trace, ops)
    key = pd.MultiIndex.from_frame(pairs[["export", "pid", "device"]])
    bound_n = base["device_bound"].reindex(key).fillna(0).to_numpy()
    median = base["median"].reindex(key).to_numpy(dtype=float)
    pairs["base"] = np.where(bound_n >= p.min_samples, median, float(p.launch_floor_ns))
    pairs["excess"] = np.clip(pairs["gap_ns"] - pairs["base"], 0, None)
    node = ["export", "pid", "device", "graph", "graph_node_id"]
    per_node = pairs.groupby(node).agg(median_gap=("gap_ns", "median"), base=("base", "first"))
    delayed = per_node[(per_node["median_gap"] - per_node["base"] >= p.min_extra_ns)
                       & (per_node["median_gap"] >= p.min_ratio * per_node["base"].clip(lower=1.0))]  # fmt: skip
    hits = pairs.merge(delayed.reset_index()[node], on=node)
    if hits.empty:
        return grade(graded, p)
    events = _event_nodes(trace, rep)
    calls = trace.launch_calls(
        hits[["export", "pid", "replay"]].drop_duplicates().rename(columns={"replay": "correlation_id"})
    )
    for region, g in hits.groupby(["export", "pid", "device", "graph"]):
        export, pid, device, graph = cast(tuple[int, int, int, int], region)
        run = int(runs.get(export, 0))
        f = _finding(trace, g, rep, base, events.get((export, pid, device, graph)), calls, p, run)
        graded.append((f, run))
    return grade(graded, p)


def _finding(
    trace: Trace,
    g: pd.DataFrame,
    rep: pd.DataFrame,
    base: pd.DataFrame,
    nodes: pd.DataFrame | None,
    calls: pd.DataFrame,
    p: Params,
    run: int,
) -> Finding:
    """One region's finding from its delayed (replay, all-reduce) pairs ``g``."""
    export, pid, device, graph = (int(g[c].iloc[0]) for c in ("export", "pid", "device", "graph"))
    impact = round(float(g["excess"].sum()))
    baseline = float(g["base"].iloc[0])
    key = (export, pid, device)
    bound = as_int(base.loc[key, "device_bound"]) if key in base.index else 0
    host = as_int(base.loc[key, "host_bound"]) if key in base.index else 0
    source = (f"median of {bound} device-bound eager all-reduces" if bound >= p.min_samples
              else f"launch floor ({bound} device-bound eager all-reduces, {p.min_samples} needed)")  # fmt: skip
    rank = trace.ranks.loc[(trace.ranks["export"] == export) & (trace.ranks["pid"] == pid), "rank"]
    rank_v = int(rank.iloc[0]) if len(rank) and pd.notna(rank.iloc[0]) else None
    replays = g["replay"].drop_duplicates().sort_values()
    region = rep[(rep["export"] == export) & (rep["pid"] == pid) & (rep["device"] == device) & (rep["graph"] == graph)]
    all_replays = region["replay"].nunique()
    launch = calls[(calls["export"] == export) & (calls["pid"] == pid) & calls["correlation_id"].isin(replays)]
    known_nodes = nodes is not None  # the capture has graph-node rows to look for event nodes in
    nodes = nodes if nodes is not None else pd.DataFrame(columns=["root", "name"])
    median_gap = float(g["gap_ns"].median())  # over every delayed all-reduce of every replay
    worst_gap = float(g["gap_ns"].max())
    label = f"rank {rank_v}" if rank_v is not None else f"pid {pid}"
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=(
            f"All-reduce waits {median_gap / 1e3:.0f} us (median; worst {worst_gap / 1e3:.0f} us) after its "
            f"producer in {len(replays)} CUDA graph replays (eager baseline {baseline / 1e3:.0f} us)"
        ),
        advice=_advice(len(nodes) if known_nodes else None),
        start_ns=int(g["producer_end"].min()),
        end_ns=int(g["start_ns"].max()),
        impact_ns=impact,
        rank=rank_v,
        device=device,
        pid=pid,
        group=f"{KIND}|{label}|device {device}|graph {graph}",
        # removed: each replay's all-reduce starts after its producer as the eager ones do
        cause=Cause(
            KIND,
            (
                Edit(
                    "no_gap",
                    ops=tuple((device, int(t)) for t in g["start_ns"].astype("int64").tolist()),
                    amounts=tuple(np.asarray(g["excess"], dtype=np.float64).tolist()),
                ),
            ),
        ),
        evidence={
            "replays": len(replays),
            "replays_of_graph": int(all_replays),
            "first_graph_node_id": graph,
            "allreduce_graph_node_ids": sorted(int(n) for n in g["graph_node_id"].unique()),
            "allreduce_kernel": str(g["op"].astype(str).mode().iloc[0]),
            "producers": sorted(str(x) for x in g["producer"].unique()),
            "median_gap_ns": round(median_gap),
            "worst_gap_ns": round(worst_gap),
            "baseline_gap_ns": round(baseline),
            "baseline": source,
            "host_bound_eager_excluded": host,
            "replay_correlation_ids": [int(c) for c in replays.head(5)],
            "graph_launch_calls": sorted({str(n) for n in launch["name"].astype(str)}),
            "event_nodes": len(nodes),
            "event_node_ids": [int(n) for n in nodes["root"].head(10)],
            "event_node_names": sorted({str(n) for n in nodes["name"].astype(str)}),
            "share_of_run": share_text(impact, run),
        },
    )


def _advice(event_nodes: int | None) -> str:
    """The fix the evidence points to: NCCL's mixing switch only where its event nodes are there to
    drop (``None``: the capture has no graph-node rows to tell)."""
    if event_nodes is None:
        return (
            "The capture has no graph-node records to show whether NCCL added event-record/stream-wait nodes "
            "before the all-reduce. If it did, NCCL_GRAPH_MIXING_SUPPORT=0 drops them (then a communicator must "
            "not have a replay outstanding together with another replay or with uncaptured NCCL calls); if not, "
            "look at what else the all-reduce node depends on in the captured graph."
        )
    if event_nodes:
        return (
            f"Set NCCL_GRAPH_MIXING_SUPPORT=0 to drop the {event_nodes} event-record/stream-wait nodes NCCL adds so "
            "that captured and uncaptured NCCL work can be outstanding together. Trade-off: with it off, a "
            "communicator must not have a graph replay outstanding together with another replay or with uncaptured "
            "NCCL calls (synchronize between them), or results and progress are undefined."
        )
    return (
        "No event-record/stream-wait nodes were created for this graph, so NCCL_GRAPH_MIXING_SUPPORT=0 would not "
        "remove this gap. Look at what the all-reduce node depends on in the captured graph (copy, memset or host "
        "nodes, or a stream joined late) and make it depend on its producer alone; then compare a capture's gaps."
    )


def _graph_mode(trace: Trace, skip: set[tuple[int, int]]) -> list[tuple[Finding, int]]:
    """Processes whose graph launches were recorded whole (``--cuda-graph-trace=graph``): say the gap
    cannot be measured there rather than stay silent. ``skip``: processes traced by node."""
    launches = trace.graph_launches
    if launches.empty:
        return []
    out = []
    for key, g in launches.groupby(["export", "pid"]):
        export, pid = cast(tuple[int, int], key)
        if (export, pid) in skip:
            continue
        rank = g["rank"].dropna()
        f = Finding(
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
            evidence={
                "graph_launches": len(g),
                "graph_ids": sorted(int(i) for i in g["graph_id"].dropna().unique())[:10],
            },
        )
        out.append((f, int(export)))
    return out
