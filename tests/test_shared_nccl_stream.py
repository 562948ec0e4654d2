"""shared_nccl_stream on hand-made operation tables: exact lost time, and each condition that must
hold (different communicators, B and its participants ready, A's participants known, not already an
ordering stall behind a late rank). Scenario truth (one NCCL stream per peer, simulated) is in
tests/test_attribution_truth.py."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsysan.attribution.comm import Participants
from nsysan.detect import nccl_ordering_stall
from nsysan.detect.shared_nccl_stream import Params, _not_judged, blocked

US = 1_000


def _ops(rows: list[dict]) -> pd.DataFrame:
    """Ops on one job clock (a_* = the times themselves), one export per rank, NCCL stream 13."""
    df = pd.DataFrame(rows)
    df["export"] = df["rank"]
    df["pid"] = 100 + df["rank"]
    df["device"] = df["rank"]
    df["stream"] = 13
    if "short_name" not in df:
        df["short_name"] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    df["comm_id"] = pd.array([pd.NA] * len(df), dtype="Int64")
    df["a_start"], df["a_end"] = df["start_ns"], df["end_ns"]
    df["ready"] = df["ready"].astype("float64")
    return df


def _pipeline(b_partner_ready: int, b_partner: int = 0) -> tuple[pd.DataFrame, Participants]:
    """Rank 1's stream: A (a send to rank 2, 400 us of transfer) then B (a receive from
    ``b_partner``), B queued right behind A. Rank 2's receive is A's partner (ready, no wait); B's
    partner is ready at ``b_partner_ready``."""
    rows = [
        {"rank": 1, "start_ns": 1_000 * US, "end_ns": 1_400 * US, "ready": 1_000 * US},  # 0: A
        {"rank": 1, "start_ns": 1_400 * US, "end_ns": 1_450 * US, "ready": 1_050 * US},  # 1: B, ready at 1,050
        {"rank": 2, "start_ns": 1_000 * US, "end_ns": 1_400 * US, "ready": 1_000 * US},  # 2: A's partner
        {"rank": b_partner, "start_ns": 1_400 * US, "end_ns": 1_450 * US, "ready": b_partner_ready},  # 3: B's
    ]
    edges = pd.DataFrame({"i": [0, 2, 1, 3], "j": [2, 0, 3, 1]})
    return _ops(rows), Participants(group=pd.Series(-1, index=range(4), dtype="int64"), edges=edges, method="test")


def test_a_receive_held_behind_a_send_to_another_peer_loses_until_it_could_have_started():
    ops, parts = _pipeline(b_partner_ready=1_100 * US)
    held = blocked(ops, parts, Params())
    assert held.index.tolist() == [1]
    assert held.loc[1, "a"] == 0
    assert held.loc[1, "free_at"] == 1_100 * US  # B ready at 1,050, its partner at 1,100
    assert held.loc[1, "lost"] == 300 * US  # started at 1,400


def test_not_when_the_ops_share_a_communicator_or_b_s_partner_was_not_ready():
    ops, parts = _pipeline(b_partner_ready=1_100 * US, b_partner=2)  # B with rank 2 too: NCCL orders them anyway
    assert blocked(ops, parts, Params()).empty
    ops, parts = _pipeline(b_partner_ready=1_380 * US)  # its partner ready 20 us before B: below 50 us
    assert blocked(ops, parts, Params()).empty
    ops, parts = _pipeline(b_partner_ready=1_340 * US)  # 60 us: reported, that much lost
    assert blocked(ops, parts, Params())["lost"].tolist() == [60 * US]


def test_not_when_a_s_participants_are_unknown_or_b_s_are():
    ops, parts = _pipeline(b_partner_ready=1_100 * US)
    no_a = Participants(group=parts.group, edges=parts.edges[parts.edges["i"].isin([1, 3])], method="test")
    assert blocked(ops, no_a, Params()).empty  # is A of another communicator? unknown
    no_b = Participants(group=parts.group, edges=parts.edges[parts.edges["i"].isin([0, 2])], method="test")
    assert blocked(ops, no_b, Params()).empty


def test_collectives_of_different_members_and_not_behind_a_late_rank():
    """Rank 0: a data-parallel all-reduce with rank 2 (A), then a tensor-parallel one with rank 1
    (B). B and rank 1's B were ready long before A ended: lost. When A itself waited for a late
    rank 2 and B's partner started early, it is nccl_ordering_stall's, not reported here."""

    def job(a_partner_start: int) -> tuple[pd.DataFrame, Participants]:
        rows = [
            {"rank": 0, "start_ns": 1_000 * US, "end_ns": 2_000 * US, "ready": 900 * US},  # 0: A (DP)
            {"rank": 2, "start_ns": a_partner_start, "end_ns": 2_000 * US, "ready": a_partner_start},  # 1: A's
            {"rank": 0, "start_ns": 2_000 * US, "end_ns": 2_050 * US, "ready": 1_200 * US},  # 2: B (TP)
            {"rank": 1, "start_ns": 1_300 * US, "end_ns": 2_050 * US, "ready": 1_300 * US},  # 3: B's, started early
        ]
        group = pd.Series([0, 0, 1, 1], dtype="int64")
        return _ops(rows), Participants(group=group, edges=pd.DataFrame({"i": [], "j": []}, dtype="int64"), method="t")

    held = blocked(*job(a_partner_start=1_000 * US), Params())
    assert held.index.tolist() == [2] and held.loc[2, "lost"] == 700 * US  # free at 1,300 (rank 1's readiness)
    assert blocked(*job(a_partner_start=1_900 * US), Params()).empty  # A waited 900 us for rank 2: the ordering stall's


def test_thresholds_are_parameters():
    ops, parts = _pipeline(b_partner_ready=1_340 * US)
    assert blocked(ops, parts, Params(min_stall_ns=70 * US)).empty
    assert np.isclose(blocked(ops, parts, Params(min_stall_ns=10 * US))["lost"].iloc[0], 60 * US)


def test_one_communicator_named_by_payloads_is_never_reported():
    """A send and a receive to different peers on ONE communicator (payloads name it): NCCL orders
    a communicator's operations whatever the streams, so separate streams would not help."""
    ops, parts = _pipeline(b_partner_ready=1_100 * US)
    ops["comm_id"] = pd.array([0, 0, 0, 0], dtype="Int64")
    assert blocked(ops, parts, Params()).empty
    ops["comm_id"] = pd.array([0, 1, 0, 1], dtype="Int64")  # a communicator per pair, as PyTorch's
    assert blocked(ops, parts, Params()).index.tolist() == [1]


