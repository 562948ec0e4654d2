"""nccl_ordering_stall against simulated jobs with real-world confounders, scored strictly.

Scenarios (fixtures/confounders_ordering.py) run the same program every step on 4 or 8 ranks, with
events gating every NCCL op, lock-stepped exchanges of other pairs, long transfers, host-bound
launches, inputs produced after the wait, TP x DP on one stream, cascades, both schema flavours,
per-rank files with their own clocks, captures without event rows and with or without NCCL's
communicator payloads. Ground truth comes from the simulated timeline with the participants and
readiness the generator knows. Scoring: tests/scoring.py (windows overlap >= 50%, impact within 5%,
root rank blamed); severity now follows the time the fix would recover, which
tests/test_attribution_truth.py checks against simulation.

``python -m tests.test_ordering_truth`` prints the table quoted in the notes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fixtures.confounders_ordering import scenario
from nsysan.detect import run_detectors
from nsysan.detect.nccl_ordering_stall import KIND
from nsysan.ingest import load_trace
from tests.scoring import Score

SEEDS = range(32)


def run(seeds: range, root: Path) -> tuple[Score, int, Counter[str]]:
    """Score over ``seeds`` (planted and clean twins); findings on clean twins; evidence seen."""
    # severity follows what fixing the stall would recover (a stall behind a late rank: ~nothing),
    # checked against simulated truth in tests/test_attribution_truth.py, not the planted impact
    score, clean, seen = Score(severity=False), 0, Counter()
    for seed in seeds:
        for planted in (True, False):
            out = root / f"{seed}-{planted}"
            paths, truths = scenario(seed, planted, out)
            with load_trace(paths) as trace:
                found = [f for f in run_detectors(trace) if f.kind == KIND]
            score.add(truths, paths, found, KIND)
            clean += 0 if planted else len(found)
            for f in found:
                seen[f.evidence["readiness"].split(" (")[0]] += 1
                seen[f.evidence["participants_from"].split(" (")[0]] += 1
                seen["cascade"] += "cascade" in f.evidence
    return score, clean, seen


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[Score, int, Counter[str]]:
    return run(SEEDS, tmp_path_factory.mktemp("ordering"))


def test_precision_and_recall_under_the_strict_rule(outcome):
    score, _, _ = outcome
    assert score.planted >= 40
    assert score.precision >= 0.95 and score.recall >= 0.95, score


def test_clean_twins_have_no_stalls(outcome):
    assert outcome[1] == 0


def test_every_path_of_the_definition_is_exercised(outcome):
    """Device readiness and the launch-return fallback, payload and position matching, cascades."""
    seen = outcome[2]
    for what in ("device: the event its stream waited on", "launch call return", "NCCL communicator payloads",
                 "program position", "cascade"):  # fmt: skip
        assert seen[what] > 0, what


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        score, clean, seen = run(SEEDS, Path(tmp))
    print(f"seeds {SEEDS.start}-{SEEDS.stop - 1} x (planted, clean): planted {score.planted}, found {score.found}, "
          f"matched {score.matched}, precision {score.precision:.3f}, recall {score.recall:.3f}, "
          f"findings on clean twins {clean}")  # fmt: skip
    print(dict(seen))
