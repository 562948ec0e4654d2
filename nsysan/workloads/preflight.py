"""What a bundled workload needs, checked before nsys starts.

A workload that cannot run still leaves nsys a report to write, with nothing in it; the report
then says "nothing to analyse" and the user goes round in a circle. So the packages, the ranks and
the GPUs a workload needs are checked here first, and a missing one is one line naming the fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable

from nsysan.errors import InputError
from nsysan.workloads import WORKLOADS

INSTALL = 'pip install "nsysan[workloads]"'

# name -> (fewest ranks, most ranks or None), what each workload's main() refuses otherwise
RANKS: dict[str, tuple[int, int | None]] = {
    "pg-scaling": (2, None),  # one group per pair of ranks: one rank has no pair
    "pipeline": (2, None),
    "redistribute": (4, 4),  # a 2x2 mesh
    "overlap": (2, None),
    "graph-allreduce": (1, None),
}


class WorkloadCannotRun(InputError):
    """A bundled workload would fail (or record nothing) on this machine with these options."""


def cuda_devices() -> int:
    """How many CUDA devices PyTorch sees here (0 for a CPU build or no GPU)."""
    torch = importlib.import_module("torch")
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def check_workload(name: str, nproc: int, transport: str, *,
                   installed: Callable[[str], bool] = lambda module: importlib.util.find_spec(module) is not None,
                   gpus: Callable[[], int] = cuda_devices) -> None:  # fmt: skip
    """Raise :class:`WorkloadCannotRun` unless ``name`` can run with ``nproc`` ranks over
    ``transport`` in this Python, naming every missing requirement in its one line (fixing one at a
    time, run after run, is what users met); ``installed`` and ``gpus`` are the probes (tests
    replace them)."""
    problems = []
    if transport not in WORKLOADS[name][1]:
        problems.append(f"workload {name} runs with --transport {' or '.join(WORKLOADS[name][1])}")
    low, high = RANKS.get(name, (1, None))
    if high is not None and low == high and nproc != low:
        problems.append(f"workload {name} runs on exactly {low} ranks: use --nproc {low}")
    elif nproc < low:
        problems.append(f"workload {name} needs at least {low} ranks: use --nproc {low} or more")
    has_torch = installed("torch")
    if not has_torch:
        problems.append(f"workload {name} needs PyTorch, which {sys.executable} cannot import: {INSTALL} "
                        "(for the CPU-only build, install torch from PyTorch's CPU wheel index first)")  # fmt: skip
    if not installed("nvtx"):
        problems.append(f"workload {name} needs the nvtx package for its ranges and rank marks "
                        f"(without it the capture holds nothing to analyse): {INSTALL}")  # fmt: skip
    if transport == "nccl" or not WORKLOADS[name][2]:
        problems.extend(_gpu_problems(name, nproc, transport, gpus if has_torch else None))
    if problems:
        raise WorkloadCannotRun("; ".join(problems))


def _gpu_problems(name: str, nproc: int, transport: str, gpus: Callable[[], int] | None) -> list[str]:
    """Why the GPUs here do not do for a workload (or --transport nccl) that needs one per rank;
    ``gpus`` None: PyTorch is missing, so they cannot be counted yet."""
    why = "--transport nccl" if WORKLOADS[name][2] else f"workload {name}"
    if gpus is None:
        return [f"{why} needs CUDA GPUs, one per rank (counted once PyTorch imports)"]
    try:
        have = gpus()
    except Exception as exc:  # a broken torch install: say so rather than fail inside nsys
        return [f"workload {name}: PyTorch does not import ({type(exc).__name__}: {exc})"]
    if have == 0:
        other = (
            "use --transport gloo or p2p" if WORKLOADS[name][2] else "run pipeline, pg-scaling, overlap or redistribute"
        )
        return [f"{why} needs CUDA GPUs and this machine has none that PyTorch sees: {other}"]
    if have < nproc:
        return [f"{why} needs one GPU per rank: --nproc {nproc}, but PyTorch sees {have}; use --nproc {have} or fewer"]
    return []
