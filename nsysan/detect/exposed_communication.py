"""exposed_communication: NCCL transfers that no compute hides.

Definition. In the step breakdown (:mod:`nsysan.attribution`), ``communication_exposed`` is the time
an NCCL kernel was transferring (all its participants had arrived) while no compute kernel ran on
the rank's GPU; the time before the last participant arrived is ``waiting_for_peer`` and belongs to
``late_rank``. An episode is a run of consecutive steps of one rank where it is at least
``min_exposed_ns`` and ``min_share`` of the step. The evidence names the operations that were
exposed longest.

Removing the cause: those operations' transfers take no time on the rank and on their send/recv
partners (the graph's transfer edges zeroed); a collective's other members are their own ranks'
findings, and the family (the whole job) removes every rank's together. Replayed for
``recoverable_ns``: what hiding the communication completely would save, an upper bound for
overlapping it better. Operations that were matched with
no participant are left out of the edits (how much of their time was transfer is unknown) and
counted in the evidence (``unmatched_ns``). Group and family: the whole job, whatever the rank
(the same collectives on every rank; one fix, overlapping them, for all).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.attribution.job import JobAttribution
from nsysan.detect.common import SeverityParams, share_text, step_episodes
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.trace import Trace

KIND = "exposed_communication"
_TOP = 5


@dataclass(frozen=True)
class Params(SeverityParams):
    min_exposed_ns: int = param(50_000, "exposed NCCL transfer time a step needs to count")
    min_share: float = param(0.05, "... and the share of the step it must be")


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """One finding per run of steps whose NCCL transfers were exposed for a large share of the step."""
    att: JobAttribution | None = job.attribution
    if att is None or att.breakdown.empty:
        return []
    amount = att.breakdown["communication_exposed"].to_numpy(dtype=np.float64)
    run = max(att.wall_ns, 1)
    return [(_finding(att, ep), run) for ep in step_episodes(att.breakdown, amount, p.min_exposed_ns, p.min_share)]


@register(KIND, Params, reduce=reduce)
def detect(trace: Trace, p: Params) -> dict[str, pd.DataFrame]:
    """NCCL transfers on the critical path: not overlapped with compute."""
    return {}  # the breakdown comes from the attribution


def _by_kernel(c: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """Exposed time (``sum``) and operations (``size``) per kernel name of ``rows`` of ``c``, by name
    in text order: from the names' codes where every row has one (a finding per rank of a 1,024-rank
    job: pandas' grouping cost 6 ms each), else grouped by the names as text."""
    names = c["short_name"]
    codes = names.cat.codes.to_numpy()[rows] if isinstance(names.dtype, pd.CategoricalDtype) else None
    if codes is None or (codes < 0).any():
        mine = c.iloc[rows]
        return mine.groupby(mine["short_name"].astype(str))["exposed_ns"].agg(["sum", "size"])
    used, at = np.unique(codes, return_inverse=True)
    order = np.argsort(at, kind="stable")
    starts = np.flatnonzero(np.concatenate([[True], at[order][1:] != at[order][:-1]])) if len(at) else at
    spent = c["exposed_ns"].to_numpy()[rows][order]
    table = pd.DataFrame({"sum": np.add.reduceat(spent, starts) if len(at) else spent,
                          "size": np.diff(np.append(starts, len(at)))},
                         index=pd.Index(np.asarray(names.cat.categories)[used].astype(str), name="short_name"))  # fmt: skip
    return table.sort_index()


def _finding(att: JobAttribution, ep: pd.DataFrame) -> Finding:
    rank = int(ep["rank"].iloc[0])
    steps = ep["step"].to_numpy()
    exposed = int(ep["amount"].sum())
    length = int((ep["end_ns"] - ep["start_ns"]).sum())
    first, last = int(steps.min()), int(steps.max())
    where = f"step {first}" if first == last else f"steps {first}-{last}"
    c = att.comm
    ends = np.empty(0, dtype=np.int64)
    top: list[dict[str, object]] = []
    unknown = 0
    if len(c) and "exposed_ns" in c:
        export = int(ep["export"].iloc[0])
        off = att.clock.offsets[export] if export < len(att.clock.offsets) else 0
        lo, hi = int(ep["start_ns"].min()) + off, int(ep["end_ns"].max()) + off
        rows = att.comm_rows_of(rank)  # the rank's operations, then those of the episode, in arrays
        arrive, spent = c["a_start"].to_numpy()[rows], c["exposed_ns"].to_numpy()[rows]
        rows = rows[(arrive >= lo) & (arrive < hi) & (spent > 0)]
        by_name = _by_kernel(c, rows).sort_values("sum", ascending=False).head(_TOP)
        top = [{"kernel": str(k), "exposed_ns": int(v["sum"]), "count": int(v["size"])} for k, v in by_name.iterrows()]
        # an operation matched with no participant: how much of its time was transfer is unknown
        # (its wait for a peer cannot be told apart), so removing its transfer is not claimed
        matched = c["matched"].iloc[rows].to_numpy(dtype=bool)
        unknown = int(c["exposed_ns"].to_numpy()[rows[~matched]].sum())
        rows = rows[matched]
        # its own operations and their send/recv partners: a collective's other members are each
        # their own rank's finding, and the family (the whole job) removes them all together
        ops = att.with_participants(rows, collectives=False)
        ends = att.comm_nodes(c["op"].to_numpy()[ops], "end")
        ends = ends[ends >= 0]
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=(
            f"Communication exposed on rank {rank}: {exposed / 1e6:.2f} ms of NCCL transfer with no compute "
            f"beside it ({100 * exposed / max(length, 1):.0f}% of {where})"
        ),
        advice=(
            "Overlap communication with compute: let DDP's buckets start earlier (bucket_cap_mb, "
            "gradient_as_bucket_view=True) or FSDP prefetch the next shard (backward_prefetch, forward_prefetch), "
            "accumulate gradients over more micro-batches per all-reduce, send less (bf16 gradients, "
            "communication hooks that compress), and check NCCL's algorithm and bandwidth for this message size "
            "(NCCL_DEBUG=INFO, nccl-tests)."
        ),
        start_ns=int(ep["start_ns"].min()),
        end_ns=int(ep["end_ns"].max()),
        impact_ns=exposed,
        rank=rank,
        group=KIND,
        evidence={
            "steps": [first, last],
            "exposed_ns_per_step": ep["amount"].to_numpy(dtype=np.int64).tolist(),
            "exposed_share_pct": round(100 * exposed / max(length, 1), 1),
            "operations": top,
            "unmatched_ns": unknown,
            "share_of_run": share_text(exposed, att.wall_ns),
        },
        cause=Cause(KIND, (Edit("no_transfer", nodes=tuple(np.asarray(ends, dtype=np.int64).tolist())),)),
    )
