"""The job simulator (fixtures/jobsim.py) and its scenario families (fixtures/attribution_scenarios.py).

Hand-checked timelines in exact ns first, then the invariants every scenario must keep: FIFO streams,
event waits, aligned collective ends, blocked launches, determinism, removals never slower,
breakdowns that add up, exports that nsysan's reader reads with the simulated counts and clocks.
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from fixtures import jobsim as js
from fixtures.attribution_scenarios import FAMILIES
from fixtures.jobsim import (
    COMPUTE,
    COPY,
    JOB_START,
    KINDS,
    NCCL,
    SESSION_BASE,
    US,
    Comm,
    Copy,
    EventWait,
    Graph,
    GraphLaunch,
    JobSpec,
    Kernel,
    Nccl,
    Node,
    Part,
    RankProgram,
    Sync,
    breakdown,
    simulate,
    write_exports,
)
from nsysan.ingest import load_trace

T0 = JOB_START
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _spec(programs: list[RankProgram], **kw: object) -> JobSpec:
    """An exact job: no latency or end jitter, every host starting at JOB_START."""
    values: dict = dict(latency_jitter=0, nccl_end_jitter=0)
    values.update(kw)
    return JobSpec(programs, **values)


def _one_step(*actions: js.Action) -> RankProgram:
    prog = RankProgram()
    prog.step()
    prog.add(*actions)
    return prog


def _ops(tl: js.Timeline, rank: int, kind: str | None = None) -> list[js.GpuOp]:
    return [o for o in tl.gpu_ops(rank) if kind is None or o.kind == kind]


# -- hand-checked timelines ------------------------------------------------------------------


def _late_allreduce(delay: int = 300 * US) -> JobSpec:
    comm = Comm(0xABC, (0, 1), "world")
    programs = []
    for r in range(2):
        extra = {"late_rank": delay} if r == 1 else {}
        programs.append(_one_step(
            Kernel(name="gemm", work=100 * US, cost=5 * US, work_extra=extra),
            EventWait(src=COMPUTE, dst=NCCL),
            Nccl(op="AllReduce", parts=(Part(comm, 50 * US, nbytes=2**20),), cost=5 * US, pre=8 * US),
        ))  # fmt: skip
    return _spec(programs)


def test_late_rank_allreduce_exact() -> None:
    """Rank 1 reaches the all-reduce 300 us late: rank 0's kernel spans its own arrival to the joint end,
    and without the delay the job is exactly 300 us shorter."""
    spec = _late_allreduce()
    tl = simulate(spec)
    g0, g1 = _ops(tl, 0, "kernel")[0], _ops(tl, 1, "kernel")[0]
    # launched at T0 (a 5 us call), on the GPU 4 us later (launch latency)
    assert (g0.start - T0, g0.end - T0) == (4 * US, 104 * US)
    assert (g1.start - T0, g1.end - T0) == (4 * US, 404 * US)
    a0, a1 = _ops(tl, 0, "nccl")[0], _ops(tl, 1, "nccl")[0]
    # each arrives 1 us after its compute stream's record (the stream wait) is satisfied
    assert a0.start - T0 == 105 * US and a1.start - T0 == 405 * US
    # both end at the last arrival + the transfer
    assert a0.end - T0 == a1.end - T0 == 455 * US
    assert a0.last_arrival == a1.last_arrival == a1.start
    assert tl.wall_ns == 451 * US
    # the NCCL launch: event record (2 us) + stream wait, 8 us inside NCCL, then a 5 us call
    launch = next(c for c in tl.calls if c.rank == 0 and c.corr == a0.corr and c.kind == "runtime")
    assert (launch.start - T0, launch.end - T0) == (18 * US, 23 * US)
    nvtx = next(c for c in tl.calls if c.rank == 0 and c.kind == "nccl")
    assert (nvtx.name, nvtx.start - T0, nvtx.end - T0) == ("ncclAllReduce", 10 * US, 25 * US)

    fixed = simulate(spec, {"late_rank"})
    assert _ops(fixed, 0, "nccl")[0].end - T0 == 155 * US
    assert tl.wall_ns - fixed.wall_ns == 300 * US
    assert js.savings(spec)["late_rank"] == 300 * US
    assert js.savings(spec)["exposed_communication"] == 50 * US

    parts = breakdown(tl)
    assert parts[(0, 0)] == dict(compute=100 * US, communication_exposed=50 * US, waiting_for_peer=300 * US,
                                 copy_exposed=0, idle=1 * US)  # fmt: skip
    assert parts[(1, 0)] == dict(compute=400 * US, communication_exposed=50 * US, waiting_for_peer=0,
                                 copy_exposed=0, idle=1 * US)  # fmt: skip


def test_stream_fifo_and_concurrent_streams() -> None:
    """One stream runs its kernels in order, each 1 us (its gap) after the previous ended; another
    stream runs beside it; the launch latency bounds the first start."""
    prog = _one_step(
        Kernel(name="a", work=50 * US, cost=5 * US),
        Kernel(name="b", work=10 * US, cost=5 * US),
        Kernel(name="c", work=30 * US, cost=5 * US, stream=COPY),
        Kernel(name="d", work=20 * US, cost=5 * US),
    )
    tl = simulate(_spec([prog]))
    got = {o.name: (o.start - T0, o.end - T0) for o in tl.gpu_ops(0)}
    assert got == {"a": (4 * US, 54 * US), "b": (55 * US, 65 * US), "c": (14 * US, 44 * US), "d": (66 * US, 86 * US)}


def test_event_wait_orders_streams() -> None:
    """Work on stream B after a wait starts only when the work on A before the record finished; work
    on B enqueued before the wait does not wait."""
    prog = _one_step(
        Kernel(name="early", work=10 * US, cost=5 * US, stream=COPY),
        Kernel(name="long", work=200 * US, cost=5 * US),
        EventWait(src=COMPUTE, dst=COPY),
        Kernel(name="after", work=10 * US, cost=5 * US, stream=COPY),
    )
    tl = simulate(_spec([prog]))
    got = {o.name: o for o in tl.gpu_ops(0)}
    assert got["early"].start - T0 == 4 * US
    assert got["after"].start == got["long"].end + 1 * US
    records = [c for c in tl.calls if c.kind in ("event_record", "stream_wait")]
    assert [(c.kind, c.info["stream"], c.info["event"]) for c in records] == [("event_record", COMPUTE, 1),
                                                                              ("stream_wait", COPY, 1)]  # fmt: skip


def test_collective_ends_aligned_with_jitter() -> None:
    comm = Comm(7, tuple(range(4)))
    programs = [
        _one_step(
            Kernel(name="k", work=(100 + 70 * r) * US, cost=5 * US),
            EventWait(src=COMPUTE, dst=NCCL),
            Nccl(op="AllReduce", parts=(Part(comm, 80 * US),), cost=5 * US),
        )
        for r in range(4)
    ]
    tl = simulate(JobSpec(programs, seed=3, nccl_end_jitter=2 * US))
    ops = [_ops(tl, r, "nccl")[0] for r in range(4)]
    last = max(o.start for o in ops)
    assert all(o.last_arrival == last for o in ops)
    assert all(last + 80 * US <= o.end < last + 82 * US for o in ops)
    assert max(o.end for o in ops) - min(o.end for o in ops) < 2 * US


def _p2p(peer: int, send: bool, comm: Comm, split_stream: int | None) -> list[js.Action]:
    alt = {"nccl_ordering_stall": {"stream": split_stream}} if split_stream else {}
    wait_alt = {"nccl_ordering_stall": {"dst": split_stream}} if split_stream else {}
    return [EventWait(src=COMPUTE, dst=NCCL, alt=wait_alt),
            Nccl(op="SendRecv", parts=(Part(comm, 20 * US, peer=peer, send=send),), cost=5 * US, alt=alt)]  # fmt: skip


def test_head_of_line_blocking_and_its_removal() -> None:
    """Rank 0 sends to rank 1 (which posts its receive 500 us late) and then to rank 2 (ready), on one
    NCCL stream: the second send waits behind the first. On a stream per peer it does not."""
    comm = Comm(0x77, (0, 1, 2))
    r0 = _one_step(Kernel(name="k", work=10 * US, cost=5 * US), *_p2p(1, True, comm, None),
                   *_p2p(2, True, comm, 17))  # fmt: skip
    r1 = _one_step(Kernel(name="k", work=10 * US, cost=5 * US, work_extra={"late_rank": 500 * US}),
                   *_p2p(0, False, comm, None))  # fmt: skip
    r2 = _one_step(Kernel(name="k", work=10 * US, cost=5 * US), *_p2p(0, False, comm, None))
    spec = _spec([r0, r1, r2])
    tl = simulate(spec)
    first, second = _ops(tl, 0, "nccl")
    recv1, recv2 = _ops(tl, 1, "nccl")[0], _ops(tl, 2, "nccl")[0]
    assert first.end == recv1.end == recv1.start + 20 * US  # rendezvous: the late receiver decides
    assert second.start == first.end + 1 * US  # head-of-line: queued behind the waiting send
    assert recv2.end == second.end == second.start + 20 * US
    assert recv2.start < first.end - 400 * US  # rank 2 was there long before

    split = simulate(spec, {"nccl_ordering_stall"})
    s_first, s_second = _ops(split, 0, "nccl")
    assert (s_first.stream, s_second.stream) == (NCCL, 17)
    assert s_second.end < s_first.start + 100 * US  # no longer behind the waiting send
    assert s_first.end == first.end  # the late receiver still late
    saving = js.savings(spec)
    # the job ends with rank 1's receive instead of rank 0's second send, queued 1 us + 20 us after it
    assert saving["nccl_ordering_stall"] == tl.wall_ns - split.wall_ns == 21 * US
    assert saving["late_rank"] > 400 * US


def test_command_buffer_full_rows_are_the_blocked_time(tmp_path: Path) -> None:
    """A queue of 2: the 4th launch blocks until the 2nd kernel starts (frees a slot); the overhead row
    is exactly that interval, with the launch's correlation id, and the API row spans it."""
    prog = _one_step(*[Kernel(name=f"k{i}", work=100 * US, cost=5 * US) for i in range(5)])
    spec = _spec([prog], queue_capacity=2)
    tl = simulate(spec)
    ks = tl.gpu_ops(0)
    assert [k.start - T0 for k in ks] == [4 * US, 105 * US, 206 * US, 307 * US, 408 * US]
    rows = [c for c in tl.calls if c.kind == "overhead"]
    # k3 is called at 15 us and gets k1's slot at 105 us; k4 is called at 110 us and gets k2's at 206 us
    assert [(c.start - T0, c.end - T0) for c in rows] == [(15 * US, 105 * US), (110 * US, 206 * US)]
    launches = {c.corr: c for c in tl.calls if c.kind == "runtime"}
    for row, k in zip(rows, ks[3:], strict=True):
        assert row.corr == k.corr
        assert (launches[k.corr].start, launches[k.corr].end) == (row.start, row.end + 5 * US)
        assert k.launch_t == row.end
    assert js.savings(spec)["command_buffer_full"] == 0  # the GPU was busy all along
    paths = write_exports(tl, tmp_path)
    with load_trace(paths, cache=None) as trace:
        overhead = trace.overhead
        assert sorted((overhead["end_ns"] - overhead["start_ns"]).tolist()) == [90 * US, 96 * US]
        assert set(overhead["overhead_type"].astype(str)) == {"Command Buffer Full"}
        assert set(overhead["correlation_id"]) == {ks[3].corr, ks[4].corr}


