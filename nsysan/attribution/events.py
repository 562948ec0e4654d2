"""Which GPU operation waited for which, across streams: CUDA events.

A framework hands data from the stream that produced it to the stream that consumes it with an
event: ``cudaEventRecord(e, producer)`` then ``cudaStreamWaitEvent(consumer, e)`` (PyTorch's
ProcessGroupNCCL does this before every collective, and the optimizer's stream waits for the
gradients' all-reduce the same way). The consumer's next operation cannot start before
everything enqueued on the producer before the record has finished.

CUPTI gives both halves: event records (``CUPTI_ACTIVITY_KIND_CUDA_EVENT``: stream, event id,
correlation id of the record call) and stream waits (``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` of type
"Stream wait", with the waiting stream and the event id). A wait is matched to the latest record of
the same event before it (correlation ids number a process's API calls in order; event ids are
reused, so order matters), which works the same in every schema version.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsysan.ingest.trace import Trace

STREAM_WAIT = "stream wait"
_KEYS = ["export", "pid", "stream"]


def stream_waits(trace: Trace) -> pd.DataFrame:
    """The "stream wait" synchronization records: export, pid, stream, event_id, correlation_id."""
    sync = trace.sync
    cols = [*_KEYS, "event_id", "correlation_id"]
    if sync.empty or trace.cuda_events.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    kind = sync["sync_type"].astype(str).str.lower().str.replace("_", " ", regex=False)
    waits = sync[kind.str.contains(STREAM_WAIT, regex=False)].dropna(subset=cols)
    return waits[cols].astype("int64").reset_index(drop=True)


def event_edges(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """Pairs (producer, consumer) of row positions in ``ops`` (export, pid, stream, correlation_id,
    end_ns): the consumer was the first operation enqueued on a waiting stream after a wait on an
    event recorded after the producer, the last work enqueued on the recording stream before the
    record. Only pairs on different streams; each consumer with its latest-ending producer."""
    empty = pd.DataFrame({"producer": pd.Series(dtype="int64"), "consumer": pd.Series(dtype="int64")})
    waits = stream_waits(trace)
    if waits.empty or ops.empty:
        return empty
    work = ops[[*_KEYS, "correlation_id", "end_ns"]].astype("int64").assign(row=np.arange(len(ops)))
    work = work[work["correlation_id"] >= 0].sort_values(["correlation_id", "end_ns"], kind="stable")
    ev = trace.cuda_events.dropna(subset=["pid", "stream", "correlation_id", "event_id"])
    rec = ev[[*_KEYS, "event_id", "correlation_id"]].astype("int64").sort_values("correlation_id", kind="stable")
    # the record's producer: the last work enqueued on its stream before it (graph kernels share a
    # launch's correlation id: the latest-ending of them)
    before = pd.merge_asof(rec, work.rename(columns={"correlation_id": "work_corr"}), left_on="correlation_id",
                           right_on="work_corr", by=_KEYS, direction="backward", allow_exact_matches=False)  # fmt: skip
    before = before.dropna(subset=["row"]).rename(columns={"row": "producer"})
    records = before[["export", "pid", "event_id", "correlation_id", "producer"]].sort_values("correlation_id")
    w = waits.sort_values("correlation_id", kind="stable")
    w = pd.merge_asof(w, records.rename(columns={"correlation_id": "record_corr"}), left_on="correlation_id",
                      right_on="record_corr", by=["export", "pid", "event_id"], direction="backward")  # fmt: skip
    w = w.dropna(subset=["producer"])
    if w.empty:
        return empty
    first = work.drop_duplicates(["export", "pid", "stream", "correlation_id"], keep="first")
    gated = pd.merge_asof(w[[*_KEYS, "correlation_id", "producer"]].sort_values("correlation_id"),
                          first[[*_KEYS, "correlation_id", "row"]].rename(columns={"correlation_id": "op_corr"}),
                          left_on="correlation_id", right_on="op_corr", by=_KEYS, direction="forward",
                          allow_exact_matches=False)  # fmt: skip
    gated = gated.dropna(subset=["row"])
    pairs = pd.DataFrame({"producer": gated["producer"].astype("int64").to_numpy(),
                          "consumer": gated["row"].astype("int64").to_numpy()})  # fmt: skip
    stream = ops["stream"].to_numpy()
    pairs = pairs[stream[pairs["producer"].to_numpy()] != stream[pairs["consumer"].to_numpy()]]
    end = ops["end_ns"].to_numpy()
    pairs = pairs.assign(e=end[pairs["producer"].to_numpy()]).sort_values(["consumer", "e"], kind="stable")
    out: pd.DataFrame = pairs.drop_duplicates("consumer", keep="last")[["producer", "consumer"]]
    return out.reset_index(drop=True)


def graph_edges(ops: pd.DataFrame) -> pd.DataFrame:
    """Pairs (producer, consumer) of row positions in ``ops`` inside CUDA graph replays: exports
    record no graph edges, so each node op of a replay (the ops sharing one launch's correlation id
    in one process, ``graph`` True) is taken to depend on the latest-ending op of the same replay that
    ended at or before it started, on any stream (a captured all-reduce runs on NCCL's stream, after
    the compute that produced its input)."""
    empty = pd.DataFrame({"producer": pd.Series(dtype="int64"), "consumer": pd.Series(dtype="int64")})
    if "graph" not in ops or not ops["graph"].any():
        return empty
    rep = ops[ops["graph"].to_numpy(dtype=bool)][["export", "pid", "correlation_id", "start_ns", "end_ns"]]
    rep = rep.assign(row=rep.index.to_numpy()).astype("int64")
    ends = rep[["export", "pid", "correlation_id", "end_ns", "row"]].rename(columns={"row": "producer"})
    q = rep[["export", "pid", "correlation_id", "start_ns", "row"]].sort_values("start_ns", kind="stable")
    hit = pd.merge_asof(q, ends.sort_values("end_ns", kind="stable"), left_on="start_ns", right_on="end_ns",
                        by=["export", "pid", "correlation_id"], direction="backward")  # fmt: skip
    hit = hit.dropna(subset=["producer"])
    hit = hit[hit["producer"].astype("int64") != hit["row"]]
    return pd.DataFrame({"producer": hit["producer"].astype("int64").to_numpy(), "consumer": hit["row"].to_numpy()})


def device_ready(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """For GPU operations ``ops`` (export, pid, stream, correlation_id), their device readiness:
    ``device_ready_ns`` (the end of the latest producer whose event a wait gating the op waited
    on; NaN where none) and ``events_known`` (whether the process has event rows at all, i.e.
    whether a NaN means "nothing to wait for" or "cannot tell"). Aligned to ``ops.index``."""
    out = pd.DataFrame(index=ops.index, data={"device_ready_ns": np.nan, "events_known": False})
    waits = stream_waits(trace)
    if waits.empty and trace.cuda_events.empty:
        return out
    known = pd.MultiIndex.from_frame(pd.concat([waits[["export", "pid"]], trace.cuda_events[["export", "pid"]]])
                                     .dropna().astype("int64"))  # fmt: skip
    out["events_known"] = pd.MultiIndex.from_frame(ops[["export", "pid"]].astype("int64")).isin(known)
    if waits.empty:
        return out
    work = gpu_work(trace)
    pairs = event_edges(trace, work)
    ready = pd.DataFrame({**{k: work[k].to_numpy()[pairs["consumer"].to_numpy()] for k in [*_KEYS, "correlation_id"]},
                          "device_ready_ns": work["end_ns"].to_numpy()[pairs["producer"].to_numpy()]})  # fmt: skip
    ready = ready.groupby([*_KEYS, "correlation_id"])["device_ready_ns"].max().reset_index()
    keyed = ops[[*_KEYS, "correlation_id"]].astype("int64").reset_index()
    merged = keyed.merge(ready, on=[*_KEYS, "correlation_id"], how="inner")
    out.loc[merged["index"].to_numpy(), "device_ready_ns"] = merged["device_ready_ns"].to_numpy(dtype="float64")
    return out


def gpu_work(trace: Trace) -> pd.DataFrame:
    """Every kernel, copy and memset with a correlation id: (export, pid, stream, correlation_id, end_ns)."""
    k = trace.kernel_columns(("pid", "stream", "correlation_id", "end_ns"))
    parts = [k[["export", "pid", "stream", "correlation_id", "end_ns"]]]
    for frame in (trace.memcpy, trace.memset):
        if len(frame):
            parts.append(frame[["export", "pid", "stream", "correlation_id", "end_ns"]])
    work = pd.concat(parts, ignore_index=True).dropna()
    return work.astype("int64").sort_values("correlation_id", kind="stable").reset_index(drop=True)
