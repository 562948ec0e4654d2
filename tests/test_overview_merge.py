"""The overview as map and reduce: per-export parts (``overview_part``, one export at a time, then
renumbered with ``with_export``) merged by ``merge_overview`` give the whole-trace overview."""

from __future__ import annotations

import pickle
import shutil
import sqlite3
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from fixtures.exporter import ExportWriter
from fixtures.samples import SAMPLES_DIR, sample_paths
from fixtures.scenarios import JobSpec, write_job
from nsysan.ingest.trace import load_trace
from nsysan.overview import Overview, OverviewPart, build_overview, merge_overview, overview_part

TABLES = ["exports", "devices", "top_kernels", "nccl", "copies", "nvtx_ranges", "transfers", "ranks"]
SINGLE = sorted(p.stem for p in SAMPLES_DIR.glob("*.sqlite"))


def assert_same(got: Overview, want: Overview) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(
            getattr(got, name).reset_index(drop=True), getattr(want, name).reset_index(drop=True), obj=name
        )
    assert got.limitations == want.limitations


def split_and_merge(paths: list[Path], order: list[int] | None = None) -> tuple[Overview, Overview]:
    """(the merge of one part per export, each from its own one-export Trace; the whole-trace overview)."""
    with load_trace(paths, cache=None, allow_mixed=True) as whole:  # samples of different jobs
        want = build_overview(whole)
        ranks, exports, notes = whole.ranks, whole.exports, whole.input_notes
    parts = []
    for i, path in enumerate(paths):
        mine = ranks[ranks["export"] == i].assign(export=0).reset_index(drop=True)  # as the engine hands it out
        with load_trace([path], cache=None, ranks=mine) as one:
            # what a worker sends the coordinator: pickled
            parts.append(pickle.loads(pickle.dumps(overview_part(one).with_export(i))))
    ordered = [parts[i] for i in order] if order else parts
    return merge_overview(ordered, ranks, exports, notes), want


@pytest.mark.parametrize("name", SINGLE)
def test_one_export_part_merges_to_the_overview(name):
    paths = sample_paths(name)
    with load_trace(paths, cache=None) as trace:
        want = build_overview(trace)
    with load_trace(paths, cache=None) as trace:
        part = pickle.loads(pickle.dumps(overview_part(trace)))
        got = merge_overview([part.with_export(0)], trace.ranks, trace.exports, trace.input_notes)
    assert_same(got, want)


def test_part_tables_are_compact_and_numbered():
    with load_trace(sample_paths("allreduce-2rank"), cache=None) as trace:
        part = overview_part(trace)
        names = trace.kernel_columns(["short_name"])["short_name"].nunique()
    for f in fields(OverviewPart):
        table = getattr(part, f.name)
        assert "export" in table.columns, f.name
        assert (table["export"] == 0).all(), f.name
        assert (part.with_export(3).tables()[f.name]["export"] == 3).all(), f.name
    assert len(part.kernels) == names  # every name, one row each: not the head, not the kernels
    assert (part.exports["export"] == 0).all()  # with_export copies, leaves the part alone


@pytest.mark.parametrize("order", [None, [3, 1, 0, 2]])
def test_file_per_rank_job_merges_to_the_overview(order):
    got, want = split_and_merge(sample_paths("allreduce-4rank-2022.4"), order)
    assert_same(got, want)
    assert len(got.exports) == 4 and got.exports["ranks"].tolist() == [[0], [1], [2], [3]]


def test_samples_as_one_job_merge_to_the_overview():
    """Exports with different kernels, copies, NVTX domains and graph modes: categories, shares
    and the top-N cut come out as the whole trace's."""
    paths = [p for name in ("graph-replay-graphmode", "graph-replay-node", "pipeline-stall", "overlap-slowdown")
             for p in sample_paths(name)]  # fmt: skip
    got, want = split_and_merge(paths, [2, 0, 3, 1])
    assert_same(got, want)
    assert len(got.top_kernels) and len(got.nvtx_ranges) and len(got.copies)


def test_graph_mode_limitation_counts_launches_of_every_export(tmp_path):
    paths, truth = write_job(JobSpec(ranks=3, graph="graph", file_per_rank=True), tmp_path)
    got, want = split_and_merge(paths, [2, 1, 0])
    assert_same(got, want)
    launches = sum(truth.graph_launches.values())
    assert any(f"{launches} graph launches" in n for n in got.limitations), got.limitations


def test_dropped_rows_say_which_exports(tmp_path):
    paths = []
    for src in sample_paths("allreduce-4rank-2022.4"):
        paths.append(Path(shutil.copy(src, tmp_path / src.name)))
    con = sqlite3.connect(paths[1])
    con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 1000 WHERE rowid <= 5')
    con.commit()
    con.close()
    got, want = split_and_merge(paths, [1, 3, 2, 0])
    assert_same(got, want)
    assert any("(1 of 4 exports)" in n for n in got.limitations), got.limitations


