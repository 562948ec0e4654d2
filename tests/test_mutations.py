"""Every deliberate bug in tests/mutations.py fails the tests named for it.

Each case copies the repository, applies one mutant and runs its tests in a subprocess (about half
a minute each): the guard that the truth tests still test the definitions they claim to.
"""

from __future__ import annotations

import pytest

from tests.mutations import MUTANTS, killed


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant):
    caught, last_line = killed(mutant)
    assert caught, f"the tests passed with '{mutant.name}' applied ({last_line})"
