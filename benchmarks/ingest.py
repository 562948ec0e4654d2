"""Ingest benchmark: ``nsysan report`` on a 1M-kernel export vs a raw sqlite3 scan of the same columns.

    python benchmarks/ingest.py [--kernels 1000000] [--repeat 3]

Builds (once, cached under .nsysan-work/) an export of a 8-rank data-parallel job with
``--kernels`` kernels, each with its launch call, plus NCCL NVTX ranges. Then, alternating the two
in fresh processes so they share the machine's state, it times

* report: load the trace, compute the overview and findings, render the terminal report
  (the one-off cost of importing nsysan and pandas is printed apart);
* raw:    a plain ``sqlite3`` loop over the same columns nsysan reads from the kernel and
  runtime tables (the overview's kernel columns; the launch calls of NCCL kernels);

and prints the median of each, their ratio and each one's peak resident memory.
Targets (issue 2): report <= 3x raw, report peak memory <= 1.5 GB.
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

from nsysan.ingest.frames import KERNEL_SOURCES  # noqa: E402
from nsysan.overview import KERNEL_COLUMNS  # noqa: E402

# The raw scan reads exactly what nsysan report reads from the two big tables: the overview's
# kernel columns, and the launch calls of NCCL kernels (for message sizes).
RAW_KERNELS = ", ".join(KERNEL_SOURCES[c] for c in KERNEL_COLUMNS)
RAW_LAUNCHES = (
    "SELECT globalTid, correlationId, start, end, nameId, returnValue FROM CUPTI_ACTIVITY_KIND_RUNTIME "
    "WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL "
    "WHERE shortName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%'))"
)

def build(path: Path, kernels: int) -> Path:
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
            if i % 20 == 19:
                w.nvtx_range(pid, pid, t - 1_000, t + 5_000, "ncclAllReduce", domain_id=3, payload=2**26)
                w.kernel(pid, r, 13, t + 4_000, t + 300_000, nccl, correlation=corr, grid=(4, 1, 1))
            else:
                w.kernel(pid, r, 7, t + 4_000, t + 40_000 + (i % 7) * 1_000, names[i % 4], correlation=corr)
            t += 50_000
            if i % 100_000 == 99_999:
                w.flush()
    return w.close()


_REPORT = """
import resource, sys, time
t0 = time.perf_counter()
from nsysan.ingest import load_trace
from nsysan.report import RENDERERS, analyse
t1 = time.perf_counter()
with load_trace([sys.argv[1]]) as trace:
    doc = analyse(trace)
text = RENDERERS["terminal"](doc)
t2 = time.perf_counter()
print(t2 - t1, t1 - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

_RAW = f"""
import resource, sqlite3, sys, time
t0 = time.perf_counter()
con = sqlite3.connect(f"file:{{sys.argv[1]}}?mode=ro", uri=True)
n = 0
for _ in con.execute("SELECT {RAW_KERNELS} FROM CUPTI_ACTIVITY_KIND_KERNEL"):
    n += 1
for _ in con.execute("{RAW_LAUNCHES}"):
    n += 1
print(time.perf_counter() - t0, 0.0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

def run(code: str, path: Path) -> tuple[float, float, int]:
    """Work seconds, import seconds and peak RSS bytes of one fresh process."""
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True, cwd=REPO)
    work, imports, rss = out.stdout.split()
    return float(work), float(imports), int(rss)

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

    report, raw = [], []
    for _ in range(args.repeat):
        raw.append(run(_RAW, path))
        report.append(run(_REPORT, path))
    r_s = statistics.median(r[0] for r in report)
    imports = statistics.median(r[1] for r in report)
    w_s = statistics.median(r[0] for r in raw)
    r_mem = max(r[2] for r in report)
    w_mem = max(r[2] for r in raw)
    result = {
        "kernels": args.kernels, "repeat": args.repeat,
        "report_s": round(r_s, 3), "imports_s": round(imports, 3), "raw_scan_s": round(w_s, 3),
        "ratio": round(r_s / w_s, 2), "ratio_with_imports": round((r_s + imports) / w_s, 2),
        "report_peak_mib": round(r_mem / 2**20), "raw_peak_mib": round(w_mem / 2**20),
    }  # fmt: skip
    print(f"raw sqlite3 scan of the same columns : {w_s:6.2f} s   peak {w_mem / 2**20:6.0f} MiB")
    print(f"nsysan report (ingest+detect+render) : {r_s:6.2f} s   peak {r_mem / 2**20:6.0f} MiB")
    print(f"  + importing nsysan/pandas once      : {imports:6.2f} s")
    print(f"ratio report/raw: {r_s / w_s:.2f}x, {(r_s + imports) / w_s:.2f}x with imports (target <= 3x); "
          f"peak memory target <= 1536 MiB")  # fmt: skip
    print(json.dumps(result))

if __name__ == "__main__":
    main()
