"""late_rank: an NCCL operation whose participants waited for one rank that arrived late.

Definition. Every participant of a collective (or both sides of a send/recv) starts its NCCL kernel
when its own stream lets it (its *arrival*); the transfer starts when the last one arrives
(:mod:`nsysan.attribution.job` matches participants across ranks on one clock). An operation waited
for a late rank when its last arrival came at least ``min_late_ns`` (and three times the clock's
uncertainty) after the one before it: the others held the GPU in the NCCL kernel meanwhile
(``waiting_for_peer`` in the step breakdown).

Why it was late. What the late rank's GPU did from the start of its step to its arrival (its
*stretch*: compute, copies, idle waiting for its host, and when the step began against its peers)
against two references: the same stretch of the same rank at the same place in its other steps
(a rank slower than usual: a transient straggler), and, for collectives, where every participant
does the same work, the other participants' stretches in the same step (a rank slower than its
peers in most steps: a persistent straggler). Only an excess beyond three times the stretch's own
step-to-step spread counts, so the jitter of a healthy job and the fixed rhythm of a pipeline
(a stage always reaches its send after the previous stage's) blame nobody. Excess compute is this
finding's cause; excess idle waiting for the host and excess copying are what ``gpu_idle`` and
``copy_bound`` find on that rank, and the evidence says so instead of claiming the time twice.

Root. A rank can be late because it waited itself: when its previous NCCL operation waited for
another rank for at least ``inherit_share`` of its lateness, the delay came from that rank, and so
on back (a pipeline's stages hand a delay down). The finding blames the root, once per (root rank,
step) - an episode - with the inherited late arrivals listed as its cascade.

Removing the cause: the root's compute in the stretches before its late arrivals scaled down by its
excess (graph edits, replayed by the what-if for ``recoverable_ns``). Arrivals that are late but
neither beyond the operation's usual lateness nor explained by an excess are the job's normal
rhythm and are not reported. Group: the root rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from nsysan.arrays import rows_by
from nsysan.attribution.host import IDLE_CAUSES
from nsysan.attribution.job import JobAttribution
from nsysan.detect.common import SeverityParams, as_int, share_text
from nsysan.detect.registry import JobFacts, param, register
from nsysan.findings import Cause, Edit, Finding, Severity
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_arrays, union_arrays

KIND = "late_rank"
HOST_CAUSES = ("launch", "sync", "data_loading", "blocked_launch")
METRICS = ("compute", "copy", "idle", "start")
_MAX_CASCADE = 32
_EVIDENCE_OPS = 10
_SPREAD = 3.0  # an excess counts beyond this many robust standard deviations of the stretch


@dataclass(frozen=True)
class Params(SeverityParams):
    min_late_ns: int = param(50_000, "the last arrival must come at least this long after the one before it")
    inherit_share: float = param(0.5, "a late rank whose previous operation waited this share of its lateness "
                                      "inherited the delay")  # fmt: skip


def reduce(tables: dict[str, pd.DataFrame], job: JobFacts, p: Params) -> list[tuple[Finding, int]]:
    """One finding per (root rank, step) whose late arrivals held other ranks back."""
    att: JobAttribution | None = job.attribution
    if att is None or att.comm.empty or att.participants is None or "late_op" not in att.comm:
        return []
    c = att.comm
    s = stretches(att)
    rec = late_arrivals(att, s, p)
    if rec.empty:
        return []
    run = max(att.wall_ns, 1)
    out = []
    for (r, k), ep in rec.groupby(["root_rank", "root_step"], sort=True):  # one iteration per episode
        out.append((_finding(att, c, s, ep, int(r), int(k)), run))  # type: ignore[call-overload]
    return out


def _waiters(c: pd.DataFrame) -> pd.DataFrame:
    """(waiter, late) pairs of rows of ``c``: each operation and the participant it waited for last."""
    late = c["late_op"].to_numpy(dtype=np.int64)
    w = np.flatnonzero((late >= 0) & (late != np.arange(len(c))))
    start = c["a_start"].to_numpy()
    w = w[start[late[w]] > start[w]]
    return pd.DataFrame({"waiter": w, "late": late[w]})


def _participants_of(att: JobAttribution, op: int) -> np.ndarray:
    """Rows of ``att.comm`` taking part in ``op``'s operation with it (itself excluded)."""
    g = int(att.comm["group"].to_numpy()[op])
    if g >= 0:
        mates = att.group_rows(g)
    else:
        assert att.participants is not None
        e = att.participants.partners()  # sorted by i
        i = e["i"].to_numpy()
        mates = e["j"].to_numpy()[np.searchsorted(i, op, side="left") : np.searchsorted(i, op, side="right")]
    out: np.ndarray = mates[mates != op]
    return out


