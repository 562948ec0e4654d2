"""Scale benchmark: ``nsysan report`` on 1M..8M-kernel exports against the floors, in one run.

    python benchmarks/scale.py [--sizes 1,2,4,8] [--repeat 1] [--op-ranges] [--slices --slice-workers 2]

For each size (millions of kernels) it builds (once, cached under .nsysan-work/, with the
generator of benchmarks/ingest.py) an 8-rank export (``--op-ranges``: with NVTX ranges per op,
module and step, as PyTorch writes them), then times in fresh child processes:

* sqlite GROUP BY: the per-name kernel summary computed inside SQLite (the floor of any reader);
* arrow fetch:     the kernel columns the full report reads, fetched into Arrow (ADBC's SQLite driver);
* nsys stats:      ``nsys stats --report gpukernsum`` (when nsys is found: $NSYS, PATH or nsysan's cache);
* report cold:     ``nsysan report --format json`` with an empty frame cache (it fills it);
* report cached:   the same again, reading the cache;
* report no-cache: ``--no-cache``.
* no-cache, text:  ``--no-cache`` in the default format (the terminal's text, no diff profile).
* imports alone:   importing what a report imports, and nothing read: the floor under any
                   report on nsysan's stack (pandas, pyarrow, SQLAlchemy), in CPU and in memory.
* phases:          the no-cache report's steps timed in one process (CPU seconds): where the time
                   goes between the floors and the report.
* with ``--slices``: the no-cache report mapped by slices of the export's 8 processes, in one
                   process (what it does past an eighth of the machine's memory) and on a local
                   cluster of ``--slice-workers`` workers (peak RSS of each process of its tree).

Each row: wall and CPU seconds and the child's peak RSS (``os.wait4``'s rusage of that child
alone). Then the ratios against the targets (cold report faster than nsys stats and within 2x of
the Arrow fetch; peak RSS <= the export's size; cached <= 20% of cold) and the log-log slopes of
the cold report's CPU time and peak RSS against the number of kernels (1.0: linear).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from ingest import _QUERIES, WORK  # noqa: E402

_BUILD = """
import sys
from pathlib import Path
sys.path[:0] = ["benchmarks", "."]
from ingest import build
build(Path(sys.argv[1]), int(sys.argv[2]), op_ranges=sys.argv[3] == "1")
"""

GROUP_BY = (
    "SELECT shortName, count(*), sum(end - start), min(end - start), max(end - start) "
    "FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY shortName"
)
_SQLITE = """
import sqlite3, sys
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(len(con.execute(sys.argv[2]).fetchall()))
"""
_ARROW = """
import sys
import adbc_driver_sqlite.dbapi as adbc
con = adbc.connect(f"file:{sys.argv[1]}?mode=ro")
cur = con.cursor()
cur.execute(sys.argv[2])
print(cur.fetch_arrow_table().num_rows)
"""


_IMPORTS = (
    "import nsysan.cli, nsysan.engine, nsysan.detect, nsysan.overview, nsysan.diff.profile, nsysan.report.renderers"
)


def nsys_binary() -> str | None:
    for candidate in (
        os.environ.get("NSYS"),
        shutil.which("nsys"),
        str(Path.home() / ".cache/nsysan/nsys/usr/bin/nsys"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def measure(cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall, CPU (user + sys) and peak RSS of one child process (and only it)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err[-500:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the least CPU time (the one least disturbed by the machine's other work)."""
    return min(runs, key=lambda r: r["cpu_s"])


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) against log(x)."""
    if len(points) < 2:
        return None
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else None


# The steps of ``nsysan report --no-cache --format json`` on one export, in the order the report
# runs them, each timed on its own (a read is timed where it first happens, as in the report).
_PHASES = """
import json, sys, time
clock = time.process_time
t = clock()
from nsysan.analysis import ExportResult, reduce_job
from nsysan.attribution.part import map_attribution
from nsysan.diff.profile import DEFAULT_STEP_PATTERN, profile_part
from nsysan.ingest import load_trace
from nsysan.overview import KERNEL_COLUMNS, overview_part
from nsysan.detect import map_detectors
from nsysan.report.renderers import render_json
spent = {"imports": clock() - t}
def step(name, fn):
    t = clock(); out = fn(); spent[name] = spent.get(name, 0.0) + clock() - t; return out
