"""Step-time attribution on hand-built jobs and graphs, in exact figures.

Small jobs written by the simulator (fixtures/jobsim.py, no jitter) whose breakdown, late arrivals
and savings are known to the microsecond; the what-if replay against a plain topological
recomputation on hand-made and random graphs; the clock's alignment on a partner export when the
program's rhythm makes non-partners coincide too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures import jobsim as js
from fixtures.jobsim import COMPUTE, NCCL, US, Comm, Copy, EventWait, JobSpec, Kernel, Nccl, Part, RankProgram
from nsysan.analysis import analyse
from nsysan.attribution import clock
from nsysan.attribution.comm import Participants
from nsysan.attribution.whatif import Topology, replay
from nsysan.ingest import load_trace


def _analyse(spec: JobSpec, out: Path) -> tuple[dict[str, Any], js.Timeline]:
    tl = js.simulate(spec)
    paths = js.write_exports(tl, out)
    with load_trace(paths, cache=None) as trace:
        return analyse(trace), tl


def _exact(programs: list[RankProgram], **kw: Any) -> JobSpec:
    values: dict[str, Any] = dict(latency_jitter=0, nccl_end_jitter=0)
    values.update(kw)
    return JobSpec(programs, **values)


# -- a late rank at an all-reduce ----------------------------------------------------------------

LATE_STEP, DELAY, STEPS = 2, 300 * US, 4


def _late_job() -> JobSpec:
    comm = Comm(0xABC, (0, 1), "world")
    programs = []
    for r in range(2):
        prog = RankProgram()
        for k in range(STEPS):
            prog.step()
            extra = {"late_rank": DELAY} if (r, k) == (1, LATE_STEP) else {}
            prog.add(Kernel(name="gemm", work=400 * US, cost=5 * US, work_extra=extra),
                     EventWait(src=COMPUTE, dst=NCCL),
                     Nccl(op="AllReduce", parts=(Part(comm, 50 * US, nbytes=2**20),), cost=5 * US, pre=8 * US),
                     EventWait(src=NCCL, dst=COMPUTE))  # fmt: skip
        programs.append(prog)
    return _exact(programs)


@pytest.fixture(scope="module")
def late(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], js.Timeline, JobSpec]:
    spec = _late_job()
    doc, tl = _analyse(spec, tmp_path_factory.mktemp("late"))
    return doc, tl, spec


def test_breakdown_of_a_late_step_is_the_simulated_one(late):
    doc, tl, _ = late
    truth = js.breakdown(tl)
    for rank in (0, 1):
        got = doc["steps"]["ranks"][str(rank)]["breakdown_ns"]
        for k in range(STEPS):
            want = truth[(rank, k)]
            assert {c: got[c][k] for c in want} == want, (rank, k)
    # rank 0 waited the whole delay in the late step, and nowhere else more than a few us
    waited = doc["steps"]["ranks"]["0"]["breakdown_ns"]["waiting_for_peer"]
    assert waited[LATE_STEP] == DELAY
    assert max(w for k, w in enumerate(waited) if k != LATE_STEP) < 5 * US


def test_the_late_rank_is_blamed_for_what_its_delay_costs(late):
    doc, tl, spec = late
    found = [f for f in doc["findings"] if f["kind"] == "late_rank"]
    assert [(f["rank"], f["evidence"]["step"]) for f in found] == [(1, LATE_STEP)]
    saving = js.savings(spec, ["late_rank"], base=tl)["late_rank"]
    assert saving == DELAY
    assert abs(found[0]["recoverable_ns"] - saving) <= 2 * US
    assert found[0]["severity"] == "critical"  # 300 us of a ~1.9 ms job
    assert doc["steps"]["job"]["critical_rank"][LATE_STEP] == 1


def test_a_clean_job_claims_nothing(tmp_path):
    comm = Comm(0xABC, (0, 1), "world")
    programs = []
    for _ in range(2):
        prog = RankProgram()
        for _k in range(STEPS):
            prog.step()
            prog.add(Kernel(name="gemm", work=400 * US, cost=5 * US), EventWait(src=COMPUTE, dst=NCCL),
                     Nccl(op="AllReduce", parts=(Part(comm, 50 * US),), cost=5 * US), EventWait(src=NCCL, dst=COMPUTE))  # fmt: skip
        programs.append(prog)
    doc, _ = _analyse(_exact(programs), tmp_path)
    assert not [f for f in doc["findings"] if f["kind"] in ("late_rank", "gpu_idle", "copy_bound")]


# -- a copy-bound step ---------------------------------------------------------------------------


def test_copies_on_the_compute_stream_are_the_step_and_recover_their_time(tmp_path):
    prog = RankProgram()
    for _ in range(STEPS):
        prog.step()
        prog.add(Copy(kind="Host-to-Device", nbytes=64 * 2**20, work=5_000 * US, stream=COMPUTE, cost=10 * US),
                 Kernel(name="gemm", work=200 * US, cost=5 * US))  # fmt: skip
    spec = _exact([prog])
    doc, tl = _analyse(spec, tmp_path)
    copy = doc["steps"]["ranks"]["0"]["breakdown_ns"]["copy_exposed"]
    assert copy == [5_000 * US] * STEPS
    top = doc["groups"][0]
    assert (top["kind"], top["severity"]) == ("copy_bound", "critical")
    f = doc["findings"][top["worst"]]
    assert f["evidence"]["by_kind"]["Host-to-Device"]["bytes"] == STEPS * 64 * 2**20
    saving = js.savings(spec, ["copy_bound"], base=tl)["copy_bound"]
    assert abs(sum(x["recoverable_ns"] for x in doc["findings"] if x["kind"] == "copy_bound") - saving) <= 0.01 * saving


# -- the what-if replay --------------------------------------------------------------------------


def _naive(
    time: np.ndarray, src: np.ndarray, dst: np.ndarray, weight: np.ndarray, edit: dict[int, float]
) -> np.ndarray:
    """New times by the definition, swept until they settle: a node with in-edges is the latest of
    its sources' new times plus the edge's (edited) weight, never earlier than 0 nor later than it
    was; a node without in-edges keeps its time."""
    w = weight.copy()
    for r, v in edit.items():
        w[r] = v
    new = time.astype(float).copy()
    for _ in range(len(time)):  # as many sweeps as nodes: any chain of equal times settles
        for v in np.argsort(time, kind="stable"):
            rows = np.flatnonzero(dst == v)
            if not len(rows):
                continue
            cand = [new[src[r]] + w[r] for r in rows if np.isfinite(w[r])]
            new[v] = min(time[v], max([0.0, *cand]))
    return new - time


def test_replay_by_hand():
    # 0 -> 1 -> 2 -> 3, and 0 -> 2 with slack: shortening 1 -> 2 moves 2 and 3 until the slack binds
    time = np.array([0.0, 10.0, 30.0, 40.0])
    src, dst = np.array([0, 1, 0, 2]), np.array([1, 2, 2, 3])
    weight = np.array([10.0, 20.0, 5.0, 10.0])
    topo = Topology.build(time, src, dst, weight)
    nodes = np.arange(4)
    got = replay(topo, [{1: 10.0}, {1: -np.inf}, {1: 0.0, 2: 0.0}, {}], nodes)
    assert got[:, 0].tolist() == [0, 0, -10, -10]
    assert got[:, 1].tolist() == [0, 0, -25, -25]  # the edge dropped: 0 -> 2 (weight 5) binds
    assert got[:, 2].tolist() == [0, 0, -20, -20]  # 1 -> 2 and 0 -> 2 both 0: node 2 at node 1's time
    assert got[:, 3].tolist() == [0, 0, 0, 0]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_replay_agrees_with_the_definition_on_random_graphs(data):
    n = data.draw(st.integers(2, 12))
    time = np.array(sorted(data.draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))), dtype=float)
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    pairs = [(a, b) for a, b in pairs if a < b]  # forward in time (sorted), no cycles: as the builder keeps
    if not pairs:
        return
    # node ids in any order (the builder's are not in time order): relabel by a drawn permutation
    label = np.array(data.draw(st.permutations(list(range(n)))))
    time = time[np.argsort(label)]
    src = label[[a for a, _ in pairs]]
    dst = label[[b for _, b in pairs]]
    # recorded times are a solution: each node's time is the latest of its in-edges' (weights fitted)
    slack = np.array(data.draw(st.lists(st.integers(0, 5), min_size=len(pairs), max_size=len(pairs))), dtype=float)
    weight = np.maximum(time[dst] - time[src] - slack, 0.0)
    for v in np.unique(dst):
        rows = np.flatnonzero(dst == v)
        best = rows[np.argmax(time[src[rows]] + weight[rows])]
        weight[best] = time[v] - time[src[best]]
    topo = Topology.build(time, src, dst, weight)
    edits = []
    for _ in range(3):
        rows = data.draw(st.lists(st.integers(0, len(pairs) - 1), max_size=3, unique=True))
        cut = [data.draw(st.sampled_from([0.0, 0.5, 1.0, -np.inf])) for _ in rows]
        edits.append({r: (weight[r] * c if np.isfinite(c) else -np.inf) for r, c in zip(rows, cut, strict=True)})
    got = replay(topo, edits, np.arange(n))
    for k, edit in enumerate(edits):
        want = _naive(time, src, dst, weight, edit)
        want = np.where(want < -0.5, want, 0.0)
        assert np.allclose(got[:, k], want), (edit, got[:, k], want)


# -- the clock -----------------------------------------------------------------------------------


def test_exports_align_on_a_partner_not_on_the_rhythm():
    """A four-stage pipeline, one export per stage: stages s and s+1 share operations (their ends
    coincide exactly), stages two apart share none but repeat the same rhythm, ends about 120 us
    apart give or take their jitter. Export 0 has the most ends (the reference). Each export's UTC
    start is off by up to 0.8 ms; the coarse alignment finds every offset exactly, each stage on
    its neighbour."""
    rng = np.random.default_rng(7)
    grid = np.arange(400) * 300_000
    shared = [grid + k * 120_000 + rng.integers(-20_000, 20_000, len(grid)) for k in range(3)]  # (s, s+1)
    true = [1_000_000, 2_000_000, 3_000_000, 4_000_000]  # export clock = job clock - offset
    skew = [0, 500_000, -700_000, 800_000]
    on_job = [np.concatenate([shared[0], rng.integers(0, grid[-1], 500)]),
              np.concatenate([shared[0], shared[1]]), np.concatenate([shared[1], shared[2]]), shared[2]]  # fmt: skip
    ends = [np.sort(t) - o for t, o in zip(on_job, true, strict=True)]
    utc = [o + s for o, s in zip(true, skew, strict=True)]
    offsets, decided = clock.coarse(ends, utc)
    assert decided == [True] * 4
    assert offsets == true  # relative to the reference, whose UTC start is right


def test_collectives_matched_by_position_share_a_clock_group():
    group = pd.Series([-1, -1, -1, -1, -1, -1])
    # ops 0, 2, 4 one collective (three ranks, by position); 1 and 3 a send/recv pair; 5 alone
    edges = pd.DataFrame({"i": [0, 2, 1], "j": [2, 4, 3]})
    p = Participants(group, edges, "program position")
    got = p.clock_groups(np.array([False, True, False, True, False, False]))
    assert got[0] == got[2] == got[4] >= 0
    assert got[1] == got[3] >= 0 and got[1] != got[0]
    assert got[5] == -1
