"""gpu_idle: a GPU idle inside steps because its host was not ready to give it work.

Definition. The step breakdown (:mod:`nsysan.attribution`) counts as idle the time of a step no
kernel, NCCL kernel, copy or memset ran on the rank's GPU, and gives each idle gap the host-side
cause the capture shows (:func:`nsysan.attribution.host.idle_causes`): the operation that ended the
gap was launched only after the gap began, and meanwhile its launching thread was loading data
(OS runtime reads and waits, data-loading NVTX ranges), or had been blocked in a synchronize
until the GPU drained, or was blocked on a full launch queue, or was simply busy between launches
(launch overhead). Idle whose operation was launched before the gap (it waited for another
stream, device or peer) is not the host's and not this finding's.

An episode is a run of consecutive steps of one rank where the idle of one cause is at least
``min_idle_ns`` and ``min_share`` of the step: a job that is launch-bound throughout is one
finding, a data-loading stall in three steps another. A rank's first step waiting for launches
more than twice as long as its other steps do (the median) is warm-up (lazy module loading, first
launches, allocator growth, autotuning, graph capture) and is left out when the rank has three steps
or more: it happens once per job, not once per step, and no launch-side fix removes it (the step
breakdown still shows its idle). Removing the cause (graph edits, replayed for
``recoverable_ns``): for launch overhead and data loading, the host loses none of that time, so each
of its launches in those steps comes earlier by the idle of that cause before it in its host epoch
(between two blocking calls), and its next blocking call by the epoch's total; where the host stays
slower than its GPU, the GPU waits at the next launches instead. For a synchronize or a full launch
queue, the blocking calls those launches waited on no longer wait for the GPU (the host's own work
in them stays), as an asynchronous copy from pinned memory or a synchronize taken out of the step
would. Group and family: the cause, whatever the rank (one fix for the host code every rank runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.attribution.host import IDLE_CAUSES
from nsysan.attribution.job import JobAttribution
from nsysan.detect.common import SeverityParams, share_text, step_episodes
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Cause, Finding, Severity
from nsysan.ingest.trace import Trace

KIND = "gpu_idle"
HOST_CAUSES = ("launch", "sync", "data_loading", "blocked_launch")
_ADVICE = {
    "launch": "The host launched work slower than the GPU ran it (launch-bound): many small kernels, each paying "
    "CPU launch overhead. Capture the step as a CUDA graph (torch.cuda.CUDAGraph, torch.compile(mode="
    "'reduce-overhead')), fuse small kernels (torch.compile), and cut Python work between launches.",
    "sync": "The host waited in a synchronize (cudaStreamSynchronize/cudaDeviceSynchronize, or a .item()/.cpu()/"
    "print of a CUDA tensor) until the GPU drained, and only then prepared the next work: the GPU idles for every "
    "host step after it. Take the synchronization out of the step (log metrics every N steps, keep values on the "
    "GPU, use non_blocking copies and events).",
    "data_loading": "The host was loading the next batch while the GPU waited: use more DataLoader workers "
    "(num_workers, persistent_workers), pin_memory=True and prefetch_factor, move decoding to the GPU (DALI), or "
    "prefetch the next batch during the current step.",
    "blocked_launch": "The launching thread was blocked on a full launch queue while this GPU had nothing to run "
    "(the queue was full of another stream's or device's work): launch from separate threads per device, or queue "
    "fewer entries (CUDA graphs).",
}


@dataclass(frozen=True)
class Params(SeverityParams):
    min_idle_ns: int = param(20_000, "idle of one host cause a step needs to count")
    min_share: float = param(0.05, "... and the share of the step it must be")


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """One finding per run of steps whose GPU idled for the same host-side cause."""
    att: JobAttribution | None = job.attribution
    if att is None or att.breakdown.empty:
        return []
    run = max(att.wall_ns, 1)
    b = att.breakdown
    first = b["step"].to_numpy() == b.groupby("rank")["step"].transform("min").to_numpy()
    enough = b.groupby("rank")["step"].transform("size").to_numpy() >= 3
    out = []
    for cause in HOST_CAUSES:
        amount = b[f"idle_{cause}_ns"].to_numpy(dtype=np.float64)
        # the first step is warm-up when the rank's other steps idle for this cause less than half as much
        usual = pd.Series(np.where(first, np.nan, amount)).groupby(b["rank"].to_numpy()).transform("median").to_numpy()
        warm_up = first & enough & (amount > 2 * np.nan_to_num(usual)) & (cause == "launch")
        amount = np.where(warm_up, 0.0, amount)
        for ep in step_episodes(b, amount, p.min_idle_ns, p.min_share):
            out.append((_finding(att, ep, cause), run))
    return out


@register(KIND, Params, reduce=reduce)
def detect(trace: Trace, p: Params) -> dict[str, pd.DataFrame]:
    """GPU idle inside steps because the host was late: launches, synchronizes, data loading."""
    return {}  # the breakdown and its idle gaps come from the attribution


def _finding(att: JobAttribution, ep: pd.DataFrame, cause: str) -> Finding:
    rank = int(ep["rank"].iloc[0])
    export = int(ep["export"].iloc[0])
    steps = ep["step"].to_numpy()
    idle = int(ep["amount"].sum())
    length = int((ep["end_ns"] - ep["start_ns"]).sum())
    mine = att.gaps_of(rank, steps, [IDLE_CAUSES.index(cause)])
    # the five longest, ordered as a (quicksort) sort by length would order them: only their times are read
    longest = (mine["end_ns"] - mine["start_ns"]).reset_index(drop=True).sort_values(ascending=False).index[:5]
    # removed: a host that lost none of that time runs that far ahead of where it was
    if cause in ("sync", "blocked_launch"):  # the host stops blocking there
        edits = att.host_unblock(rank, steps, [IDLE_CAUSES.index(cause)])
    else:  # the host loses no time there
        edits = att.host_catch_up(rank, steps, [IDLE_CAUSES.index(cause)])
    first, last = int(steps.min()), int(steps.max())
    where = f"step {first}" if first == last else f"steps {first}-{last}"
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=(
            f"GPU of rank {rank} idle {idle / 1e6:.2f} ms waiting for its host ({cause.replace('_', ' ')}) in "
            f"{where}: {100 * idle / max(length, 1):.1f}% of those steps"
        ),
        advice=_ADVICE[cause],
        start_ns=int(ep["start_ns"].min()),
        end_ns=int(ep["end_ns"].max()),
        impact_ns=idle,
        rank=rank,
        device=None,
        pid=None,
        group=f"{KIND}|{cause}",
        evidence={
            "cause": cause,
            "steps": [first, last],
            "idle_ns_per_step": ep["amount"].to_numpy(dtype=np.int64).tolist(),
            "idle_share_pct": round(100 * idle / max(length, 1), 1),
            "gaps": len(mine),
            "longest_gaps_ns": [
                [int(s), int(e)]
                for s, e in zip(mine["start_ns"].to_numpy()[longest], mine["end_ns"].to_numpy()[longest], strict=True)
            ],
            "export": export,
            "share_of_run": share_text(idle, att.wall_ns),
        },
        cause=Cause(f"{KIND}|{cause}", edits),
    )