def test_ties_are_ordered_by_name_whatever_the_split():
    """Equal totals sort by the key, so the order does not depend on which part held which group."""
    paths = sample_paths("allreduce-4rank-2022.4")
    parts = []
    for i, path in enumerate(paths):
        with load_trace([path], cache=None) as one:
            part = overview_part(one).with_export(i)
        part.kernels = part.kernels.assign(total_ns=1000, count=1)
        parts.append(part)
    with load_trace(paths, cache=None) as whole:
        ranks, exports = whole.ranks, whole.exports
    forward = merge_overview(parts, ranks, exports, [])
    backward = merge_overview(parts[::-1], ranks, exports, [])
    pd.testing.assert_frame_equal(forward.top_kernels, backward.top_kernels)
    names = forward.top_kernels["kernel"].astype(str).tolist()
    assert names == sorted(names)


def test_exports_without_kernels_or_sizes_merge_to_the_overview(tmp_path):
    """An export whose tables exist but are empty, one with NVTX only, and NCCL sizes known in one
    export and unknown in another (the size column mixes numbers and "unknown")."""
    full = tmp_path / "full.sqlite"
    w = ExportWriter(full, "2022.4")
    w.process(77, "python3")
    w.nvtx_mark(77, 77, 1_000, "nsysan rank=5")
    w.nvtx_range(77, 77, 2_000, 9_000, "step 0")
    w.close(lazy=False)
    lazy = tmp_path / "lazy.sqlite"
    w = ExportWriter(lazy, "current")
    w.process(78, "python3")
    w.nvtx_mark(78, 78, 1_000, "nsysan rank=6")
    w.nvtx_range(78, 78, 2_000, 9_000, "step 0")
    w.close()
    ranks, _ = write_job(JobSpec(ranks=2, file_per_rank=True, seed=6), tmp_path / "job")
    con = sqlite3.connect(ranks[1])
    con.execute("DELETE FROM NVTX_EVENTS WHERE eventType != 34")  # rank 1 kept only its rank mark
    con.commit()
    con.close()
    got, want = split_and_merge([full, *ranks, lazy], [3, 1, 0, 2])
    assert_same(got, want)
    assert {str(b) for b in got.nccl["bytes"]} == {str(64 * 2**20), "unknown"}
    assert any(n.startswith("No CUDA data in 2 of 4 exports") for n in got.limitations), got.limitations


def _concat_by_union_categoricals(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The oracle: each part's column made a categorical of text categories, then pandas'
    union_categoricals (categories in order of appearance, empty categorical parts included)."""
    columns = list(frames[0].columns)
    cats = [c for c in columns if any(isinstance(f[c].dtype, pd.CategoricalDtype) for f in frames)]
    rows = [f for f in frames if len(f)]
    out = pd.concat([f.drop(columns=cats) for f in rows], ignore_index=True) if rows else \
        frames[0].iloc[0:0].drop(columns=cats).reset_index(drop=True)  # fmt: skip
    for c in cats:
        parts = []
        for f in frames:
            if len(f) or isinstance(f[c].dtype, pd.CategoricalDtype):
                a = f[c].array if isinstance(f[c].dtype, pd.CategoricalDtype) else pd.Categorical(f[c].astype(object))
                parts.append(pd.Categorical.from_codes(a.codes, categories=pd.Index(a.categories.astype(str))))
        out[c] = pd.api.types.union_categoricals(parts, ignore_order=True)
    return out[columns]


@pytest.mark.parametrize("seed", range(40))
def test_parts_concatenate_as_union_categoricals_would(seed):
    """Parts of a 1,024-export job are merged with one concat and a re-coding of categories; the
    result must be what unioning each part's categoricals gives, dtypes and category order too."""
    import numpy as np

    from nsysan.overview import _concat

    rng = np.random.default_rng(seed)
    names = ["gemm", "nccl", "copy", "softmax", "7", "reduce"]
    frames = []
    for export in range(int(rng.integers(2, 6))):
        n = int(rng.integers(0, 5))
        cats = list(rng.choice(names, size=int(rng.integers(1, 5)), replace=False))
        values = [cats[i] if rng.random() > 0.2 else None for i in rng.integers(0, len(cats), n)]
        kernel = pd.Series(pd.Categorical(values, categories=cats))
        if rng.random() < 0.2:  # a part whose column is plain text (no kernels read as categorical)
            kernel = kernel.astype(object)
        frames.append(pd.DataFrame({"export": np.int64(export), "kernel": kernel,
                                    "count": rng.integers(1, 9, n), "bytes": pd.array(rng.integers(0, 4, n), "Int64")}))  # fmt: skip
    if not any(isinstance(f["kernel"].dtype, pd.CategoricalDtype) for f in frames):
        frames[0]["kernel"] = frames[0]["kernel"].astype("category")
    pd.testing.assert_frame_equal(_concat(frames), _concat_by_union_categoricals(frames))
