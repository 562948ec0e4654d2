"""copy_bound: steps whose GPU time goes to copies that nothing hides.

Definition. In the step breakdown (:mod:`nsysan.attribution`), ``copy_exposed`` is the time a
memcpy or memset ran on the rank's GPU while no kernel did: copies serialized with compute on one
stream (a ``tensor.to("cuda")`` on the compute stream) or waited for by it, not overlapped. An
episode is a run of consecutive steps of one rank where it is at least ``min_copy_ns`` and
``min_share`` of the step. The evidence gives what moved: bytes, the bandwidth achieved (bytes
over the copies' busy time), the share from pageable host memory (staged through a bounce
buffer, about half the bandwidth of pinned memory) and the share of copy time on the rank's main
stream.

Removing the cause: the copies of those steps take no GPU time (their data already on the GPU),
replayed for ``recoverable_ns``: an upper bound for prefetching them on a side stream, which hides
them only as far as compute lasts. Group and family: the whole job (the same input pipeline on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.attribution.breakdown import COPY_KINDS
from nsysan.attribution.job import JobAttribution
from nsysan.detect.common import SeverityParams, share_text, step_episodes
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.trace import Trace

KIND = "copy_bound"


@dataclass(frozen=True)
class Params(SeverityParams):
    min_copy_ns: int = param(50_000, "exposed copy time a step needs to count")
    min_share: float = param(0.05, "... and the share of the step it must be")


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """One finding per run of steps whose exposed copies took a large share of the step."""
    att: JobAttribution | None = job.attribution
    if att is None or att.breakdown.empty:
        return []
    amount = att.breakdown["copy_exposed"].to_numpy(dtype=np.float64)
    run = max(att.wall_ns, 1)
    return [(_finding(att, ep), run) for ep in step_episodes(att.breakdown, amount, p.min_copy_ns, p.min_share)]


@register(KIND, Params, reduce=reduce)
def detect(trace: Trace, p: Params) -> dict[str, pd.DataFrame]:
    """Steps bound by memory copies that no compute hides."""
    return {}  # the breakdown comes from the attribution


def _finding(att: JobAttribution, ep: pd.DataFrame) -> Finding:
    rank = int(ep["rank"].iloc[0])
    steps = ep["step"].to_numpy()
    exposed = int(ep["amount"].sum())
    length = int((ep["end_ns"] - ep["start_ns"]).sum())
    nbytes = int(ep["copy_bytes"].sum())
    busy = int(ep["copy_busy_ns"].sum())
    pageable = int(ep["copy_pageable_bytes"].sum())
    on_main = int(ep["copy_main_stream_ns"].sum())
    kinds = {
        label: (int(ep[f"copy_{k}_bytes"].sum()), int(ep[f"copy_{k}_ns"].sum())) for k, label in COPY_KINDS.items()
    }
    kinds = {label: v for label, v in kinds.items() if v[0] or v[1]}
    # the kind that took the most time names the bottleneck (a D2D copy at HBM speed is not one)
    main_kind = max(kinds, key=lambda label: kinds[label][1]) if kinds else None
    kbytes, kbusy = kinds[main_kind] if main_kind else (nbytes, busy)
    bandwidth = kbytes / kbusy if kbusy else 0.0  # bytes per ns = GB/s
    first, last = int(steps.min()), int(steps.max())
    where = f"step {first}" if first == last else f"steps {first}-{last}"
    nodes = np.empty(0, dtype=np.int64)
    if att.graph is not None:
        n = att.graph.nodes
        nodes = np.flatnonzero((n["rank"].to_numpy() == rank) & np.isin(n["step"].to_numpy(), steps)
                               & (n["copy_ns"].to_numpy() > 0))  # fmt: skip
    advice = (
        "Copies are on the critical path. Move them off it: copy from pinned host memory (DataLoader "
        "pin_memory=True, tensor.pin_memory()) with non_blocking=True on a side stream, prefetch the next batch "
        "while this one computes, keep data resident on the GPU across steps, or move less (smaller dtypes, "
        "GPU-side decoding)."
        + (f" {100 * pageable / nbytes:.0f}% of the bytes came from pageable memory, staged through a bounce buffer."
           if nbytes and pageable else "")
        + (f" {100 * on_main / busy:.0f}% of the copy time ran on the compute stream itself, serialized with the "
           "kernels." if busy and on_main else "")
    )  # fmt: skip
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=(
            f"Copies exposed on rank {rank}: {exposed / 1e6:.2f} ms ({100 * exposed / max(length, 1):.0f}% of "
            f"{where}), mostly {(main_kind or 'copies').lower()}: {kbytes / 1e9:.2f} GB at {bandwidth:.1f} GB/s"
        ),
        advice=advice,
        start_ns=int(ep["start_ns"].min()),
        end_ns=int(ep["end_ns"].max()),
        impact_ns=exposed,
        rank=rank,
        group=KIND,
        evidence={
            "steps": [first, last],
            "copy_exposed_ns_per_step": ep["amount"].to_numpy(dtype=np.int64).tolist(),
            "exposed_share_pct": round(100 * exposed / max(length, 1), 1),
            "bytes": nbytes,
            "copy_busy_ns": busy,
            "by_kind": {
                label: {"bytes": b, "busy_ns": t, "gb_per_s": round(b / t, 2) if t else None}
                for label, (b, t) in kinds.items()
            },
            "bandwidth_gb_per_s": round(bandwidth, 2),
            "pageable_bytes": pageable,
            "copy_ns_on_compute_stream": on_main,
            "share_of_run": share_text(exposed, att.wall_ns),
        },
        cause=Cause(
            KIND,
            (
                Edit(
                    "scale",
                    nodes=tuple(np.asarray(nodes, dtype=np.int64).tolist()),
                    amounts=tuple(x for _ in nodes for x in (1.0, 0.0)),
                ),
            ),
        ),
    )
