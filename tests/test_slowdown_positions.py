"""The slowdown detector's program positions (``_enclosing``) work on path ids, not a string per
range. The oracle is the string definition: a range's path is its parent's path, "/", its name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nsysan.detect import comm_compute_slowdown as slowdown
from nsysan.detect.comm_compute_slowdown import _enclosing, _one_per_launch, _texts
from nsysan.ingest import load_trace
from nsysan.ingest.nccl import NCCL_DOMAIN
from nsysan.ingest.trace import Trace

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"


def _nested(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Push/pop ranges on one thread: random nesting up to depth 4, names with digits and '/'."""
    names = ["step 1", "step 22", "fwd", "fwd/bwd", "bwd", "aten::mm", "Block_3", "Block_7", "opt"]
    rows, stack, t = [], [], 0
    while len(rows) < n:
        t += int(rng.integers(1, 50))
        if stack and (len(stack) >= 4 or rng.random() < 0.45):
            rows[stack.pop()][1] = t
        else:
            stack.append(len(rows))
            rows.append([t, None, names[int(rng.integers(len(names)))]])
    for i in reversed(stack):
        t += 1
        rows[i][1] = t
    df = pd.DataFrame(rows, columns=["start_ns", "end_ns", "text"]).sample(frac=1, random_state=1)
    return df.assign(**_texts(df["text"]))


def _oracle(ranges: pd.DataFrame, t: np.ndarray) -> dict[str, np.ndarray]:
    r = ranges.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
    start, end = r["start_ns"].to_numpy(np.int64), r["end_ns"].to_numpy(np.int64)
    norm, raw = r["norm"].to_numpy(object), r["raw"].to_numpy(object)
    order = np.arange(len(r))
    ends = np.sort(end)
    depth = np.maximum(order - np.searchsorted(ends, start, side="right"), 0)
    latest = np.searchsorted(start, t, side="right") - 1
    open_now = latest + 1 - np.searchsorted(ends, t, side="right")
    safe = np.maximum(latest, 0)
    paths, parent = norm.copy(), np.full(len(r), -1)
    inner = np.full(len(t), -1)
    levels = range(int(depth.max()) + 1)
    for d in levels:
        last_d = np.maximum.accumulate(np.where(depth == d, order, -1))
        child = np.flatnonzero(depth == d + 1)
        parent[child] = last_d[child]
        ok = child[parent[child] >= 0]
        paths[ok] = paths[parent[ok]] + "/" + norm[ok]
        hit = (open_now - 1 == d) & (latest >= 0)
        inner[hit] = last_d[safe[hit]]
    repeats = pd.Series(paths).map(pd.Series(paths).value_counts()).to_numpy() > 1
    step = np.where(repeats, order, -1)
    for d in levels[1:]:
        at = np.flatnonzero((depth == d) & (parent >= 0))
        step[at] = np.where(step[parent[at]] >= 0, step[parent[at]], step[at])
    top = np.where(inner >= 0, step[np.maximum(inner, 0)], -1)
    placed = top >= 0
    return {"top": top, "top_text": np.where(placed, raw[np.maximum(top, 0)], ""),
            "path": np.where(placed, paths[np.maximum(inner, 0)], "")}  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_enclosing_matches_the_string_definition(seed):
    rng = np.random.default_rng(seed)
    ranges = _nested(rng, 3_000)
    t = np.sort(rng.integers(0, int(ranges["end_ns"].max()) + 100, 5_000))
    got, want = _enclosing(ranges, t), _oracle(ranges, t)
    assert (want["top"] >= 0).sum() > 100
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_name_with_a_slash_is_the_same_path_as_the_nesting_it_spells():
    """ "fwd/bwd" at the top and "bwd" inside "fwd" are one path, as their texts are equal."""
    ranges = pd.DataFrame({"start_ns": [0, 10, 11, 20], "end_ns": [5, 30, 15, 25],
                           "text": ["fwd/bwd", "fwd", "bwd", "other"]})  # fmt: skip
    ranges = ranges.assign(**_texts(ranges["text"]))
    got = _enclosing(ranges, np.array([1, 12]))
    assert got["path"].tolist() == ["fwd/bwd", "fwd/bwd"]
    assert got["top"].tolist() == [0, 2]  # a repeating path: each is a step


