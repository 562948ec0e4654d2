"""Ingest benchmark: ``nsysan report`` on a 1M-kernel export vs a raw sqlite3 scan of the same columns.

    python benchmarks/ingest.py [--kernels 1000000] [--repeat 3]

Builds (once, cached under .nsysan-work/) an export of a 8-rank data-parallel job with
``--kernels`` kernels, each with its launch call, plus NCCL NVTX ranges. Then, alternating the two
in fresh processes so they share the machine's state, it times

* report: load the trace and compute the overview (ingest), run the four detectors, render the
  terminal report, timed apart (the one-off import of nsysan and pandas is printed apart);
* raw A:  a plain ``sqlite3`` loop over the columns the overview reads (its kernel columns and
  the launch calls of NCCL kernels);
* raw B:  the same over every kernel column the full report reads (overview + detectors);

and prints medians and ratios. Targets: report without detectors <= 3x raw A, peak memory
<= 1.5 GB, detectors <= 1x ingest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures.exporter import ExportWriter  # noqa: E402

WORK = REPO / ".nsysan-work"


# With ``op_ranges``, NVTX as PyTorch's ``emit_nvtx``/profiler schedule writes it: a range per op
# around each launch, a module range per 4 ops, a step range per 100 (1.31 events per kernel with
# the NCCL ranges; the real 2-GPU PyTorch exports of ../shared/realtraces hold 2 to 5).
_OPS = ["aten::mm", "aten::add_", "aten::addmm", "aten::sum"]


def build(path: Path, kernels: int, op_ranges: bool = False) -> Path:
    if path.exists():
        return path
    ranks = 8
    w = ExportWriter(path, "current")
    names = ["ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4>(int)",
             "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
             "void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)"]  # fmt: skip
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    per_rank = kernels // ranks
    for r in range(ranks):
        pid = 5000 + r
        w.process(pid, "python3")
        w.thread(pid, pid, "python3")
        w.gpu(r)
        w.nvtx_domain(pid, pid, 3, "NCCL", 0)
        t = 1_000_000
        for i in range(per_rank):
            corr = i + 1
            w.runtime(pid, pid, t, t + 3_000, "cudaLaunchKernel", corr)
            if op_ranges:
                if i % 100 == 0:
                    w.nvtx_range(pid, pid, t - 500, t + 100 * 50_000 - 1_000, f"ProfilerStep#{i // 100}")
                if i % 4 == 0:
                    w.nvtx_range(pid, pid, t - 200, t + 4 * 50_000 - 2_000, f"nn.Module: Block_{i // 4 % 8}")
                w.nvtx_range(pid, pid, t - 100, t + 3_500, _OPS[i % 4])
            if i % 20 == 19:
                w.nvtx_range(pid, pid, t - 1_000, t + 5_000, "ncclAllReduce", domain_id=3, payload=2**26)
                w.kernel(pid, r, 13, t + 4_000, t + 300_000, nccl, correlation=corr, grid=(4, 1, 1))
            else:
                w.kernel(pid, r, 7, t + 4_000, t + 40_000 + (i % 7) * 1_000, names[i % 4], correlation=corr)
            t += 50_000
            if i % 100_000 == 99_999:
                w.flush()
    return w.close()


RAW_LAUNCHES = (
    "SELECT globalTid, correlationId, start, end, nameId, returnValue FROM CUPTI_ACTIVITY_KIND_RUNTIME "
    "WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL "
    "WHERE shortName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%'))"
)

# Prints the kernel SELECTs of the two raw scans: the overview's columns, and every kernel column
# the full report (overview + detectors) reads. Run in its own process so that its memory does not
# leak into the measured processes' peak RSS.
_QUERIES = """
import json, sys
from nsysan.detect import run_detectors
from nsysan.ingest import load_trace
from nsysan.ingest.frames import KERNEL_SOURCES, source_sql
from nsysan.overview import KERNEL_COLUMNS, build_overview

def select(columns):
    return "SELECT " + ", ".join(source_sql(KERNEL_SOURCES[c]) for c in columns) + " FROM CUPTI_ACTIVITY_KIND_KERNEL"

