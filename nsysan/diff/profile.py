"""The diff profile of one capture: the figures two captures are compared on, as JSON-ready data.

``nsysan report --format json`` stores it under ``profile``, so a saved report is a baseline a CI
job can diff against without keeping the trace. Everything is computed per rank and vectorised.
"""

from __future__ import annotations

import re
from typing import Any, cast

import numpy as np
import pandas as pd

from nsysan.attribution.part import AttributionPart, map_attribution
from nsysan.ingest.export import NsysExport
from nsysan.ingest.nccl import attach_nccl_bytes, is_communication
from nsysan.ingest.trace import Trace
from nsysan.intervals import union_ns
from nsysan.overview import copy_table
from nsysan.steps import DEFAULT_STEP_PATTERN, Steps, check_pattern

PROFILE_VERSION = 1
# META_DATA_CAPTURE rows that differ on every run (ids, durations, times), not capture options
_VOLATILE_OPTION = re.compile(r"UUID|DURATION|TIME|DATE|HOST|PID$", re.IGNORECASE)
_KERNEL_COLUMNS = ("pid", "device", "start_ns", "end_ns", "name", "short_name", "grid", "block")


def _grid(packed: int) -> str:
    return f"{packed >> 32}x{(packed >> 16) & 0xFFFF}x{packed & 0xFFFF}"


def _block(packed: int) -> str:
    return f"{packed >> 22}x{(packed >> 11) & 0x7FF}x{packed & 0x7FF}"


def _kernels(trace: Trace) -> pd.DataFrame:
    """Kernels of known ranks with ``signature``: demangled name, grid and block as one string,
    built once per distinct signature (categorical), not once per kernel."""
    k = trace.kernel_columns(_KERNEL_COLUMNS)
    k = k[k["rank"].notna()] if len(k) else k
    if k.empty:
        return k.assign(signature=pd.Series(dtype=object), shape=pd.Series(dtype=object))
    # signatures numbered in order of first appearance; the names' strings are built once per
    # distinct (name, short name, grid, block), then folded where two give one name (a missing
    # demangled name falls back to the short name)
    name, short = k["name"].astype("category"), k["short_name"].astype("category")
    ints = pd.DataFrame({"name": name.cat.codes, "short": short.cat.codes,
                         "grid": k["grid"].fillna(0).astype("int64"), "block": k["block"].fillna(0).astype("int64")})  # fmt: skip
    row_key = ints.groupby(list(ints.columns), sort=False).ngroup().to_numpy()
    distinct = ints.drop_duplicates()
    text = np.array([*name.cat.categories, None], dtype=object)[distinct["name"].to_numpy()]  # code -1: None
    fallback = np.array([*short.cat.categories, None], dtype=object)[distinct["short"].to_numpy()]
    named = pd.Series(text, dtype=object).fillna(pd.Series(fallback, dtype=object)).astype(str).to_numpy(dtype=object)
    first = pd.DataFrame({"name": named, "grid": distinct["grid"].to_numpy(), "block": distinct["block"].to_numpy()})
    fold = first.groupby(["name", "grid", "block"], sort=False).ngroup().to_numpy()
    codes = fold[row_key]
    first = first.drop_duplicates()
    shapes = np.array(
        [f"grid {_grid(g)} block {_block(b)}" for g, b in zip(first["grid"], first["block"], strict=True)], dtype=object
    )
    labels = first["name"].to_numpy(dtype=object) + " | " + shapes
    shape_codes, distinct_shapes = pd.factorize(shapes)  # names differ where shapes do not
    return k.assign(signature=pd.Categorical.from_codes(codes, categories=pd.Index(labels)),
                    shape=pd.Categorical.from_codes(shape_codes[codes], categories=pd.Index(distinct_shapes)))  # fmt: skip


def kernel_table(k: pd.DataFrame) -> list[dict[str, Any]]:
    """Every kernel signature (demangled name, grid, block) with its count and total time."""
    if k.empty:
        return []
    d = k.assign(dur=k["end_ns"] - k["start_ns"], nccl=is_communication(k))
    g = d.groupby("signature", observed=True, sort=False).agg(
        short_name=("short_name", "first"), shape=("shape", "first"), nccl=("nccl", "first"),
        count=("dur", "size"), total_ns=("dur", "sum"),
    )  # fmt: skip
    return _kernel_rows(g.sort_values("total_ns", ascending=False).reset_index())