def test_contention_partial_overlap_exact() -> None:
    """A 100 us kernel overlapped for 40 us by an NCCL kernel at factor 2 takes 120 us."""
    solo = Comm(1, (0,))
    prog = _one_step(Kernel(name="gemm", work=100 * US, cost=5 * US),
                     Nccl(op="AllReduce", parts=(Part(solo, 40 * US),), cost=5 * US, pre=8 * US))  # fmt: skip
    spec = _spec([prog], contention={0: 2.0})
    tl = simulate(spec)
    gemm, ar = _ops(tl, 0, "kernel")[0], _ops(tl, 0, "nccl")[0]
    assert (ar.start - T0, ar.end - T0) == (17 * US, 57 * US)
    # 13 us at full rate, 40 us at half rate (20 us of work), the last 67 us at full rate
    assert (gemm.start - T0, gemm.end - T0) == (4 * US, 124 * US)
    assert simulate(spec, {"comm_compute_slowdown"}).gpu_ops(0)[0].end - T0 == 104 * US
    assert js.savings(spec)["comm_compute_slowdown"] == 20 * US


def test_stream_sync_and_blocking_memcpy() -> None:
    """cudaStreamSynchronize returns `ret` after the stream's last op; cudaMemcpy after its copy."""
    prog = _one_step(
        Kernel(name="k", work=300 * US, cost=5 * US),
        Sync(stream=COMPUTE, cost=3 * US, ret=4 * US),
        Copy(kind="Host-to-Device", nbytes=2**20, work=50 * US, stream=COMPUTE, sync=True, cost=10 * US, ret=6 * US),
        Kernel(name="after", work=10 * US, cost=5 * US),
    )
    tl = simulate(_spec([prog]))
    k, copy, after = tl.gpu_ops(0)
    sync = next(c for c in tl.calls if c.kind == "runtime" and c.name == "cudaStreamSynchronize")
    assert (sync.start - T0, sync.end - T0) == (5 * US, 308 * US)
    row = next(c for c in tl.calls if c.kind == "sync")
    assert (row.name, row.start, row.end, row.corr) == ("Stream sync", sync.start, sync.end, sync.corr)
    assert copy.start - T0 == 312 * US and copy.end - T0 == 362 * US
    memcpy = next(c for c in tl.calls if c.name == "cudaMemcpy")
    assert (memcpy.start - T0, memcpy.end - T0) == (308 * US, 368 * US)
    assert after.start - T0 == 372 * US  # launched when cudaMemcpy returned, + launch latency
    parts = breakdown(tl)[(0, 0)]
    assert parts["copy_exposed"] == 50 * US and parts["compute"] == 310 * US
    assert sum(parts.values()) == after.end - k.start