with load_trace([sys.argv[1]]) as trace:
    build_overview(trace)
    run_detectors(trace)
    print(json.dumps([select(KERNEL_COLUMNS), select(trace.kernel_columns_read)]))
"""

_REPORT = """
import resource, sys, time
t0 = time.perf_counter()
from nsysan.detect import run_detectors
from nsysan.ingest import load_trace
from nsysan.overview import build_overview
from nsysan.report.document import build_document
from nsysan.report.renderers import RENDERERS
t1 = time.perf_counter()
with load_trace([sys.argv[1]]) as trace:
    overview = build_overview(trace)
    t2 = time.perf_counter()
    findings = run_detectors(trace)
    t3 = time.perf_counter()
text = RENDERERS["terminal"](build_document(overview, findings))
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

_RAW = """
import resource, sqlite3, sys, time
t0 = time.perf_counter()
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
n = 0
for sql in sys.argv[2:]:
    for _ in con.execute(sql):
        n += 1
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def run(code: str, *args: str) -> list[float]:
    """The numbers one fresh process prints."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=REPO)
    return [float(v) for v in out.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    WORK.mkdir(exist_ok=True)
    path = WORK / f"bench-{args.kernels}.sqlite"
    t0 = time.perf_counter()
    build(path, args.kernels)
    print(f"export: {path} ({path.stat().st_size / 2**20:.0f} MiB, built/cached in {time.perf_counter() - t0:.1f} s)")
    out = subprocess.run(
        [sys.executable, "-c", _QUERIES, str(path)], capture_output=True, text=True, check=True, cwd=REPO
    )
    overview_sql, all_sql = json.loads(out.stdout)
    print(f"raw scan A (what the overview reads): {overview_sql}; + NCCL launch calls")
    print(f"raw scan B (what the full report reads): {all_sql}; + NCCL launch calls")

    raw_a, raw_b, report = [], [], []
    for _ in range(args.repeat):  # interleaved, so the three share the machine's state
        raw_a.append(run(_RAW, str(path), overview_sql, RAW_LAUNCHES))
        raw_b.append(run(_RAW, str(path), all_sql, RAW_LAUNCHES))
        report.append(run(_REPORT, str(path)))
    med = statistics.median
    a_s, b_s = med(r[0] for r in raw_a), med(r[0] for r in raw_b)
    imports, ingest, detect, render = (med(r[i] for r in report) for i in range(4))
    peak = max(r[4] for r in report)
    without = ingest + render
    result = {
        "kernels": args.kernels, "repeat": args.repeat,
        "raw_a_s": round(a_s, 3), "raw_b_s": round(b_s, 3), "imports_s": round(imports, 3),
        "ingest_overview_s": round(ingest, 3), "detectors_s": round(detect, 3), "render_s": round(render, 3),
        "report_without_detectors_over_raw_a": round(without / a_s, 2),
        "detectors_over_ingest": round(detect / ingest, 2),
        "full_report_over_raw_b": round((without + detect) / b_s, 2),
        "report_peak_mib": round(peak / 2**20), "raw_b_peak_mib": round(max(r[1] for r in raw_b) / 2**20),
    }  # fmt: skip
    print(f"raw sqlite3 scan A                 : {a_s:6.2f} s")
    print(f"raw sqlite3 scan B                 : {b_s:6.2f} s")
    print(f"nsysan: import nsysan + pandas     : {imports:6.2f} s (once per process, not counted below)")
    print(f"nsysan: ingest + overview          : {ingest:6.2f} s")
    print(f"nsysan: the four detectors         : {detect:6.2f} s")
    print(f"nsysan: render                     : {render:6.2f} s   peak memory {peak / 2**20:.0f} MiB (target <= 1536)")
    print(f"report without detectors / raw A   : {without / a_s:.2f}x (target <= 3x)")
    print(f"detectors / ingest                 : {detect / ingest:.2f}x (target <= 1x)")
    print(f"full report / raw B                : {(without + detect) / b_s:.2f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
