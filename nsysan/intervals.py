"""Vectorised arithmetic on [start_ns, end_ns) intervals, shared by the overview and detectors."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsysan.errors import InputError

_INT64_MAX = 2**63 - 1


def check_sum_fits(values: pd.Series) -> None:
    """Refuse, rather than wrap around, when non-negative int64 values could sum beyond int64.

    The bound max * count is exact enough and costs one pass; only a damaged export (timestamps
    near the readers' limit in thousands of rows) can fail it.
    """
    if len(values) == 0:
        return
    largest = values.max()
    if pd.isna(largest) or int(largest) <= 0:
        return
    if int(largest) * len(values) > _INT64_MAX and float(values.astype("float64").sum()) >= 2.0**62:
        raise InputError(
            f"durations or sizes add up beyond what int64 holds ({len(values)} values up to {int(largest)}); "
            "the export's timestamps are damaged: export it again from the .nsys-rep"
        )


def union_ns(intervals: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Length of the union of [start_ns, end_ns) intervals per group: time something was running."""
    merged = merge(intervals, keys)
    if merged.empty:
        return pd.Series(dtype="int64")
    return (merged["end_ns"] - merged["start_ns"]).groupby([merged[k] for k in keys]).sum()


def segment_ids(intervals: pd.DataFrame, keys: list[str], gap_ns: int = 0) -> pd.Series:
    """Per row (aligned to ``intervals``), the number of the merged interval it belongs to.

    Intervals of a group that overlap, touch, or lie at most ``gap_ns`` apart belong to one merged
    interval; numbers count up from 0 in (keys, start) order.
    """
    d = intervals[[*keys, "start_ns", "end_ns"]].reset_index(drop=True)
    ordered = d.sort_values([*keys, "start_ns"], kind="stable")
    segment = _segments(ordered, keys, gap_ns).sort_index()
    return pd.Series(segment.to_numpy(), index=intervals.index)


def merge(intervals: pd.DataFrame, keys: list[str], gap_ns: int = 0) -> pd.DataFrame:
    """Intervals of each group merged into disjoint ones, sorted by start: those that overlap, and
    with ``gap_ns`` also those at most that apart (a burst of calls as one stall)."""
    columns = [*keys, "start_ns", "end_ns"]
    if intervals.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    d = intervals[columns].sort_values([*keys, "start_ns"], kind="stable")
    segment = _segments(d, keys, gap_ns)
    if d["start_ns"].dtype == np.int64 and d["end_ns"].dtype == np.int64:
        # segments are runs of the sorted rows: each starts at its first row (the earliest start)
        # and ends at its latest end, one reduceat instead of a groupby over a million segments
        seg = segment.to_numpy()
        first = np.flatnonzero(np.concatenate([[True], seg[1:] != seg[:-1]]))
        out = d[keys].iloc[first].reset_index(drop=True)
        out["start_ns"] = d["start_ns"].to_numpy()[first]
        out["end_ns"] = np.maximum.reduceat(d["end_ns"].to_numpy(), first)
        return out
    merged = (
        d.assign(segment=segment)
        .groupby("segment")
        .agg(**{k: (k, "first") for k in keys}, start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    )
    return merged.reset_index(drop=True)


def _segments(ordered: pd.DataFrame, keys: list[str], gap_ns: int) -> pd.Series:
    """:func:`segment_ids` of intervals already sorted by (keys, start): a new segment starts where
    an interval begins more than ``gap_ns`` after everything before it in its group has ended."""
    group = [ordered[k] for k in keys]
    reach = ordered.groupby(group, sort=False)["end_ns"].cummax()
    previous = reach.groupby(group, sort=False).shift()
    segments: pd.Series = (previous.isna() | (ordered["start_ns"] - previous > gap_ns)).cumsum() - 1
    return segments


def covered_ns(starts: np.ndarray, ends: np.ndarray, merged: pd.DataFrame) -> np.ndarray:
    """For each query [start, end), how much of it the disjoint sorted intervals ``merged`` cover.

    Coverage up to time t is a running sum over the merged intervals, so each query costs two
    binary searches: O((n + m) log m), no loop over rows.
    """
    if merged.empty:
        return np.zeros(len(starts), dtype=np.int64)
    return covered_arrays(starts, ends, merged["start_ns"].to_numpy(dtype=np.int64),
                          merged["end_ns"].to_numpy(dtype=np.int64))  # fmt: skip


# -- one timeline as plain arrays -----------------------------------------------------------------
# The attribution (nsysan.attribution) works one rank at a time on sorted numpy arrays: a rank's
# GPU activity as disjoint sorted intervals, set operations on them, and windows (steps) to sum in.


def union_arrays(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Any intervals as disjoint sorted ones (touching ones joined)."""
    if len(start) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, dtype=np.int64)[order], np.asarray(end, dtype=np.int64)[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > reach[:-1]])
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def intersect_arrays(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces where intervals ``a`` (any, possibly overlapping) meet the disjoint sorted intervals
    ``b``: (start, end, index into ``a``), non-empty, in ``a``'s order then time."""
    if len(a_start) == 0 or len(b_start) == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    lo = np.searchsorted(b_end, a_start, side="right")  # first b ending after a starts
    hi = np.searchsorted(b_start, a_end, side="left")  # b starting before a ends
    n = np.maximum(hi - lo, 0)
    which = np.repeat(np.arange(len(a_start)), n)
    at = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(lo, n)
    s = np.maximum(np.asarray(a_start)[which], b_start[at])
    e = np.minimum(np.asarray(a_end)[which], b_end[at])
    keep = e > s
    return s[keep], e[keep], which[keep]


def complement_arrays(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The gaps of disjoint sorted intervals within [lo, hi)."""
    edges_s = np.concatenate([[lo], end])
    edges_e = np.concatenate([start, [hi]])
    s, e = np.maximum(edges_s, lo), np.minimum(edges_e, hi)
    keep = e > s
    return s[keep], e[keep]


def covered_arrays(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """:func:`covered_ns` with the disjoint sorted intervals as arrays: how much of each query
    [start, end) they cover."""
    if len(lo) == 0 or len(starts) == 0:
        return np.zeros(len(starts), dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(hi - lo)])

    def coverage(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(lo, t, side="right")
        j = np.maximum(i - 1, 0)
        partial = np.where(i > 0, np.clip(t - lo[j], 0, hi[j] - lo[j]), 0)
        return np.where(i > 0, before[j], 0) + partial

    return coverage(np.asarray(ends, dtype=np.int64)) - coverage(np.asarray(starts, dtype=np.int64))