def _graph_job(gap: int) -> JobSpec:
    comm = Comm(9, (0, 1))
    programs = []
    for r in range(2):
        prog = RankProgram()
        for _ in range(3):
            prog.step()
            nodes = [Node(op=Kernel(name="fwd", work=100 * US), node_id=100),
                     Node(op=Kernel(name="bwd", work=(150 + 10 * r) * US), node_id=101),
                     Node(op=Nccl(op="AllReduce", parts=(Part(comm, 60 * US),)), node_id=102, gap=2 * US,
                          gap_extra={"graph_allreduce_gap": gap}),
                     Node(op=Kernel(name="adam", work=30 * US), node_id=103)]  # fmt: skip
            prog.add(GraphLaunch(graph=Graph(1, nodes), cost=10 * US), Sync(stream=COMPUTE))
        programs.append(prog)
    return _spec(programs)


def test_graph_replays_nodes_and_gap() -> None:
    spec = _graph_job(100 * US)
    tl = simulate(spec)
    for r in range(2):
        ops = tl.gpu_ops(r)
        assert len(ops) == 12
        for k in range(3):
            step = [o for o in ops if o.step == k]
            assert [o.graph_node_id for o in step] == [100, 101, 102, 103]
            assert len({o.corr for o in step}) == 1  # one cudaGraphLaunch
            fwd, bwd, ar, adam = step
            assert fwd.start == fwd.launch_t + 4 * US and bwd.start == fwd.end + 1 * US
            assert ar.stream == NCCL and ar.start == bwd.end + 102 * US
            assert adam.start == ar.end + 1 * US
    # both ranks wait 100 us more per replay: 3 replays
    assert js.savings(spec)["graph_allreduce_gap"] == 300 * US


