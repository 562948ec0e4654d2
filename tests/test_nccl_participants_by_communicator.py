"""Cross-rank pairing from NCCL's payloads: the packed-key search gives the edges the four-column
merge gives (the definition), on random jobs with unmatched operations, and the merge still
decides when keys repeat or a rank in the communicator is unknown."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nsysan.ingest.nccl import _pairs, participants_by_communicator


def _by_merge(pts: pd.DataFrame) -> set[tuple[int, int]]:
    pe = pts.merge(pts, left_on=["comm_id", "me", "peer", "seq"], right_on=["comm_id", "peer", "me", "seq"],
                   suffixes=("_i", "_j"))  # fmt: skip
    return set(zip(pe["index_i"].astype(int), pe["index_j"].astype(int), strict=True))


def _edges(pts: pd.DataFrame) -> set[tuple[int, int]]:
    keys = [pts[c].to_numpy(dtype="int64", na_value=-1) for c in ("comm_id", "me", "peer", "seq")]
    e = _pairs(pts["index"].to_numpy(dtype="int64"), keys)
    assert list(e.columns) == ["i", "j"] and e.dtypes.eq("int64").all()
    return set(zip(e["i"].astype(int), e["j"].astype(int), strict=True))


def _random_points(seed: int, n: int) -> pd.DataFrame:
    """Sends and receives among 16 ranks of 3 communicators, about a tenth without their partner."""
    rng = np.random.default_rng(seed)
    comm, me = rng.integers(0, 3, n), rng.integers(0, 16, n)
    peer = (me + rng.integers(1, 16, n)) % 16
    frame = pd.DataFrame({"comm_id": comm, "me": me, "peer": peer})
    frame["seq"] = frame.groupby(["comm_id", "me", "peer"]).cumcount()
    mirrored = frame.rename(columns={"me": "peer", "peer": "me"}).sample(frac=0.9, random_state=seed)
    both = pd.concat([frame, mirrored], ignore_index=True).drop_duplicates(["comm_id", "me", "peer", "seq"])
    both = both.sample(frac=1.0, random_state=seed + 1)
    both.index = rng.permutation(np.arange(10_000, 10_000 + len(both)))  # op ids are not positions
    return both.rename_axis("index").reset_index()


@pytest.mark.parametrize("seed", range(5))
def test_packed_keys_give_the_merges_edges(seed):
    pts = _random_points(seed, 3_000)
    edges = _edges(pts)
    assert edges == _by_merge(pts)
    assert len(edges) < len(pts)  # some ops have no partner and get no edge


def test_repeated_keys_and_unknown_ranks_fall_back_to_the_merge():
    pts = pd.DataFrame({"index": [1, 2, 3], "comm_id": [0, 0, 0], "me": [0, 0, 1], "peer": [1, 1, 0],
                        "seq": [0, 0, 0]})  # fmt: skip
    assert _edges(pts) == _by_merge(pts) == {(1, 3), (2, 3), (3, 1), (3, 2)}
    unknown = pd.DataFrame({"index": [1, 2, 3], "comm_id": [0, 0, 0], "peer": [1, 0, 0], "seq": [0, 0, 0],
                            "me": pd.array([0, 1, pd.NA], dtype="Int64")})  # fmt: skip
    assert _edges(unknown) == _by_merge(unknown) == {(1, 2), (2, 1)}


def test_collectives_group_by_sequence_and_sends_pair_across_ranks():
    ops = pd.DataFrame({
        "comm_id": pd.array([7, 7, 7, 7, 9, 9], dtype="Int64"),
        "comm_rank": pd.array([0, 1, 0, 1, 0, 1], dtype="Int64"),
        "peer": pd.array([pd.NA, pd.NA, pd.NA, pd.NA, 1, 0], dtype="Int64"),
        "rank": [0, 1, 0, 1, 0, 1],
        "a_start": [10, 11, 20, 19, 30, 31],
    }, index=[100, 101, 102, 103, 104, 105])  # fmt: skip
    group, edges = participants_by_communicator(ops)
    assert group.loc[100] == group.loc[101] != group.loc[102] == group.loc[103]  # n-th with n-th
    assert group.loc[104] == group.loc[105] == -1
    assert set(zip(edges["i"], edges["j"], strict=True)) == {(104, 105), (105, 104)}


def _by_definition(ops: pd.DataFrame) -> tuple[pd.Series, set[tuple[int, int]]]:
    """The groups and edges as pandas states them: in start order, the n-th collective of a
    (rank, communicator) and the n-th send of a (rank, communicator, peer)."""
    group = pd.Series(-1, index=ops.index, dtype="int64")
    known = ops.dropna(subset=["comm_id"]).sort_values("a_start", kind="stable")
    coll = known[known["peer"].isna()]
    seq = coll.groupby(["rank", "comm_id"]).cumcount()
    group.loc[coll.index] = coll.assign(seq=seq).groupby(["comm_id", "seq"], sort=False).ngroup().to_numpy()
    pts = known[known["peer"].notna()].copy()
    pts["me"] = pts["comm_rank"]
    pts["seq"] = pts.groupby(["rank", "comm_id", "peer"]).cumcount()
    return group, _by_merge(pts.reset_index()[["index", "comm_id", "me", "peer", "seq"]])


@pytest.mark.parametrize("unknown_ranks", [0.0, 0.02])  # 0: the packed search; else the merge decides
@pytest.mark.parametrize("seed", range(3))
def test_array_implementation_gives_the_pandas_definition(seed, unknown_ranks):
    """Random jobs: tied starts, ops without a communicator, unknown communicator ranks, ids that
    are not positions, 64-bit communicator hashes."""
    rng = np.random.default_rng(seed)
    n = 4_000
    rank = rng.integers(0, 8, n)
    comm = rng.choice(np.array([2**64 - 5, 12345, 2**63 + 1], dtype=np.uint64), n)
    p2p = rng.random(n) < 0.5
    ops = pd.DataFrame({
        "comm_id": pd.array(comm, dtype="UInt64"),
        "comm_rank": pd.array(rank, dtype="Int64"),
        "peer": pd.array(np.where(p2p, (rank + rng.integers(1, 8, n)) % 8, 0), dtype="Int64"),
        "rank": rank,
        "a_start": rng.integers(0, 500, n),  # many ties
    }, index=rng.permutation(np.arange(50_000, 50_000 + n)))  # fmt: skip
    ops.loc[~p2p, "peer"] = pd.NA
    ops.loc[rng.random(n) < 0.05, "comm_id"] = pd.NA
    ops.loc[rng.random(n) < unknown_ranks, "comm_rank"] = pd.NA
    group, edges = participants_by_communicator(ops)
    want_group, want_edges = _by_definition(ops)
    pd.testing.assert_series_equal(group, want_group)
    assert set(zip(edges["i"].astype(int), edges["j"].astype(int), strict=True)) == want_edges
    assert len(want_edges) > 100
