"""Deliberate bugs that the tests must catch: in the detectors and in the transport's wake-ups.

Each mutant is one small source edit that reintroduces a mistake a detector could plausibly make
(several were the detectors' real behaviour before the truth tests), or that breaks the rule of
when the P2P transport rings a peer's doorbell (a lost wake-up only shows as a 2 ms stall, which
no transfer's data reveals). :func:`killed` applies it to a
copy of the repository and runs the tests named for it; a mutant the tests do not fail on means
the tests no longer guard that part of the definition.

``python -m tests.mutations`` runs them all and prints a line each; tests/test_mutations.py runs
them in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import realtraces_dir

REPO = Path(__file__).resolve().parent.parent
_COPY = ("nsysan", "dashboards", "fixtures", "tests", "pyproject.toml")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


ORDERING = ("tests/test_ordering_truth.py",)
GRAPH_CBF = ("tests/test_graph_cbf_truth.py",)
SLOWDOWN = ("tests/test_slowdown_truth.py",)
# each sample's own finding at the severity its recoverable share of the job gives it
SEVERITY = ("tests/test_detector_scenarios.py", "-k", "appear_in_every_format")
# the real export's test needs ../shared, which the mutant's copy of the repository lacks
SLICES = ("tests/test_slices.py", "-k", "not real_two_gpu")
WAKEUPS = ("tests/test_transport_wakeups.py",)
SHARED_STREAM = ("tests/test_shared_nccl_stream.py",)
SLOWDOWN_POSITIONS = ("tests/test_slowdown_positions.py", "-k", "layout or gemm_of or one_position")

MUTANTS: tuple[Mutant, ...] = (
    Mutant("ordering: B's own peers never checked", "nsysan/detect/nccl_ordering_stall.py",
           "free_at = np.fmax(ready[b], b_peers_ready)",
           "free_at = ready[b] + 0 * b_peers_ready", ORDERING),
    Mutant("ordering: readiness from the launch call's return", "nsysan/attribution/comm.py",
           'ops["ready_local"] = np.fmax(ops["launched_ns"].astype("float64"), device.astype("float64"))',
           'ops["ready_local"] = ops["launched_ns"].astype("float64")', ORDERING),
    Mutant("ordering: impact x1.2", "nsysan/detect/nccl_ordering_stall.py",
           "impact = a_start[b] - free_at",
           "impact = (a_start[b] - free_at) * 1.2", ORDERING),
    Mutant("ordering: cascade links reported as new stalls", "nsysan/detect/nccl_ordering_stall.py",
           'heads = st.index[st["parent"] < 0].to_numpy()', "heads = st.index.to_numpy()", ORDERING),
    Mutant("ordering: any kernel ending at the same time is a participant", "nsysan/attribution/participants.py",
           'links = links[(links["agree"] >= links["common"]) & (links["common"] >= need)].reset_index()',
           'links = links[links["agree"] >= 1].reset_index()', ORDERING),
    Mutant("slowdown: kernels grouped by short name", "nsysan/detect/comm_compute_slowdown.py",
           'k["sig"] = k.groupby(["name", "grid", "block"], observed=True, dropna=False).ngroup()',
           'k["sig"] = k.groupby(["short_name", "grid", "block"], observed=True, dropna=False).ngroup()', SLOWDOWN),
    Mutant("slowdown: copies pooled with NCCL as one communication class", "nsysan/detect/comm_compute_slowdown.py",
           'base = {"export": copies["export"], "cls": kind.map(_COPY_CLASS),',
           'base = {"export": copies["export"], "cls": 0,', SLOWDOWN),
    Mutant("slowdown: impact x1.2", "nsysan/detect/comm_compute_slowdown.py",
           "def _finding(e: pd.DataFrame, impact: int, run: int) -> Finding:\n",
           "def _finding(e: pd.DataFrame, impact: int, run: int) -> Finding:\n    impact = int(impact * 1.2)\n",
           SLOWDOWN),
    Mutant("graph gaps: producer from kernels only", "nsysan/detect/graph_allreduce_gap.py",
           "parts = [p[_OP_COLUMNS] for p in (kernels, copies, sets) if len(p)]",
           "parts = [p[_OP_COLUMNS] for p in (kernels,) if len(p)]", GRAPH_CBF),
    Mutant("command buffer full: clustering gap 1 ms -> 10 ms", "nsysan/detect/command_buffer_full.py",
           "cluster_gap_ns: int = param(1_000_000,", "cluster_gap_ns: int = param(10_000_000,", GRAPH_CBF),
    Mutant("severity thresholds swapped", "nsysan/detect/common.py",
           'warning_share: float = param(0.01, "impact / run length at which a finding becomes a warning")\n'
           '    critical_share: float = param(0.05,',
           'warning_share: float = param(0.05, "impact / run length at which a finding becomes a warning")\n'
           '    critical_share: float = param(0.01,', SEVERITY),
    Mutant("slices: each slice weighed against its own run, not the export's", "nsysan/analysis.py",
           "            with trace.export_alone(index, part, run) as one:",
           "            with trace.export_alone(index, part, None) as one:", SLICES),
    Mutant("slices: rows without a process read by no slice", "nsysan/ingest/slices.py",
           'cond = f"{pid} IS NULL" + (', 'cond = f"{pid} IS NULL AND 0" + (', SLICES),
    Mutant("transport: a receiver asleep on its doorbell is never rung", "nsysan/transport/p2p.py",
           "        if self._peer_sleepers[peer][0]:\n", "        if False:\n", WAKEUPS),
    Mutant("transport: every descriptor rings, even for a peer that polls", "nsysan/transport/p2p.py",
           "        if self._peer_sleepers[peer][0]:\n", "        if True:\n", WAKEUPS),
    Mutant("slowdown: an instance beside compute on another stream blamed on NCCL anyway",
           "nsysan/detect/comm_compute_slowdown.py",
           'k["ambiguous"] = (k["cls"] > 0) & (k["compute_share"] >= p.overlap_share)',
           'k["ambiguous"] = (k["cls"] > 0) & (k["compute_share"] > 1.0)',
           ("tests/test_slowdown_positions.py", "-k", "beside_compute_on")),
    Mutant("slowdown: one group per communication class, not per cause", "nsysan/detect/comm_compute_slowdown.py",
           'key = np.where(k["slowed"], _primary(k["cls"].to_numpy()), -1)', 'key = np.where(k["slowed"], k["cls"], -1)',
           ("tests/test_slowdown_positions.py", "-k", "one_group")),
    Mutant("ordering: ops with unknown participants dropped silently", "nsysan/detect/nccl_ordering_stall.py",
           "unknown = b[held & unsure & (a_start[b] - ready[b] >= p.min_stall_ns)]",
           "unknown = b[held & unsure & (a_start[b] - ready[b] >= p.min_stall_ns) & False]",
           ("tests/test_detectors.py", "-k", "dropped_silently")),
    Mutant("cache: an export's identity from its first MiB only", "nsysan/ingest/cache_home.py",
           "while chunk := fh.read(CHUNK_BYTES):", "for chunk in (fh.read(CHUNK_BYTES),):",
           ("tests/test_cache.py", "-k", "first_mib")),
    Mutant("reads: no progress handler (Ctrl-C and the time limit wait for SQLite)", "nsysan/ingest/export.py",
           "dbapi.set_progress_handler(lambda: time.monotonic() > self._deadline, _PROGRESS_STEPS)",
           "dbapi.set_progress_handler(None, _PROGRESS_STEPS)",
           ("tests/test_hostile.py", "-k", "ctrl_c or time_limit")),
    Mutant("shared stream: ops of one communicator reported", "nsysan/detect/shared_nccl_stream.py",
           "ok = held & (signature[b] != signature[ab])", "ok = held", SHARED_STREAM),
    Mutant("shared stream: B's participants' readiness ignored", "nsysan/detect/shared_nccl_stream.py",
           "free_at = np.fmax(ready[b], peers_ready)", "free_at = ready[b] + 0 * peers_ready", SHARED_STREAM),
    Mutant("shared stream: stalls behind a late rank reported twice", "nsysan/detect/shared_nccl_stream.py",
           "held &= ~np.isin(b, late)", "held &= np.isin(b, b)", SHARED_STREAM),
    Mutant("shared stream: one communicator's order taken for a doubt", "nsysan/detect/shared_nccl_stream.py",
           "len(other) >= 2 and other < mine", "len(other) >= 2 and other <= mine", SHARED_STREAM),
    Mutant("shared stream: any kernel's or stream's smaller sets raise a doubt", "nsysan/detect/shared_nccl_stream.py",
           "sets_of.get((int(rank[i]), int(stream[i]), int(name[i])), [])", "sum(sets_of.values(), [])",
           SHARED_STREAM),
    Mutant("shared stream: a smaller set seen once raises a doubt", "nsysan/detect/shared_nccl_stream.py",
           'seen = seen[seen["count"] >= 2]', 'seen = seen[seen["count"] >= 1]', SHARED_STREAM),
    Mutant("shared stream: a named communicator taken for a doubt", "nsysan/detect/shared_nccl_stream.py",
           "if mine is None or not unnamed[i]:", "if mine is None:", SHARED_STREAM),
    Mutant("shared stream: doubtful waits queued one behind the other summed", "nsysan/detect/common.py",
           'merged = merge(waits, ["rank", "stream"])', "merged = waits", SHARED_STREAM),
    Mutant("shared stream: the wait before A started counted as A's", "nsysan/detect/shared_nccl_stream.py",
           "free_at = np.fmax(free_at, a_start[ab])", "free_at = free_at + 0 * a_start[ab]", SHARED_STREAM),
    Mutant("shared stream: the ordering detector's stalls judged with its defaults, not as set",
           "nsysan/detect/shared_nccl_stream.py", "ordering_params or ordering.Params()", "ordering.Params()",
           SHARED_STREAM),
    Mutant("slowdown: any kernel's same grid elsewhere taken as its baseline", "nsysan/detect/comm_compute_slowdown.py",
           ".str.contains(_SHAPE_FIXES_WORK)", '.str.contains("")', SLOWDOWN_POSITIONS),
    Mutant("slowdown: clean runs at one position taken as a signature baseline",
           "nsysan/detect/comm_compute_slowdown.py", "(positions.reindex(stats.index) >= 2)",
           "(positions.reindex(stats.index) >= 1)", SLOWDOWN_POSITIONS),
    Mutant("transport: a SIGTERMed rank leaves its segments", "nsysan/transport/p2p.py",
           'own(f"{self._files}{rank}-")', 'str(f"{self._files}{rank}-")',
           ("tests/test_transport.py", "-k", "teardown")),
)  # fmt: skip


def killed(mutant: Mutant, timeout_s: int = 900) -> tuple[bool, str]:
    """Apply ``mutant`` to a copy of the repository and run its tests: (whether a test failed, last
    line). Only failed tests count (pytest's exit 1): an error of the run itself (nothing collected,
    a collection error, an internal error) raises, so it cannot pass for a caught mutant."""
    with tempfile.TemporaryDirectory(prefix="nsysan-mutant-") as tmp:
        root = Path(tmp)
        for name in _COPY:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", "samples"))
            else:
                shutil.copy2(source, root / name)
        (root / "fixtures" / "samples").symlink_to(REPO / "fixtures" / "samples")
        target = root / mutant.path
        text = target.read_text()
        if text.count(mutant.old) != 1:
            raise ValueError(
                f"{mutant.name}: the code to mutate is not in {mutant.path} exactly once; update the mutant"
            )
        target.write_text(text.replace(mutant.old, mutant.new))
        env = {
            **os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1",
            # the copy has no ../shared beside it: the real exports stay where this checkout finds them
            "NSYSAN_REALTRACES": str(realtraces_dir().resolve()),
            "OMP_NUM_THREADS": "1",  # mutants run side by side: one thread each
        }  # fmt: skip
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                   f"--basetemp={root / 'pytest-tmp'}", *mutant.tests]  # fmt: skip
        result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout_s, env=env)
        last = (result.stdout.strip().splitlines() or [""])[-1]
        if result.returncode not in (0, 1):
            raise RuntimeError(f"{mutant.name}: its tests did not run (pytest exit {result.returncode}: {last})")
        return result.returncode == 1, last


if __name__ == "__main__":
    names = set(sys.argv[1:])
    for m in MUTANTS:
        if names and m.name not in names:
            continue
        caught, line = killed(m)
        print(f"{'caught' if caught else 'MISSED'}  {m.name}  ({line})", flush=True)
