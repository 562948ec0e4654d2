"""The ordering detector's step numbers (``_step_numbers``) are worked out once per distinct NVTX
text and taken by code. The oracle is the definition: the pattern on every range's text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nsysan.attribution.participants import STEP, _step_numbers

TEXTS = ["step 3", None, "ProfilerStep#12", "fwd", "Iteration-7", "iter\u0663", "epoch 2/step 5", "", "STEP 99999",
         "aten::mm", "nan", "step", "train_step_41 bwd"]  # fmt: skip


def _oracle(text: pd.Series) -> np.ndarray:
    number = text.astype(object).fillna("").astype(str).str.extract(STEP, expand=False)
    return pd.to_numeric(number, errors="coerce").to_numpy(dtype=np.float64)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", ["category", object])
def test_step_numbers_per_text_equal_the_pattern_on_every_range(seed, dtype):
    rng = np.random.default_rng(seed)
    text = pd.Series([TEXTS[i] for i in rng.integers(0, len(TEXTS), 5_000)], dtype=dtype)
    got = _step_numbers(text)
    np.testing.assert_array_equal(got.to_numpy(dtype=np.float64), _oracle(text))
    assert got.index.equals(text.index)
    assert (got.notna()).sum() > 1_000


def test_ranges_without_any_text_have_no_step():
    assert _step_numbers(pd.Series([None, None], dtype="category")).isna().all()
    assert _step_numbers(pd.Series([], dtype="category")).empty
