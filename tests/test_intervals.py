"""Property tests: the interval arithmetic against brute force on small integer timelines, and the
readers' type coercion against what SQLite may hand back where nsys's DDL says INTEGER."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.errors import InputError
from nsysan.ingest.export import _categorical_from_ids, _whole_ids
from nsysan.ingest.frames import _as_int
from nsysan.intervals import check_sum_fits, covered_ns, merge, union_ns

SMALL = st.integers(min_value=0, max_value=60)


@st.composite
def intervals(draw: st.DrawFn, groups: int = 2) -> pd.DataFrame:
    rows = draw(st.lists(st.tuples(st.integers(0, groups - 1), SMALL, st.integers(0, 20)), max_size=25))
    return pd.DataFrame(
        {"g": [g for g, _, _ in rows], "start_ns": [s for _, s, _ in rows], "end_ns": [s + d for _, s, d in rows]},
        dtype="int64",
    )


def _covered_set(df: pd.DataFrame) -> set[int]:
    return {t for s, e in zip(df["start_ns"], df["end_ns"], strict=True) for t in range(s, e)}


@settings(deadline=None)
@given(intervals())
def test_union_is_the_covered_length_per_group(df):
    got = union_ns(df, ["g"])
    for g, part in df.groupby("g"):
        assert got.get(g, 0) == len(_covered_set(part))
    assert (got >= 0).all()


@settings(deadline=None)
@given(intervals())
def test_merge_gives_disjoint_sorted_intervals_covering_the_same_time(df):
    merged = merge(df, ["g"])
    for g, part in merged.groupby("g"):
        starts, ends = part["start_ns"].to_numpy(), part["end_ns"].to_numpy()
        assert (ends >= starts).all()
        assert (starts[1:] > ends[:-1]).all(), "disjoint and not touching"
        assert _covered_set(part) == _covered_set(df[df["g"] == g])


@settings(deadline=None)
@given(intervals(groups=1), st.lists(st.tuples(SMALL, st.integers(0, 30)), max_size=10))
def test_covered_counts_the_query_time_under_the_intervals(df, queries):
    merged = merge(df, ["g"])
    starts = np.array([s for s, _ in queries], dtype=np.int64)
    ends = np.array([s + d for s, d in queries], dtype=np.int64)
    got = covered_ns(starts, ends, merged)
    busy = _covered_set(df)
    expected = [len(busy & set(range(s, e))) for s, e in zip(starts, ends, strict=True)]
    assert got.tolist() == expected
    assert ((got >= 0) & (got <= ends - starts)).all()


@settings(deadline=None)
@given(st.lists(st.integers(0, 2**56), min_size=1, max_size=300))
def test_check_sum_fits_refuses_only_sums_beyond_int64(values):
    series = pd.Series(values, dtype="int64")
    exact = sum(values)
    if exact >= 2**63:
        with pytest.raises(InputError):
            check_sum_fits(series)
    elif exact < 2**62:
        check_sum_fits(series)
        assert int(series.sum()) == exact


# What SQLite can return from an INTEGER column of a damaged export.
SQLITE_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.binary(max_size=4),
)


def _expected(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and np.isfinite(value) and value == int(value) and abs(value) < 2.0**63:
        return int(value)
    return None


@settings(max_examples=300, deadline=None)
@given(st.lists(SQLITE_VALUES, max_size=12))
def test_as_int_keeps_whole_int64s_and_nothing_else(values):
    col = pd.Series(values, dtype=object)
    got = _as_int(col, present=True)
    assert str(got.dtype) in ("int64", "Int64")
    for value, out in zip(values, got.tolist(), strict=True):
        expected = _expected(value)
        if expected is None or expected == -(2**63):  # the NULL sentinel; _select tells them apart in SQL
            assert out is pd.NA or out is None
        else:
            assert out == expected


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-5, 5), st.floats(), st.text(max_size=2)), max_size=10))
def test_string_ids_resolve_or_are_missing_never_crash(ids):
    lookup = pd.Series(["zero", "one", "minus"], index=np.array([0, 1, -1], dtype=np.int64))
    cat = _categorical_from_ids(pd.Series(ids, dtype=object), lookup)
    filled, missing = _whole_ids(pd.Series(ids, dtype=object))
    assert len(cat) == len(ids) == len(filled) == len(missing)
    for value, name, gone in zip(ids, cat.astype(object), missing, strict=True):
        expected = _expected(value)
        if expected in (0, 1, -1) and not gone:
            assert name == {0: "zero", 1: "one", -1: "minus"}[expected]
        else:
            assert pd.isna(name)
