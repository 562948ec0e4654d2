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

from tests.mutations import MUTANTS, killed


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict[str, tuple[bool, str]]:
    """(caught, last line) of each mutant this session's cases ask about (``-k`` picks some), by name."""
    chosen = [item.callspec.params["mutant"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "mutant" in item.callspec.params]  # fmt: skip
    with ThreadPoolExecutor(max_workers=max(1, min(len(chosen), os.cpu_count() or 1))) as pool:
        return dict(zip([m.name for m in chosen], pool.map(killed, chosen), strict=True))


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant, outcomes):
    caught, last_line = outcomes[mutant.name]
    assert caught, f"the tests passed with '{mutant.name}' applied ({last_line})"
