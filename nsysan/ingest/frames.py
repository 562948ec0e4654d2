"""Tidy pandas frames read from one export.

Each ``read_*`` function returns one frame with nsysan's column names (snake_case, times in
``_ns``), strings resolved through ``StringIds`` into categoricals, and ``globalTid`` /
``globalPid`` decoded into ``pid`` / ``tid``. Only the columns listed here are read, so memory
grows with these columns, not with the file. A table the export lacks gives an empty frame
with the same columns.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from nsysan.ingest.export import NsysExport
from nsysan.ingest.tables import find_table

# globalTid = <hw:8><vm:8><pid:24><tid:24>; globalPid carries only the pid part.
_PID_SHIFT = 0x1000000


def decode_pid(global_id: pd.Series) -> np.ndarray:
    values = pd.to_numeric(global_id, errors="coerce").fillna(0).to_numpy(dtype=np.int64)
    return (values // _PID_SHIFT) % _PID_SHIFT


def decode_tid(global_tid: pd.Series) -> np.ndarray:
    values = pd.to_numeric(global_tid, errors="coerce").fillna(0).to_numpy(dtype=np.int64)
    return values % _PID_SHIFT


def _ident(name: str) -> str:
    return f'"{name}"'


def _select(
    x: NsysExport,
    table: str | None,
    columns: Mapping[str, str],
    required: tuple[str, ...] = (),
    where: str = "",
) -> pd.DataFrame:
    """SELECT ``columns`` (tidy name -> source column) that exist; absent optional ones become NA."""
    have = set(x.columns(table)) if table else set()
    present = {out: src for out, src in columns.items() if src in have}
    if table is None or not present or any(columns[r] not in have for r in required):
        return pd.DataFrame({out: pd.Series(dtype="object") for out in columns})
    exprs = ", ".join(f"{_ident(src)} AS {_ident(out)}" for out, src in present.items())
    df = x.query(f"SELECT {exprs} FROM {table} {where}")
    for out in columns:
        if out not in df:
            df[out] = pd.NA
    return df[list(columns)]


def _ints(df: pd.DataFrame, names: tuple[str, ...]) -> None:
    """Whole-number columns: int64 when complete, nullable Int64 when some rows are NULL."""
    for name in names:
        col = pd.to_numeric(df[name], errors="coerce")
        df[name] = col.astype("int64") if col.notna().all() else col.astype("Int64")


def _label_enum(x: NsysExport, enum_table: str, ids: pd.Series, fallback: Mapping[int, str]) -> pd.Categorical:
    enum = x.enum(enum_table)
    labels = dict(fallback)
    labels.update(zip(enum["id"].astype("int64"), enum["label"].astype(str)))
    return pd.Categorical(pd.to_numeric(ids, errors="coerce").map(labels))


def _resolve(df: pd.DataFrame, x: NsysExport, table: str, src: str, out: str) -> None:
    df[out] = x.resolve(df[out], table, src)


_TIME = ("start_ns", "end_ns")


def read_kernels(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "kernels")
    cols = {
        "pid": "globalPid", "device": "deviceId", "context": "contextId", "stream": "streamId",
        "correlation_id": "correlationId", "start_ns": "start", "end_ns": "end",
        "name": "demangledName", "short_name": "shortName",
        "grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ",
        "block_x": "blockX", "block_y": "blockY", "block_z": "blockZ",
        "graph_node_id": "graphNodeId", "graph_id": "graphId",
    }  # fmt: skip
    df = _select(x, table, cols, required=("start_ns", "end_ns", "short_name"))
    df["pid"] = decode_pid(df["pid"])
    _ints(df, ("device", "context", "stream", "correlation_id", *_TIME,
               "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
               "graph_node_id", "graph_id"))  # fmt: skip
    if table:
        _resolve(df, x, table, "shortName", "short_name")
        if "demangledName" in x.columns(table):
            _resolve(df, x, table, "demangledName", "name")
        else:
            df["name"] = df["short_name"]
    return df


_COPY_KIND = {0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 8: "Device-to-Device",
              9: "Host-to-Host", 10: "Peer-to-Peer"}  # fmt: skip
_MEM_KIND = {0: "Unknown", 1: "Pageable", 2: "Pinned", 3: "Device", 4: "Array", 5: "Managed"}


def read_memcpy(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "memcpy")
    cols = {
        "pid": "globalPid", "device": "deviceId", "context": "contextId", "stream": "streamId",
        "correlation_id": "correlationId", "start_ns": "start", "end_ns": "end",
        "bytes": "bytes", "copy_kind": "copyKind", "src_kind": "srcKind", "dst_kind": "dstKind",
        "src_device": "srcDeviceId", "dst_device": "dstDeviceId", "graph_node_id": "graphNodeId",
    }  # fmt: skip
    df = _select(x, table, cols, required=("start_ns", "end_ns", "bytes"))
    df["pid"] = decode_pid(df["pid"])
    _ints(df, ("device", "context", "stream", "correlation_id", *_TIME, "bytes",
               "src_device", "dst_device", "graph_node_id"))  # fmt: skip
    df["copy_kind"] = _label_enum(x, "ENUM_CUDA_MEMCPY_OPER", df["copy_kind"], _COPY_KIND)
    df["src_kind"] = _label_enum(x, "ENUM_CUDA_MEM_KIND", df["src_kind"], _MEM_KIND)
    df["dst_kind"] = _label_enum(x, "ENUM_CUDA_MEM_KIND", df["dst_kind"], _MEM_KIND)
    return df


def read_memset(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "memset")
    cols = {
        "pid": "globalPid", "device": "deviceId", "context": "contextId", "stream": "streamId",
        "correlation_id": "correlationId", "start_ns": "start", "end_ns": "end",
        "bytes": "bytes", "value": "value", "graph_node_id": "graphNodeId",
    }  # fmt: skip
    df = _select(x, table, cols, required=("start_ns", "end_ns"))
    df["pid"] = decode_pid(df["pid"])
    _ints(df, ("device", "context", "stream", "correlation_id", *_TIME, "bytes", "value",
               "graph_node_id"))  # fmt: skip
    return df


def read_cuda_api(x: NsysExport) -> pd.DataFrame:
    """CUDA runtime and driver calls in one frame; ``api`` says which."""
    cols = {
        "pid": "globalTid", "tid": "globalTid", "correlation_id": "correlationId",
        "start_ns": "start", "end_ns": "end", "name": "nameId", "return_value": "returnValue",
    }  # fmt: skip
    parts = []
    for role in ("runtime", "driver"):
        table = find_table(x, role)
        df = _select(x, table, cols, required=("start_ns", "end_ns", "name"))
        if table:
            _resolve(df, x, table, "nameId", "name")
        df["api"] = role
        parts.append(df)
    df = concat_frames(parts)
    df["pid"], df["tid"] = decode_pid(df["pid"]), decode_tid(df["tid"])
    _ints(df, ("correlation_id", *_TIME, "return_value"))
    df["api"] = df["api"].astype("category")
    return df


_NVTX_TYPES = {34: "mark", 39: "thread_name", 59: "push_pop", 60: "start_end",
               75: "domain_create", 76: "domain_destroy"}  # fmt: skip
_NVTX_TYPE_NAMES = {"NvtxMark": "mark", "NvtxThread": "thread_name", "NvtxPushPopRange": "push_pop",
                    "NvtxStartEndRange": "start_end", "NvtxDomainCreate": "domain_create",
                    "NvtxDomainDestroy": "domain_destroy"}  # fmt: skip
NVTX_RANGE_TYPES = ("push_pop", "start_end")


def read_nvtx(x: NsysExport) -> pd.DataFrame:
    """NVTX marks, ranges, domains and thread names, with the domain name on every row."""
    table = find_table(x, "nvtx")
    cols = {
        "pid": "globalTid", "tid": "globalTid", "start_ns": "start", "end_ns": "end",
        "event_type": "eventType", "domain_id": "domainId", "text": "text", "text_id": "textId",
        "category": "category", "int64": "int64Value", "uint64": "uint64Value",
        "int32": "int32Value", "uint32": "uint32Value", "double": "doubleValue",
        "float": "floatValue", "json": "jsonText",
    }  # fmt: skip
    df = _select(x, table, cols, required=("start_ns", "event_type"))
    df["pid"], df["tid"] = decode_pid(df["pid"]), decode_tid(df["tid"])
    _ints(df, ("start_ns", "end_ns", "domain_id", "category", "text_id"))

    enum = x.enum("ENUM_NSYS_EVENT_TYPE")
    names = dict(_NVTX_TYPES)
    names.update({int(i): _NVTX_TYPE_NAMES.get(str(n), str(n)) for i, n in zip(enum["id"], enum["name"])})
    df["event_type"] = pd.Categorical(pd.to_numeric(df["event_type"]).map(names))

    if table and "textId" in x.columns(table):
        registered = pd.Series(x.resolve(df["text_id"], table, "textId"), index=df.index, dtype=object)
        text = df["text"].astype(object).where(df["text"].notna(), registered)
    else:
        text = df["text"].astype(object)
    df["text"] = text

    # Domain ids are per process; domain-create rows carry the name.
    created = df.loc[df["event_type"] == "domain_create", ["pid", "domain_id", "text"]]
    created = created.dropna(subset=["domain_id"]).drop_duplicates(["pid", "domain_id"], keep="last")
    created = created.rename(columns={"text": "domain"})
    df = df.merge(created, on=["pid", "domain_id"], how="left")
    df["domain"] = df["domain"].where(df["domain_id"].fillna(0) != 0, "")
    df["domain"] = df["domain"].fillna("").astype("category")
    df["text"] = df["text"].astype("category")

    ints = df[["int64", "uint64", "int32", "uint32"]].apply(pd.to_numeric, errors="coerce")
    df["payload_int"] = ints.bfill(axis=1).iloc[:, 0].astype("Int64")
    floats = df[["double", "float"]].apply(pd.to_numeric, errors="coerce")
    df["payload_float"] = floats.bfill(axis=1).iloc[:, 0].astype("float64")
    return df[["pid", "tid", "start_ns", "end_ns", "event_type", "domain", "text", "category",
               "payload_int", "payload_float", "json"]]  # fmt: skip


def read_overhead(x: NsysExport) -> pd.DataFrame:
    """Profiler and CUPTI overhead rows; ``overhead_type`` is the enum label when one exists."""
    cols = {
        "pid": "globalTid", "tid": "globalTid", "start_ns": "start", "end_ns": "end",
        "name": "nameId", "overhead_type": "overheadType", "correlation_id": "correlationId",
    }  # fmt: skip
    parts = []
    for role in ("cupti_overhead", "profiler_overhead"):
        table = find_table(x, role)
        df = _select(x, table, cols, required=("start_ns", "end_ns"))
        if table:
            _resolve(df, x, table, "nameId", "name")
        df["overhead_type"] = _label_enum(x, "ENUM_CUPTI_OVERHEAD_TYPE", df["overhead_type"], {})
        df["source"] = table or ""
        parts.append(df)
    df = concat_frames(parts)
    df["pid"], df["tid"] = decode_pid(df["pid"]), decode_tid(df["tid"])
    _ints(df, (*_TIME, "correlation_id"))
    df["overhead_type"] = df["overhead_type"].astype("category")
    df["source"] = df["source"].astype("category")
    return df


def read_sync(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "sync")
    cols = {
        "pid": "globalPid", "device": "deviceId", "context": "contextId", "stream": "streamId",
        "correlation_id": "correlationId", "start_ns": "start", "end_ns": "end",
        "sync_type": "syncType", "event_id": "eventId", "event_sync_id": "eventSyncId",
    }  # fmt: skip
    df = _select(x, table, cols, required=("start_ns", "end_ns"))
    df["pid"] = decode_pid(df["pid"])
    _ints(df, ("device", "context", "stream", "correlation_id", *_TIME, "event_id", "event_sync_id"))
    df["sync_type"] = _label_enum(x, "ENUM_CUPTI_SYNC_TYPE", df["sync_type"], {})
    return df


def read_cuda_events(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "cuda_events")
    cols = {
        "pid": "globalPid", "device": "deviceId", "context": "contextId", "stream": "streamId",
        "correlation_id": "correlationId", "event_id": "eventId", "event_sync_id": "eventSyncId",
        "timestamp_ns": "timestamp",
    }  # fmt: skip
    df = _select(x, table, cols, required=("event_id",))
    df["pid"] = decode_pid(df["pid"])
    _ints(df, ("device", "context", "stream", "correlation_id", "event_id", "event_sync_id",
               "timestamp_ns"))  # fmt: skip
    return df


def read_graph_nodes(x: NsysExport) -> pd.DataFrame:
    """CUDA graph node creation/cloning records (2022.4's CUDA_GRAPH_EVENTS or the newer node table)."""
    table = find_table(x, "graph_nodes")
    cols = {
        "pid": "globalTid", "tid": "globalTid", "start_ns": "start", "end_ns": "end",
        "name": "nameId", "graph_node_id": "graphNodeId", "original_graph_node_id": "originalGraphNodeId",
    }  # fmt: skip
    df = _select(x, table, cols, required=("graph_node_id",))
    df["pid"], df["tid"] = decode_pid(df["pid"]), decode_tid(df["tid"])
    _ints(df, (*_TIME, "graph_node_id", "original_graph_node_id"))
    if table:
        _resolve(df, x, table, "nameId", "name")
    return df


def read_graph_launches(x: NsysExport) -> pd.DataFrame:
    """Whole-graph executions (``--cuda-graph-trace=graph``): one row per launch, no node kernels."""
    table = find_table(x, "graph_trace")
    cols = {
        "pid": "globalPid", "device": "deviceId", "stream": "streamId",
        "correlation_id": "correlationId", "start_ns": "start", "end_ns": "end",
        "graph_id": "graphId", "graph_exec_id": "graphExecId",
    }  # fmt: skip
    df = _select(x, table, cols, required=("start_ns", "end_ns"))
    df["pid"] = decode_pid(df["pid"])
    _ints(df, ("device", "stream", "correlation_id", *_TIME, "graph_id", "graph_exec_id"))
    return df


def read_processes(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "processes")
    df = _select(x, table, {"global_pid": "globalPid", "pid": "pid", "name": "name"})
    _ints(df, ("global_pid", "pid"))
    df["name"] = df["name"].astype(object)
    return df


def read_threads(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "threads")
    df = _select(x, table, {"pid": "globalTid", "tid": "globalTid", "name": "nameId"})
    df["pid"], df["tid"] = decode_pid(df["pid"]), decode_tid(df["tid"])
    if table:
        _resolve(df, x, table, "nameId", "name")
    return df


def read_gpus(x: NsysExport) -> pd.DataFrame:
    table = find_table(x, "gpus")
    cols = {
        "device": "id", "name": "name", "bus_location": "busLocation", "sm_count": "smCount",
        "total_memory": "totalMemory", "uuid": "uuid", "compute_major": "computeMajor",
        "compute_minor": "computeMinor",
    }  # fmt: skip
    df = _select(x, table, cols)
    _ints(df, ("device", "sm_count", "total_memory", "compute_major", "compute_minor"))
    df["name"] = df["name"].astype(object)
    return df.drop_duplicates("device")


def concat_frames(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate tidy frames, keeping string columns categorical even when categories differ."""
    non_empty = [p for p in parts if len(p)]
    if not non_empty:
        return parts[0].iloc[0:0].reset_index(drop=True) if parts else pd.DataFrame()
    if len(non_empty) == 1:
        return non_empty[0].reset_index(drop=True)
    columns = list(non_empty[0].columns)
    cat_cols = [c for c in columns if any(isinstance(p[c].dtype, pd.CategoricalDtype) for p in non_empty)]
    combined = pd.concat([p.drop(columns=cat_cols) for p in non_empty], ignore_index=True)
    for c in cat_cols:
        arrays = [p[c].array if isinstance(p[c].dtype, pd.CategoricalDtype) else pd.Categorical(p[c].astype(object))
                  for p in non_empty]
        combined[c] = pd.api.types.union_categoricals(arrays, ignore_order=True)
    return combined[columns]
