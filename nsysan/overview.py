"""The figures of ``nsysan report`` that are not findings: what ran where, and what the capture
cannot show. Pure functions of a Trace; everything vectorised over frames.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from nsysan.ingest.frames import NVTX_RANGE_TYPES
from nsysan.ingest.nccl import NCCL_DOMAIN, attach_nccl_bytes, is_communication
from nsysan.ingest.ranks import RANK_TAKEN
from nsysan.ingest.trace import ExportInfo, Trace
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


@dataclass
class OverviewPart:
    """The overview's partial tables for some exports: grouped counts and sums, not rows, so that
    :func:`merge_overview` re-aggregates parts computed one export at a time (each on a worker)
    without the Trace. Every table has an ``export`` column, the index into the job's exports.

    Key columns keep their categorical dtype (with each export's categories), so that merging
    parts rebuilds the categories a whole-trace overview has.
    """

    exports: pd.DataFrame  # per export: the export table without ranks (filled in by the merge)
    facts: pd.DataFrame  # per export: graph_launches, graph_node_kernels (for the limitations)
    devices: pd.DataFrame  # per (export, device): the device table's rows
    kernels: pd.DataFrame  # per (export, kernel): nccl, count, total_ns (a NaN kernel keeps unnamed time)
    nccl: pd.DataFrame  # per (export, kind, op, bytes): count, total_ns
    copies: pd.DataFrame  # per (export, copy_kind): count, bytes, total_ns
    nvtx_ranges: pd.DataFrame  # per (export, domain, range): count, total_ns
    transfers: pd.DataFrame  # per (export, transfer): ranks (tuple of ints), count, bytes, total_ns
    dropped: pd.DataFrame  # per (export, what, reason): rows, as Trace.dropped_rows

    def tables(self) -> dict[str, pd.DataFrame]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_export(self, index: int) -> OverviewPart:
        """A copy with every ``export`` column set to ``index`` (a one-export part renumbered to
        its place in the job)."""
        return OverviewPart(**{k: df.assign(export=np.int64(index)) for k, df in self.tables().items()})

    @classmethod
    def concat(cls, parts: Sequence[OverviewPart]) -> OverviewPart:
        """One part holding the rows of ``parts``, ordered by export."""
        if not parts:
            raise ValueError("OverviewPart.concat needs at least one part")
        # in export order, so categories are unioned as the Trace unions its exports'
        ordered = sorted(parts, key=lambda p: int(p.exports["export"].min()) if len(p.exports) else -1)
        names = [f.name for f in fields(cls)]
        return cls(**{k: _by_export(_concat([p.tables()[k] for p in ordered])) for k in names})

    @classmethod
    def combine_slices(cls, parts: Sequence[OverviewPart]) -> OverviewPart:
        """One export's part from the parts of its slices of processes (:mod:`nsysan.ingest.slices`):
        their counts added, their devices (no two slices share one) listed together. The grouped
        tables stay one row per slice and key: the merge adds rows of the same key anyway."""
        p = cls.concat(parts)
        exports = p.exports
        counts = [c for c in exports.columns if c in _EXPORT_COUNTS]
        first = exports.iloc[[0]].reset_index(drop=True)
        first[counts] = exports[counts].sum().to_numpy()[None, :]
        first["devices"] = [sorted({int(d) for ds in exports["devices"] for d in ds})]
        facts = p.facts.groupby("export", as_index=False).sum()
        dropped = p.dropped
        if len(dropped):
            rows = dropped.groupby(["export", "what", "reason"])["rows"].sum().reset_index()
            dropped = rows.sort_values(["what", "reason"], kind="stable").reset_index(drop=True)
        devices = p.devices.sort_values("device", kind="stable").reset_index(drop=True)
        return dataclasses.replace(p, exports=first, facts=facts, devices=devices, dropped=dropped)


# the export table's columns that count rows (added over an export's slices)
_EXPORT_COUNTS = frozenset(
    {"kernels", "nccl_kernels", "memcpy", "peer_copies", "nccl_nvtx", "nvtx_events", "nvtx_ranges", "nvtx_marks",
     "cuda_api_calls"}
)  # fmt: skip


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate frames, unioning the categories of categorical columns (those of empty frames
    too, in order), as the Trace's frames are unioned from its exports.

    One ``pd.concat`` of the whole frames (categories that differ come out as plain values), then
    each categorical column re-coded against the union of the parts' categories, read from their
    dtypes: a job of 1,024 exports merges 1,024 parts of every table, and a column taken out of
    each part costs more than the part's rows (1,024 parts: 3.07 s that way, 1.04 s this way).
    """
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    columns = list(frames[0].columns)
    dtypes = [f.dtypes for f in frames]
    non_empty = [f for f in frames if len(f)]
    combined = pd.concat(non_empty, ignore_index=True) if non_empty else frames[0].iloc[0:0].reset_index(drop=True)
    for c in columns:
        if not any(isinstance(d[c], pd.CategoricalDtype) for d in dtypes):
            continue
        names = []  # each part's categories as text, in part order; empty parts count when categorical
        for f, d in zip(frames, dtypes, strict=True):
            if isinstance(d[c], pd.CategoricalDtype):
                names.append(pd.Index(d[c].categories.astype(str)))
            elif len(f):
                names.append(pd.Index(pd.Categorical(f[c].astype(object)).categories.astype(str)))
        union = names[0].append(names[1:]).unique()
        values = combined[c]
        codes = union.get_indexer(values.astype(object).astype(str))
        codes[values.isna().to_numpy()] = -1
        combined[c] = pd.Categorical.from_codes(codes, categories=union)
    return combined[columns]


def _by_export(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) < 2:
        return df
    return df.sort_values("export", kind="stable").reset_index(drop=True)


def _ranked(g: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows by total time, most first; ties by the keys (as text, sizes as numbers), so the order
    does not depend on how the exports were split into parts."""

    def key(s: pd.Series) -> pd.Series:
        if s.name == "total_ns":
            return s
        if s.name == "bytes":
            return pd.to_numeric(s.astype(object), errors="coerce").fillna(-1)
        return s.astype(object).astype(str)

    return g.sort_values(["total_ns", *keys], ascending=[False] + [True] * len(keys), key=key, kind="stable")


# ---- the map: per export, partial tables ------------------------------------------------------


def _gpu_activity(trace: Trace) -> pd.DataFrame:
    cols = ["export", "rank", "device", "start_ns", "end_ns"]
    parts = [f[cols] for f in (_kernels(trace), trace.memcpy, trace.memset) if len(f)]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
    activity = pd.concat(parts, ignore_index=True).dropna(subset=["device"])
    return _on_a_gpu(activity)


def _on_a_gpu(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows on a GPU: nsys writes device -1 for "no device"."""
    return frame[frame["device"] >= 0]


DEVICE_COLUMNS = ["export", "device", "ranks", "kernels", "kernel_ns", "busy_ns", "span_ns", "busy_pct"]


def device_table(trace: Trace) -> pd.DataFrame:
    """Per export and device: kernels, busy time (union of kernels and copies) and busy share."""
    activity = _gpu_activity(trace)
    if activity.empty:
        return pd.DataFrame(columns=DEVICE_COLUMNS)
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
    out["ranks"] = out["ranks"].astype(object).fillna("")
    out["busy_pct"] = np.where(out["span_ns"] > 0, 100.0 * out["busy_ns"] / out["span_ns"].clip(lower=1), 0.0)
    return out.reset_index()[DEVICE_COLUMNS]


_KERNEL_PART = ["export", "kernel", "nccl", "count", "total_ns"]
_NCCL_PART = ["export", "kind", "op", "bytes", "count", "total_ns"]
_COPY_PART = ["export", "copy_kind", "count", "bytes", "total_ns"]
_NVTX_PART = ["export", "domain", "range", "count", "total_ns"]
_TRANSFER_PART = ["export", "transfer", "ranks", "count", "bytes", "total_ns"]


def _kernel_part(trace: Trace) -> pd.DataFrame:
    """Per export and kernel name: NCCL or not, count and total time. Every name, and the time of
    kernels without one (a NaN name), which the shares count."""
    k = _kernels(trace)
    if k.empty:
        return pd.DataFrame(columns=_KERNEL_PART)
    d = k.assign(dur=k["end_ns"] - k["start_ns"], nccl=is_communication(k))
    check_sum_fits(d["dur"])
    g = d.groupby(["export", "short_name"], observed=True, dropna=False).agg(
        nccl=("nccl", "first"), count=("dur", "size"), total_ns=("dur", "sum")
    )
    return g.reset_index().rename(columns={"short_name": "kernel"})[_KERNEL_PART]


def _nccl_part(trace: Trace) -> pd.DataFrame:
    k = _kernels(trace)
    nccl = k[is_communication(k)] if len(k) else k
    if nccl.empty:
        return pd.DataFrame(columns=_NCCL_PART)
    sized = attach_nccl_bytes(nccl, trace)
    d = sized.assign(dur=sized["end_ns"] - sized["start_ns"])
    check_sum_fits(d["dur"])
    size = _plausible_bytes(d["nccl_bytes"])
    d["bytes"] = size.astype(object).where(size.notna(), "unknown")
    g = d.groupby(["export", "nccl_kind", "nccl_op", "bytes"], observed=True, dropna=False).agg(
        count=("dur", "size"), total_ns=("dur", "sum")
    )
    return g.reset_index().rename(columns={"nccl_kind": "kind", "nccl_op": "op"})[_NCCL_PART]


def _copy_part(trace: Trace) -> pd.DataFrame:
    m = trace.memcpy
    if m.empty:
        return pd.DataFrame(columns=_COPY_PART)
    d = m.assign(dur=m["end_ns"] - m["start_ns"], bytes=_plausible_bytes(m["bytes"]).fillna(0))
    check_sum_fits(d["dur"])
    check_sum_fits(d["bytes"])
    g = d.groupby(["export", "copy_kind"], observed=True, dropna=False).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), total_ns=("dur", "sum")
    )
    return g.reset_index()[_COPY_PART]