def test_removal_uses_the_same_draws() -> None:
    """Jitter draws do not depend on what is removed: removing a cause the job lacks changes nothing."""
    spec = _late_allreduce()
    spec.latency_jitter, spec.nccl_end_jitter = 1 * US, 2 * US
    a, b = simulate(spec), simulate(spec, {"graph_allreduce_gap", "gpu_idle"})
    assert [(o.start, o.end) for o in a.ops] == [(o.start, o.end) for o in b.ops]
    assert a.wall_ns == b.wall_ns


# -- scenario families ---------------------------------------------------------------------------

SEEDS = {name: (i, i + 5) for i, name in enumerate(FAMILIES)}  # both flavours, two layouts each
CASES = [(name, seed, planted) for name in FAMILIES for seed in SEEDS[name] for planted in (True, False)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every (family, seed, planted) of CASES, written once for the module."""
    out = {}
    root = tmp_path_factory.mktemp("jobsim")
    for name, seed, planted in CASES:
        out[(name, seed, planted)] = FAMILIES[name](seed, planted, root / f"{name}-{seed}-{int(planted)}")
    return out


@pytest.mark.parametrize(("name", "seed", "planted"), CASES)
def test_family_exports_read_with_simulated_counts(built: dict, name: str, seed: int, planted: bool) -> None:
    paths, truth = built[(name, seed, planted)]
    tl = truth.timeline
    spec = tl.spec
    assert len(paths) == (spec.ranks if truth.file_per_rank else 1)
    with load_trace(paths, cache=None) as trace:
        ranks = trace.ranks
        assert sorted(ranks["rank"].astype(int)) == list(range(spec.ranks))
        kernels = trace.kernel_columns(["pid", "start_ns", "end_ns", "correlation_id", "graph_node_id"])
        assert kernels.groupby("rank").size().to_dict() == truth.kernels
        nccl = kernels[trace.kernel_columns(["short_name"])["nccl_kind"].notna().to_numpy()]
        assert nccl.groupby("rank").size().reindex(range(spec.ranks), fill_value=0).to_dict() == truth.nccl_kernels
        memcpy = trace.memcpy
        assert memcpy.groupby("rank").size().reindex(range(spec.ranks), fill_value=0).to_dict() == truth.memcpy
        # every kernel's launch call is there (graph kernels share their cudaGraphLaunch)
        api = trace.cuda_api
        assert set(zip(kernels["export"], kernels["correlation_id"], strict=True)) <= set(
            zip(api["export"], api["correlation_id"], strict=True)
        )
        nvtx = trace.nvtx
        labelled = nvtx["text"].astype(str).str.fullmatch(spec.step_label.format(r"\d+"))
        n_steps = sum(len(p.steps) for p in spec.programs)
        assert int(labelled.sum()) == (n_steps if truth.nvtx_steps else 0)
        overhead = [c for c in tl.calls if c.kind == "overhead"]
        assert len(trace.overhead) == len(overhead)
        assert len(trace.sync) == sum(c.kind in ("sync", "stream_wait") for c in tl.calls)
        assert len(trace.osrt) == sum(c.kind == "osrt" for c in tl.calls)
        calls = trace.nccl_calls
        assert len(calls) == sum(c.kind == "nccl" for c in tl.calls)
        if truth.payloads and truth.flavour == "current":
            coll = calls[calls["call"].astype(str).isin(["ncclAllReduce", "ncclSend", "ncclRecv"])]
            assert coll["comm_id"].notna().all()
        else:
            assert calls["comm_id"].isna().all()
        if name == "graph_replays":
            assert len(trace.graph_nodes) == sum(c.kind == "graph_node" for c in tl.calls)
            assert kernels["graph_node_id"].notna().any()


@pytest.mark.parametrize(("name", "seed", "planted"), CASES)
def test_family_truth_invariants(built: dict, name: str, seed: int, planted: bool) -> None:
    _, truth = built[(name, seed, planted)]
    tl = truth.timeline
    assert set(truth.saving_ns) == set(KINDS)
    assert all(v >= 0 for v in truth.saving_ns.values()), truth.saving_ns  # removing a cause never slows the job
    assert truth.planted == (FAMILY_PLANTED[name] if planted else None)
    assert (truth.late_rank is not None) == (planted and truth.planted == "late_rank")
    # steps: contiguous windows, breakdowns that add up, wall time from the windows
    begin, end = [], []
    for r, steps in truth.steps.items():
        for a, b in itertools.pairwise(steps):
            assert a.end_ns == b.start_ns
        for s in steps:
            assert s.length_ns >= 0
            assert all(v >= 0 for v in s.categories().values())
            assert sum(s.categories().values()) == s.length_ns
        begin.append(steps[0].start_ns + truth.offset_ns[r])
        end.append(steps[-1].end_ns + truth.offset_ns[r])
    assert max(end) - min(begin) == truth.wall_ns
    # streams are FIFO and collectives end together
    by_stream: dict[tuple[int, int], list[js.GpuOp]] = {}
    for o in tl.ops:
        by_stream.setdefault((o.rank, o.stream), []).append(o)
    for ops in by_stream.values():
        assert all(a.end <= b.start for a, b in itertools.pairwise(ops))
    for o in tl.ops:
        assert o.start >= o.launch_t + tl.spec.launch_latency
        if o.kind == "nccl":
            assert o.start <= o.last_arrival <= o.end


def _assert_as_early_as_allowed(tl: js.Timeline) -> None:
    """Every operation starts exactly when its last constraint allows; NCCL kernels end at their
    completion + jitter; compute kernels do their work at rate 1, or 1/f under communication."""
    prev: dict[tuple[int, int], js.GpuOp] = {}
    for o in tl.ops:  # in enqueue order, so per stream in FIFO order
        bound = o.launch_t + o.lat
        before = prev.get((o.rank, o.stream))
        if before is not None:
            bound = max(bound, before.end + o.gap)
        for d in o.deps:
            bound = max(bound, d.end + o.gap)
        assert o.start == bound, o
        prev[(o.rank, o.stream)] = o
    starts: dict[tuple, int] = {}
    for o in tl.ops:
        for key in o.keys:
            starts[key] = max(starts.get(key, o.start), o.start)
    busy: dict[int, list[tuple[int, int]]] = {}
    for o in tl.ops:
        if o.kind == "nccl" or (o.kind == "memcpy" and tl.spec.copy_contention):
            busy.setdefault(o.rank, []).append((o.start, o.end))
    for o in tl.ops:
        if o.kind == "nccl":
            assert o.last_arrival == max(starts[key] for key in o.keys)
            assert o.end == o.complete + o.jitter and o.complete >= o.last_arrival
        elif o.kind == "kernel":
            factor = 1.0 if "comm_compute_slowdown" in tl.removed else tl.spec.contention.get(o.rank, 1.0)
            points = sorted({o.start, o.end, *(t for iv in busy.get(o.rank, []) for t in iv if o.start < t < o.end)})
            work = 0.0
            for a, b in itertools.pairwise(points):
                slowed = any(s <= a and b <= e for s, e in busy.get(o.rank, []))
                work += (b - a) / (factor if slowed else 1.0)
            assert abs(work - o.work) <= 3, (o, work)


@pytest.mark.parametrize(("name", "seed"), [(n, SEEDS[n][0]) for n in FAMILIES])
def test_family_timelines_start_as_early_as_allowed(built: dict, name: str, seed: int) -> None:
    _, truth = built[(name, seed, True)]
    _assert_as_early_as_allowed(truth.timeline)
    removed = truth.planted if truth.planted != "command_buffer_full" else "exposed_communication"
    _assert_as_early_as_allowed(simulate(truth.timeline.spec, {removed}))


def test_mismatched_or_deadlocked_programs_are_refused() -> None:
    comm = Comm(5, (0, 1))
    ar = Nccl(op="AllReduce", parts=(Part(comm, 10 * US),), cost=5 * US)
    with pytest.raises(ValueError, match="programs do not match"):
        simulate(_spec([_one_step(ar), _one_step(Kernel(name="k", work=US, cost=US))]))
    # both ranks receive first on one stream: neither send is ever reached
    recv = [Nccl(op="SendRecv", parts=(Part(comm, 10 * US, peer=1 - r, send=False),), cost=5 * US) for r in range(2)]
    send = [Nccl(op="SendRecv", parts=(Part(comm, 10 * US, peer=1 - r, send=True),), cost=5 * US) for r in range(2)]
    with pytest.raises(js.SimulationError, match="deadlock"):
        simulate(_spec([_one_step(recv[r], send[r]) for r in range(2)]))


FAMILY_PLANTED = {"pipeline_late_peer": "late_rank", "tp_dp_one_stream": "late_rank",
                  "ddp_slowed_backward": "comm_compute_slowdown", "graph_replays": "graph_allreduce_gap",
                  "launch_bound_burst": "gpu_idle", "copy_bound_step": "copy_bound", "host_bound_step": "gpu_idle",
                  "queue_full_gpu_busy": "command_buffer_full"}  # fmt: skip


@pytest.mark.parametrize("name", list(FAMILIES))
def test_planted_cause_costs_more_than_in_the_clean_twin(built: dict, name: str) -> None:
    for seed in SEEDS[name]:
        _, planted = built[(name, seed, True)]
        _, clean = built[(name, seed, False)]
        kind = planted.planted
        if kind == "command_buffer_full":  # launches block, the GPU is busy anyway: fixing it saves nothing
            assert planted.saving_ns[kind] == 0 and clean.saving_ns[kind] == 0
            assert any(c.kind == "overhead" for c in planted.timeline.calls)
            assert not any(c.kind == "overhead" for c in clean.timeline.calls)
            continue
        assert planted.saving_ns[kind] > max(clean.saving_ns[kind], 0.02 * planted.wall_ns)
        if name in ("pipeline_late_peer", "tp_dp_one_stream", "ddp_slowed_backward", "graph_replays"):
            # the twins share every draw: the planted job without its cause is the clean twin
            assert planted.wall_ns - planted.saving_ns[kind] == clean.wall_ns


def test_family_is_deterministic(tmp_path: Path) -> None:
    """The same seed writes the same rows (every table's dump) and the same timeline."""
    dumps = []
    for i in range(2):
        paths, truth = FAMILIES["tp_dp_one_stream"](6, True, tmp_path / str(i))
        dumps.append(([list(sqlite3.connect(p).iterdump()) for p in paths], truth.saving_ns, truth.wall_ns))
    assert dumps[0] == dumps[1]
    assert len(dumps[0][0]) == 8  # file per rank


@pytest.mark.parametrize(("name", "seed"), [(n, s) for n in FAMILIES for s in SEEDS[n]])
def test_file_per_rank_clocks(built: dict, name: str, seed: int) -> None:
    paths, truth = built[(name, seed, True)]
    tl = truth.timeline
    with load_trace(paths, cache=None) as trace:
        starts = [e.session_start_utc_ns for e in trace.exports]
        assert starts == [x.session_start_utc_ns for x in truth.exports]
        kernels = trace.kernel_columns(["pid", "start_ns"])
        for x_index, x in enumerate(truth.exports):
            assert x.session_start_utc_ns == SESSION_BASE + x.offset_ns + x.skew_ns
            for r in x.ranks:
                first = min(o.start for o in tl.ops if o.rank == r and o.kind in ("kernel", "nccl"))
                mine = kernels[(kernels["export"] == x_index) & (kernels["rank"] == r)]
                assert int(mine["start_ns"].min()) == first - truth.offset_ns[r]  # export clock = true - offset
        job = trace.job_clock().tolist()
    if truth.file_per_rank:
        assert len(set(truth.offset_ns.values())) > 1
        skews = list(truth.skew_ns.values())
        assert all(abs(s) <= 1_000_000 for s in skews)
        assert any(skews) == ((seed // 2) % 4 >= 2)
        # aligning by session start alone is off by exactly the skews
        base = min(x.offset_ns + x.skew_ns for x in truth.exports)
        assert job == [x.offset_ns + x.skew_ns - base for x in truth.exports]
    else:
        assert set(truth.offset_ns.values()) == {0} and set(truth.skew_ns.values()) == {0}
