"""comm_compute_slowdown: compute kernels that run longer while communication shares the GPU.

NCCL kernels take SMs and memory bandwidth; peer and host copies take memory bandwidth. Tools
report how much communication *overlaps* compute; this measures what the overlap *costs*.

Algorithm:

1. Communication on a device: NCCL kernels plus peer-to-peer, host-to-device and device-to-host
   copies, merged into disjoint intervals per (export, device).
2. For every compute kernel, the share of its duration covered by communication (two binary
   searches per kernel). Covered >= ``overlap_share``: *overlapped*; covered 0: *clean*.
3. Group compute kernels by (device, short name, grid, block): the same work. A group is reported when
   both sides have ``min_samples`` instances, the overlapped median is at least ``min_ratio`` x
   the clean median, and above the clean 90th percentile (so jitter does not count).
4. Extra time = (overlapped median - clean median) x overlapped instances; the communication that
   overlapped most is named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.detect.common import SeverityParams, run_ns, severity, share_text
from nsysan.detect.registry import param, register
from nsysan.findings import Finding
from nsysan.ingest.frames import unpack_shape
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_ns, merge

KIND = "comm_compute_slowdown"
_COPY_KINDS = ("Peer-to-Peer", "Host-to-Device", "Device-to-Host")
_COLUMNS = ("pid", "device", "start_ns", "end_ns", "short_name", "grid", "block")


@dataclass(frozen=True)
class Params(SeverityParams):
    overlap_share: float = param(0.5, "share of a kernel's time covered by communication to count it as overlapped")
    min_samples: int = param(5, "instances needed on each side (overlapped and clean) of a kernel group")
    min_ratio: float = param(1.15, "overlapped median / clean median needed to report")


def _communication(trace: Trace, kernels: pd.DataFrame) -> pd.DataFrame:
    """(export, device, start_ns, end_ns, what) of every NCCL kernel and peer/host copy."""
    nccl = kernels[kernels["nccl_kind"].notna()]
    parts = [nccl.assign(what="NCCL " + nccl["nccl_op"].astype(str))[["export", "device", "start_ns", "end_ns", "what"]]]
    m = trace.memcpy
    if len(m):
        copies = m[m["copy_kind"].isin(_COPY_KINDS)]
        parts.append(copies.assign(what=copies["copy_kind"].astype(str) + " copy")[["export", "device", "start_ns", "end_ns", "what"]])
    comm = pd.concat(parts, ignore_index=True).dropna(subset=["device"])
    return comm.astype({"device": "int64"})


def _coverage(compute: pd.DataFrame, comm: pd.DataFrame) -> np.ndarray:
    """ns of each compute kernel covered by ``comm`` on its device."""
    covered = np.zeros(len(compute), dtype=np.int64)
    merged = merge(comm, ["export", "device"])
    positions = np.arange(len(compute))
    for (export, device), idx in compute.groupby(["export", "device"]).indices.items():  # per device, not per row
        m = merged[(merged["export"] == export) & (merged["device"] == device)]
        rows = compute.iloc[idx]
        covered[positions[idx]] = covered_ns(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy(), m)
    return covered


@register(KIND, Params)
def detect(trace: Trace, p: Params) -> list[Finding]:
    """Compute kernels slower while NCCL kernels or peer/host copies run on the same GPU."""
    k = trace.kernel_columns(_COLUMNS).dropna(subset=["device"])
    if k.empty:
        return []
    k = k.astype({"device": "int64"})
    comm = _communication(trace, k)
    compute = k[k["nccl_kind"].isna()].reset_index(drop=True)
    if comm.empty or compute.empty:
        return []
    duration = (compute["end_ns"] - compute["start_ns"]).to_numpy()
    share = _coverage(compute, comm) / np.maximum(duration, 1)
    # a missing launch shape (old exports, NULLs) is its own value, not a reason to drop the kernel
    compute = compute.assign(dur=duration, overlapped=share >= p.overlap_share, clean=share == 0,
                             grid=compute["grid"].fillna(-1), block=compute["block"].fillna(-1))  # fmt: skip
    keys = ["export", "device", "short_name", "grid", "block"]
    groups = compute.groupby(keys, observed=True)
    stats = _group_stats(compute, keys)
    if stats.empty:
        return []
    stats = stats[(stats["n_over"] >= p.min_samples) & (stats["n_clean"] >= p.min_samples)]
    stats = stats[(stats["med_over"] >= p.min_ratio * stats["med_clean"]) & (stats["med_over"] > stats["p90_clean"])]

    runs = run_ns(trace)
    comm_by_device = {key: g for key, g in comm.groupby(["export", "device"])}
    findings = []
    for key, s in stats.iterrows():  # one iteration per slowed kernel group
        export, device, name, grid, block = key
        members = compute.iloc[groups.indices[key]]
        over = members[members["overlapped"]]
        what = _main_overlap(over, comm_by_device.get((export, device), comm.iloc[0:0]))
        extra = int((s["med_over"] - s["med_clean"]) * s["n_over"])
        run = int(runs.get(export, 0))
        pid = int(over["pid"].mode().iloc[0])
        rank = over["rank"].dropna()
        findings.append(
            Finding(
                kind=KIND,
                severity=severity(extra, run, p),
                title=(f"{name} runs {s['med_over'] / s['med_clean']:.2f}x slower while {what} runs "
                       f"({s['med_over'] / 1e3:.0f} us vs {s['med_clean'] / 1e3:.0f} us)"),  # fmt: skip
                advice=(
                    "Communication is taking GPU resources from this kernel. For NCCL, cap its SM use while it "
                    "overlaps compute (NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS, or a lower NCCL_NCHANNELS_PER_NET_PEER), "
                    "or move point-to-point traffic to copy engines (cudaMemcpyPeerAsync, nsysan's P2P transport), "
                    "which use no SMs. Otherwise schedule communication where compute is memory-light "
                    "(bucket sizes, overlap windows)."
                ),
                start_ns=int(over["start_ns"].min()),
                end_ns=int(over["end_ns"].max()),
                impact_ns=extra,
                rank=int(rank.iloc[0]) if len(rank) else None,
                device=int(device),
                pid=pid,
                evidence={
                    "kernel": str(name),
                    "grid": unpack_shape(grid, block)[0] if grid >= 0 else None,
                    "block": unpack_shape(grid, block)[1] if block >= 0 else None,
                    "overlapped_instances": int(s["n_over"]),
                    "clean_instances": int(s["n_clean"]),
                    "median_overlapped_ns": round(float(s["med_over"])),
                    "median_clean_ns": round(float(s["med_clean"])),
                    "p90_clean_ns": round(float(s["p90_clean"])),
                    "overlapping_communication": what,
                    "example_overlapped_starts_ns": [int(t) for t in over["start_ns"].head(3)],
                    "share_of_run": share_text(extra, run),
                },
            )
        )
    return findings


def _group_stats(compute: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per kernel group: instances, median duration overlapped and clean, and the clean p90
    (grouped aggregations, no Python per group)."""
    over = compute[compute["overlapped"]].groupby(keys, observed=True)["dur"]
    clean = compute[compute["clean"]].groupby(keys, observed=True)["dur"]
    stats = pd.concat(
        {"n_over": over.size(), "med_over": over.median(), "n_clean": clean.size(), "med_clean": clean.median(),
         "p90_clean": clean.quantile(0.9)},
        axis=1,
    )  # fmt: skip
    return stats.dropna(subset=["med_over", "med_clean"])


def _main_overlap(over: pd.DataFrame, comm: pd.DataFrame) -> str:
    """The kind of communication that covered the overlapped instances most."""
    if over.empty or comm.empty:
        return "communication"
    best, best_ns = "communication", -1
    for what, g in comm.groupby("what"):  # a handful of kinds
        ns = int(covered_ns(over["start_ns"].to_numpy(), over["end_ns"].to_numpy(), merge(g, ["export", "device"])).sum())
        if ns > best_ns:
            best, best_ns = str(what), ns
    return best