@pytest.mark.parametrize("seed", range(4))
def test_one_row_per_launch_is_the_first_of_each_as_drop_duplicates_keeps(seed):
    """The packed-key shortcut returns the calls untouched only when no launch repeats."""
    rng = np.random.default_rng(seed)
    n = 3_000
    calls = pd.DataFrame({
        "export": rng.integers(0, 2, n) if seed == 3 else np.zeros(n, dtype=np.int64),
        "pid": rng.integers(100, 103, n), "tid": np.arange(n),
        "correlation_id": np.arange(n) if seed in (0, 3) else rng.integers(0, 2 * n, n),
    })  # fmt: skip
    if seed == 2:
        calls.loc[::7, "pid"] = -1  # a pid the packed key cannot hold
    got = _one_per_launch(calls)
    pd.testing.assert_frame_equal(got, calls.drop_duplicates(["export", "pid", "correlation_id"]))


def _judged(trace: Trace) -> pd.DataFrame:
    """The verdicts, with step ids as their order among steps (ids count the ranges considered)
    and paths as texts (categories list every path seen, enclosing or not)."""
    k = slowdown.judge(trace, slowdown.Params())
    assert k is not None
    step = k["step"].to_numpy().copy()
    order = np.unique(step[step >= 0], return_inverse=True)[1]
    step[step >= 0] = order
    return k.assign(step=step, path=k["path"].astype(object))


def _with_nccl_ranges_as(trace: Trace, domain: str) -> None:
    """Move the trace's NCCL ranges into ``domain``, as if a user had pushed them."""
    v = trace.nvtx.copy()
    nccl = v["domain"] == NCCL_DOMAIN
    assert nccl.any()
    v["domain"] = v["domain"].cat.add_categories([domain]).mask(nccl, domain)
    trace._frames["nvtx"] = v


def test_nccl_ranges_enclose_no_compute_launch_on_a_real_capture():
    """NCCL's ranges are left out of program positions; counted as user ranges they change nothing
    (allreduce-2rank: NCCL ranges beside the user's "train" ranges)."""
    with load_trace([SAMPLES / "allreduce-2rank.sqlite"], cache=None) as plain:
        want = _judged(plain)
    with load_trace([SAMPLES / "allreduce-2rank.sqlite"], cache=None) as moved:
        _with_nccl_ranges_as(moved, "user")
        got = _judged(moved)
    assert (want["path"] != "").any()
    pd.testing.assert_frame_equal(got, want)


def test_a_capture_with_only_nccl_ranges_reads_no_launch_calls(monkeypatch):
    """Without user ranges there is no position to find, so the million launch calls of a large
    capture are not read (allreduce-2rank with its "train" ranges dropped)."""
    with load_trace([SAMPLES / "allreduce-2rank.sqlite"], cache=None) as trace:
        v = trace.nvtx
        trace._frames["nvtx"] = v[(v["domain"] == NCCL_DOMAIN) | (v["event_type"] != "push_pop")]
        with monkeypatch.context() as m:
            m.setattr(Trace, "launch_calls", lambda *a, **kw: pytest.fail("launch calls read"))
            got = _judged(trace)
        _with_nccl_ranges_as(trace, "user")
        want = _judged(trace)  # the same ranges as a user's: read, and enclosing no compute launch
    assert (got["path"] == "").all()
    pd.testing.assert_frame_equal(got, want)