with load_trace([sys.argv[1]], cache=None) as job:
    ranks = step("ranks", lambda: job.ranks)
    one = job.export_alone(0)
    step("read kernels", lambda: one.kernel_columns(KERNEL_COLUMNS))  # the overview reads first
    step("read NVTX", lambda: one.nvtx)
    step("read copies, sets, NCCL calls", lambda: (one.memcpy, one.memset, one.nccl_calls))
    overview = step("overview", lambda: overview_part(one).with_export(0))
    detectors = step("detectors (map)", lambda: map_detectors(one))
    attribution, detectors.findings = step("attribution (map)", lambda: map_attribution(one, DEFAULT_STEP_PATTERN,
                                                                                        detectors.findings))
    # the report hands the profile its attribution part (nsysan.engine.map_file): not mapped twice
    profile = step("diff profile (map)", lambda: profile_part(one, DEFAULT_STEP_PATTERN, [attribution]))
    result = ExportResult(one.exports[0], overview, detectors.with_export(0), attribution.with_export(0), [profile])
    doc = step("reduce", lambda: reduce_job([result], ranks, [], None))
    step("render JSON", lambda: render_json(doc))
print(json.dumps(spent))
"""


# ``nsysan report --no-cache --format json --workers 0`` with the export mapped one slice of
# processes at a time (as it is past an eighth of the machine's memory)
_BY_SLICES = """
import sys
import nsysan.engine as engine
from nsysan.diff.profile import DEFAULT_STEP_PATTERN
from nsysan.ingest.cache import configure
from nsysan.report.renderers import render_json
configure(False)
engine.slice_in_process = lambda path: True
render_json(engine.analyse_files([sys.argv[1]], {}, engine.Serial(), DEFAULT_STEP_PATTERN))
"""


def by_slices(py: str, path: Path, whole: dict[str, float], workers: int) -> dict[str, Any]:
    """The no-cache report by slices, in one process and on a local cluster, against ``whole``."""
    from ranks import measure_tree  # a sibling script (it imports this one's slope)

    alone = measure([py, "-c", _BY_SLICES, str(path)])
    cluster: dict[str, Any] = measure_tree([py, "-m", "nsysan", "report", str(path), "--format", "json",
                                            "--no-cache", "--workers", str(workers)])  # fmt: skip
    largest = max(cluster["coordinator_rss_mib"], cluster["largest_worker_rss_mib"])
    print(f"  {'by slices, in process':24s} wall {alone['wall_s']:6.2f} s  cpu {alone['cpu_s']:6.2f} s  "
          f"peak RSS {alone['rss_mib']:6.0f} MiB  (x{alone['cpu_s'] / whole['cpu_s']:.2f} CPU, "
          f"x{alone['rss_mib'] / whole['rss_mib']:.2f} peak RSS of the whole export's no-cache report)")  # fmt: skip
    print(f"  {f'by slices, {workers} workers':24s} wall {cluster['wall_s']:6.2f} s  largest process "
          f"{largest:6.0f} MiB (coordinator {cluster['coordinator_rss_mib']:.0f}, largest worker "
          f"{cluster['largest_worker_rss_mib']:.0f})  (x{cluster['wall_s'] / whole['wall_s']:.2f} wall)")  # fmt: skip
    return {"in_process": alone, "cluster": cluster}


def phases(py: str, path: Path) -> dict[str, float]:
    """CPU seconds of each step of a no-cache report of ``path`` (one export), in a fresh process."""
    out = subprocess.run([py, "-c", _PHASES, str(path)], capture_output=True, text=True, check=True, cwd=REPO)
    spent: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8", help="millions of kernels, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement (the least CPU is kept)")
    parser.add_argument("--op-ranges", action="store_true",
                        help="exports with NVTX ranges per op, module and step, as PyTorch captures have")  # fmt: skip
    parser.add_argument("--slices", action="store_true", help="also time the report mapped by slices of processes")
    parser.add_argument("--slice-workers", type=int, default=2, help="local cluster workers for --slices")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    nsys = nsys_binary()
    WORK.mkdir(exist_ok=True)
    py = sys.executable
    results = []
    for size in sizes:
        kernels = int(size * 1_000_000)
        path = WORK / f"bench-{kernels}{'-ops' if args.op_ranges else ''}.sqlite"
        t0 = time.perf_counter()
        # built in a child: a child's peak RSS counts what it inherited at fork (Linux), so this
        # process stays small for the measured children
        subprocess.run([py, "-c", _BUILD, str(path), str(kernels), str(int(args.op_ranges))], check=True, cwd=REPO)
        mib = path.stat().st_size / 2**20
        print(
            f"\n== {kernels:,} kernels: {path} ({mib:.0f} MiB; built/cached in {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        out = subprocess.run([py, "-c", _QUERIES, str(path)], capture_output=True, text=True, check=True, cwd=REPO)
        report_sql = json.loads(out.stdout)[1]
        cache = Path(tempfile.mkdtemp(prefix="nsysan-scale-"))
        # in this one process (--workers 0), as one export is by default
        report = [py, "-m", "nsysan", "report", str(path), "--format", "json", "--workers", "0"]
        env = {k: v for k, v in os.environ.items() if k != "NSYSAN_CACHE"}
        runs: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeat):
            shutil.rmtree(cache, ignore_errors=True)
            steps = [
                ("sqlite GROUP BY", [py, "-c", _SQLITE, str(path), GROUP_BY]),
                ("arrow fetch", [py, "-c", _ARROW, str(path), report_sql]),
                *([("nsys stats gpukernsum", [nsys, "stats", "--report", "gpukernsum", "--format", "csv",
                                              "--output", "-", str(path)])] if nsys else []),
                ("report cold", [*report, "--cache", str(cache)]),
                ("report cached", [*report, "--cache", str(cache)]),
                ("report no-cache", [*report, "--no-cache"]),
                ("no-cache, text", [py, "-m", "nsysan", "report", str(path), "--workers", "0", "--no-cache"]),
                ("imports alone", [py, "-c", _IMPORTS]),
            ]  # fmt: skip
            for name, cmd in steps:
                runs.setdefault(name, []).append(measure(cmd, env=env))
        shutil.rmtree(cache, ignore_errors=True)
        row = {name: best(r) for name, r in runs.items()}
        for name, r in row.items():
            print(f"  {name:24s} wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  peak RSS {r['rss_mib']:6.0f} MiB")
        cold, cached, arrow = row["report cold"], row["report cached"], row["arrow fetch"]
        ratios = {
            "cold_over_arrow_fetch_cpu": cold["cpu_s"] / arrow["cpu_s"],
            "cold_over_group_by_cpu": cold["cpu_s"] / row["sqlite GROUP BY"]["cpu_s"],
            "cached_over_cold_cpu": cached["cpu_s"] / cold["cpu_s"],
            "cold_rss_over_file_size": cold["rss_mib"] / mib,
        }
        imports = row["imports alone"]
        ratios["imports_rss_over_file_size"] = imports["rss_mib"] / mib
        ratios["imports_and_arrow_fetch_over_arrow_fetch_cpu"] = (imports["cpu_s"] + arrow["cpu_s"]) / arrow["cpu_s"]
        if "nsys stats gpukernsum" in row:
            nsys_cpu = row["nsys stats gpukernsum"]["cpu_s"]
            ratios["cold_over_nsys_stats_cpu"] = cold["cpu_s"] / nsys_cpu
            ratios["imports_and_arrow_fetch_over_nsys_stats_cpu"] = (imports["cpu_s"] + arrow["cpu_s"]) / nsys_cpu
        print(
            f"  ratios: cold/arrow {ratios['cold_over_arrow_fetch_cpu']:.2f}x (target <= 2), "
            + (f"cold/nsys {ratios['cold_over_nsys_stats_cpu']:.2f}x (target < 1), " if nsys else "")
            + f"cached/cold {ratios['cached_over_cold_cpu']:.2f} (target <= 0.20), "
            f"RSS/file {ratios['cold_rss_over_file_size']:.2f} (target <= 1)"
        )
        floor = ratios.get("imports_and_arrow_fetch_over_nsys_stats_cpu")
        print(
            f"  floors: imports alone peak at {ratios['imports_rss_over_file_size']:.2f}x the file; imports + arrow "
            + (f"fetch take {floor:.2f}x nsys stats' CPU and " if floor is not None else "fetch take ")
            + f"{ratios['imports_and_arrow_fetch_over_arrow_fetch_cpu']:.2f}x the arrow fetch's"
        )
        spent = phases(py, path)
        print("  phases of the no-cache report (CPU s): " + ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
              + f"; sum {sum(spent.values()):.2f}")  # fmt: skip
        sliced = by_slices(py, path, row["report no-cache"], args.slice_workers) if args.slices else None
        results.append({"kernels": kernels, "file_mib": round(mib, 1), "runs": row, "ratios": ratios,
                        "phases": spent, "slices": sliced})  # fmt: skip
    points = {
        name: slope([(r["kernels"], r["runs"][name]["cpu_s"]) for r in results])
        for name in ("report cold", "report cached", "arrow fetch", "sqlite GROUP BY")
    }
    memory = slope([(r["kernels"], r["runs"]["report cold"]["rss_mib"]) for r in results])
    if len(results) > 1:
        print("\nlog-log slope of CPU time vs kernels: " + ", ".join(
            f"{k} {v:.2f}" for k, v in points.items() if v is not None) + " (target <= 1.05 for report cold)")  # fmt: skip
        print(f"log-log slope of the cold report's peak RSS vs kernels: {memory:.2f} (target <= 1.05)")
    print(json.dumps({"results": results, "slopes": points, "rss_slope": memory}, default=lambda v: round(v, 3)))


if __name__ == "__main__":
    main()