@register(KIND, Params, reduce=reduce)
def detect(trace: Trace, p: Params) -> dict[str, pd.DataFrame]:
    """NCCL operations whose participants waited for a late rank; blames the root of the delay."""
    return {}  # the NCCL operations and their arrivals come from the attribution's reduce


def stretches(att: JobAttribution) -> pd.DataFrame:
    """Per NCCL operation (rows of ``att.comm``): its step and place (``slot``) among its rank's
    operations in the step, and its rank's stretch before it: compute, copy and host-caused idle ns
    from where the rank last synchronized (its previous NCCL operation's end in the step, else the
    step's start) to the arrival, ``begin`` (that point, job clock), and ``start`` (how much later
    the rank's step began than the mean of the operation's other participants')."""
    c = att.comm
    n = len(c)
    out = pd.DataFrame({"step": np.full(n, -1, dtype=np.int64), **{m: np.zeros(n) for m in METRICS}})
    if n == 0 or att.windows.empty:
        out["slot"] = -1
        return out
    rank_of = c["rank"].to_numpy(dtype=np.int64)
    arrive = c["a_start"].to_numpy(dtype=np.int64)
    begin = np.full(n, -1, dtype=np.int64)
    times = att.graph.job_times() if att.graph is not None else np.empty(0)
    nodes = att.graph.nodes if att.graph is not None else None
    gaps = att.gaps
    host_caused = gaps["cause"].isin([IDLE_CAUSES.index(x) for x in HOST_CAUSES]).to_numpy() if len(gaps) else None
    # each rank's rows, found once: a pass over every row per rank is quadratic in ranks
    comm_rows = rows_by(rank_of)
    node_rows = rows_by(nodes["rank"].to_numpy()) if nodes is not None else {}
    gap_rows = rows_by(gaps["rank"].to_numpy()) if host_caused is not None else {}
    none = np.empty(0, dtype=np.int64)
    for value, w in att.windows.groupby("rank"):
        rank = as_int(value)
        mine = comm_rows.get(rank, none)
        if not len(mine):
            continue
        w = w.sort_values("a_start")
        ws, we = w["a_start"].to_numpy(), w["a_end"].to_numpy()
        at = np.searchsorted(ws, arrive[mine], side="right") - 1
        inside = (at >= 0) & (arrive[mine] < we[np.maximum(at, 0)])
        rows, at = mine[inside], at[inside]
        out.loc[rows, "step"] = w["step"].to_numpy()[at]
        # the stretch starts where the rank last synchronized: its previous NCCL operation's end in
        # the step (work before that was already waited for there), else the step's start
        order = rows[np.argsort(arrive[rows], kind="stable")]
        ends = np.maximum.accumulate(c["a_end"].to_numpy(dtype=np.int64)[order])
        prev_end = np.concatenate([[-1], ends[:-1]])
        same_step = np.concatenate([[False], at[np.argsort(arrive[rows], kind="stable")][1:]
                                    == at[np.argsort(arrive[rows], kind="stable")][:-1]])  # fmt: skip
        start = ws[at[np.argsort(arrive[rows], kind="stable")]]
        begin[order] = np.where(same_step, np.clip(prev_end, start, arrive[order]), start)
        if nodes is not None:  # work of the rank's graph segments that ended before the arrival
            own = node_rows.get(rank, none)
            order = own[np.argsort(times[own], kind="stable")]
            t = times[order]
            for metric, column in (("compute", "compute_ns"), ("copy", "copy_ns")):
                cum = np.concatenate([[0.0], np.cumsum(nodes[column].to_numpy()[order])])
                upto = cum[np.searchsorted(t, arrive[rows], side="right")]
                since = cum[np.searchsorted(t, begin[rows], side="right")]
                out.loc[rows, metric] = upto - since
        if host_caused is not None:
            host = gap_rows.get(rank, none)
            host = host[host_caused[host]]
            if len(host):
                off = np.asarray(att.clock.offsets, dtype=np.int64)[gaps["export"].to_numpy(dtype=np.int64)[host]]
                lo, hi = union_arrays(gaps["start_ns"].to_numpy()[host] + off, gaps["end_ns"].to_numpy()[host] + off)
                out.loc[rows, "idle"] = covered_arrays(begin[rows], arrive[rows], lo, hi)
    step_start = np.full(n, -1, dtype=np.int64)
    placed = out["step"].to_numpy() >= 0
    for value, w in att.windows.groupby("rank"):
        rank = as_int(value)
        mine = comm_rows.get(rank, none)
        mine = mine[placed[mine]]
        lookup = pd.Series(w["a_start"].to_numpy(), index=w["step"].to_numpy())
        step_start[mine] = lookup.reindex(out["step"].to_numpy()[mine]).to_numpy()
    out["start"] = np.maximum(step_start - _others_mean(att, {"start": step_start.astype(np.float64)})["start"], 0.0)
    out.loc[step_start < 0, "start"] = 0.0
    order = np.lexsort((arrive, out["step"].to_numpy(), rank_of))
    slot = np.empty(n, dtype=np.int64)
    key = np.stack([rank_of[order], out["step"].to_numpy()[order]])
    first = np.concatenate([[True], (key[:, 1:] != key[:, :-1]).any(axis=0)])
    run_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    slot[order] = np.arange(n) - run_start
    out["slot"] = slot
    out["begin"] = begin
    return out