def _nvtx_part(trace: Trace) -> pd.DataFrame:
    v = trace.nvtx
    if v.empty:
        return pd.DataFrame(columns=_NVTX_PART)
    # grouped even when empty: the (categorical) domain keeps this export's categories
    ranges = v[v["event_type"].isin(NVTX_RANGE_TYPES) & v["end_ns"].notna()]
    d = ranges.assign(dur=(ranges["end_ns"] - ranges["start_ns"]).astype("int64"), range=ranges["text"])
    check_sum_fits(d["dur"])
    # grouped by the texts' codes first (millions of ranges, a few hundred texts), then by the
    # texts themselves: a range without text counts as "", and the groups sort by text
    keys = ["export", "domain", "range"]
    g = d.groupby(keys, observed=True, dropna=False).agg(count=("dur", "size"), total_ns=("dur", "sum")).reset_index()
    g["range"] = g["range"].astype(object).fillna("")
    g = g.groupby(keys, observed=True, dropna=False).agg(count=("count", "sum"), total_ns=("total_ns", "sum"))
    return g.reset_index()[_NVTX_PART]


def _transfer_part(trace: Trace) -> pd.DataFrame:
    """nsysan's P2P transport: its NVTX ranges (domain ``nsysan``, ``p2p ...``) per export, direction and tag."""
    v = trace.nvtx
    if v.empty:
        return pd.DataFrame(columns=_TRANSFER_PART)
    t = v[(v["domain"] == "nsysan") & v["end_ns"].notna()]
    text = t["text"].astype(object).fillna("").astype(str)
    t = t[text.str.startswith("p2p ")]
    if t.empty:
        return pd.DataFrame(columns=_TRANSFER_PART)
    d = t.assign(transfer=text[t.index], dur=(t["end_ns"] - t["start_ns"]).astype("int64"),
                 nbytes=_plausible_bytes(t["payload_int"]).fillna(0))  # fmt: skip
    check_sum_fits(d["dur"])
    check_sum_fits(d["nbytes"])
    g = d.groupby(["export", "transfer"]).agg(
        ranks=("rank", lambda r: tuple(sorted({int(x) for x in r.dropna()}))),
        count=("dur", "size"), bytes=("nbytes", "sum"), total_ns=("dur", "sum"),
    )  # fmt: skip
    return g.reset_index()[_TRANSFER_PART]


