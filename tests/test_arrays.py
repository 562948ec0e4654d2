"""Array helpers the reduce leans on at 1,024 ranks: each must give what the pandas it replaced gives."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsysan.arrays import rows_by
from nsysan.ingest.frames import concat_frames


def test_rows_by_gives_each_key_s_positions_in_order_as_groupby_indices_does():
    rng = np.random.default_rng(7)
    for n in (0, 1, 17, 5000):
        keys = rng.integers(-1, 40, n)
        got = rows_by(keys)
        want = pd.Series(keys).groupby(keys).indices if n else {}
        assert sorted(got) == sorted(int(k) for k in want)
        for k, rows in want.items():
            np.testing.assert_array_equal(got[int(k)], rows)


def test_concat_frames_of_plain_numeric_parts_equals_the_column_at_a_time_join():
    rng = np.random.default_rng(3)
    parts = [pd.DataFrame({"rank": rng.integers(0, 9, m), "ns": rng.integers(0, 10**12, m), "share": rng.random(m)})
             for m in (3, 0, 5, 1)]  # fmt: skip
    joined = concat_frames(parts)
    assert list(joined.dtypes) == [np.dtype("int64"), np.dtype("int64"), np.dtype("float64")]
    pd.testing.assert_frame_equal(joined, pd.DataFrame({c: np.concatenate([p[c].to_numpy() for p in parts])
                                                        for c in ("rank", "ns", "share")}))  # fmt: skip
    # a part whose column differs in dtype goes the column-at-a-time way, and keeps every value
    mixed = [parts[0], parts[2].astype({"ns": "float64"})]
    assert concat_frames(mixed)["ns"].tolist() == [*parts[0]["ns"].astype(float), *parts[2]["ns"].astype(float)]


def test_concat_frames_types_text_columns_as_a_single_part_s_read_would():
    """Text in object columns (a process's name, None where the export has none) goes the column-wise
    way: pandas' text dtype, as every other join of exports gives it, not the numeric fast path."""
    parts = [pd.DataFrame({"pid": [1, 2], "name": ["python", None]}).astype({"name": object}),
             pd.DataFrame({"pid": [3], "name": ["torchrun"]}).astype({"name": object})]  # fmt: skip
    assert all(p["name"].dtype == object for p in parts)  # as the readers leave Kind.OBJECT columns
    joined = concat_frames(parts)
    assert joined["name"].dtype != object and pd.api.types.is_string_dtype(joined["name"])
    assert joined["name"].isna().tolist() == [False, True, False]
