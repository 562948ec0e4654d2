"""Ranks benchmark: a many-rank job through ``nsysan report`` (serial vs local cluster), and the
cross-rank reduce of the ordering detector alone at up to 1,024 ranks.

    python benchmarks/ranks.py [--part 1|2|both] [--ranks 64 --kernels-per-rank 250000 --workers 2]
                               [--reduce-ranks 64,128,256,512,1024 --ops-per-rank 10000 --variants a,b]
                               [--profile-ranks 128 --profile-ops 3000]

Part 1 builds (once, cached under .nsysan-work/ranks-R-K/) one export per rank (one process, one
GPU, its own pid, an ``nsysan rank=R`` NVTX mark, NCCL all-reduce kernels with NCCL's NVTX ranges and
payloads, each file's session start shifted so the job clock aligns them), then times
``nsysan report --format markdown --no-cache`` in fresh child processes with ``--workers 0``
(serial) and ``--workers N`` (local Dask cluster), polling every process of the cluster run's tree
for its peak RSS. Targets: cluster wall <= 1.2 x (serial wall / N); no process above 1.5 GiB; the
two reports byte-identical.

Part 2 synthesises what each export's map sends in memory (its attribution part: NCCL operations in
the compact table's types, steps, breakdown, and its graph within its share of the job's limit; its
detectors' part), and times the coordinator's reduce of them (``reduce_attribution``: the clock,
participants, breakdown and graph; then ``reduce_detectors``, replays included) in a child process
per (ranks, variant): (a) with
NCCL communicator payloads (one data-parallel all-reduce communicator over all ranks plus one
communicator per neighbour pair for P2P send/recv), (b) without payloads (participants by program
position, NVTX iteration numbers). A child is stopped at 240 s or 8 GiB RSS. Target: 1,024 ranks x
10,000 ops in <= 60 s and <= 2 GiB. With ``--profile-ranks`` it also prints the top functions by
cumulative time of one smaller point under cProfile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scale import slope  # noqa: E402  (run as a script: benchmarks/ is on the path)

from fixtures.exporter import ExportWriter  # noqa: E402

WORK = REPO / ".nsysan-work"
GIB = 2**30
SESSION_BASE_NS = 1_760_000_000_000_000_000
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE = ["ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4>(int)",
           "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
           "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)"]  # fmt: skip
DP_COMM = 0x9E3779B97F4A7C15  # a 64-bit communicator hash, as NCCL's are
STEP_NS = 50_000
NCCL_EVERY = 20


# -- part 1: one export per rank ---------------------------------------------------------------------


def clock_shift(rank: int) -> int:
    """ns by which rank's session started after rank 0's (its file times are that much smaller)."""
    return (rank * 7_919 % 997) * 1_000


def build_rank(path: Path, rank: int, ranks: int, kernels: int) -> Path:
    """One rank's export: compute kernels and, every ``NCCL_EVERY``-th, an all-reduce with its NCCL
    call range (communicator payload), each kernel with its launch call; written to a temporary
    name and renamed, so a cached file is always complete."""
    if path.exists():
        return path
    shift = clock_shift(rank)
    tmp = path.with_suffix(".tmp")
    w = ExportWriter(tmp, "current", session_start_utc_ns=SESSION_BASE_NS + shift)
    pid = 5000 + rank
    w.process(pid, "python3")
    w.thread(pid, pid, "python3")
    w.gpu(rank % 8)
    t = 2_000_000 - shift  # job time 2 ms, on this file's clock
    w.nvtx_domain(pid, pid, 2, "nsysan", t)
    w.nvtx_mark(pid, pid, t + 1_000, f"nsysan rank={rank} local_rank={rank % 8} world_size={ranks}", domain_id=2)
    w.nccl_call(pid, pid, t + 2_000, t + 9_000, "ncclCommInitRank", comm_id=DP_COMM, nranks=ranks, rank=rank,
                cuda_device=rank % 8, domain_id=3)  # fmt: skip
    t += 20_000
    for i in range(kernels):
        corr = i + 1
        w.runtime(pid, pid, t, t + 3_000, "cudaLaunchKernel", corr)
        if i % NCCL_EVERY == NCCL_EVERY - 1:
            w.nccl_call(pid, pid, t - 1_000, t + 5_000, "ncclAllReduce", comm_id=DP_COMM, nbytes=2**26, domain_id=3)
            # every rank's all-reduce ends at the same job time; starts differ by rank
            w.kernel(pid, rank % 8, 13, t + 4_000 + (rank % 5) * 10_000, t + 300_000, NCCL_KERNEL, correlation=corr,
                     grid=(4, 1, 1))  # fmt: skip
        else:
            w.kernel(pid, rank % 8, 7, t + 4_000, t + 40_000 + (i % 7) * 1_000, COMPUTE[i % 4], correlation=corr)
        t += STEP_NS
        if i % 100_000 == 99_999:
            w.flush()
    w.close()
    tmp.rename(path)
    return path


def build_job(ranks: int, kernels: int, procs: int) -> list[Path]:
    """The job's exports (cached), built ``procs`` at a time."""
    folder = WORK / f"ranks-{ranks}-{kernels}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"rank{r:04d}.sqlite" for r in range(ranks)]
    todo = [r for r in range(ranks) if not paths[r].exists()]
    if todo:
        with ProcessPoolExecutor(max_workers=procs) as pool:
            list(pool.map(build_rank, [paths[r] for r in todo], todo, [ranks] * len(todo), [kernels] * len(todo)))
    return paths