def _others_mean(att: JobAttribution, xs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per operation and column of ``xs``, the mean over its operation's other participants (its
    collective's members, or its send/recv partners); NaN where it has none or the column is NaN
    for all of them. The columns share one grouping key, made once; each is grouped on its own."""
    c = att.comm
    out = {m: np.full(len(x), np.nan) for m, x in xs.items()}
    group = c["group"].to_numpy()
    coll = group >= 0
    if coll.any():
        codes = np.asarray(group[coll], dtype=np.int64)
        groups = int(codes.max()) + 1
        at = np.flatnonzero(coll)
        for m, x in xs.items():
            v = pd.Series(x[coll])
            ok = ~np.isnan(v.to_numpy())
            total = v.groupby(codes).transform("sum").to_numpy()  # NaN rows in neither
            size = np.bincount(codes, weights=ok, minlength=groups).astype(np.int64)[codes]
            mean = np.where(size > 1, (total - v.to_numpy()) / np.maximum(size - 1, 1), np.nan)
            out[m][at[ok]] = mean[ok]
    if att.participants is not None and len(att.participants.edges):
        e = att.participants.partners()
        i, j = e["i"].to_numpy(), e["j"].to_numpy()
        for m, x in xs.items():
            ok = ~np.isnan(x[j]) & (group[i] < 0)
            if ok.any():
                mean_of = pd.Series(x[j][ok]).groupby(i[ok]).mean()
                out[m][mean_of.index.to_numpy()] = mean_of.to_numpy()
    return out


def _robust(values: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per value, the median and robust standard deviation (1.4826 x the median absolute deviation)
    of the values sharing its group number in ``key`` (:func:`_groups`)."""
    center = pd.Series(values).groupby(key).transform("median").to_numpy()
    spread = 1.4826 * pd.Series(np.abs(values - center)).groupby(key).transform("median").to_numpy()
    return center, spread


def _groups(keys: list[np.ndarray]) -> np.ndarray:
    """The groups of rows sharing ``keys`` as one group number per row, found once for every
    metric: grouping by one array of numbers costs half of grouping by several columns."""
    ids: np.ndarray = pd.DataFrame({f"k{i}": k for i, k in enumerate(keys)}).groupby(
        [f"k{i}" for i in range(len(keys))]).ngroup().to_numpy()  # fmt: skip
    return ids


def _excess(att: JobAttribution, s: pd.DataFrame) -> pd.DataFrame:
    """Per operation, the excess of its rank's stretch per metric, counted only beyond ``_SPREAD``
    robust deviations of what is usual there.

    Collectives (every participant does the same work): the stretch minus the other participants'
    (mean) in the same step, against that difference over every rank and step at the same place:
    one slow rank stands out of all of them whether it is slow once or always. Send/recv (a
    pipeline's stages do different work): the stretch against the same rank's at the same place in
    its other steps, from the faster half (a late stage may be late in half of them)."""
    c = att.comm
    out = pd.DataFrame(index=s.index)
    placed = s["step"].to_numpy() >= 0
    group = c["group"].to_numpy()
    xs = {m: np.where(placed, s[m].to_numpy(dtype=np.float64), np.nan) for m in METRICS}
    others = _others_mean(att, xs)
    rank, slot = c["rank"].to_numpy(), s["slot"].to_numpy()
    collective = ~c["p2p"].to_numpy(dtype=bool) & (group >= 0) & placed
    own = placed & ~collective
    by_place = _groups([np.where(collective, slot, -1)]) if collective.any() else None
    by_rank_place = _groups([rank, slot]) if own.any() else None
    for m in METRICS:
        x = xs[m]
        excess = np.zeros(len(x))
        if by_place is not None:
            diff = np.where(collective, x - others.pop(m), np.nan)
            center, spread = _robust(diff, by_place)
            hit = collective & (diff - center > _SPREAD * spread) & (diff > 0)
            excess[hit] = diff[hit]
        if by_rank_place is not None:
            # the faster half of the rank's steps at this place: what it does when nothing delays it
            q = np.where(own, x, np.nan)
            median = pd.Series(q).groupby(by_rank_place).transform("median").to_numpy()
            center, spread = _robust(np.where(q <= median, q, np.nan), by_rank_place)
            hit = own & (x - center > _SPREAD * np.nan_to_num(spread)) & (x > center)
            excess[hit] = (x - center)[hit]
        out[m] = np.nan_to_num(np.minimum(excess, np.maximum(np.nan_to_num(x), 0.0)))
    return out


def late_arrivals(att: JobAttribution, s: pd.DataFrame, p: Params) -> pd.DataFrame:
    """One row per NCCL operation that others waited for and that arrived late, later than its rank
    usually is at that place or with an excess in its stretch: ``op`` (its row in ``att.comm``),
    rank, lateness_ns (after the latest of those who waited for it), second_ns (that arrival, job
    clock), step, the excess per metric, and root / root_rank / root_step (the cascade's origin)."""
    c = att.comm
    w = _waiters(c)
    lateness = np.zeros(len(c))
    second = np.zeros(len(c), dtype=np.int64)
    if len(w):
        start = c["a_start"].to_numpy(dtype=np.int64)
        latest = pd.Series(start[w["waiter"].to_numpy()]).groupby(w["late"].to_numpy()).max()
        ops = latest.index.to_numpy()
        second[ops] = latest.to_numpy()
        lateness[ops] = start[ops] - latest.to_numpy()
    excess = _excess(att, s)
    # how late this rank usually is at this place: the rhythm of the job, not a delay
    usual = pd.Series(lateness).groupby([c["rank"].to_numpy(), s["slot"].to_numpy()]).transform("median").to_numpy()
    floor = max(int(p.min_late_ns), 3 * int(att.clock.uncertainty_ns))
    explained = excess["compute"].to_numpy() + excess["copy"].to_numpy() + excess["idle"].to_numpy() > 0
    keep = np.flatnonzero((lateness >= floor) & ((lateness - usual >= floor) | explained))
    if not len(keep):
        return pd.DataFrame()
    rec = pd.DataFrame({"op": keep, "rank": c["rank"].to_numpy()[keep].astype(np.int64), "lateness_ns": lateness[keep],
                        "second_ns": second[keep], "step": s["step"].to_numpy()[keep]})  # fmt: skip
    for m in METRICS:
        rec[m] = excess[m].to_numpy()[keep]
    # parent: the late rank's previous NCCL operation waited for someone else for long enough
    by_rank = c.sort_values(["rank", "a_start"], kind="stable")
    prev = pd.Series(by_rank.index.to_numpy(), index=by_rank.index).groupby(by_rank["rank"].to_numpy()).shift()
    prev_op = prev.reindex(rec["op"]).to_numpy()
    rec_of_op = pd.Series(np.arange(len(rec)), index=rec["op"].to_numpy())
    parent = np.full(len(rec), -1, dtype=np.int64)
    ok = np.flatnonzero(~np.isnan(prev_op))
    y = prev_op[ok].astype(np.int64)
    candidate = rec_of_op.reindex(c["late_op"].to_numpy()[y]).to_numpy()
    waited = c["waited_ns"].to_numpy()[y] >= p.inherit_share * rec["lateness_ns"].to_numpy()[ok]
    cand = np.nan_to_num(candidate, nan=-1).astype(np.int64)
    valid = ~np.isnan(candidate) & waited & (rec["rank"].to_numpy()[np.maximum(cand, 0)] != rec["rank"].to_numpy()[ok])
    parent[ok[valid]] = cand[valid]
    root = np.where(parent >= 0, parent, np.arange(len(rec)))
    for _ in range(_MAX_CASCADE):
        up = parent[root]
        if not (up >= 0).any():
            break
        root = np.where(up >= 0, up, root)
    rec["root"] = root
    rec["root_rank"] = rec["rank"].to_numpy()[root]
    rec["root_step"] = rec["step"].to_numpy()[root]
    return rec


def _nodes_within(att: JobAttribution, rank: int, step: int, begin: int, arrive: int) -> np.ndarray:
    """The rank's graph nodes of the step that ended within (``begin``, ``arrive``] (job clock), ascending."""
    if att.graph is None:
        return np.empty(0, dtype=np.int64)
    del step  # by time: a rank with many steps has segments that span several
    ids, times = att.rank_nodes_by_time(rank)
    window = ids[np.searchsorted(times, begin, side="right") : np.searchsorted(times, arrive, side="right")]
    out: np.ndarray = np.sort(window[att.graph.nodes["compute_ns"].to_numpy()[window] > 0])
    return out


def _finding(att: JobAttribution, c: pd.DataFrame, s: pd.DataFrame, ep: pd.DataFrame, rank: int,
             step: int) -> Finding:  # fmt: skip
    direct = ep[ep["rank"] == rank].sort_values("lateness_ns", ascending=False)
    worst = (direct if len(direct) else ep.sort_values("lateness_ns", ascending=False)).iloc[0]
    op = int(worst["op"])
    export = int(c["export"].to_numpy()[op])
    off = int(att.clock.offsets[export]) if export < len(att.clock.offsets) else 0
    lateness = int(worst["lateness_ns"])
    kernel = str(c["short_name"].iat[op])  # one value: to_numpy() would convert every name
    rank_of = c["rank"].to_numpy()
    # the cause: the root's excess compute before each of its late arrivals, removed
    scale: dict[int, float] = {}
    for _, r in direct.iterrows():
        extra = float(r["compute"])
        own = float(s["compute"].to_numpy()[int(r["op"])])
        if extra <= 0 or own <= 0:
            continue
        op_r = int(r["op"])
        begin = int(s["begin"].to_numpy()[op_r])
        for v in _nodes_within(att, rank, int(r["step"]), begin, int(c["a_start"].to_numpy()[op_r])).tolist():
            scale[v] = min(scale.get(v, 1.0), (own - extra) / own)
    edits = (
        (Edit("scale", nodes=tuple(scale), amounts=tuple(x for f in scale.values() for x in (f, 1.0))),)
        if scale
        else ()
    )
    why = {m: int(worst[m]) for m in METRICS}
    stretch = {m: int(s[m].to_numpy()[op]) for m in METRICS}
    ops = []
    for _, r in direct.head(_EVIDENCE_OPS).iterrows():
        mates = np.append(_participants_of(att, int(r["op"])), int(r["op"]))
        ops.append({
            "kernel": str(c["short_name"].iat[int(r["op"])]),
            "correlation_id": int(c["correlation_id"].to_numpy()[int(r["op"])]),
            "late_by_ns": int(r["lateness_ns"]),
            "participants": sorted(int(x) for x in rank_of[mates]),
            "waited_ns": {str(int(rank_of[m])): int(c["waited_ns"].to_numpy()[m]) for m in mates if rank_of[m] != rank},
        })  # fmt: skip
    cascade = [{"rank": int(r["rank"]), "kernel": str(c["short_name"].iat[int(r["op"])]),
                "late_by_ns": int(r["lateness_ns"])} for _, r in ep[ep["rank"] != rank].head(_EVIDENCE_OPS).iterrows()]  # fmt: skip
    waited = 0
    for o in ops:
        waited += sum(cast(dict[str, int], o["waited_ns"]).values())
    reasons = []
    if why["compute"]:
        reasons.append(f"its GPU computed {why['compute'] / 1e3:.0f} us more than usual before the operation: uneven "
                       "work (unequal batch or sequence lengths: balance the sampler, bucket or pad sequences) or a "
                       "slower GPU (check its clocks and temperature: nvidia-smi -q -d PERFORMANCE,CLOCK)")  # fmt: skip
    if why["idle"]:
        reasons.append(f"its GPU waited {why['idle'] / 1e3:.0f} us more than usual for its host (see gpu_idle on rank "
                       f"{rank}: data loading, synchronizations, launch overhead)")  # fmt: skip
    if why["copy"]:
        reasons.append(f"it copied {why['copy'] / 1e3:.0f} us more than usual (see copy_bound on rank {rank})")
    if why["start"]:
        reasons.append(f"it began the step {why['start'] / 1e3:.0f} us after the other participants: a delay carried "
                       "over from the previous step")  # fmt: skip
    advice = f"The other ranks held their GPUs in {kernel} until rank {rank} arrived. " + (
        f"Rank {rank} was late because {'; '.join(reasons)}." if reasons else
        f"Rank {rank}'s stretch before the operation was no longer than usual: it was late by the job's own rhythm "
        "(a pipeline stage reaching its send after the previous stage's) or by its host launching the operation late.")  # fmt: skip
    title = (f"Rank {rank} arrived {lateness / 1e3:.0f} us late at {kernel} in step {step}: "
             f"{len(direct) or 1} operation(s) waited for it" + (f", {len(ep) - len(direct)} more downstream"
                                                                   if len(ep) > len(direct) else ""))  # fmt: skip
    return Finding(
        kind=KIND,
        severity=Severity.INFO,
        title=title,
        advice=advice,
        start_ns=int(worst["second_ns"]) - off,
        end_ns=int(c["a_start"].to_numpy()[op]) - off,
        impact_ns=lateness,
        rank=rank,
        device=int(c["device"].to_numpy()[op]),
        pid=int(c["pid"].to_numpy()[op]),
        group=f"{KIND}|rank {rank}",
        evidence={
            "late_rank": rank,
            "step": step,
            "operations": ops,
            "cascade": cascade,
            "peers_waited_ns": int(waited),
            "stretch_before_arrival_ns": stretch,
            "excess_ns": why,
            "participants_from": att.participants.method if att.participants is not None else None,
            "clock": {"method": att.clock.method, "uncertainty_ns": int(att.clock.uncertainty_ns)},
            "share_of_run": share_text(lateness, att.wall_ns),
        },
        cause=Cause(f"{KIND}|rank {rank}", edits),
    )