def _per_step(part: AttributionPart) -> dict[str, dict[str, list[float]]]:
    """Per rank and step: duration, GPU busy share (the step less its idle, from the report's step
    breakdown: one implementation of both) and the time of the NCCL kernels that started inside it."""
    out: dict[str, dict[str, list[float]]] = {}
    b, comm = part.breakdown, part.comm
    c_rank = comm["rank"].to_numpy(dtype=np.int64) if len(comm) else np.empty(0, dtype=np.int64)
    for rank, rows in sorted(b.groupby("rank").indices.items()):
        s = b.iloc[rows].sort_values("step")
        starts, ends = s["start_ns"].to_numpy(dtype=np.int64), s["end_ns"].to_numpy(dtype=np.int64)
        length = ends - starts
        busy = length - s["idle_ns"].to_numpy(dtype=np.int64)
        mine = comm[c_rank == int(cast(int, rank))]
        start = mine["start_ns"].to_numpy(dtype=np.int64)
        i = np.searchsorted(starts, start, side="right") - 1
        ok = (i >= 0) & (start < ends[i.clip(0)])
        dur = (mine["end_ns"].to_numpy(dtype=np.int64) - start)[ok]
        out[str(int(cast(int, rank)))] = {
            "step_ns": length.astype(float).tolist(),
            "busy_pct": (100.0 * busy / np.maximum(length, 1)).round(3).tolist(),
            "nccl_ns": np.bincount(i[ok], weights=dur, minlength=len(s)).tolist(),
        }
    return out


def _activity(trace: Trace, k: pd.DataFrame) -> pd.DataFrame:
    """Kernel, memcpy and memset intervals of known ranks and devices."""
    cols = ["rank", "device", "start_ns", "end_ns"]
    parts = [f[cols] for f in (k, trace.memcpy, trace.memset) if len(f)]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    return pd.concat(parts, ignore_index=True).dropna().astype("int64")


def _rank_table(trace: Trace, k: pd.DataFrame) -> list[dict[str, Any]]:
    """Per rank: GPU busy time (union of kernels and copies per device, summed over the rank's
    devices), span, idle share (of span x devices), kernel, NCCL and copy time."""
    a = _activity(trace, k)
    if a.empty:
        return []
    m = trace.memcpy[trace.memcpy["rank"].notna()] if len(trace.memcpy) else trace.memcpy
    span = a.groupby("rank").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    busy = union_ns(a, ["rank", "device"]).groupby(level="rank").sum().reindex(span.index, fill_value=0)
    devices = (
        a[["rank", "device"]].drop_duplicates().sort_values("device").groupby("rank")["device"].agg(list).to_dict()
    )

    def dur(f: pd.DataFrame) -> pd.Series:
        return (
            (f["end_ns"] - f["start_ns"]).groupby(f["rank"].astype("int64")).sum()
            if len(f)
            else pd.Series(dtype="int64")
        )

    nccl = k[is_communication(k)] if len(k) else k
    t = pd.DataFrame({"span_ns": span["last"] - span["first"], "busy_ns": busy, "kernel_ns": dur(k),
                      "nccl_ns": dur(nccl), "copy_ns": dur(m)}).fillna(0).astype("int64")  # fmt: skip
    width = t["span_ns"] * pd.Series({r: len(d) for r, d in devices.items()}).reindex(t.index, fill_value=1)
    t["idle_pct"] = (100.0 * (1 - t["busy_ns"] / width.clip(lower=1))).round(3)
    return [{"rank": int(r), "devices": devices.get(r, []), **{c: (float(v) if c == "idle_pct" else int(v)) for c, v in row.items()}}  # type: ignore[call-overload, misc]  # int64 index, str columns
            for r, row in t.iterrows()]  # fmt: skip


def _nccl_table(trace: Trace, k: pd.DataFrame) -> list[dict[str, Any]]:
    nccl = k[is_communication(k)] if len(k) else k
    if nccl.empty:
        return []
    sized = attach_nccl_bytes(
        trace.kernel_columns(("pid", "correlation_id", "start_ns", "end_ns", "short_name")).loc[nccl.index], trace
    )
    size = sized["nccl_bytes"].astype("Int64").astype(object).where(sized["nccl_bytes"].notna(), "unknown")
    d = sized.assign(dur=sized["end_ns"] - sized["start_ns"], bytes=size.astype(str))
    g = (
        d.groupby(["nccl_kind", "nccl_op", "bytes"], observed=True)
        .agg(count=("dur", "size"), total_ns=("dur", "sum"))
        .reset_index()
    )
    return [{"kind": str(a), "op": str(o), "bytes": b, "count": int(c), "total_ns": int(t)}
            for a, o, b, c, t in zip(g["nccl_kind"], g["nccl_op"], g["bytes"], g["count"], g["total_ns"], strict=True)]  # fmt: skip


