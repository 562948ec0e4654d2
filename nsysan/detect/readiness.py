"""When a GPU operation's input was ready on the device: the CUDA events that gate its stream.

A framework hands data from the stream that produced it to the stream that consumes it with an
event: ``cudaEventRecord(e, producer)`` then ``cudaStreamWaitEvent(consumer, e)`` (PyTorch's
ProcessGroupNCCL does this before every collective). The consumer's next operation cannot start
before everything enqueued on the producer before the record has finished. So the device
readiness of an operation is the latest end, over the waits enqueued on its stream since the
stream's previous operation, of the last GPU work enqueued on the recording stream before the
record.

CUPTI gives both halves: event records (``CUPTI_ACTIVITY_KIND_CUDA_EVENT``: stream, event id,
correlation id of the record call) and stream waits (``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` of type
"Stream wait", with the waiting stream and the event id). A wait is matched to the latest record of
the same event before it (correlation ids number a process's API calls in order; event ids are
reused, so order matters), which works the same in every schema version; newer exports also carry
``eventSyncId``, which this does not need.

A launch call's return is no readiness: an operation launched early may wait milliseconds for
its input. It is used only where a process has no event rows, and the result says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsysan.ingest.trace import Trace

STREAM_WAIT = "stream wait"
_KEYS = ["export", "pid", "stream"]


def gpu_work(trace: Trace) -> pd.DataFrame:
    """Every kernel, copy and memset with a correlation id: (export, pid, stream, correlation_id, end_ns)."""
    k = trace.kernel_columns(("pid", "stream", "correlation_id", "end_ns"))
    parts = [k[["export", "pid", "stream", "correlation_id", "end_ns"]]]
    for frame in (trace.memcpy, trace.memset):
        if len(frame):
            parts.append(frame[["export", "pid", "stream", "correlation_id", "end_ns"]])
    work = pd.concat(parts, ignore_index=True).dropna()
    return work.astype("int64").sort_values("correlation_id", kind="stable").reset_index(drop=True)


def _record_ready(trace: Trace, work: pd.DataFrame) -> pd.DataFrame:
    """Per event record: (export, pid, event_id, correlation_id, ready_ns), ready_ns being the end of
    the last work enqueued on the recording stream before the record (NaN: nothing before it)."""
    ev = trace.cuda_events.dropna(subset=["pid", "stream", "correlation_id", "event_id"])
    rec = ev[["export", "pid", "stream", "event_id", "correlation_id"]].astype("int64")
    rec = rec.sort_values("correlation_id", kind="stable")
    before = pd.merge_asof(rec, work.rename(columns={"correlation_id": "work_corr"}), left_on="correlation_id",
                           right_on="work_corr", by=_KEYS, direction="backward", allow_exact_matches=False)  # fmt: skip
    return before.rename(columns={"end_ns": "ready_ns"})[["export", "pid", "event_id", "correlation_id", "ready_ns"]]


def device_ready(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame:
    """For GPU operations ``ops`` (export, pid, stream, correlation_id), their device readiness.

    Returns a frame aligned to ``ops.index`` with ``device_ready_ns`` (NaN where no wait gated the
    operation) and ``events_known`` (whether the process has event rows at all, i.e. whether a
    NaN means "nothing to wait for" or "cannot tell").
    """
    out = pd.DataFrame(index=ops.index, data={"device_ready_ns": np.nan, "events_known": False})
    sync = trace.sync
    if sync.empty or trace.cuda_events.empty:
        return out
    kind = sync["sync_type"].astype(str).str.lower().str.replace("_", " ", regex=False)
    waits = sync[kind.str.contains(STREAM_WAIT, regex=False)]
    waits = waits.dropna(subset=["pid", "stream", "correlation_id", "event_id"])
    known = pd.MultiIndex.from_frame(pd.concat([waits[["export", "pid"]], trace.cuda_events[["export", "pid"]]])
                                     .dropna().astype("int64"))  # fmt: skip
    out["events_known"] = pd.MultiIndex.from_frame(ops[["export", "pid"]].astype("int64")).isin(known)
    if waits.empty:
        return out
    work = gpu_work(trace)
    records = _record_ready(trace, work).sort_values("correlation_id", kind="stable")
    w = waits[["export", "pid", "stream", "event_id", "correlation_id"]].astype("int64").sort_values("correlation_id")
    # the latest record of the same event before the wait
    w = pd.merge_asof(w, records.rename(columns={"correlation_id": "record_corr"}), left_on="correlation_id",
                      right_on="record_corr", by=["export", "pid", "event_id"], direction="backward")  # fmt: skip
    w = w.dropna(subset=["ready_ns"])
    # the first operation enqueued on the waiting stream after the wait is the one it gates
    gated = pd.merge_asof(w[[*_KEYS, "correlation_id", "ready_ns"]], work[[*_KEYS, "correlation_id"]]
                          .rename(columns={"correlation_id": "op_corr"}), left_on="correlation_id",
                          right_on="op_corr", by=_KEYS, direction="forward", allow_exact_matches=False)  # fmt: skip
    gated = gated.dropna(subset=["op_corr"]).astype({"op_corr": "int64"})
    ready = gated.groupby([*_KEYS, "op_corr"])["ready_ns"].max().rename("device_ready_ns").reset_index()
    keyed = ops[[*_KEYS, "correlation_id"]].astype("int64").reset_index()
    merged = keyed.merge(ready, left_on=[*_KEYS, "correlation_id"], right_on=[*_KEYS, "op_corr"], how="left")
    out.loc[merged["index"].to_numpy(), "device_ready_ns"] = merged["device_ready_ns"].to_numpy()
    return out
