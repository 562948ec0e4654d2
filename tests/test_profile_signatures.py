"""The diff profile's kernel signatures are built once per distinct (name, short name, grid, block)
and folded where two give one name. The oracle is the definition: a string per kernel (its
demangled name, else its short name), numbered by first appearance of (name, grid, block)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from nsysan.diff.profile import _kernels


def _oracle(k: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    name = k["name"].astype(object).fillna(k["short_name"].astype(object)).astype(str)
    keys = pd.DataFrame({"name": name, "grid": k["grid"].fillna(0).astype("int64"),
                         "block": k["block"].fillna(0).astype("int64")})  # fmt: skip
    codes = keys.groupby(["name", "grid", "block"], sort=False).ngroup().to_numpy()
    first = keys.drop_duplicates()
    return codes, [f"{n} | {g} {b}" for n, g, b in zip(first["name"], first["grid"], first["block"], strict=True)]


@pytest.mark.parametrize("seed", range(4))
def test_signatures_equal_the_string_per_kernel_definition(seed):
    rng = np.random.default_rng(seed)
    n = 4_000
    # "gemm" is both a demangled name and a short name: a kernel without its demangled name and
    # short name "gemm" has the same signature as one whose demangled name is "gemm"
    names = np.array(["gemm", "void at::native::elementwise<1>", "nccl", None], dtype=object)
    shorts = np.array(["gemm", "elementwise", "ncclDevKernel_AllReduce", "gemm"], dtype=object)
    pick = rng.integers(0, 4, n)
    k = pd.DataFrame({
        "rank": 0, "pid": 1, "device": 0, "start_ns": np.arange(n) * 10, "end_ns": np.arange(n) * 10 + 5,
        "name": pd.Categorical(names[pick]), "short_name": pd.Categorical(shorts[rng.integers(0, 4, n)]),
        "grid": pd.array(rng.choice([1, 2, None], n), dtype="Int64"), "block": rng.choice([128, 256], n),
    })  # fmt: skip
    got = _kernels(SimpleNamespace(kernel_columns=lambda columns: k))
    codes, labels = _oracle(k)
    assert got["signature"].cat.codes.to_numpy().tolist() == codes.tolist()
    names_got = [label.split(" | ")[0] for label in got["signature"].cat.categories]
    assert names_got == [label.split(" | ")[0] for label in labels]
    # folded: fewer signatures than distinct (name, short name, grid, block)
    assert len(labels) < len(k[["name", "short_name", "grid", "block"]].drop_duplicates())
