"""The figures of ``nsysan report`` that are not findings: what ran where, and what the capture
cannot show. Pure functions of a Trace; everything vectorised over frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nsysan.ingest.frames import NVTX_RANGE_TYPES
from nsysan.ingest.nccl import NCCL_DOMAIN, attach_nccl_bytes, is_communication
from nsysan.ingest.trace import Trace
from nsysan.intervals import check_sum_fits, union_ns

TOP_N = 15
PEER_TO_PEER = "Peer-to-Peer"
# Byte counts beyond this (256 TiB in one call) are damage, not data: shown as unknown.
MAX_BYTES = 2**48


# The kernel columns the overview reads: a 1M-kernel trace costs only these.
KERNEL_COLUMNS = ("pid", "device", "correlation_id", "start_ns", "end_ns", "short_name", "graph_node_id")


def _kernels(trace: Trace) -> pd.DataFrame:
    return trace.kernel_columns(KERNEL_COLUMNS)


@dataclass
class Overview:
    exports: pd.DataFrame
    devices: pd.DataFrame
    top_kernels: pd.DataFrame
    nccl: pd.DataFrame
    copies: pd.DataFrame
    nvtx_ranges: pd.DataFrame
    transfers: pd.DataFrame
    ranks: pd.DataFrame
    limitations: list[str] = field(default_factory=list)


def _gpu_activity(trace: Trace) -> pd.DataFrame:
    cols = ["export", "rank", "device", "start_ns", "end_ns"]
    parts = [f[cols] for f in (_kernels(trace), trace.memcpy, trace.memset) if len(f)]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    return pd.concat(parts, ignore_index=True).dropna(subset=["device"])


def device_table(trace: Trace) -> pd.DataFrame:
    """Per export and device: kernels, busy time (union of kernels and copies) and busy share."""
    activity = _gpu_activity(trace)
    columns = ["export", "device", "ranks", "kernels", "kernel_ns", "busy_ns", "span_ns", "busy_pct"]
    if activity.empty:
        return pd.DataFrame(columns=columns)
    keys = ["export", "device"]
    activity["device"] = activity["device"].astype("int64")
    span = activity.groupby(keys).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    span_ns = span["last"] - span["first"]
    busy = union_ns(activity, keys).reindex(span.index, fill_value=0)
    k = _kernels(trace).dropna(subset=["device"]).astype({"device": "int64"})
    k = k.assign(d=k["end_ns"] - k["start_ns"])
    check_sum_fits(k["d"])
    per_kernel = k.groupby(keys).agg(kernels=("d", "size"), kernel_ns=("d", "sum"))
    pairs = activity[[*keys, "rank"]].dropna().drop_duplicates().sort_values("rank")
    ranks = pairs.groupby(keys)["rank"].agg(lambda r: ",".join(str(int(v)) for v in r))
    out = pd.DataFrame({"busy_ns": busy, "span_ns": span_ns}).join(per_kernel).join(ranks.rename("ranks"))
    out[["kernels", "kernel_ns"]] = out[["kernels", "kernel_ns"]].fillna(0).astype("int64")
    out["ranks"] = out["ranks"].fillna("")
    out["busy_pct"] = np.where(out["span_ns"] > 0, 100.0 * out["busy_ns"] / out["span_ns"].clip(lower=1), 0.0)
    return out.reset_index()[columns]


def top_kernels(trace: Trace, n: int = TOP_N) -> pd.DataFrame:
    k = _kernels(trace)
    columns = ["kernel", "nccl", "count", "total_ns", "mean_ns", "pct"]
    if k.empty:
        return pd.DataFrame(columns=columns)
    d = k.assign(dur=k["end_ns"] - k["start_ns"], nccl=is_communication(k))
    check_sum_fits(d["dur"])
    g = d.groupby("short_name", observed=True).agg(
        nccl=("nccl", "first"), count=("dur", "size"), total_ns=("dur", "sum"), mean_ns=("dur", "mean")
    )
    g["pct"] = 100.0 * g["total_ns"] / max(int(d["dur"].sum()), 1)
    g = g.sort_values("total_ns", ascending=False).head(n)
    return g.reset_index().rename(columns={"short_name": "kernel"})[columns]


def nccl_table(trace: Trace) -> pd.DataFrame:
    """NCCL kernel time by kind, operation, and message size where the NCCL NVTX ranges give it."""
    k = _kernels(trace)
    columns = ["kind", "op", "bytes", "count", "total_ns", "mean_ns"]
    nccl = k[is_communication(k)] if len(k) else k
    if nccl.empty:
        return pd.DataFrame(columns=columns)
    sized = attach_nccl_bytes(nccl, trace)
    d = sized.assign(dur=sized["end_ns"] - sized["start_ns"])
    check_sum_fits(d["dur"])
    size = _plausible_bytes(d["nccl_bytes"])
    d["bytes"] = size.astype(object).where(size.notna(), "unknown")
    g = d.groupby(["nccl_kind", "nccl_op", "bytes"], observed=True).agg(
        count=("dur", "size"), total_ns=("dur", "sum"), mean_ns=("dur", "mean")
    )
    g = g.reset_index().rename(columns={"nccl_kind": "kind", "nccl_op": "op"})
    return g.sort_values("total_ns", ascending=False)[columns].reset_index(drop=True)


def copy_table(trace: Trace) -> pd.DataFrame:
    m = trace.memcpy
    columns = ["copy_kind", "count", "bytes", "total_ns"]
    if m.empty:
        return pd.DataFrame(columns=columns)
    d = m.assign(dur=m["end_ns"] - m["start_ns"], bytes=_plausible_bytes(m["bytes"]).fillna(0))
    check_sum_fits(d["dur"])
    check_sum_fits(d["bytes"])
    g = d.groupby("copy_kind", observed=True).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), total_ns=("dur", "sum")
    )
    return g.reset_index().sort_values("total_ns", ascending=False)[columns].reset_index(drop=True)


def nvtx_range_table(trace: Trace, n: int = TOP_N) -> pd.DataFrame:
    v = trace.nvtx
    columns = ["domain", "range", "count", "total_ns", "mean_ns"]
    ranges = v[v["event_type"].isin(NVTX_RANGE_TYPES) & v["end_ns"].notna()] if len(v) else v
    if ranges.empty:
        return pd.DataFrame(columns=columns)
    d = ranges.assign(
        dur=(ranges["end_ns"] - ranges["start_ns"]).astype("int64"), range=ranges["text"].astype(object).fillna("")
    )
    check_sum_fits(d["dur"])
    g = d.groupby(["domain", "range"], observed=True).agg(
        count=("dur", "size"), total_ns=("dur", "sum"), mean_ns=("dur", "mean")
    )
    return g.reset_index().sort_values("total_ns", ascending=False).head(n)[columns].reset_index(drop=True)


def transfer_table(trace: Trace) -> pd.DataFrame:
    """nsysan's P2P transport: its NVTX ranges (domain ``nsysan``, ``p2p ...``) per direction and tag."""
    v = trace.nvtx
    columns = ["transfer", "ranks", "count", "bytes", "total_ns", "mean_ns"]
    if v.empty:
        return pd.DataFrame(columns=columns)
    text = v["text"].astype(object).fillna("").astype(str)
    t = v[(v["domain"] == "nsysan") & text.str.startswith("p2p ") & v["end_ns"].notna()]
    if t.empty:
        return pd.DataFrame(columns=columns)
    d = t.assign(transfer=text[t.index], dur=(t["end_ns"] - t["start_ns"]).astype("int64"),
                 nbytes=_plausible_bytes(t["payload_int"]).fillna(0))  # fmt: skip
    check_sum_fits(d["dur"])
    check_sum_fits(d["nbytes"])
    g = d.groupby("transfer").agg(
        ranks=("rank", lambda r: ",".join(str(int(x)) for x in sorted(set(r.dropna())))),
        count=("dur", "size"), bytes=("nbytes", "sum"), total_ns=("dur", "sum"), mean_ns=("dur", "mean"),
    )  # fmt: skip
    return g.reset_index().sort_values("total_ns", ascending=False)[columns].reset_index(drop=True)


