"""Step-time attribution against simulated truth: recoverable time, breakdowns, the top group, clean twins.

Each family of fixtures/attribution_scenarios.py is a simulated job; its truth for "what would fixing
X save" is the same simulation, same draws, re-run without X (fixtures/jobsim.py). Every scenario is
analysed as a user would (tests/attribution_truth.py; ``python -m tests.attribution_truth`` prints
the table quoted in the notes) and scored strictly:

- per family, the planted kind's summed ``recoverable_ns`` over the seeds is within 30% of the
  summed simulated saving;
- every step found with the simulated window has each category within 10% of the step of the
  simulated one;
- the top group of a planted scenario names the kind whose removal saves the most (the planted
  one, unless the job has a bigger problem the simulation also measures, e.g. exposed
  communication in a pipeline): its truth is at least 90% of the largest;
- a clean twin (same job, nothing planted) claims, over all kinds, no more than 2% of its wall
  time beyond 1.3x what the simulation says each kind saves.

Known gaps, asserted as strict xfails so that fixing them shows: DDP's backward kernels that NCCL
overlaps every time have no clean baseline (issue 30); tensor- and data-parallel communicators on one
stream are not told apart without payloads when their all-reduces end together (issue 30 item 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.attribution_scenarios import FAMILIES
from tests.attribution_truth import Result, run

SEEDS = range(3)
PLANTED_KIND = {
    "pipeline_late_peer": "late_rank",
    "tp_dp_one_stream": "late_rank",
    "ddp_slowed_backward": "comm_compute_slowdown",
    "graph_replays": "graph_allreduce_gap",
    "launch_bound_burst": "gpu_idle",
    "copy_bound_step": "copy_bound",
    "host_bound_step": "gpu_idle",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, bool], Result]:
    root: Path = tmp_path_factory.mktemp("attribution")
    return {(f, s, p): run(f, s, p, root) for f in FAMILIES for s in SEEDS for p in (True, False)}


def test_every_family_is_scored(results):
    assert set(PLANTED_KIND) | {"queue_full_gpu_busy"} == set(FAMILIES)


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(
            f,
            marks=pytest.mark.xfail(
                strict=True, reason="issue 30: no baseline for kernels NCCL always overlaps (DDP's backward)"
            ),
        )
        if f == "ddp_slowed_backward"
        else f
        for f in PLANTED_KIND
    ],
)
def test_recoverable_time_of_the_planted_kind_is_within_30_percent(results, family):
    kind = PLANTED_KIND[family]
    claimed = sum(results[family, s, True].claimed.get(kind, 0) for s in SEEDS)
    truth = sum(results[family, s, True].truth.get(kind, 0) for s in SEEDS)
    assert truth > 0
    assert abs(claimed - truth) <= 0.3 * truth, (family, kind, claimed, truth)


@pytest.mark.parametrize(
    "family",
    [
        "pipeline_late_peer",
        pytest.param(
            "tp_dp_one_stream",
            marks=pytest.mark.xfail(
                strict=True,
                reason="issue 30 item 1: without payloads, tensor-parallel groups whose all-reduces end together "
                "are taken for one communicator, so the shared stream's cost is not seen",
            ),
        ),
    ],
)
@pytest.mark.parametrize("planted", [True, False])
def test_one_nccl_stream_per_peer_is_within_30_percent(results, family, planted):
    """What one NCCL stream per communicator or peer saves, the simulation re-run so (the late rank
    still late): claimed by nccl_ordering_stall (behind a late rank) and shared_nccl_stream (behind a
    running op) together, in planted jobs and clean twins alike."""
    claimed = sum(results[family, s, planted].claimed.get("nccl_ordering_stall", 0) for s in SEEDS)
    truth = sum(results[family, s, planted].truth.get("nccl_ordering_stall", 0) for s in SEEDS)
    assert truth > 0
    assert abs(claimed - truth) <= 0.3 * truth, (family, planted, claimed, truth)


def test_the_shared_stream_s_cost_is_never_silent_where_communicators_are_not_told_apart(results):
    """TP x DP without payloads (the strict xfail above): what nsysan cannot judge it says. Per
    scenario, the claimed recoverable time plus the unjudged wait nsysan names (steps.unjudged of
    shared_nccl_stream, the rank with the most) is within 30% of what one stream per communicator
    saves (the claims and the unjudged wait together neither silent nor doubled)."""
    for s in SEEDS:
        for planted in (True, False):
            r = results["tp_dp_one_stream", s, planted]
            unjudged = [u for u in r.doc["steps"]["unjudged"] if u["detector"] == "shared_nccl_stream"]
            named = max((u["ns"] for u in unjudged), default=0) + r.claimed.get("nccl_ordering_stall", 0)
            truth = r.truth["nccl_ordering_stall"]
            assert abs(named - truth) <= 0.3 * truth, (s, planted, named, truth)
    for key, r in results.items():  # nowhere else: one communicator per rank set there
        if key[0] != "tp_dp_one_stream":
            assert not [u for u in r.doc["steps"]["unjudged"] if u["detector"] == "shared_nccl_stream"], key


def test_command_buffer_full_while_the_gpu_is_busy_recovers_nothing(results):
    for s in SEEDS:
        r = results["queue_full_gpu_busy", s, True]
        assert r.truth.get("command_buffer_full", 0) == 0
        found = [f for f in r.doc["findings"] if f["kind"] == "command_buffer_full"]
        assert found, s
        assert all(f["recoverable_ns"] <= 0.001 * r.wall_ns and f["severity"] == "info" for f in found), s


def test_breakdowns_match_the_simulated_steps(results):
    compared = 0
    for key, r in results.items():
        compared += r.steps_compared
        if r.steps_compared:
            assert r.breakdown_error <= 0.10, (key, r.breakdown_error)
    assert compared >= 0.8 * sum(len(s) for r in results.values() for s in _steps(r))


def _steps(r: Result) -> list[list[int]]:
    return [st["start_ns"] for st in r.doc.get("steps", {}).get("ranks", {}).values()]


def test_the_top_group_is_what_saves_the_most(results):
    for family in PLANTED_KIND:
        for s in SEEDS:
            r = results[family, s, True]
            if family == "ddp_slowed_backward":
                continue  # its slowdown is not judged (see the xfail above)
            best = max(r.truth.values())
            assert r.top_kind is not None, (family, s)
            assert r.truth.get(r.top_kind, 0) >= 0.9 * best, (family, s, r.top_kind, r.truth)
            assert r.top_severity in ("warning", "critical"), (family, s)


def test_the_planted_cause_is_a_ranked_group(results):
    """Where the planted cause is not the job's biggest problem, it still has its group, ranked by
    recoverable time among the warnings and criticals."""
    for family, kind in PLANTED_KIND.items():
        if family == "ddp_slowed_backward":
            continue
        for s in SEEDS:
            groups = results[family, s, True].doc["groups"]
            assert any(g["kind"] == kind and g["severity"] != "info" for g in groups), (family, s)


def test_clean_twins_claim_at_most_2_percent(results):
    for (family, s, planted), r in results.items():
        if planted:
            continue
        beyond = sum(max(0, c - 1.3 * r.truth.get(k, 0)) for k, c in r.claimed.items())
        assert beyond <= 0.02 * r.wall_ns, (family, s, r.claimed, r.truth, r.wall_ns)
