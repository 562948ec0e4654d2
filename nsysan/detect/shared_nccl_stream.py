"""shared_nccl_stream: an NCCL operation that was ready, with ready participants, but waited in its
stream's queue behind a running operation of another communicator: head-of-line blocking that one
stream per communicator would remove.

NCCL runs a stream's operations in order. When operations of different communicators share a
stream (tensor- and data-parallel all-reduces on one stream; a pipeline stage's sends to the next
stage and receives from the previous one), an operation B whose input and participants are ready
waits until the operation A ahead of it finishes its transfer, although nothing orders B after A but
the stream. :mod:`nsysan.detect.nccl_ordering_stall` reports the case where A was waiting for a late
rank; this reports the rest: A was running (or waiting for peers that were themselves queued).

Definition, on the job clock, with the attribution's NCCL operations and participants:

1. **B queued behind A**: A is the op before B (as nccl_ordering_stall finds it: on B's stream, or
   B's communicator's previous op when that ended later); B started within ``queue_tolerance_ns``
   of A's end.
2. **Different communicators**: NCCL's communicator alone where payloads name it (so an A found
   through B's communicator never qualifies: NCCL orders a communicator's operations whatever the
   streams); otherwise the set of ranks taking part, so two communicators over the same ranks count
   as one and are never reported.
3. **Held**: B was ready (the event its stream waited on, else its launch's return) at least
   ``min_stall_ns`` before A ended.
4. **Lost** = B.start - max(B ready, its participants' latest readiness, A's start) >=
   ``min_stall_ns`` (before A started, B waited for something else). Not reported where
   :mod:`~nsysan.detect.nccl_ordering_stall`, with the parameters this report runs it with, reports
   B (behind an op waiting for a late rank).

One finding per rank, stream and step (an episode), its lost time the sum; the group is (rank,
stream), so a pipeline stage's stream is one headline. Recoverable time is the what-if replay with
the episode's ops no longer ordered behind the op before them on their stream
(``no_stream_order``), the job's other constraints kept.

Blind spots: without payloads, participants come from program position and an op whose
participants are unknown is not judged; communicators over the same ranks look alike, and where
program position may have merged several into one set (:func:`_merged_ranks`) the wait is not
judged but counted in ``steps.unjudged``; readiness
cannot see host-side dependencies that are not CUDA events; a copy engine or SM contention that
separate streams would bring is not modelled (the replay assumes both transfers proceed at their
measured speed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.attribution import comm as comm_table
from nsysan.detect import nccl_ordering_stall as ordering
from nsysan.detect.common import SeverityParams, as_int, as_optional_int, operations, share_text, unjudged_waits
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.trace import Trace

KIND = "shared_nccl_stream"
_EVIDENCE_OPS = 20  # held operations listed in a finding's evidence, the longest waits first


@dataclass(frozen=True)
class Params(SeverityParams):
    min_stall_ns: int = param(50_000, "B must lose at least this much, and be ready this long before A ended")
    queue_tolerance_ns: int = param(20_000, "B counts as queued behind A if it started within this after A ended")


def blocked(
    ops: pd.DataFrame, parts: comm_table.Participants, p: Params, ordering_params: ordering.Params | None = None
) -> pd.DataFrame:
    """The ops held behind an op of another communicator, indexed by op position (as B): A, when B
    and its participants were all ready and A had started (``free_at``: B could have run beside A
    from then) and the time lost (``lost``). ``ordering_params``:
    nccl_ordering_stall's, as this report runs it (its stalls are its own, not reported here)."""
    a = ordering.predecessor(ops)
    a_end = ops["a_end"].to_numpy()
    queued = np.abs(ops["start_ns"].to_numpy() - ops["end_ns"].to_numpy()[np.maximum(a, 0)])
    b = np.flatnonzero((queued <= p.queue_tolerance_ns) & (a >= 0))
    if not len(b):
        return pd.DataFrame(columns=["a", "free_at", "lost", "ambiguous"])
    ab = a[b]
    ready = ops["ready"].to_numpy()
    last = comm_table.latest_peer(ops, parts, key="ready")[b]
    peers_ready = np.where(last >= 0, ready[np.maximum(last, 0)], np.nan)  # NaN: participants unknown
    free_at = np.fmax(ready[b], peers_ready)
    a_start = ops["a_start"].to_numpy()
    free_at = np.fmax(free_at, a_start[ab])  # before A started, B waited for something else
    lost = a_start[b] - free_at
    signature = comm_table.communicator_signature(ops, parts)
    latest = comm_table.latest_peer(ops, parts)
    known_a = latest[ab] >= 0  # A's participants known, so its communicator
    held = known_a & ~np.isnan(peers_ready) & (lost >= p.min_stall_ns) & (a_end[ab] - ready[b] >= p.min_stall_ns)
    late = ordering.stalls(ops, parts, ordering_params or ordering.Params(), known=(latest, a)).index.to_numpy()
    held &= ~np.isin(b, late)
    ok = held & (signature[b] != signature[ab])
    same = held & ~ok
    if same.any():
        same[same] = _merged_ranks(ops, parts, signature, b[same])
    kept = ok | same
    return pd.DataFrame({"a": ab[kept], "free_at": free_at[kept], "lost": lost[kept], "ambiguous": same[kept]},
                        index=b[kept])  # fmt: skip