def test_not_behind_its_own_communicator_s_op_on_another_stream():
    """B on stream 14, A on 13, both of communicator 0 (payloads): A is B's predecessor through the
    communicator, which NCCL orders whatever the streams; separate streams would not help."""
    ops, parts = _pipeline(b_partner_ready=1_100 * US)
    ops.loc[1, "stream"] = 14
    ops["comm_id"] = pd.array([0, 0, 0, 0], dtype="Int64")
    assert nccl_ordering_stall.predecessor(ops).tolist()[1] == 0
    assert blocked(ops, parts, Params()).empty


def test_the_wait_before_a_started_is_not_a_s():
    """Rank 1's stream: X (with rank 0, 1,000-1,400 us), A (with rank 2, 1,400-1,500), B (with rank
    0 again, queued behind A). B was ready at 1,050, but until 1,400 it waited for X, an op of its
    own communicator, which NCCL orders before it anyway: only A's 100 us are the shared stream's."""
    rows = [
        {"rank": 1, "start_ns": 1_000 * US, "end_ns": 1_400 * US, "ready": 1_000 * US},  # 0: X
        {"rank": 1, "start_ns": 1_400 * US, "end_ns": 1_500 * US, "ready": 1_390 * US},  # 1: A, ready late
        {"rank": 1, "start_ns": 1_500 * US, "end_ns": 1_550 * US, "ready": 1_050 * US},  # 2: B
        {"rank": 0, "start_ns": 1_000 * US, "end_ns": 1_400 * US, "ready": 1_000 * US},  # 3: X's
        {"rank": 2, "start_ns": 1_400 * US, "end_ns": 1_500 * US, "ready": 1_000 * US},  # 4: A's
        {"rank": 0, "start_ns": 1_500 * US, "end_ns": 1_550 * US, "ready": 1_060 * US},  # 5: B's
    ]
    edges = pd.DataFrame({"i": [0, 3, 1, 4, 2, 5], "j": [3, 0, 4, 1, 5, 2]})
    parts = Participants(group=pd.Series(-1, index=range(6), dtype="int64"), edges=edges, method="test")
    held = blocked(_ops(rows), parts, Params())
    assert held.index.tolist() == [2] and held.loc[2, "lost"] == 100 * US


def test_stalls_behind_a_late_rank_are_left_to_the_ordering_detector_as_it_is_set():
    """With nccl_ordering_stall's min_wait_ns raised past A's wait, B is no ordering stall, so it is
    this detector's; with it lowered below, the ordering detector's, not reported twice."""
    ops, parts = _pipeline(b_partner_ready=1_100 * US)
    ops.loc[2, ["start_ns", "a_start", "ready"]] = [1_040 * US, 1_040 * US, 1_040 * US]  # A waited 40 us for rank 2
    ops.loc[3, ["start_ns", "a_start"]] = [1_100 * US, 1_100 * US]  # B's partner started early
    ordering = nccl_ordering_stall.Params
    assert blocked(ops, parts, Params(), ordering(min_wait_ns=30 * US)).empty
    assert blocked(ops, parts, Params(), ordering(min_wait_ns=50 * US)).index.tolist() == [1]


AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _tp_dp_merged(named: bool = False, first: str = AR, tp_stream: int = 13) -> tuple[pd.DataFrame, Participants]:
    """Four ranks, TP pairs {0, 1} and {2, 3}. First two TP all-reduces per pair (ops 0-7, each
    pair its own set, on ``tp_stream``), then a DP all-reduce (A, ops 8-11, 1,000-2,000 us) and,
    queued behind it on every rank, a TP all-reduce (B, ops 12-15) whose four kernels all ended
    together, so program position matched them as one set {0, 1, 2, 3}: the same ranks as A. B
    was ready at 1,200 us on every rank. ``named``: NCCL's payloads name each op's communicator."""
    rows, group = [], []
    for at in (300, 500):
        for r in range(4):
            rows.append(
                {"rank": r, "start_ns": at * US, "end_ns": (at + 50) * US, "ready": at * US, "short_name": first}
            )
            group.append(r // 2 + (at == 500) * 10)
    for r in range(4):  # A: DP
        rows.append({"rank": r, "start_ns": 1_000 * US, "end_ns": 2_000 * US, "ready": 900 * US, "short_name": AR})
        group.append(2)
    for r in range(4):  # B: TP, matched as one set
        rows.append({"rank": r, "start_ns": 2_000 * US, "end_ns": 2_050 * US, "ready": 1_200 * US, "short_name": AR})
        group.append(3)
    ops = _ops(rows)
    ops.loc[:7, "stream"] = tp_stream
    if named:
        ops["comm_id"] = pd.array([0, 0, 1, 1] * 2 + [2] * 4 + [0, 0, 1, 1], dtype="Int64")
    edges = pd.DataFrame({"i": [], "j": []}, dtype="int64")
    return ops, Participants(group=pd.Series(group, dtype="int64"), edges=edges, method="test")


def test_ops_of_a_rank_set_that_may_be_several_communicators_are_held_as_ambiguous():
    """B's set is A's, but on their stream its ranks also run the same kernel in smaller sets: one
    communicator, or TP pairs taken for one? Kept apart (``ambiguous``) for steps.unjudged, never
    a finding; with payloads naming the communicators it is judged (B's is not A's)."""
    held = blocked(*_tp_dp_merged(), Params())
    assert held.index.tolist() == [12, 13, 14, 15]
    assert held["ambiguous"].tolist() == [True] * 4
    assert held["lost"].tolist() == [800 * US] * 4  # from 1,200 (all ready) to 2,000
    named = blocked(*_tp_dp_merged(named=True), Params())
    assert named.index.tolist() == [12, 13, 14, 15] and not named["ambiguous"].any()


def test_one_named_communicator_behind_itself_is_neither_judged_nor_ambiguous():
    """Payloads say B is A's communicator: NCCL orders them anyway, whatever smaller sets exist."""
    ops, parts = _tp_dp_merged(named=True)
    ops["comm_id"] = pd.array([0, 0, 1, 1] * 2 + [2] * 8, dtype="Int64")
    assert blocked(ops, parts, Params()).empty


def test_one_set_of_ranks_queued_behind_itself_is_neither_judged_nor_ambiguous():
    """Pure data parallelism: every op over the same four ranks, no smaller set anywhere. B behind A
    is one communicator's order (NCCL's), not a shared stream, and not a doubt either."""
    ops, parts = _tp_dp_merged()
    first = parts.group.copy()
    first.iloc[:8] = 4  # the first all-reduces over all four ranks too
    assert blocked(ops, Participants(group=first, edges=parts.edges, method="test"), Params()).empty


def test_smaller_sets_elsewhere_raise_no_doubt():
    """The smaller sets must run B's kernel, on B's stream, more than once: not a pipeline's sends
    and receives beside two world all-reduces (the bundled pipeline-stall), not a subgroup on a
    stream of its own (PyTorch gives each process group one), not one op matched without a rank
    that joined the capture late."""
    assert blocked(*_tp_dp_merged(first="ncclDevKernel_SendRecv"), Params()).empty
    assert blocked(*_tp_dp_merged(tp_stream=14), Params()).empty
    ops, parts = _tp_dp_merged()
    late = parts.group.copy()
    late.iloc[:8] = [4, 4, 4, -1, 5, 5, 5, 5]  # rank 3's first op unmatched: {0, 1, 2} once
    assert blocked(ops, Participants(group=late, edges=parts.edges, method="test"), Params()).empty


def test_waits_of_doubtful_ops_queued_one_behind_the_other_count_once():
    """Two held ops on one stream of rank 0, the second queued behind the first: their waits
    overlap, and the time not judged is their union (1,200 to 2,100 us), not the sum."""
    ops, _ = _tp_dp_merged()
    held = pd.DataFrame({"a": [8, 12], "free_at": [1_200 * US, 1_300 * US], "lost": [800 * US, 800 * US],
                         "ambiguous": [True, True]}, index=[12, 16])  # fmt: skip
    extra = ops.iloc[[12]].assign(start_ns=2_100 * US, end_ns=2_150 * US, a_start=2_100 * US, a_end=2_150 * US)
    ops = pd.concat([ops, extra], ignore_index=True)
    (entry,) = _not_judged(ops, held)
    assert (entry["detector"], entry["rank"], entry["ns"]) == ("shared_nccl_stream", 0, 900 * US)
    assert entry["why"].startswith("2 NCCL operations")