def test_beside_compute_matches_a_brute_force_sweep():
    rng = np.random.default_rng(7)
    n = 400
    start = rng.integers(0, 5_000, n)
    frame = pd.DataFrame({"export": 0, "device": rng.integers(0, 2, n), "start_ns": start,
                          "end_ns": start + rng.integers(1, 300, n)})  # fmt: skip
    got = slowdown._beside_compute(frame)
    s, e, d = (frame[c].to_numpy() for c in ("start_ns", "end_ns", "device"))
    for i in range(n):
        t = np.arange(s[i], e[i])  # every ns of kernel i: does another kernel of its device run then?
        others = (d == d[i]) & (np.arange(n) != i)
        busy = ((s[others][None, :] <= t[:, None]) & (t[:, None] < e[others][None, :])).any(axis=1)
        assert got[i] == busy.sum(), i


def test_a_kernel_under_nccl_beside_compute_on_another_stream_is_not_blamed_on_nccl(tmp_path):
    """A GEMM 1.8x slower under an NCCL kernel is slowed by NCCL; the same, while a data-loading
    kernel (DALI) runs beside it on another stream, could be slowed by either: it is not judged,
    and its time is reported as unjudged with that reason."""
    from fixtures.exporter import ExportWriter

    w = ExportWriter(tmp_path / "beside.sqlite")
    w.process(100, "python3")
    corr, t = 0, 1_000_000

    def kernel(stream: int, start: int, dur: int, name: str) -> None:
        nonlocal corr
        corr += 1
        w.runtime(100, 100, start - 5_000, start - 4_000, "cudaLaunchKernel", corr)
        w.kernel(100, 0, stream, start, start + dur, name, correlation=corr)

    for _ in range(10):  # clean: 100 us
        kernel(7, t, 100_000, "ampere_sgemm_128x64_nn")
        t += 150_000
    for beside in (False, True) * 4:  # under NCCL: 180 us, alternately beside DALI on stream 9
        kernel(20, t - 10_000, 200_000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL")
        kernel(7, t, 180_000, "ampere_sgemm_128x64_nn")
        if beside:
            kernel(9, t + 5_000, 170_000, "FlipKernel")
        t += 300_000
    path = w.close()
    with load_trace([path]) as trace:
        verdicts = slowdown.detect(trace, slowdown.Params())
    slowed = sorted(f.evidence["starts_ns"][0] for f in verdicts.findings)
    assert sum(f.evidence["instances"] for f in verdicts.findings) == 4
    assert all(f.evidence["kernel"] == "ampere_sgemm_128x64_nn" for f in verdicts.findings), slowed
    why = [u for u in verdicts.unjudged if "another stream" in u["why"]]
    assert why and why[0]["why"].startswith("8 compute kernels"), verdicts.unjudged  # 4 GEMMs and 4 FlipKernels


def test_one_kernel_slowed_under_nccl_sometimes_with_a_host_copy_is_one_group(tmp_path):
    """The classes are evidence, not groups: "NCCL kernel" and "NCCL kernel + host copy" instances
    of one slowed GEMM were two groups, each below the warning share."""
    from fixtures.exporter import ExportWriter

    w = ExportWriter(tmp_path / "classes.sqlite")
    w.process(100, "python3")
    corr, t = 0, 1_000_000

    def launch(start: int) -> int:
        nonlocal corr
        corr += 1
        w.runtime(100, 100, start - 5_000, start - 4_000, "cudaLaunchKernel", corr)
        return corr

    for _ in range(10):
        w.kernel(100, 0, 7, t, t + 100_000, "ampere_sgemm_128x64_nn", correlation=launch(t))
        t += 150_000
    for copy in (False, True) * 4:  # under NCCL, every other one under a host copy too
        w.kernel(100, 0, 20, t - 10_000, t + 190_000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", correlation=launch(t))
        w.kernel(100, 0, 7, t, t + 180_000, "ampere_sgemm_128x64_nn", correlation=launch(t))
        if copy:
            w.memcpy(100, 0, 30, t - 5_000, t + 185_000, 64 << 20, "Host-to-Device", correlation=launch(t))
        t += 300_000
    with load_trace([w.close()]) as trace:
        findings = slowdown.detect(trace, slowdown.Params()).findings
    assert len(findings) == 1 and findings[0].group.endswith("|NCCL kernel")  # one episode, one group
    assert findings[0].evidence["classes"] == {"NCCL kernel": 4, "NCCL kernel + host copy": 4}
    assert findings[0].evidence["instances"] == 8 and "while NCCL kernel + host copy runs" in findings[0].title


def _ddp_layout_job(tmp_path: Path, name: str, forward: int = 2) -> Path:
    """Five steps of DDP as NERSC's capture has them: in each step's "forward" range ``name``
    runs clean ``forward`` times (50 us, at that many program positions); in "backward", launched from autograd's
    thread outside any range, it runs once under the bucket all-reduce every time, at 100 us."""
    from fixtures.exporter import ExportWriter

    w = ExportWriter(tmp_path / f"{name[:12]}.sqlite")
    w.process(100, "python3")
    corr, t = 0, 1_000_000

    def kernel(tid: int, stream: int, start: int, dur: int, kname: str) -> None:
        nonlocal corr
        corr += 1
        w.runtime(100, tid, start - 5_000, start - 4_000, "cudaLaunchKernel", corr)
        w.kernel(100, 0, stream, start, start + dur, kname, correlation=corr, grid=(2, 16, 512))

    for step in range(5):  # a step every 1 ms: forward from 0.05 to 0.35 ms, backward at 0.5 ms
        s0 = t
        w.nvtx_range(100, 100, s0 + 50_000, s0 + 350_000, "forward")
        for i in range(forward):
            kernel(100, 7, s0 + 100_000 + 120_000 * i, 50_000 + 500 * step, name)
        kernel(101, 20, s0 + 490_000, 130_000, "ncclDevKernel_AllReduce_Sum_f16_RING_LL")
        kernel(101, 7, s0 + 500_000, 100_000, name)
        w.nvtx_range(100, 100, s0, s0 + 900_000, f"step {step}")
        t += 1_000_000
    return w.close()


def test_a_layout_transform_always_under_nccl_is_judged_against_its_clean_forward_runs(tmp_path):
    """No clean instance at its backward position, but the same transform (name, grid, block) runs
    clean at two forward positions that agree: its grid fixes its work, so that is its baseline
    (NERSC 4gpu_baseline: nchwToNhwcKernel 52 -> 111 us under NCCL, 8.5 ms, was never judged)."""
    with load_trace([_ddp_layout_job(tmp_path, "void cudnn::ops::nchwToNhwcKernel<__half>(int)")]) as trace:
        verdicts = slowdown.detect(trace, slowdown.Params())
    assert sum(f.evidence["instances"] for f in verdicts.findings) == 5
    assert all("other program positions" in f.evidence["baseline"] for f in verdicts.findings)
    expected = np.mean([50_000 + 500 * s for s in range(5)])
    assert sum(f.impact_ns for f in verdicts.findings) == pytest.approx(5 * (100_000 - expected), rel=0.01)


def test_a_gemm_of_the_same_grid_elsewhere_is_no_baseline(tmp_path):
    """The same job with a convolution's dgrad: one grid does different work for different
    reduction sizes (NERSC's strided_dgrad: 4.9 us in the forward pass, 5-52 us in the backward
    one), so its forward runs are no baseline, and the backward ones stay unjudged."""
    name = "void xmma_cudnn::implicit_gemm::strided_dgrad_indexed::kernel<int>(int)"
    with load_trace([_ddp_layout_job(tmp_path, name)]) as trace:
        verdicts = slowdown.detect(trace, slowdown.Params())
    assert verdicts.findings == []
    assert any("no baseline" in u["why"] and u["ns"] >= 5 * 100_000 for u in verdicts.unjudged), verdicts.unjudged


def test_clean_runs_at_one_position_only_are_no_baseline_elsewhere(tmp_path):
    """One forward position cannot show that the transform does the same work wherever it runs:
    the backward runs stay unjudged."""
    name = "void cudnn::ops::nchwToNhwcKernel<__half>(int)"
    with load_trace([_ddp_layout_job(tmp_path, name, forward=1)]) as trace:
        assert slowdown.detect(trace, slowdown.Params()).findings == []