def _merged_ranks(
    ops: pd.DataFrame, parts: comm_table.Participants, signature: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """Per op in ``b`` (held behind an op of its own rank set), whether that rank set may be
    several communicators taken for one: its participants came from program position (no payload
    names its communicator) and, on its stream, its rank runs the same kernel with a smaller set of
    ranks inside it, in two operations or more (the tensor-parallel pairs of TP x DP, whose
    all-reduces end together when they all waited behind a data-parallel one). Not a pipeline's
    sends and receives beside its world all-reduce (another kernel), nor a subgroup on a stream of
    its own (PyTorch gives each process group one: not what position merged into B), nor one op
    matched without a rank that joined the capture late. Then B and the op ahead of it may be one
    communicator (NCCL orders them anyway) or several sharing a stream, and nothing in the timing
    tells which."""
    rank = ops["rank"].to_numpy()
    stream = ops["stream"].to_numpy()
    unnamed = ops["comm_id"].isna().to_numpy() if "comm_id" in ops else np.ones(len(ops), dtype=bool)
    known = np.flatnonzero(parts.matched())
    first = pd.Series(known).groupby(signature[known]).first()  # one op per rank set
    members = parts.ranks_of(ops, first.to_numpy())
    set_of = {int(s): frozenset([int(rank[i]), *members[int(i)]])
              for s, i in zip(first.index.tolist(), first.tolist(), strict=True)}  # fmt: skip
    name, _ = pd.factorize(ops["short_name"])
    seen = pd.DataFrame({"rank": rank[known], "stream": stream[known], "name": name[known], "sig": signature[known]})
    seen = seen.groupby(list(seen.columns)).size().rename("count").reset_index()
    seen = seen[seen["count"] >= 2]
    sets_of: dict[tuple[int, int, int], list[frozenset[int]]] = {}
    columns = (seen[c].tolist() for c in ("rank", "stream", "name", "sig"))
    for r, st, n, sig in zip(*columns, strict=True):  # distinct (rank, stream, kernel, set): few
        sets_of.setdefault((int(r), int(st), int(n)), []).append(set_of[int(sig)])
    out = np.zeros(len(b), dtype=bool)
    for k, i in enumerate(b):  # held ops only (a few per step)
        mine = set_of.get(int(signature[i]))
        if mine is None or not unnamed[i]:
            continue
        here = sets_of.get((int(rank[i]), int(stream[i]), int(name[i])), [])
        out[k] = any(len(other) >= 2 and other < mine for other in here)
    return out


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """Every B of the job held behind another communicator's op on its stream, one finding per
    rank, stream and step (an episode: a pipeline stage's stream holds several ops every step)."""
    found = ordering.job_operations(job)
    if found is None:
        return []
    ops, parts = found
    att = job.attribution
    held = blocked(ops, parts, p, job.params.get(ordering.KIND))
    unsure = held["ambiguous"].to_numpy(dtype=bool)
    if unsure.any():
        job.unjudged.extend(_not_judged(ops, held[unsure]))
    held = held[~unsure]
    if held.empty:
        return []
    rows = held.index.to_numpy()
    held = held.assign(arrival=att.comm_nodes(ops["op"].to_numpy()[rows], "arrival"),
                       rank=ops["rank"].to_numpy()[rows], stream=ops["stream"].to_numpy()[rows],
                       iteration=ops["iteration"].to_numpy()[rows], export=ops["export"].to_numpy()[rows])  # fmt: skip
    participants_of = parts.ranks_of(ops, rows)
    blocking_of = parts.ranks_of(ops, held["a"].to_numpy(dtype=np.int64))
    graded = []
    for _key, e in held.groupby(["export", "rank", "stream", "iteration"], sort=True):  # one per episode
        graded.append(_finding(ops, e, participants_of, blocking_of, job, parts.method))
    return graded


def _not_judged(ops: pd.DataFrame, held: pd.DataFrame) -> list[dict[str, object]]:
    """The time held ops of :func:`_merged_ranks` waited, per rank, as ``steps.unjudged`` entries."""
    rows = held.index.to_numpy()
    return unjudged_waits(
        KIND, ops["rank"].to_numpy()[rows], ops["stream"].to_numpy()[rows], held["free_at"].to_numpy(dtype=np.int64),
        ops["a_start"].to_numpy()[rows].astype(np.int64),
        lambda count: f"{operations(count)} ready, with ready peers, waited behind an operation of the same ranks on "
        "their stream; without NCCL's payloads the ranks were matched by program position, and the same kernel "
        "also runs in smaller sets of them, so whether these are one communicator (ordered by NCCL anyway) or "
        "several sharing the stream is not judged (up to this long)")  # fmt: skip


def _finding(ops: pd.DataFrame, e: pd.DataFrame, participants_of: dict[int, list[int]],
             blocking_of: dict[int, list[int]], job: JobFacts, method: str) -> tuple[Finding, int]:  # fmt: skip
    worst = as_int(e["lost"].idxmax())
    b, prev = ops.iloc[worst], ops.iloc[as_int(e.at[worst, "a"])]
    lost = int(e["lost"].sum())
    export = as_int(b["export"])
    off = int(comm_table.offsets(job.clock, np.array([export]))[0])
    run = int(job.runs[export])
    rank, stream, n = int(b["rank"]), int(b["stream"]), len(e)
    step = f" in step {int(b['iteration'])}" if int(b["iteration"]) >= 0 else ""
    title = (
        f"{b['short_name']} on rank {rank} waited {lost / 1e3:.0f} us behind {prev['short_name']} of another "
        f"communicator on NCCL stream {stream}{step}, though it and its peers were ready"
        if n == 1
        else f"{n} NCCL operations on rank {rank} waited {lost / 1e3:.0f} us in all behind other communicators' "
        f"operations on NCCL stream {stream}{step}, though they and their peers were ready"
    )
    arrivals = tuple(int(x) for x in e["arrival"] if x > 0)
    ops_listed = [{"kernel": str(ops["short_name"].iat[i]), "correlation_id": as_optional_int(ops["correlation_id"].iat[i]),
                   "start_ns": as_int(ops["start_ns"].iat[i]), "lost_ns": as_int(e.at[i, "lost"]),
                   "behind": str(ops["short_name"].iat[as_int(e.at[i, "a"])])}
                  for i in e.sort_values("lost", ascending=False).index[:_EVIDENCE_OPS]]  # fmt: skip
    finding = Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=title,
        advice=(
            "NCCL runs a stream's operations in order, so an operation of one communicator waits for the transfer "
            "of another's ahead of it. Give each communicator its own stream: separate process groups "
            "(torch.distributed.new_group) get separate NCCL streams in PyTorch; group a pipeline stage's sends "
            "and receives (batch_isend_irecv) or issue the one whose peer is ready first; or use a transport "
            "without a total order for point-to-point (nsysan's P2P transport)."
        ),
        start_ns=int(e["free_at"].min()) - off,
        end_ns=int(ops["start_ns"].to_numpy()[e.index.to_numpy()].max()),
        impact_ns=lost,
        rank=rank,
        device=int(b["device"]),
        pid=int(b["pid"]),
        group=f"{KIND}|rank {rank}|stream {stream}",
        cause=Cause(KIND, (Edit("no_stream_order", nodes=arrivals),)) if arrivals else None,
        evidence={
            "stream": stream,
            "operations": n,
            "worst": {
                "blocked_op": {
                    "kernel": str(b["short_name"]),
                    "correlation_id": as_optional_int(b["correlation_id"]),
                    "ready_ns": int(b["ready"]) - off,
                    "start_ns": int(b["start_ns"]),
                    "participants": participants_of[worst],
                    "could_start_ns": as_int(e.at[worst, "free_at"]) - off,
                },
                "blocking_op": {
                    "kernel": str(prev["short_name"]),
                    "correlation_id": as_optional_int(prev["correlation_id"]),
                    "start_ns": int(prev["start_ns"]),
                    "end_ns": int(prev["end_ns"]),
                    "participants": blocking_of[as_int(e.at[worst, "a"])],
                },
            },
            "held_ops": ops_listed,
            "participants_from": method,
            "share_of_run": share_text(lost, run),
        },
    )
    return finding, run


@register(KIND, Params, reduce=reduce)
def detect(trace: Trace, p: Params) -> dict[str, pd.DataFrame]:
    """NCCL ops held in their stream's queue behind another communicator's running op."""
    return {}  # the NCCL operations come from the attribution's map (nsysan.attribution.comm)