def _capture_part(trace: Trace) -> dict[str, Any]:
    """What each export says about how it was captured (newer exports record options, the launched
    command and its environment in META_DATA_CAPTURE), kept per export for :func:`_capture`."""
    exports = []
    for e in trace.exports:
        options: dict[str, str] = {}
        command: list[str] = []
        with NsysExport(e.path) as x:
            meta = {"name", "value"} <= set(x.columns("META_DATA_CAPTURE"))
            if meta:
                rows = x.query("SELECT name, value FROM META_DATA_CAPTURE")
                for name, value in zip(rows["name"].astype(str), rows["value"].astype(str), strict=True):
                    if name == "PROCESS_0:COMMAND" or re.fullmatch(r"PROCESS_0:ARGUMENT_\d+", name):
                        command.append(value)
                    elif not name.startswith("PROCESS_"):
                        options.setdefault(name, value)
            exports.append({"meta": meta, "options": options, "command": command, "env": x.capture_env()})
    node_ids = trace.kernel_columns(("graph_node_id",))["graph_node_id"].notna().any() if trace.exports else False
    return {
        "exports": exports,
        "nsys_versions": [e.nsys_version for e in trace.exports if e.nsys_version],
        "schema_versions": [e.schema_version for e in trace.exports if e.schema_version],
        "graph_launches": len(trace.graph_launches),
        "graph_node_ids": bool(node_ids),
    }


