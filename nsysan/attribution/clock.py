"""One clock for a job captured as several exports.

Each export counts time from its own session start; the session's UTC start time puts exports on
one clock to within the hosts' clock agreement (NTP: tens of us to ms across nodes). That is too
coarse to say who arrived last at a collective whose participants finish within microseconds of
each other. So the exports are aligned on the collectives themselves: every participant of an NCCL
operation ends within a few us of the others, whatever time each arrived.

1. Coarse: per export, the offset at which the most NCCL kernel ends coincide (within ``BIN_NS``)
   with those of an export already aligned, among offsets within ``WINDOW_NS`` of the UTC
   alignment, preferring the one nearest the UTC alignment among near ties (a job repeating every
   step also coincides one step off); exports are taken in the order of how well they coincide
   with an aligned one, from the export with the most NCCL kernels (:func:`coarse`).
2. Fine, once the operations are matched across ranks (:mod:`.comm`): each export's offset moved
   by the median of its operations' ends' distance from their operation's median end.

The uncertainty is the 90th percentile of |end - operation's median end| over matched operations
spanning more than one export after alignment (one export: over all matched operations; it then
measures how far apart NCCL's participants end, not clock error). Without enough coinciding
ends, an export keeps its UTC alignment and the method says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nsysan.arrays import distinct

WINDOW_NS = 20_000_000  # how far the UTC alignment may be off
BIN_NS = 4_000
TIGHT_NS = 2_500  # how closely the ends of one operation's participants agree
MIN_MATCHES = 3  # coinciding ends (or operations matched across exports) an alignment needs
_SAMPLE = 500  # ends of an export paired: enough for a clear peak, a few ms a pair
_ALL_PAIRS = 64  # up to this many exports, every aligned export is a candidate partner
_NEAR = 8
_CANDIDATES = 32
_SHARED = 0.9  # an export this much of whose ends coincide with the reference's shares a communicator with it


@dataclass(frozen=True)
class Clock:
    """Per export, the ns to add to its times to put them on the job clock, and how it was decided."""

    offsets: list[int]
    method: str
    uncertainty_ns: int


def coarse(ends: list[np.ndarray], utc: list[int]) -> tuple[list[int], list[bool]]:
    """Per export, its offset (UTC alignment corrected by coinciding NCCL ends) and whether the
    ends decided it. ``ends``: each export's NCCL kernel ends on its own clock.

    Every export is first paired with the reference; one that coincides with it on nearly all its
    ends (``_SHARED``) shares a communicator with it and is aligned. The others are aligned one at a time,
    each against the aligned export its ends coincide with best (a maximum spanning tree): two
    ranks that share no communicator (stages 0 and 3 of a pipeline, the TP groups of TP x DP)
    coincide only by the program's rhythm, one layer or one micro-batch off as readily as not, so
    each is aligned on a partner; past ``_ALL_PAIRS`` exports, on the aligned exports within
    ``_NEAR`` of it in export order."""
    offsets = list(utc)
    decided = [False] * len(ends)
    if len(ends) < 2:
        return offsets, decided
    ref = int(np.argmax([len(x) for x in ends]))
    if len(ends[ref]) < MIN_MATCHES:
        return offsets, decided
    decided[ref] = True
    own = [_sample(np.sort(x.astype(np.int64) + u)) for x, u in zip(ends, utc, strict=True)]
    best: dict[int, tuple[float, int]] = {}  # export -> (share of its ends coinciding, offset)
    todo = {e for e, x in enumerate(ends) if e != ref and len(x) >= MIN_MATCHES}
    # first every export against the reference: most coincide with it on most of their ends (a
    # communicator spanning the job), and are aligned at once; the others grow the tree
    y = np.sort(ends[ref].astype(np.int64) + offsets[ref])
    for e in sorted(todo):
        found = _pair(own[e], y)
        if found is not None:
            best[e] = (found[0], utc[e] + found[1])
            if found[0] >= _SHARED:
                offsets[e], decided[e] = best[e][1], True
    todo = {e for e in todo if not decided[e]}
    # the rest, one at a time: each against the aligned exports (near it in export order, past
    # _ALL_PAIRS), the best coinciding aligned first, and the others then against it too
    fresh = [e for e, d in enumerate(decided) if d and e != ref]
    while todo:
        for a in fresh:
            y = np.sort(ends[a].astype(np.int64) + offsets[a])
            for e in todo:
                if len(ends) > _ALL_PAIRS and abs(e - a) > _NEAR:
                    continue
                found = _pair(own[e], y)
                if found is not None and found[0] > best.get(e, (0.0, 0))[0]:
                    best[e] = (found[0], utc[e] + found[1])
        ready = [e for e in todo if e in best]
        if not ready:
            break
        newest = max(ready, key=lambda e: (best[e][0], -e))
        offsets[newest] = best[newest][1]
        decided[newest] = True
        todo.discard(newest)
        fresh = [newest]
    return offsets, decided


def _sample(x: np.ndarray) -> np.ndarray:
    return x[np.linspace(0, len(x) - 1, _SAMPLE).astype(np.int64)] if len(x) > _SAMPLE else x


def _pair(x: np.ndarray, y: np.ndarray) -> tuple[float, int] | None:
    """How ends ``x`` (sorted) best coincide with ends ``y`` (sorted): (share of ``x`` that
    coincides, the ns to add to ``x``), None under ``MIN_MATCHES``. Among offsets within ``WINDOW_NS``,
    the one most ends agree on; among near ties (a job repeating every step also coincides one step
    off, missing one step's ends), the one nearest 0."""
    lo = np.searchsorted(y, x - WINDOW_NS, side="left")
    hi = np.searchsorted(y, x + WINDOW_NS, side="right")
    n = hi - lo
    if n.sum() == 0 or n.sum() > 50_000_000:
        return None
    which = np.repeat(np.arange(len(x)), n)
    at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    d = y[at] - x[which]
    bins = np.round(d / BIN_NS).astype(np.int64)
    # the differences sorted twice, by bin and by value: each candidate below is then two binary
    # searches, not two passes over every difference (a 1,024-rank job pairs a thousand exports)
    by_bin = np.argsort(bins, kind="stable")
    sorted_bins = bins[by_bin]
    first = np.flatnonzero(np.concatenate([[True], sorted_bins[1:] != sorted_bins[:-1]]))
    values, counts = sorted_bins[first], np.diff(np.append(first, len(bins)))
    by_d = np.argsort(d, kind="stable")
    sorted_d = d[by_d]

    def within(center: float) -> np.ndarray:  # the differences within TIGHT_NS of ``center``
        lo_, hi_ = (
            np.searchsorted(sorted_d, center - TIGHT_NS, "left"),
            np.searchsorted(sorted_d, center + TIGHT_NS, "right"),
        )
        out: np.ndarray = by_d[lo_:hi_]
        return out

    # the busiest bins (a bin and its neighbours), each judged by the ends of ``x`` within ``TIGHT_NS``
    # of its median: a partner's ends agree to a few us, the program's rhythm only to tens
    near = counts + _count_at(values, counts, values - 1) + _count_at(values, counts, values + 1)
    busy = values[np.argsort(-near, kind="stable")[:_CANDIDATES]]
    centers, held = [], []
    for b in busy:
        rows = by_bin[np.searchsorted(sorted_bins, b - 1, "left") : np.searchsorted(sorted_bins, b + 1, "right")]
        center = float(np.median(d[rows]))
        centers.append(center)
        held.append(len(distinct(which[within(center)])))
    top = max(held, default=0)
    strong = [i for i, h in enumerate(held) if h >= max(MIN_MATCHES, top - max(1, int(0.02 * top)))]
    if not strong:
        return None
    pick = min(strong, key=lambda i: abs(centers[i]))
    return held[pick] / len(x), int(np.median(d[within(centers[pick])]))


def _count_at(values: np.ndarray, counts: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The counts of bins ``wanted`` (0 where there is none), ``values`` sorted."""
    at = np.minimum(np.searchsorted(values, wanted), len(values) - 1)
    return np.where(values[at] == wanted, counts[at], 0)


def refine(offsets: list[int], ops: pd.DataFrame, group: np.ndarray) -> tuple[list[int], int, int]:
    """Offsets moved so that each export's operations end with their operation's other
    participants: (offsets, uncertainty_ns, matched operations spanning exports). ``ops``: export,
    end_ns (own clock); ``group``: per op, its operation across ranks (-1: unmatched)."""
    export = ops["export"].to_numpy(dtype=np.int64)
    end = ops["end_ns"].to_numpy(dtype=np.int64)
    keep = group >= 0
    if not keep.any():
        return offsets, 0, 0
    out = list(offsets)
    multi = np.zeros(len(group), dtype=bool)
    key = group[keep]
    for _ in range(2):
        table = np.asarray(out, dtype=np.int64)
        a_end = end + table[export]
        frame = pd.DataFrame({"export": export[keep], "a_end": a_end[keep]})
        by = frame.groupby(key)
        median = by["a_end"].transform("median").to_numpy()
        # more than one export: nunique's hashing cost seconds over 10M operations, min and max do not
        spread = by["export"].transform("min").to_numpy() != by["export"].transform("max").to_numpy()
        resid = frame["a_end"].to_numpy() - median
        multi = np.zeros(len(group), dtype=bool)
        multi[np.flatnonzero(keep)[spread]] = True
        if len(out) > 1 and spread.any():
            shift = pd.Series(resid[spread]).groupby(frame["export"].to_numpy()[spread]).median()
            for e, s in shift.items():
                out[int(e)] -= round(float(s))  # type: ignore[call-overload]
    table = np.asarray(out, dtype=np.int64)
    a_end = end + table[export]
    ends = pd.Series(a_end[keep])
    resid = np.abs(ends.to_numpy() - ends.groupby(key).transform("median").to_numpy())
    use = multi[keep] if multi[keep].any() else np.ones(len(resid), dtype=bool)
    uncertainty = int(np.percentile(resid[use], 90)) if use.any() else 0
    spanning = int(pd.Series(group[multi]).nunique()) if multi.any() else 0
    return out, uncertainty, spanning