def build_rate(kernels: int = 20_000) -> float:
    """Kernels per second one process writes (measured on a small rank file)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build_rank(Path(tmp) / "probe.sqlite", 0, 2, kernels)
        return kernels / (time.perf_counter() - t0)


def measure_tree(cmd: list[str], poll_s: float = 0.2) -> dict[str, object]:
    """Wall, CPU (the child plus the descendants it reaped, from ``os.wait4``) and the peak RSS of
    every process of the child's tree, polled with psutil, with each process's CPU time and when it
    last used CPU (for a cluster: when the workers' map ended and the coordinator's tail began)."""
    peaks: dict[int, tuple[str, int]] = {}
    cpu: dict[int, tuple[float, float]] = {}
    alone = [0.0]  # pid -> (CPU seconds, seconds since start when it was last busy)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = threading.Event()

    def poll() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            busy_before = {pid: c for pid, (c, _) in cpu.items()}
            for p in tree:
                try:
                    rss, cmdline, times = p.memory_info().rss, " ".join(p.cmdline()), p.cpu_times()
                except psutil.Error:
                    continue
                used, (before, busy_at) = times.user + times.system, cpu.get(p.pid, (0.0, 0.0))
                # busy: over a third of a core since the last poll (idle workers' heartbeats do not count)
                cpu[p.pid] = (used, time.perf_counter() - t0 if used - before > poll_s / 3 else busy_at)
                if rss > peaks.get(p.pid, ("", 0))[1]:
                    peaks[p.pid] = (cmdline, rss)
            grew = {pid: c - busy_before.get(pid, c) for pid, (c, _) in cpu.items()}
            others_busy = sum(g for pid, g in grew.items() if pid != proc.pid)
            if grew.get(proc.pid, 0.0) > poll_s / 3 and others_busy < poll_s / 3:
                alone[0] += poll_s  # the coordinator busy while its children idle: the reduce and render
            done.wait(poll_s)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    poller.join()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])} failed: {err[-800:]}")
    coordinator = peaks.get(proc.pid, ("", 0))[1]
    others = {pid: v for pid, v in peaks.items() if pid != proc.pid}
    worker = max((v[1] for v in others.values() if "spawn_main" in v[0]), default=0)

    def role(pid: int, cmdline: str) -> str:
        if pid == proc.pid:
            return "coordinator"
        return "worker" if "spawn_main" in cmdline else "other"

    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "tree_max_rss_mib": usage.ru_maxrss / 1024,
        "coordinator_rss_mib": coordinator / 2**20,
        "largest_other_rss_mib": max((v[1] for v in others.values()), default=0) / 2**20,
        "largest_worker_rss_mib": worker / 2**20,
        "processes": len(peaks),
        "peaks_mib": sorted((round(v[1] / 2**20), role(pid, v[0])) for pid, v in peaks.items()),
        "coordinator_cpu_s": cpu.get(proc.pid, (0.0, 0.0))[0],
        "workers_cpu_s": sum(c for pid, (c, _) in cpu.items() if pid in others and "spawn_main" in others[pid][0]),
        "coordinator_alone_s": alone[0],
        "workers_done_s": max(
            (t for pid, (_, t) in cpu.items() if pid in others and "spawn_main" in others[pid][0]), default=0.0
        ),
    }


def part1(args: argparse.Namespace) -> dict[str, object]:
    """Serial vs local-cluster ``nsysan report`` on a job of one export per rank."""
    ranks, kernels = args.ranks, args.kernels_per_rank
    folder = WORK / f"ranks-{ranks}-{kernels}"
    cached = folder.exists() and all((folder / f"rank{r:04d}.sqlite").exists() for r in range(ranks))
    if not cached:
        rate = build_rate()
        eta = ranks * kernels / (rate * args.build_procs)
        print(f"build rate: {rate:,.0f} kernels/s per process; {ranks} x {kernels:,} kernels: ~{eta:.0f} s "
              f"on {args.build_procs} processes", flush=True)  # fmt: skip
        if eta > args.max_build_s and not args.force_build:
            kernels = max(1_000, int(args.max_build_s * rate * args.build_procs / ranks) // 1_000 * 1_000)
            print(f"  over {args.max_build_s:.0f} s: using {kernels:,} kernels per rank instead "
                  f"(--force-build to build the full size)", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    paths = build_job(ranks, kernels, args.build_procs)
    mib = sum(p.stat().st_size for p in paths) / 2**20
    print(f"\n== part 1: {ranks} ranks x {kernels:,} kernels = {ranks * kernels:,} kernels "
          f"({ranks * kernels // NCCL_EVERY:,} NCCL all-reduces), {len(paths)} exports, {mib:.0f} MiB "
          f"(built/cached in {time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="nsysan-ranks-"))
    report = [sys.executable, "-m", "nsysan", "report", *map(str, paths), "--format", "markdown", "--no-cache"]
    runs = {}
    for name, workers in (("serial", 0), ("cluster", args.workers)):
        if name not in args.modes.split(","):
            continue
        runs[name] = measure_tree([*report, "--workers", str(workers), "-o", str(out / f"{name}.md")])
        r = runs[name]
        print(f"  {name:8s} --workers {workers}: wall {r['wall_s']:7.1f} s  cpu {r['cpu_s']:7.1f} s  "
              f"coordinator peak RSS {r['coordinator_rss_mib']:6.0f} MiB  largest worker {r['largest_worker_rss_mib']:6.0f} MiB  "
              f"({r['processes']} processes)", flush=True)  # fmt: skip
        if workers > 1:
            print(f"    workers' CPU {r['workers_cpu_s']:.1f} s, coordinator's CPU {r['coordinator_cpu_s']:.1f} s, "
                  f"of which ~{r['coordinator_alone_s']:.1f} s wall with the workers idle (the reduce and render); "
                  f"workers last busy at {r['workers_done_s']:.1f} s", flush=True)  # fmt: skip
    if len(runs) < 2:
        return {"runs": runs}
    serial, cluster = runs["serial"], runs["cluster"]
    ratio = cluster["wall_s"] / (serial["wall_s"] / args.workers)
    largest = max(max(v for v, _ in r["peaks_mib"]) for r in runs.values()) / 1024
    same = (out / "serial.md").read_bytes() == (out / "cluster.md").read_bytes()
    print(f"  cluster wall / (serial wall / {args.workers}) = {ratio:.2f} (target <= 1.2)")
    print(f"  largest process peak RSS {largest:.2f} GiB (target: no process above 1.5 GiB)")
    print(f"  cluster run's processes (peak MiB, role): {cluster['peaks_mib']}")
    print(f"  reports identical: {same} ({(out / 'serial.md').stat().st_size:,} bytes; {out})")
    return {"ranks": ranks, "kernels_per_rank": kernels, "export_mib": round(mib), "runs": runs,
            "cluster_over_ideal": ratio, "largest_rss_gib": largest, "identical": same}  # fmt: skip


# -- part 2: the reduce alone ------------------------------------------------------------------------


def synth(ranks: int, ops_per_rank: int, payloads: bool) -> tuple[dict[str, pd.DataFrame], object]:
    """The ordering detector's compact tables of a ``ranks``-rank job (one export per rank), as the
    maps would send them, and its JobFacts. Each iteration every rank sends to rank+1 and receives
    from rank-1 (P2P, one communicator per neighbour pair) and then all-reduces over all ranks;
    participants end together; every 10th iteration one rank arrives late to the all-reduce."""
    from nsysan.detect.registry import JobFacts

    per_iter = 3
    iters = max(1, ops_per_rank // per_iter)
    slot_ns = 1_000_000
    r = np.repeat(np.arange(ranks), iters * per_iter)
    i = np.tile(np.repeat(np.arange(iters), per_iter), ranks)
    s = np.tile(np.arange(per_iter), ranks * iters)  # 0 send to r+1, 1 recv from r-1, 2 all-reduce
    n = len(r)
    pair = np.where(s == 0, r, (r - 1) % ranks)  # neighbour pair (p, p+1) by its lower rank p
    base = 2_000_000 + (i * per_iter + s).astype(np.int64) * slot_ns
    end = base + np.where(s == 2, 900_000, 300_000 + (pair % 8) * 60_000) + (r % 3) * 1_000
    late = (s == 2) & (i % 10 == 9) & (r == (i // 10) % ranks)
    start = np.where(late, end - 100_000, end - 250_000 - (r % 5) * 10_000)
    launched = start - 20_000
    shift = np.array([clock_shift(x) for x in range(ranks)], dtype=np.int64)
    off = shift[r]
    p2p = s < 2
    cat = pd.Categorical
    ops = pd.DataFrame({
        "export": r.astype(np.int64), "pid": (5000 + r).astype(np.int64), "device": (r % 8).astype(np.int64),
        "stream": np.full(n, 13, dtype=np.int64), "correlation_id": (i * per_iter + s + 1).astype(np.int64),
        "start_ns": start - off, "end_ns": end - off,
        "short_name": cat(np.where(p2p, "ncclDevKernel_SendRecv", "ncclDevKernel_AllReduce_Sum_f32_RING_LL")),
        "rank": r.astype(np.int64), "p2p": p2p,
        "iteration": i.astype(np.int64), "ready_local": (launched - off).astype(np.float64),
        "ready_from": cat(np.full(n, "launch_only")),
    })  # fmt: skip
    pair_comm = (np.uint64(0x51ED270B27A5C0DE) + pair.astype(np.uint64) * np.uint64(2654435761)).astype(np.uint64)
    if payloads:
        comm = np.where(p2p, pair_comm, np.uint64(DP_COMM)).astype(np.uint64)
        me_in_pair = np.where(s == 0, 0, 1)  # the pair's lower rank is its rank 0
        comm_rank = np.where(p2p, me_in_pair, r)
        peer = np.where(p2p, 1 - me_in_pair, -1)
        ops["comm_id"] = pd.array(comm, dtype="UInt64")
        ops["comm_rank"] = pd.array(comm_rank, dtype="Int64")
        ops["peer"] = pd.array(np.where(p2p, peer, 0), dtype="Int64")
        ops.loc[~p2p, "peer"] = pd.NA
        pairs = np.arange(ranks)
        pair_comms = (np.uint64(0x51ED270B27A5C0DE) + pairs.astype(np.uint64) * np.uint64(2654435761)).astype(np.uint64)
        members = pd.DataFrame({
            "export": np.concatenate([np.arange(ranks), pairs, (pairs + 1) % ranks]).astype(np.int64),
            "comm_id": pd.array(np.concatenate([np.full(ranks, DP_COMM, dtype=np.uint64), pair_comms, pair_comms]),
                                dtype="UInt64"),
            "rank": pd.array(np.concatenate([np.arange(ranks), pairs, (pairs + 1) % ranks]), dtype="Int64"),
        })  # fmt: skip
    else:
        for column, dtype in (("comm_id", "UInt64"), ("comm_rank", "Int64"), ("peer", "Int64")):
            ops[column] = pd.array([pd.NA] * n, dtype=dtype)
        members = pd.DataFrame({"export": pd.Series(dtype="int64"), "comm_id": pd.Series(dtype="UInt64"),
                                "rank": pd.Series(dtype="Int64")})  # fmt: skip
    run_ns = int(2_000_000 + iters * per_iter * slot_ns)
    return {"ops": ops, "members": members}, JobFacts(runs=[run_ns] * ranks, clock=shift.tolist())


def export_parts(tables: dict[str, pd.DataFrame], job: object) -> tuple[list, list]:
    """What each export's map sends the coordinator, as the maps would send it: one
    :class:`AttributionPart` per export (its NCCL operations in the compact table's types, one step
    per iteration, the step breakdown and exposed pieces, and its graph only within its share of
    the job's limit, as :func:`nsysan.analysis.graph_budget` allows a map) and one
    :class:`DetectorParts` (the detectors that reduce send no tables of their own)."""
    from nsysan.analysis import graph_budget
    from nsysan.attribution.breakdown import MAP_COLUMNS
    from nsysan.attribution.comm import compact
    from nsysan.attribution.graph import EDGE, KIND, GraphPart
    from nsysan.attribution.part import AttributionPart
    from nsysan.detect import DetectorParts
    from nsysan.detect.registry import registered

    ops, members = compact(tables["ops"]), tables["members"]
    n_exports = len(job.runs)
    budget = graph_budget(n_exports, 1)
    bounds = np.searchsorted(ops["export"].to_numpy(), np.arange(n_exports + 1))  # synth orders by export
    reduced = [spec.kind for spec in registered().values() if spec.reduce is not None]
    att, det = [], []
    for x, run_ns in enumerate(job.runs):
        mine = ops.iloc[bounds[x] : bounds[x + 1]].reset_index(drop=True).copy()
        mine["op"] = np.arange(len(mine))
        start, end = mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy()
        it = mine["iteration"].to_numpy(dtype=np.int64)
        first = np.flatnonzero(np.r_[True, it[1:] != it[:-1]])
        w_start = start[first]
        w_end = np.append(w_start[1:], end[-1])
        windows = pd.DataFrame(
            {"export": x, "rank": x, "step": np.arange(len(first)), "start_ns": w_start, "end_ns": w_end}
        )
        comm_ns = np.add.reduceat(end - start, first)
        breakdown = windows.assign(
            compute_ns=np.maximum(w_end - w_start - comm_ns, 0), comm_ns=comm_ns, copy_ns=0, idle_ns=0
        ).reindex(columns=MAP_COLUMNS, fill_value=0)
        step_of = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(mine))))
        pieces = pd.DataFrame(
            {"export": x, "rank": x, "step": step_of, "start_ns": start, "end_ns": end, "op": np.arange(len(mine))}
        )
        graph = GraphPart.empty()
        n = len(mine)
        if 2 * n <= budget:  # an arrival and an end per operation, one after another on its stream
            nodes = pd.DataFrame({
                "kind": np.tile([KIND["arrival"], KIND["end"]], n), "time_ns": np.c_[start, end].ravel(), "rank": x,
                "pid": 5000 + x, "device": x % 8, "stream": 13, "step": np.repeat(step_of, 2),
                "comm": np.repeat(np.arange(n), 2), "work_ns": 0.0, "compute_ns": 0.0, "copy_ns": 0.0,
                "first_ns": np.repeat(start, 2), "launch_bound": False,
            })  # fmt: skip
            arrival, ends = 2 * np.arange(n), 2 * np.arange(n) + 1
            edges = pd.DataFrame({
                "src": np.r_[arrival, -1, ends[:-1]], "dst": np.r_[ends, arrival[0], arrival[1:]],
                "weight": np.r_[end - start, start[0], start[1:] - end[:-1]].astype(float),
                "kind": np.r_[np.full(n, EDGE["transfer"]), EDGE["fixed"], np.full(n - 1, EDGE["stream"])].astype(np.int8),
            })  # fmt: skip
            graph = GraphPart(nodes, edges)
        gaps = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("export", "rank", "step", "start_ns", "end_ns",
                                                                    "cause", "node")})  # fmt: skip
        legs = pd.DataFrame({"op": pd.Series(dtype="int64"), "comm_id": pd.Series(dtype="UInt64"),
                             "comm_rank": pd.Series(dtype="Int64"), "peer": pd.Series(dtype="Int64")})  # fmt: skip
        part = AttributionPart(source="nvtx", detail="synthetic", windows=windows, breakdown=breakdown, pieces=pieces,
                               gaps=gaps, comm=mine, legs=legs, graph=graph,
                               members=members[members["export"] == x].reset_index(drop=True))  # fmt: skip
        att.append(part.with_export(x))
        det.append(DetectorParts(run_ns=run_ns, tables={k: {} for k in reduced}).with_export(x))
    return att, det


_CHILD = """
import ctypes, gc, json, resource, sys, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/benchmarks")
from ranks import export_parts, synth
from nsysan.attribution.job import reduce_attribution
from nsysan.detect import reduce_detectors
from nsysan.detect.nccl_ordering_stall import matching
ranks, ops, payloads, profile = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1"

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def reduce(att, det, clock):
    notes = []
    job = reduce_attribution(att, clock, matching(None), notes)
    found = reduce_detectors(det, job.clock.offsets, None, notes, attribution=job)
    job.document()
    return found, notes, job

t0 = time.perf_counter()
tables, job = synth(ranks, ops, payloads)
n_ops = len(tables["ops"])
att, det = export_parts(tables, job)
del tables
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand the synthesis's freed heap back: measure the reduce, not it
in_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tables_bytes = sum(int(p.comm.memory_usage(deep=True).sum()) for p in att)
graph_nodes = sum(len(p.graph.nodes) for p in att)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak RSS (VmHWM): the reduce's own peak, not the synthesis's
rss_before = status("VmRSS")
t1 = time.perf_counter()
if profile:
    import cProfile, pstats
    prof = cProfile.Profile()
    found, notes, attribution = prof.runcall(reduce, att, det, job.clock)
    st = pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative")
    print("top 5 functions by cumulative time:", file=sys.stderr); st.print_stats(5)
    print("top nsysan functions by cumulative time:", file=sys.stderr); st.print_stats("nsysan/", 10)
else:
    found, notes, attribution = reduce(att, det, job.clock)
t2 = time.perf_counter()
print(json.dumps({"synth_s": t1 - t0, "reduce_s": t2 - t1, "ops": n_ops, "findings": len(found),
                  "skipped": any("skipped" in n or "not attempted" in n for n in notes), "input_rss": in_rss,
                  "tables": tables_bytes, "graph_nodes": graph_nodes,
                  "replayed": attribution.graph is not None, "rss_before": rss_before, "rss": status("VmHWM")}))
"""


def reduce_point(ranks: int, ops: int, payloads: bool, timeout_s: float, max_rss: int, profile: bool = False) -> dict:
    """One reduce in a child process, stopped past ``timeout_s`` or ``max_rss`` bytes of RSS."""
    cmd = [
        sys.executable,
        "-c",
        _CHILD,
        str(REPO),
        str(ranks),
        str(ops),
        "1" if payloads else "0",
        "1" if profile else "0",
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p, peak, why = psutil.Process(proc.pid), 0, None
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, p.memory_info().rss)
        if peak > max_rss:
            why = f"over {max_rss / GIB:.0f} GiB"
        elif time.perf_counter() - t0 > timeout_s:
            why = f"over {timeout_s:.0f} s"
        if why:
            proc.kill()
            break
        time.sleep(0.1)
    out, err = proc.communicate()
    if why or proc.returncode != 0:
        return {"failed": why or f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}", "peak_rss": peak,
                "wall_s": time.perf_counter() - t0}  # fmt: skip
    res = json.loads(out.strip().splitlines()[-1])
    if profile:
        res["profile"] = err
    return res


def _print_point(variant: str, ranks: int, ops: int, res: dict) -> None:
    if "failed" in res:
        print(f"  {variant:15s} {ranks:5d} ranks x {ops:6,} ops: {res['failed']} (peak RSS seen "
              f"{res['peak_rss'] / 2**20:.0f} MiB, stopped after {res['wall_s']:.0f} s)", flush=True)  # fmt: skip
    else:
        print(f"  {variant:15s} {ranks:5d} ranks x {ops:6,} ops ({res['ops']:>10,} in all): reduce "
              f"{res['reduce_s']:7.2f} s  peak RSS during it {res['rss'] / 2**20:6.0f} MiB (before it "
              f"{res['rss_before'] / 2**20:.0f} MiB, of which the compact tables {res['tables'] / 2**20:.0f} MiB; "
              f"peak while synthesising them {res['input_rss'] / 2**20:.0f} MiB)  findings {res['findings']}  "
              f"graph {res['graph_nodes']:,} nodes, {'replayed' if res['replayed'] else 'not replayed'}"
              + ("  (a limit reached: skipped, said in the report)" if res.get("skipped") else ""),
              flush=True)  # fmt: skip


def part2(args: argparse.Namespace) -> dict[str, object]:
    """The coordinator's reduce alone (the attribution's, then the detectors'), per (ranks, variant), in child processes. A point that
    fails is run again with a tenth of the ops, then a hundredth; once a size failed at some number
    of ranks, larger numbers start at the next smaller size (the failed one would fail too)."""
    rank_points = [int(x) for x in args.reduce_ranks.split(",") if x.strip()]
    full = args.ops_per_rank
    levels = list(dict.fromkeys([full, max(30, full // 10), max(30, full // 100)]))
    limits = (args.timeout_s, int(args.max_rss_gib * GIB))
    print(f"\n== part 2: the reduce alone (reduce_attribution, reduce_detectors), {full:,} ops per rank (stop at {args.timeout_s:.0f} s / "
          f"{args.max_rss_gib:.0f} GiB; on failure again with {', '.join(f'{n:,}' for n in levels[1:])})",
          flush=True)  # fmt: skip
    variants = [("a: payloads", True), ("b: no payloads", False)]
    variants = [v for v in variants if v[0][0] in args.variants.split(",")]
    results: dict[str, list[dict]] = {}
    for variant, payloads in variants:
        results[variant] = []
        level, failed_at = 0, None
        for ranks in rank_points:
            if level:
                print(f"  {variant:15s} {ranks:5d} ranks x {levels[level - 1]:6,} ops: not run "
                      f"(failed at {failed_at} ranks)")  # fmt: skip
            for lvl in range(level, len(levels)):
                ops = levels[lvl]
                res = {**reduce_point(ranks, ops, payloads, *limits), "ranks": ranks, "ops_per_rank": ops}
                results[variant].append(res)
                _print_point(variant, ranks, ops, res)
                if "failed" not in res:
                    break
                if lvl == level:
                    level, failed_at = lvl + 1, ranks
        for ops in levels:
            done = [
                (r["ranks"], r["reduce_s"]) for r in results[variant] if "failed" not in r and r["ops_per_rank"] == ops
            ]
            k = slope(done)
            if k is not None:
                print(f"  {variant}: log-log slope of reduce time vs ranks at {ops:,} ops per rank: {k:.2f} "
                      f"(over {', '.join(str(r) for r, _ in done)} ranks)")  # fmt: skip
    print("  target: 1,024 ranks x 10,000 ops: <= 60 s and <= 2 GiB")
    if args.profile_ranks:
        for variant, payloads in variants:
            res = reduce_point(args.profile_ranks, args.profile_ops, payloads, *limits, profile=True)
            print(f"\n  cProfile, {variant}, {args.profile_ranks} ranks x {args.profile_ops:,} ops:")
            print(res.get("profile") or res.get("failed"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("1", "2", "both"), default="both")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--kernels-per-rank", type=int, default=250_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default="serial,cluster", help="part 1's runs: serial, cluster or both")
    parser.add_argument("--build-procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-build-s", type=float, default=600, help="shrink the job if its build would take longer")
    parser.add_argument("--force-build", action="store_true", help="build the full size however long it takes")
    parser.add_argument("--reduce-ranks", default="64,128,256,512,1024")
    parser.add_argument("--ops-per-rank", type=int, default=10_000)
    parser.add_argument("--variants", default="a,b", help="a: with communicator payloads, b: without")
    parser.add_argument("--timeout-s", type=float, default=240)
    parser.add_argument("--max-rss-gib", type=float, default=8)
    parser.add_argument("--profile-ranks", type=int, default=128, help="cProfile the reduce at this many ranks (0: no)")
    parser.add_argument("--profile-ops", type=int, default=3_000)
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    result: dict[str, object] = {}
    if args.part in ("1", "both"):
        result["part1"] = part1(args)
    if args.part in ("2", "both"):
        result["part2"] = part2(args)
    print(json.dumps(result, default=lambda v: round(v, 3) if isinstance(v, float) else str(v)))


if __name__ == "__main__":
    main()
