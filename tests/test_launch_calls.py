"""Trace.launch_calls reads the launching CUDA calls two ways (SQLite's IN over the wanted ids, or
the whole table picked in numpy when most calls are wanted) and must give the same rows either way."""

from __future__ import annotations

import pandas as pd
import pytest

from fixtures.exporter import ExportWriter
from nsysan.ingest import frames, load_trace

COLUMNS = ("tid", "start_ns", "end_ns")
KEYS = ["export", "pid", "correlation_id"]


@pytest.fixture
def export(tmp_path):
    """Two processes numbering their correlation ids alike, calls that launched nothing, a call
    ending before it starts (left out, counted) and kernels launched by one call each."""
    w = ExportWriter(tmp_path / "two.sqlite")
    for pid in (100, 200):
        w.process(pid, f"python{pid}")
        for i in range(1, 41):
            start = 1_000_000 + i * 10_000 + pid
            w.runtime(pid, pid + 1 + i % 2, start, start + 3_000, "cudaLaunchKernel", i)
            if i % 10 != 0:  # every tenth call launched nothing
                w.kernel(pid, pid // 100, 7, start + 5_000, start + 8_000, "gemm", correlation=i)
        w.runtime(pid, pid + 1, 2_000_000, 1_999_000, "cudaLaunchKernel", 5)  # ends before it starts
        w.runtime(pid, pid + 1, 2_100_000, 2_101_000, "cudaStreamSynchronize", 900)
    w.close()
    return tmp_path / "two.sqlite"


def _calls(trace, kernels, columns):
    got = trace.launch_calls(kernels, columns=columns)
    if columns is not None:  # the keys and the columns asked for, in either order: nothing else
        assert sorted(got.columns) == sorted([*KEYS, *columns])
        got = got[[*KEYS, *columns]]
    return got.sort_values([*KEYS, "start_ns"], kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("share, whole", [(1.0, True), (0.1, False)], ids=["most calls: whole table", "few: IN"])
def test_columns_give_the_rows_of_the_full_read(export, share, whole, monkeypatch):
    with load_trace([export], cache=None) as trace:
        kernels = trace.kernel_columns(["pid", "correlation_id"])
        kernels = kernels.head(max(1, int(len(kernels) * share)))
        full = _calls(trace, kernels, None)[[*KEYS, *COLUMNS]]
        reads = []
        real = frames.read_frame
        monkeypatch.setattr(frames, "read_frame", lambda *a, **kw: reads.append(kw) or real(*a, **kw))
        narrow = _calls(trace, kernels, COLUMNS)
        assert [kw.get("correlation_ids") is None for kw in reads] == [whole]
        pd.testing.assert_frame_equal(narrow, full)
        # both processes number their calls alike: each id is read for both, the bad call is out
        assert set(full["pid"]) == {100, 200}
        assert (full["end_ns"] >= full["start_ns"]).all()
        assert 900 not in set(full["correlation_id"])


def test_columns_from_a_loaded_frame_match(export):
    with load_trace([export], cache=None) as trace:
        kernels = trace.kernel_columns(["pid", "correlation_id"])
        read = _calls(trace, kernels, COLUMNS)
        trace.cuda_api  # noqa: B018 (loads the frame: the merge path)
        pd.testing.assert_frame_equal(_calls(trace, kernels, COLUMNS), read)


def test_whole_table_read_goes_through_the_frame_cache(export, tmp_path):
    from nsysan.ingest.cache import FrameCache

    cache = FrameCache(tmp_path / "cache")
    results = []
    for _ in range(2):
        with load_trace([export], cache=cache) as trace:
            results.append(_calls(trace, trace.kernel_columns(["pid", "correlation_id"]), COLUMNS))
    pd.testing.assert_frame_equal(results[0], results[1])
    assert any("cuda_api." in p.name for p in (tmp_path / "cache").rglob("*"))