def _export_part(trace: Trace) -> pd.DataFrame:
    """Per export: the counts a user can check against ``nsys stats`` or SQL (ranks left out)."""
    k, m, v = _kernels(trace), trace.memcpy, trace.nvtx
    index = pd.Index([e.index for e in trace.exports], name="export")

    def per_export(mask: pd.Series, frame: pd.DataFrame) -> pd.Series:
        counts = mask.groupby(frame["export"]).sum() if len(frame) else pd.Series(dtype="int64")
        return counts.reindex(index, fill_value=0).astype("int64")

    true_k = pd.Series(True, index=k.index)
    true_m = pd.Series(True, index=m.index)
    true_v = pd.Series(True, index=v.index)
    used = [f[["export", "device"]].dropna().astype("int64") for f in (k, m) if len(f)]
    used = [_on_a_gpu(u) for u in used]
    pairs = pd.concat(used).drop_duplicates().sort_values(["export", "device"]) if used else None
    devices = pairs.groupby("export")["device"].agg(list) if pairs is not None and len(pairs) else pd.Series()
    counts = {
        "kernels": per_export(true_k, k),
        "nccl_kernels": per_export(is_communication(k) if len(k) else true_k, k),
        "memcpy": per_export(true_m, m),
        "peer_copies": per_export(m["copy_kind"] == PEER_TO_PEER if len(m) else true_m, m),
        "nccl_nvtx": per_export(v["domain"] == NCCL_DOMAIN if len(v) else true_v, v),
        "nvtx_events": per_export(true_v, v),
        "nvtx_ranges": per_export(v["event_type"].isin(NVTX_RANGE_TYPES) if len(v) else true_v, v),
        "nvtx_marks": per_export(v["event_type"] == "mark" if len(v) else true_v, v),
    }
    rows = []
    for e in trace.exports:  # one row per export, not per event
        rows.append({
            "export": e.index,
            "path": str(e.path),
            "nsys_version": e.nsys_version,
            "schema_version": e.schema_version,
            "devices": [int(d) for d in devices.get(e.index, [])],
            "kernels": int(counts["kernels"][e.index]),
            "nccl_kernels": int(counts["nccl_kernels"][e.index]),
            "memcpy": int(counts["memcpy"][e.index]),
            "peer_copies": int(counts["peer_copies"][e.index]),
            "cuda_data": e.has_cuda_data,
            "nccl_nvtx": int(counts["nccl_nvtx"][e.index]),
            "nvtx_events": int(counts["nvtx_events"][e.index]),
            "nvtx_ranges": int(counts["nvtx_ranges"][e.index]),
            "nvtx_marks": int(counts["nvtx_marks"][e.index]),
            "cuda_api_calls": trace.count_in_export(e.index, "runtime") + trace.count_in_export(e.index, "driver"),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _facts_part(trace: Trace) -> pd.DataFrame:
    """Per export, what the limitations need beyond the export table: graph launches recorded, and
    kernels with a graph node id (none means graph-mode capture)."""
    index = pd.Index([e.index for e in trace.exports], name="export")
    launches = trace.graph_launches
    k = _kernels(trace)
    n_launches = launches.groupby("export").size() if len(launches) else pd.Series(dtype="int64")
    with_node = k["graph_node_id"].notna().groupby(k["export"]).sum() if len(k) else pd.Series(dtype="int64")
    return pd.DataFrame({
        "graph_launches": n_launches.reindex(index, fill_value=0).astype("int64"),
        "graph_node_kernels": with_node.reindex(index, fill_value=0).astype("int64"),
    }).reset_index()  # fmt: skip


def overview_part(trace: Trace) -> OverviewPart:
    """The map: the overview's partial tables for every export of ``trace`` (see :class:`OverviewPart`).
    Reads everything the overview needs from the frames; the dropped rows come last, after every read."""
    part = OverviewPart(
        exports=_export_part(trace),
        facts=_facts_part(trace),
        devices=device_table(trace),
        kernels=_kernel_part(trace),
        nccl=_nccl_part(trace),
        copies=_copy_part(trace),
        nvtx_ranges=_nvtx_part(trace),
        transfers=_transfer_part(trace),
        dropped=pd.DataFrame(),
    )
    trace.audit_times()
    part.dropped = trace.dropped_rows()
    return part


# ---- the reduce: partial tables to the overview's -----------------------------------------------


def _merge_top_kernels(k: pd.DataFrame, n: int = TOP_N) -> pd.DataFrame:
    columns = ["kernel", "nccl", "count", "total_ns", "mean_ns", "pct"]
    if k.empty:
        return pd.DataFrame(columns=columns)
    check_sum_fits(k["total_ns"])
    everything = int(k["total_ns"].sum())  # kernels without a name too
    g = k.groupby("kernel", observed=True).agg(
        nccl=("nccl", "first"), count=("count", "sum"), total_ns=("total_ns", "sum")
    )
    g["mean_ns"] = g["total_ns"] / g["count"]
    g["pct"] = 100.0 * g["total_ns"] / max(everything, 1)
    g = _ranked(g.reset_index(), ["kernel"]).head(n)
    return g[columns].reset_index(drop=True)


def _merge_nccl(d: pd.DataFrame) -> pd.DataFrame:
    columns = ["kind", "op", "bytes", "count", "total_ns", "mean_ns"]
    if d.empty:
        return pd.DataFrame(columns=columns)
    d = d.copy()
    for c in ("kind", "op"):  # the Trace's NCCL categories are sorted (classify_kernels)
        if isinstance(d[c].dtype, pd.CategoricalDtype):
            d[c] = d[c].cat.reorder_categories(sorted(d[c].cat.categories))
    check_sum_fits(d["total_ns"])
    g = d.groupby(["kind", "op", "bytes"], observed=True).agg(count=("count", "sum"), total_ns=("total_ns", "sum"))
    g["mean_ns"] = g["total_ns"] / g["count"]
    return _ranked(g.reset_index(), ["kind", "op", "bytes"])[columns].reset_index(drop=True)


def _merge_copies(d: pd.DataFrame) -> pd.DataFrame:
    columns = ["copy_kind", "count", "bytes", "total_ns"]
    if d.empty:
        return pd.DataFrame(columns=columns)
    check_sum_fits(d["total_ns"])
    check_sum_fits(d["bytes"])
    g = d.groupby("copy_kind", observed=True).agg(
        count=("count", "sum"), bytes=("bytes", "sum"), total_ns=("total_ns", "sum")
    )
    return _ranked(g.reset_index(), ["copy_kind"])[columns].reset_index(drop=True)


def _merge_nvtx_ranges(d: pd.DataFrame, n: int = TOP_N) -> pd.DataFrame:
    columns = ["domain", "range", "count", "total_ns", "mean_ns"]
    if d.empty:
        return pd.DataFrame(columns=columns)
    check_sum_fits(d["total_ns"])
    g = d.groupby(["domain", "range"], observed=True).agg(count=("count", "sum"), total_ns=("total_ns", "sum"))
    g["mean_ns"] = g["total_ns"] / g["count"]
    return _ranked(g.reset_index(), ["domain", "range"]).head(n)[columns].reset_index(drop=True)


def _merge_transfers(d: pd.DataFrame) -> pd.DataFrame:
    columns = ["transfer", "ranks", "count", "bytes", "total_ns", "mean_ns"]
    if d.empty:
        return pd.DataFrame(columns=columns)
    check_sum_fits(d["total_ns"])
    check_sum_fits(d["bytes"])
    g = d.groupby("transfer").agg(
        ranks=("ranks", lambda r: ",".join(str(x) for x in sorted(set().union(*r)))),
        count=("count", "sum"), bytes=("bytes", "sum"), total_ns=("total_ns", "sum"),
    )  # fmt: skip
    g["mean_ns"] = g["total_ns"] / g["count"]
    return _ranked(g.reset_index(), ["transfer"])[columns].reset_index(drop=True)


def _merge_devices(d: pd.DataFrame) -> pd.DataFrame:
    if d.empty:
        return pd.DataFrame(columns=DEVICE_COLUMNS)
    return d.sort_values(["export", "device"], kind="stable")[DEVICE_COLUMNS].reset_index(drop=True)


def _with_ranks(exports: pd.DataFrame, ranks: pd.DataFrame) -> pd.DataFrame:
    """The export table with each export's ranks (from the job's rank table) after its versions."""
    out = exports.sort_values("export", kind="stable").reset_index(drop=True)
    by_export: dict[int, list[int]] = {}
    for e, r in zip(ranks["export"].tolist(), ranks["rank"].tolist(), strict=True):  # a row per process
        by_export.setdefault(int(e), []).append(int(r))
    for listed in by_export.values():
        listed.sort()
    column = [by_export.get(int(e), []) for e in out["export"]]
    out.insert(list(out.columns).index("schema_version") + 1, "ranks", pd.Series(column, dtype=object))
    return out


def _dropped_notes(input_notes: list[str], dropped: pd.DataFrame, n: int) -> list[str]:
    notes = list(input_notes)
    if dropped.empty:
        return notes
    for (what, reason), part in _by_export(dropped).groupby(["what", "reason"], sort=False):
        k = part["export"].nunique()
        where = "" if n == 1 else f" ({'every export' if k == n else f'{k} of {n} exports'})"
        notes.append(f"{int(part['rows'].sum())} {what} {reason}{where}." if what else f"{reason}{where}.")
    return notes


def _limitations(
    exports: pd.DataFrame, facts: pd.DataFrame, ranks: pd.DataFrame, infos: list[ExportInfo], dropped: list[str]
) -> list[str]:
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
    launches = int(facts["graph_launches"].sum())
    if launches and int(facts["graph_node_kernels"].sum()) == 0:
        notes.append(
            f"Taken with `--cuda-graph-trace=graph`: {launches} graph launches are recorded whole and "
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
    guessed = ranks[ranks["rank_source"] == "process order"]
    if len(guessed) and len(ranks) > 1:
        notes.append(
            f"Ranks of {len(guessed)} of {len(ranks)} processes were guessed from process order; "
            "an NVTX mark such as `nsysan rank=3` in each process records them."
        )
    retaken = ranks[ranks["rank_source"] == RANK_TAKEN]
    if len(retaken):
        notes.append(
            f"{len(retaken)} process(es) announced a rank another process had already announced (--allow-mixed): "
            f"numbered as guessed ranks {', '.join(map(str, retaken['rank']))}; these exports are not one job."
        )
    if n > 1 and any(e.session_start_utc_ns is None for e in infos):
        notes.append("Some exports lack a session start time: their clocks cannot be aligned across ranks.")
    return notes + dropped


def merge_overview(
    parts: Sequence[OverviewPart], ranks: pd.DataFrame, exports: list[ExportInfo], input_notes: list[str]
) -> Overview:
    """The reduce: the overview of a job from the parts of its exports (each part's ``export``
    columns numbered in the job, see :meth:`OverviewPart.with_export`), its rank table, its exports
    and the notes of its inputs. Needs no Trace."""
    p = OverviewPart.concat(parts)
    table = _with_ranks(p.exports, ranks)
    return Overview(
        exports=table,
        devices=_merge_devices(p.devices),
        top_kernels=_merge_top_kernels(p.kernels),
        nccl=_merge_nccl(p.nccl),
        copies=_merge_copies(p.copies),
        nvtx_ranges=_merge_nvtx_ranges(p.nvtx_ranges),
        transfers=_merge_transfers(p.transfers),
        ranks=ranks,
        limitations=_limitations(table, p.facts, ranks, exports, _dropped_notes(input_notes, p.dropped, len(exports))),
    )


# ---- the tables of one Trace (map and reduce in one process) ----------------------------------


def copy_table(trace: Trace) -> pd.DataFrame:
    """Copies per kind (``nsysan diff``'s profile of a trace without a report reads it)."""
    return _merge_copies(_copy_part(trace))


def _plausible_bytes(values: pd.Series) -> pd.Series:
    """Byte counts as Int64, NA where the value cannot be a size (negative, absurd, not a number)."""
    size = pd.to_numeric(values, errors="coerce").astype("Float64")
    return size.where((size >= 0) & (size < MAX_BYTES)).astype("Int64")


def build_overview(trace: Trace) -> Overview:
    return merge_overview([overview_part(trace)], trace.ranks, trace.exports, trace.input_notes)
