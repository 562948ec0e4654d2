"""One clock for a job captured as several exports.

Each export counts time from its own session start; the session's UTC start time puts exports on
one clock to within the hosts' clock agreement (NTP: tens of us to ms across nodes). That is too
coarse to say who arrived last at a collective whose participants finish within microseconds of
each other. So the exports are aligned on the collectives themselves: every participant of an NCCL
operation ends within a few us of the others, whatever time each arrived.

1. Coarse: per export, the offset against a reference export (the one with the most NCCL kernels)
   at which the most NCCL kernel ends coincide (within ``BIN_NS``), among offsets within
   ``WINDOW_NS`` of the UTC alignment, preferring the one nearest the UTC alignment among near
   ties (a job repeating every step also coincides one step off).
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

WINDOW_NS = 20_000_000  # how far the UTC alignment may be off
BIN_NS = 4_000
MIN_MATCHES = 5
_SAMPLE = 2_000


@dataclass(frozen=True)
class Clock:
    """Per export, the ns to add to its times to put them on the job clock, and how it was decided."""

    offsets: list[int]
    method: str
    uncertainty_ns: int


def coarse(ends: list[np.ndarray], utc: list[int]) -> tuple[list[int], list[bool]]:
    """Per export, its offset (UTC alignment corrected by coinciding NCCL ends) and whether the
    ends decided it. ``ends``: each export's NCCL kernel ends on its own clock."""
    offsets = list(utc)
    decided = [False] * len(ends)
    if len(ends) < 2:
        return offsets, decided
    ref = int(np.argmax([len(x) for x in ends]))
    if len(ends[ref]) < MIN_MATCHES:
        return offsets, decided
    decided[ref] = True
    y = np.sort(ends[ref].astype(np.int64) + utc[ref])
    for e, x in enumerate(ends):
        if e == ref or len(x) < MIN_MATCHES:
            continue
        x = np.sort(x.astype(np.int64) + utc[e])
        if len(x) > _SAMPLE:
            x = x[np.linspace(0, len(x) - 1, _SAMPLE).astype(np.int64)]
        lo = np.searchsorted(y, x - WINDOW_NS, side="left")
        hi = np.searchsorted(y, x + WINDOW_NS, side="right")
        n = hi - lo
        if n.sum() == 0 or n.sum() > 50_000_000:
            continue
        which = np.repeat(np.arange(len(x)), n)
        at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
        d = y[at] - x[which]
        bins = np.round(d / BIN_NS).astype(np.int64)
        values, counts = np.unique(bins, return_counts=True)
        # a coincidence counts once per end of this export: the bin and its neighbours
        near = np.convolve(counts, np.ones(3, dtype=np.int64), mode="same") if len(counts) > 2 else counts
        strong = near >= max(MIN_MATCHES, int(0.8 * near.max()))
        candidates = values[strong]
        best = candidates[np.argmin(np.abs(candidates))]
        close = np.abs(d - best * BIN_NS) <= BIN_NS
        if close.sum() < MIN_MATCHES:
            continue
        offsets[e] = utc[e] + int(np.median(d[close]))
        decided[e] = True
    return offsets, decided


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
    for _ in range(2):
        table = np.asarray(out, dtype=np.int64)
        a_end = end + table[export]
        frame = pd.DataFrame({"g": group[keep], "export": export[keep], "a_end": a_end[keep]})
        median = frame.groupby("g")["a_end"].transform("median").to_numpy()
        spread = frame.groupby("g")["export"].transform("nunique").to_numpy() > 1
        resid = frame["a_end"].to_numpy() - median
        multi = np.zeros(len(group), dtype=bool)
        multi[np.flatnonzero(keep)[spread]] = True
        if len(out) > 1 and spread.any():
            shift = pd.Series(resid[spread]).groupby(frame["export"].to_numpy()[spread]).median()
            for e, s in shift.items():
                out[int(e)] -= int(round(float(s)))  # type: ignore[call-overload]
    table = np.asarray(out, dtype=np.int64)
    a_end = end + table[export]
    frame = pd.DataFrame({"g": group[keep], "a_end": a_end[keep]})
    resid = np.abs(frame["a_end"].to_numpy() - frame.groupby("g")["a_end"].transform("median").to_numpy())
    use = multi[keep] if multi[keep].any() else np.ones(len(resid), dtype=bool)
    uncertainty = int(np.percentile(resid[use], 90)) if use.any() else 0
    spanning = int(pd.Series(group[multi]).nunique()) if multi.any() else 0
    return out, uncertainty, spanning
