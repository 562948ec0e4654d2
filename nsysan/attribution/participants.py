"""Which NCCL kernels on other ranks belong to the same NCCL operation as a given one.

An ordering stall is only real if the right peers are compared, so this never accepts "some NCCL
kernel on another rank ended at about the same time": a busy job has several communicators whose
operations end within microseconds of each other.

Two sources, best first:

1. **Communicator and sequence** (:func:`nsysan.ingest.nccl.participants_by_communicator`): when
   NCCL's NVTX payloads give each call its communicator (and, for point-to-point, its peer), the
   n-th operation of a communicator on one rank is the n-th on every member; the n-th send from a
   to b pairs with the n-th receive of b from a. That is NCCL's own rule, so it lives with the rest
   of nsysan's NCCL knowledge.
2. **Program position** (``by_position``): a training job runs the same sequence of operations
   every iteration. A *slot* is (rank, stream, position among that stream's NCCL kernels in the
   iteration, kernel name). Two slots on different ranks are one operation's participants when
   their kernels end together (within the tolerance) in *every* iteration both run, and there are
   at least ``min_iterations`` such iterations. Operations of another communicator may end
   together by coincidence in quiet iterations, but not in the iteration where one of them waits
   for a late rank, and a single disagreement breaks the link. Iterations are numbered by NVTX
   ranges named like ``step 12`` / ``iteration 12`` / ``ProfilerStep#12`` on the launching
   process; without them the whole capture is one iteration and one agreement has to do (the
   report says which source was used).

Program position is an inference with the ordering detector's tolerances (end-time tolerance,
iterations that must agree, how many neighbours to examine), not a fact about NCCL, so it stays
here with the detector that sets them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from nsysan.ingest.frames import per_distinct_text
from nsysan.ingest.nccl import EDGE_COLUMNS
from nsysan.ingest.trace import Trace

STEP = re.compile(r"(?i)(?:step|iter(?:ation)?)\D{0,3}(\d+)")
_P2P_MARGIN_NS = 2_000


def iterations(trace: Trace, ops: pd.DataFrame) -> pd.Series:
    """Per op, the number of the NVTX step range its launch call ran in (-1: none).

    ``ops`` needs export, pid and ``launch_ns`` (the launch call's start, export clock).
    """
    out = pd.Series(-1, index=ops.index, dtype="int64")
    nv = trace.nvtx
    if nv.empty:
        return out
    ranges = nv.dropna(subset=["end_ns", "pid"])
    ranges = ranges.assign(number=_step_numbers(ranges["text"])).dropna(subset=["number"])
    if ranges.empty:
        return out
    ranges = ranges[["export", "pid", "start_ns", "end_ns", "number"]].astype("int64")
    # nested step ranges (an outer "epoch 3" holding "step 12"): the innermost, i.e. the latest start
    ranges = ranges.sort_values("start_ns", kind="stable").rename(columns={"start_ns": "s", "end_ns": "e"})
    q = ops[["export", "pid", "launch_ns"]].dropna().astype("int64").reset_index().sort_values("launch_ns")
    hit = pd.merge_asof(q, ranges, left_on="launch_ns", right_on="s", by=["export", "pid"], direction="backward")
    hit = hit[hit["e"].notna() & (hit["launch_ns"] <= hit["e"])]
    out.loc[hit["index"].to_numpy()] = hit["number"].astype("int64").to_numpy()
    return out


def _step_numbers(text: pd.Series) -> pd.Series:
    """The step number each range's text names (NaN where none), the pattern run once per text."""

    def numbers(texts: pd.Series) -> np.ndarray:
        return pd.to_numeric(texts.str.extract(STEP, expand=False), errors="coerce").to_numpy(dtype=np.float64)

    return pd.Series(per_distinct_text(text, numbers), index=text.index)


def _candidates(ops: pd.DataFrame, tol_ns: int, tol_share: float, reach: int, p2p_tol_ns: int = 0) -> pd.DataFrame:
    """Ordered pairs (i, j) of ops on different ranks, in the same iteration, that overlap in time
    and end within the tolerance: a bounded number of vectorised passes over the ops in end order."""
    order = np.lexsort((ops["a_end"].to_numpy(), ops["iteration"].to_numpy()))
    end = ops["a_end"].to_numpy()[order]
    start = ops["a_start"].to_numpy()[order]
    rank = ops["rank"].to_numpy()[order]
    it = ops["iteration"].to_numpy()[order]
    index = ops.index.to_numpy()[order]
    tol = np.maximum(tol_ns, tol_share * (end - start))
    if p2p_tol_ns and "p2p" in ops:  # a receiver finishes a few tens of us after its sender: wider for p2p
        tol = np.where(ops["p2p"].to_numpy(dtype=bool)[order], np.maximum(tol, p2p_tol_ns), tol)
    n = len(order)
    pairs = []
    for shift in range(1, min(reach, n - 1) + 1):
        a, b = np.arange(n - shift), np.arange(shift, n)
        near = np.abs(end[b] - end[a]) <= np.maximum(tol[a], tol[b])
        ok = near & (rank[a] != rank[b]) & (it[a] == it[b]) & (start[a] < end[b]) & (start[b] < end[a])
        pairs.append(np.stack([index[a[ok]], index[b[ok]]], axis=1))
    both = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
    both = np.concatenate([both, both[:, ::-1]])
    return pd.DataFrame(both, columns=EDGE_COLUMNS).drop_duplicates()


def by_position(
    ops: pd.DataFrame, tol_ns: int, tol_share: float, min_iterations: int, reach: int, p2p_tol_ns: int = 0
) -> pd.DataFrame:
    """Participant edges (i, j) from program position; ``ops`` needs rank, export, pid, stream,
    iteration, a_start, a_end (job clock) and short_name, indexed by op id."""
    if ops.empty:
        return pd.DataFrame(columns=EDGE_COLUMNS, dtype="int64")
    ordered = ops.sort_values("a_start", kind="stable")
    position = ordered.groupby(["export", "pid", "stream", "iteration"], sort=False).cumcount().reindex(ops.index)
    # numbered in order of first appearance, as factorizing the (rank, stream, position, name)
    # tuples would, in a tenth of the time (names stay categorical codes)
    slot_key = pd.DataFrame({"rank": ops["rank"], "stream": ops["stream"], "position": position,
                             "name": ops["short_name"]})  # fmt: skip
    slot = slot_key.groupby(list(slot_key.columns), sort=False, dropna=False, observed=True).ngroup()
    cand = _candidates(ops, tol_ns, tol_share, reach, p2p_tol_ns)
    cand = cand.assign(si=slot.loc[cand["i"]].to_numpy(), sj=slot.loc[cand["j"]].to_numpy())
    agree = cand.drop_duplicates(["si", "sj", "i"]).groupby(["si", "sj"]).size().rename("agree")
    presence = pd.DataFrame({"slot": slot, "iteration": ops["iteration"]}).drop_duplicates()
    pairs = agree.reset_index()[["si", "sj"]]
    common = (pairs.merge(presence.rename(columns={"slot": "si"}), on="si")
              .merge(presence.rename(columns={"slot": "sj"}), on=["sj", "iteration"])
              .groupby(["si", "sj"]).size().rename("common"))  # fmt: skip
    links = pd.concat([agree, common], axis=1).fillna(0)
    one_iteration = ops["iteration"].nunique() == 1
    need = 1 if one_iteration else min_iterations
    links = links[(links["agree"] >= links["common"]) & (links["common"] >= need)].reset_index()
    links = _one_partner_for_p2p(links, cand, ops, slot)
    kept = cand.merge(links[["si", "sj"]], on=["si", "sj"])
    return kept[EDGE_COLUMNS].reset_index(drop=True)


def _one_partner_for_p2p(links: pd.DataFrame, cand: pd.DataFrame, ops: pd.DataFrame, slot: pd.Series) -> pd.DataFrame:
    """A point-to-point kernel has exactly one partner. Where exchanges of other pairs run in lock
    step, a p2p slot links to several; keep the pair whose ends agree most tightly (largest
    difference over the iterations), when each is the other's tightest and no other comes within
    ``_P2P_MARGIN_NS``; otherwise the slot stays unmatched (never reported)."""
    p2p_slots = set(slot[ops["p2p"].to_numpy()].unique()) if "p2p" in ops else set()
    if not p2p_slots or links.empty:
        return links
    end = ops["a_end"]
    spread = (cand.assign(d=np.abs(end.loc[cand["i"]].to_numpy() - end.loc[cand["j"]].to_numpy()))
              .groupby(["si", "sj"])["d"].max().rename("spread").reset_index())  # fmt: skip
    links = links.merge(spread, on=["si", "sj"], how="left")
    is_p2p = links["si"].isin(p2p_slots)
    p2p = links[is_p2p].sort_values(["si", "spread"], kind="stable")
    best = p2p.groupby("si").head(1)
    second = p2p.groupby("si")["spread"].nth(1)
    runner_up = pd.Series(second.to_numpy(), index=p2p.loc[second.index, "si"].to_numpy())
    clear = best["spread"].to_numpy() + _P2P_MARGIN_NS < runner_up.reindex(best["si"]).fillna(np.inf).to_numpy()
    best = best[clear]
    mutual = best.merge(best[["si", "sj"]].rename(columns={"si": "sj", "sj": "si"}), on=["si", "sj"])
    return pd.concat([links[~is_p2p], mutual], ignore_index=True)