def _capture(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's capture from its exports' (in order): options and environment from the first
    export that records each, the command of the first export that records one."""
    options: dict[str, str] = {}
    command: list[str] | None = None
    env: dict[str, str] = {}
    for e in (e for p in parts for e in p["exports"]):
        if e["meta"]:
            command = e["command"] if command is None else command
            for name, value in e["options"].items():
                options.setdefault(name, value)
        env = env or e["env"]
    options = {n: v for n, v in options.items() if not _VOLATILE_OPTION.search(n)}
    graph_mode = options.get("CUDA_GRAPH_TRACE_OPTIONS:MODE", "").lower() or None
    if graph_mode is None and sum(p["graph_launches"] for p in parts):  # older exports: no kernel has a node id
        graph_mode = "node" if any(p["graph_node_ids"] for p in parts) else "graph"
    return {
        "nsys_versions": sorted({v for p in parts for v in p["nsys_versions"]}),
        "schema_versions": sorted({v for p in parts for v in p["schema_versions"]}),
        "graph_trace": graph_mode,
        "command": command or None,
        "environment": {n: v for n, v in sorted(env.items()) if n.startswith(("NCCL_", "CUDA_", "TORCH_"))},
        "options": options,
    }


def profile_part(
    trace: Trace, step_pattern: str = DEFAULT_STEP_PATTERN, attribution: list[AttributionPart] | None = None
) -> dict[str, Any]:
    """The profile figures of ``trace`` (one export on a worker, or a whole job), per rank, for
    :func:`merge_profiles`. Steps and their figures come from the report's attribution
    (``attribution``: each export's part, when the caller has mapped them, as the report does;
    else mapped here), the same windows and breakdown the report uses; whether the job's steps are
    NVTX's or the kernel sequence's is the job's choice, so each part says which it found."""
    check_pattern(step_pattern)
    k = _kernels(trace)
    ranks = trace.ranks
    m = trace.memcpy
    parts = attribution if attribution is not None else _map_attribution(trace, step_pattern)
    sources = [p.source for p in parts if p.source]
    source = max(set(sources), key=sources.count) if sources else None
    detail = next((p.detail for p in parts if p.source == source), None)
    per = {r: v for p in parts if p.source in ("nvtx", "kernel_sequence") for r, v in _per_step(p).items()}
    steps = Steps(source, detail, pd.DataFrame())
    return {
        "ranks": sorted(int(r) for r in ranks["rank"].dropna().unique()),
        "rank_sources": sorted(str(x) for x in ranks["rank_source"].dropna().unique())
        if "rank_source" in ranks
        else [],
        "devices": sorted(int(d) for d in pd.concat([k["device"], m["device"]]).dropna().unique()),
        "capture": _capture_part(trace),
        "nvtx_steps": per if steps.source == "nvtx" else {},
        "sequence_steps": per if steps.source == "kernel_sequence" else {},
        "anchors": [(min(int(r) for r in per), steps.detail)] if per and steps.source == "kernel_sequence" else [],
        "ranks_table": _rank_table(trace, k),
        "kernels": kernel_table(k),
    }


def _map_attribution(trace: Trace, step_pattern: str) -> list[AttributionPart]:
    parts = []
    for i in range(len(trace.exports)):
        with trace.export_alone(i) as one:
            parts.append(map_attribution(one, step_pattern)[0])
    return parts


def merge_profiles(parts: list[dict[str, Any]], nccl: list[dict[str, Any]], copies: list[dict[str, Any]],
                   step_pattern: str = DEFAULT_STEP_PATTERN) -> dict[str, Any]:  # fmt: skip
    """The job's diff profile from its parts (in export order) and the report's NCCL and copy tables."""
    nvtx = {r: v for p in parts for r, v in p["nvtx_steps"].items()}
    source: str | None
    detail: str | None
    if nvtx:
        source, detail, per_rank = "nvtx", f"NVTX ranges matching '{step_pattern}'", nvtx
    else:
        per_rank = {r: v for p in parts for r, v in p["sequence_steps"].items()}
        anchors = sorted((a for p in parts for a in p["anchors"]), key=lambda a: a[0])
        detail = "; ".join(dict.fromkeys(text for _, text in anchors)) or None
        source = "kernel sequence" if detail else None
        per_rank = per_rank if detail else {}
    kernels = pd.DataFrame([row for p in parts for row in p["kernels"]],
                           columns=["signature", "short_name", "shape", "nccl", "count", "total_ns"])  # fmt: skip
    g = kernels.groupby("signature", sort=False).agg(
        short_name=("short_name", "first"), shape=("shape", "first"), nccl=("nccl", "first"),
        count=("count", "sum"), total_ns=("total_ns", "sum"),
    )  # fmt: skip
    g = g.sort_values("total_ns", ascending=False, kind="stable").reset_index()
    return {
        "version": PROFILE_VERSION,
        "ranks": sorted({r for p in parts for r in p["ranks"]}),
        "rank_sources": sorted({x for p in parts for x in p["rank_sources"]}),
        "devices": sorted({d for p in parts for d in p["devices"]}),
        "capture": _capture([p["capture"] for p in parts]),
        "steps": {"source": source, "detail": detail, "per_rank": {r: per_rank[r] for r in sorted(per_rank, key=int)}},
        "ranks_table": sorted((row for p in parts for row in p["ranks_table"]), key=lambda row: row["rank"]),
        "kernels": _kernel_rows(g),
        "nccl": nccl,
        "copies": copies,
    }


def _kernel_rows(g: pd.DataFrame) -> list[dict[str, Any]]:
    columns = (g["signature"], g["short_name"], g["shape"], g["nccl"], g["count"], g["total_ns"])
    return [
        {"signature": str(s), "short_name": str(n), "shape": str(sh), "nccl": bool(c), "count": int(cnt),
         "total_ns": int(t)}
        for s, n, sh, c, cnt, t in zip(*columns, strict=True)
    ]  # fmt: skip


def summary_tables(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The profile's NCCL and copy tables from a report document's summary (computed once there)."""
    nccl = [{"kind": r["kind"], "op": r["op"], "bytes": str(r["bytes"]), "count": r["count"], "total_ns": r["total_ns"]}
            for r in summary["nccl"]]  # fmt: skip
    copies = [{k: r[k] for k in ("copy_kind", "count", "bytes", "total_ns")} for r in summary["copies"]]
    return nccl, copies


def build_profile(trace: Trace, step_pattern: str = DEFAULT_STEP_PATTERN,
                  summary: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The diff profile of ``trace`` (see the module docstring and docs/diff.md). ``summary``, the
    report document's, lends its NCCL and copy tables, which are costly to compute twice."""
    part = profile_part(trace, step_pattern)
    if summary is not None:
        nccl, copies = summary_tables(summary)
    else:
        nccl = _nccl_table(trace, _kernels(trace))
        copies = [{"copy_kind": str(r["copy_kind"]), "count": int(r["count"]), "bytes": int(r["bytes"]),
                   "total_ns": int(r["total_ns"])} for r in copy_table(trace).to_dict("records")]  # fmt: skip
    return merge_profiles([part], nccl, copies, step_pattern)
