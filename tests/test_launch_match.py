"""The slowdown detector finds each compute kernel's launch call by packed integer keys; a plain
pandas merge on (export, pid, correlation_id), keeping a key's first call, is the oracle."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nsysan.detect.comm_compute_slowdown import _launched

KEYS = ["export", "pid", "correlation_id"]


def _oracle(compute: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    wanted = compute[KEYS].reset_index(drop=True).dropna()
    first = calls.drop_duplicates(KEYS)[[*KEYS, "tid", "start_ns"]]
    hit = wanted.reset_index().merge(first, on=KEYS).set_index("index").sort_index()
    return hit[["export", "pid", "tid", "start_ns"]].rename_axis(None)


def _frames(seed: int, wide_ids: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    n, m = 3_000, 2_500
    scale = (1 << 22) if wide_ids else 1  # wide: ids up to 2**34, past what packing takes
    compute = pd.DataFrame({
        "export": rng.integers(0, 3, n), "pid": rng.choice([7, 9, (1 << 24) - 1], n),
        "correlation_id": pd.array(rng.integers(0, 4_000, n) * scale, dtype="Int64"),
    }, index=rng.permutation(n) + 50)  # fmt: skip
    compute.loc[compute.index[::17], "correlation_id"] = pd.NA  # kernels without an id
    calls = pd.DataFrame({
        "export": rng.integers(0, 3, m), "pid": rng.choice([7, 9, (1 << 24) - 1], m),
        "correlation_id": rng.integers(0, 4_000, m) * scale, "tid": rng.integers(1, 5, m),
        "start_ns": rng.integers(0, 1 << 40, m),
    })  # fmt: skip
    calls = pd.concat([calls, calls.sample(300, random_state=seed).assign(tid=99)])  # repeated ids: first wins
    return compute, calls


@pytest.mark.parametrize("wide_ids", [False, True], ids=["packed", "merge"])
@pytest.mark.parametrize("seed", range(4))
def test_launch_calls_match_the_merge(seed, wide_ids):
    compute, calls = _frames(seed, wide_ids)
    got = _launched(compute, calls)
    want = _oracle(compute, calls)
    assert len(want) > 100
    pd.testing.assert_frame_equal(got.sort_index(), want, check_dtype=False)


def test_no_calls_no_points():
    compute, calls = _frames(0, False)
    assert _launched(compute, calls.iloc[0:0]).empty
