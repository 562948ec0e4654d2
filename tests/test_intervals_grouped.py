"""Property tests for what tests/test_intervals.py leaves out: grouping by several keys, the exact
merged intervals (not only the time they cover), and merging across small gaps (``gap_ns``).

The oracle links two intervals of one group when the gap between them, max(starts) - min(ends), is
at most ``gap_ns`` (negative: they overlap) and takes connected components with a union-find: no
sorting sweep, nothing shared with nsysan.intervals.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import nsysan.intervals
from nsysan.intervals import covered_ns, merge, union_ns

HAS_GAP = "gap_ns" in inspect.signature(merge).parameters
segment_ids: Any = getattr(nsysan.intervals, "segment_ids", None)  # new beside merge(gap_ns=)


@st.composite
def two_key_intervals(draw: st.DrawFn) -> pd.DataFrame:
    rows = draw(st.lists(st.tuples(st.integers(0, 1), st.integers(-1, 1), st.integers(0, 60), st.integers(0, 15)),
                         max_size=25))  # fmt: skip
    return pd.DataFrame(
        {
            "rank": [r for r, _, _, _ in rows],
            "device": [d for _, d, _, _ in rows],
            "start_ns": [s for _, _, s, _ in rows],
            "end_ns": [s + n for _, _, s, n in rows],
        },
        dtype="int64",
    )


def merged_by_union_find(df: pd.DataFrame, keys: list[str], gap_ns: int = 0) -> list[tuple[int, ...]]:
    rows = list(df[[*keys, "start_ns", "end_ns"]].itertuples(index=False, name=None))
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, a in enumerate(rows):
        for j in range(i):
            b = rows[j]
            if a[: len(keys)] == b[: len(keys)] and max(a[-2], b[-2]) - min(a[-1], b[-1]) <= gap_ns:
                parent[root(i)] = root(j)
    parts: dict[int, list[tuple[int, ...]]] = {}
    for i, row in enumerate(rows):
        parts.setdefault(root(i), []).append(row)
    return sorted((*p[0][: len(keys)], min(r[-2] for r in p), max(r[-1] for r in p)) for p in parts.values())


@settings(max_examples=300, deadline=None)
@given(two_key_intervals())
def test_merge_by_two_keys_gives_exactly_the_connected_components(df):
    keys = ["rank", "device"]
    got = merge(df, keys)
    assert list(got.columns) == [*keys, "start_ns", "end_ns"]
    rows = [tuple(int(v) for v in r) for r in got.itertuples(index=False, name=None)]
    assert rows == sorted(rows), "sorted by the keys, then by start"
    assert rows == merged_by_union_find(df, keys)


@settings(max_examples=300, deadline=None)
@given(two_key_intervals())
def test_union_by_two_keys_is_the_covered_time_of_each_group(df):
    keys = ["rank", "device"]
    got = union_ns(df, keys)
    expected = {}
    for key, part in df.groupby(keys):
        expected[key] = len({t for s, e in zip(part["start_ns"], part["end_ns"], strict=True) for t in range(s, e)})
    assert {k: int(v) for k, v in got.items()} == expected


@settings(max_examples=300, deadline=None)
@given(two_key_intervals(), st.integers(0, 12))
def test_merge_across_gaps_of_at_most_gap_ns(df, gap):
    if not HAS_GAP:  # merge(gap_ns=) is new; nothing to check where it is not there yet
        return
    keys = ["rank", "device"]
    got = merge(df, keys, gap_ns=gap)
    rows = [tuple(int(v) for v in r) for r in got.itertuples(index=False, name=None)]
    assert rows == merged_by_union_find(df, keys, gap)
    if gap == 0:
        assert rows == [tuple(int(v) for v in r) for r in merge(df, keys).itertuples(index=False, name=None)]


@settings(max_examples=300, deadline=None)
@given(two_key_intervals(), st.lists(st.tuples(st.integers(-20, 100), st.integers(0, 40)), max_size=12))
def test_covered_counts_queries_anywhere_including_outside_every_interval(df, queries):
    one = df[(df["rank"] == 0) & (df["device"] == 0)]
    merged = merge(one, ["rank", "device"])
    starts = np.array([s for s, _ in queries], dtype=np.int64)
    ends = np.array([s + d for s, d in queries], dtype=np.int64)
    busy = {t for s, e in zip(one["start_ns"], one["end_ns"], strict=True) for t in range(s, e)}
    got = covered_ns(starts, ends, merged)
    assert got.tolist() == [len(busy & set(range(s, e))) for s, e in zip(starts, ends, strict=True)]


@settings(max_examples=300, deadline=None)
@given(two_key_intervals(), st.integers(0, 12))
def test_segment_ids_number_each_row_with_its_merged_interval(df, gap):
    if segment_ids is None:
        return
    keys = ["rank", "device"]
    df.index = df.index[::-1] * 7  # any index: ids come back aligned to it
    ids = segment_ids(df, keys, gap)
    assert ids.index.equals(df.index)
    merged = merged_by_union_find(df, keys, gap)  # sorted by (keys, start): the numbering order
    for (i, row), segment in zip(df.iterrows(), ids, strict=True):
        k1, k2, lo, hi = merged[int(segment)]
        assert (k1, k2) == (row["rank"], row["device"]) and lo <= row["start_ns"] and row["end_ns"] <= hi, i


@given(two_key_intervals(), st.integers(0, 5), st.booleans())
@settings(max_examples=150, deadline=None)
def test_merge_of_plain_int64_times_equals_the_general_path(df, gap, categorical):
    """int64 times take merge's reduceat path; nullable ones its groupby: the same intervals, in the
    same order, with the keys' own dtypes (a missing rank, a categorical device)."""
    keyed = df.assign(rank=df["rank"].astype("Int64").mask(df["start_ns"] % 7 == 0))
    if categorical:
        keyed["device"] = keyed["device"].astype(str).astype("category")
    fast = merge(keyed, ["rank", "device"], gap)
    general = merge(keyed.astype({"start_ns": "Int64", "end_ns": "Int64"}), ["rank", "device"], gap)
    pd.testing.assert_frame_equal(fast, general.astype({"start_ns": "int64", "end_ns": "int64"}))