def _plausible_bytes(values: pd.Series) -> pd.Series:
    """Byte counts as Int64, NA where the value cannot be a size (negative, absurd, not a number)."""
    size = pd.to_numeric(values, errors="coerce").astype("Float64")
    return size.where((size >= 0) & (size < MAX_BYTES)).astype("Int64")


def dropped_notes(trace: Trace) -> list[str]:
    """What the readers left out or repaired, one sentence each ("12 kernels with end before start
    ignored"), so nobody takes a figure for complete when rows could not be computed with."""
    trace.audit_times()
    notes = list(trace.input_notes)
    dropped = trace.dropped_rows()
    n = len(trace.exports)
    for (what, reason), part in dropped.groupby(["what", "reason"], sort=False):
        k = part["export"].nunique()
        where = "" if n == 1 else f" ({'every export' if k == n else f'{k} of {n} exports'})"
        notes.append(f"{int(part['rows'].sum())} {what} {reason}{where}." if what else f"{reason}{where}.")
    return notes


def export_table(trace: Trace) -> pd.DataFrame:
    """Per export: the counts a user can check against ``nsys stats`` or SQL."""
    rows = []
    k, m, v = _kernels(trace), trace.memcpy, trace.nvtx
    for e in trace.exports:
        ke = k[k["export"] == e.index]
        me = m[m["export"] == e.index]
        ve = v[v["export"] == e.index]
        devices = sorted(set(ke["device"].dropna().astype(int)) | set(me["device"].dropna().astype(int)))
        rows.append({
            "export": e.index,
            "path": str(e.path),
            "nsys_version": e.nsys_version,
            "schema_version": e.schema_version,
            "ranks": sorted(int(r) for r in trace.ranks.loc[trace.ranks["export"] == e.index, "rank"]),
            "devices": devices,
            "kernels": len(ke),
            "nccl_kernels": int(is_communication(ke).sum()),
            "memcpy": len(me),
            "peer_copies": int((me["copy_kind"] == PEER_TO_PEER).sum()),
            "cuda_data": e.has_cuda_data,
            "nccl_nvtx": int((ve["domain"] == NCCL_DOMAIN).sum()),
            "nvtx_events": len(ve),
            "nvtx_ranges": int(ve["event_type"].isin(NVTX_RANGE_TYPES).sum()),
            "nvtx_marks": int((ve["event_type"] == "mark").sum()),
            "cuda_api_calls": trace.count_in_export(e.index, "runtime") + trace.count_in_export(e.index, "driver"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def limitations(trace: Trace, exports: pd.DataFrame | None = None) -> list[str]:
    """What this capture cannot show, each with the capture option that would show it.

    Judged per export: one rank's file missing kernels or NVTX is worth saying even when the
    others have them.
    """
    exports = export_table(trace) if exports is None else exports
    n = len(exports)

    def where(mask: pd.Series, every: str = "any export") -> str:
        k = int(mask.sum())
        return "this capture" if k == n == 1 else every if k == n else f"{k} of {n} exports"

    notes = []
    no_cuda = ~exports["cuda_data"].astype(bool)
    if no_cuda.any():
        notes.append(
            f"No CUDA data in {where(no_cuda)}: GPU figures and GPU detectors are unavailable "
            "(capture with `--trace=cuda,nvtx,osrt` on a machine with a GPU)."
        )
    no_kernels = ~no_cuda & (exports["kernels"] == 0)
    if no_kernels.any():
        notes.append(f"No kernel records in {where(no_kernels)}: kernel figures are unavailable there.")
    launches = trace.graph_launches
    if len(launches) and _kernels(trace)["graph_node_id"].isna().all():
        notes.append(
            f"Taken with `--cuda-graph-trace=graph`: {len(launches)} graph launches are recorded whole and "
            "the kernels inside them are invisible; re-capture with `--cuda-graph-trace=node`."
        )
    no_nvtx = exports["nvtx_events"] == 0
    if no_nvtx.any():
        notes.append(
            f"No NVTX events in {where(no_nvtx)}: NCCL API ranges and user annotations are unavailable "
            "(capture with `--trace=nvtx`)."
        )
    unsized = (exports["nccl_kernels"] > 0) & (exports["nccl_nvtx"] == 0)
    if unsized.any():
        notes.append(
            f"NCCL kernels without NCCL NVTX ranges in {where(unsized, 'every export')}: message sizes are unknown "
            "(unset `NCCL_NVTX_DISABLE` and capture with `--trace=nvtx`)."
        )
    ranks = trace.ranks
    guessed = ranks[ranks["rank_source"] == "process order"]
    if len(guessed) and len(ranks) > 1:
        notes.append(
            f"Ranks of {len(guessed)} of {len(ranks)} processes were guessed from process order; "
            "an NVTX mark such as `nsysan rank=3` in each process records them."
        )
    claimed = ranks.groupby("rank")["pid"].count()
    shared = sorted(int(r) for r in claimed[claimed > 1].index)
    if shared:
        notes.append(
            f"Rank(s) {', '.join(map(str, shared))} announced by more than one process: "
            "are all these exports from one job?"
        )
    if n > 1 and any(e.session_start_utc_ns is None for e in trace.exports):
        notes.append("Some exports lack a session start time: their clocks cannot be aligned across ranks.")
    return notes + dropped_notes(trace)


def build_overview(trace: Trace) -> Overview:
    exports = export_table(trace)
    return Overview(
        exports=exports,
        devices=device_table(trace),
        top_kernels=top_kernels(trace),
        nccl=nccl_table(trace),
        copies=copy_table(trace),
        nvtx_ranges=nvtx_range_table(trace),
        transfers=transfer_table(trace),
        ranks=trace.ranks,
        limitations=limitations(trace, exports),
    )
