"""Latency benchmark: what a person waits for on a small input (issue 32, item 3).

    python benchmarks/latency.py [--runs 5] [--tree OTHER_CHECKOUT ...]

Times whole processes, as a user runs them: ``nsysan --help`` (the start alone: imports),
``nsysan report --no-cache`` of a bundled sample, ``nsysan diff`` of the bundled before/after pair.
Each is run ``--runs`` times and the median wall and CPU (user + system) seconds are printed.
With ``--tree``, the same commands run from each named checkout too (``PYTHONPATH`` set to it), in
turn with this one, so a before/after pair is measured side by side on the same loaded machine;
the last column is each tree's median wall as a multiple of this checkout's.

Targets (issue 32): the sample report <= 1.0 s wall, the diff <= 2.0 s, on a quiet machine of this
kind (2 cores).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SAMPLES = HERE / "fixtures" / "samples"
COMMANDS = {
    "start (--help)": ["--help"],
    "report, sample": ["report", "--no-cache", str(SAMPLES / "pipeline-stall.sqlite")],
    "diff, two samples": [
        "diff",
        "--no-cache",
        str(SAMPLES / "pipeline-stall.sqlite"),
        str(SAMPLES / "pipeline-stall-fixed.sqlite"),
    ],
}


def _one(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``python -m nsysan ARGS`` run from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "NO_COLOR": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "nsysan", *args], env=env, cwd=tree, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: nsysan {' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", type=Path, action="append", default=[], help="another checkout to time beside this one")
    a = ap.parse_args()
    trees = [HERE, *[t.resolve() for t in a.tree]]
    print(f"| command | tree | median wall s | median CPU s | wall vs {HERE.name} |")
    print("|---|---|---|---|---|")
    for name, args in COMMANDS.items():
        times: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
        for _ in range(a.runs):
            for t in trees:  # interleaved: a load spike hits every tree alike
                times[t].append(_one(t, args))
        base = statistics.median(w for w, _ in times[HERE])
        for t in trees:
            wall = statistics.median(w for w, _ in times[t])
            cpu = statistics.median(c for _, c in times[t])
            print(f"| {name} | {t.name} | {wall:.2f} | {cpu:.2f} | {wall / base:.2f} |")


if __name__ == "__main__":
    main()
