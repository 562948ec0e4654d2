"""Every deliberate bug in tests/mutations.py fails the tests named for it.

Each case copies the repository, applies one mutant and runs its tests in a subprocess (half a
minute to two minutes each): the guard that the truth tests still test the definitions they claim
to. The mutants run side by side, one per CPU, the first time a case asks (a quarter of the suite's
time when they ran one after another); each case then reads its own mutant's outcome.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.mutations import MUTANTS, Mutant, killed


def _outcome(mutant: Mutant) -> tuple[bool, str] | Exception:
    """Its run, or what stopped it: one mutant's error is its own case's, not every case's."""
    try:
        return killed(mutant)
    except Exception as exc:  # re-raised in the mutant's own case
        return exc


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict[str, tuple[bool, str] | Exception]:
    """The outcome of each mutant this session's cases ask about (``-k`` picks some), by name;
    NSYSAN_MUTANT_WORKERS sets how many run at once (default: the CPUs this process may use)."""
    chosen = [item.callspec.params["mutant"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "mutant" in item.callspec.params]  # fmt: skip
    workers = int(os.environ.get("NSYSAN_MUTANT_WORKERS", len(os.sched_getaffinity(0))))
    with ThreadPoolExecutor(max_workers=max(1, min(len(chosen), workers))) as pool:
        return dict(zip([m.name for m in chosen], pool.map(_outcome, chosen), strict=True))


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant, outcomes):
    outcome = outcomes[mutant.name]
    if isinstance(outcome, Exception):
        raise outcome
    caught, last_line = outcome
    assert caught, f"the tests passed with '{mutant.name}' applied ({last_line})"
