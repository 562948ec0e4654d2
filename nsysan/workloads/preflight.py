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
    ``transport`` in this Python; ``installed`` and ``gpus`` are the probes (tests replace them)."""
    if transport not in WORKLOADS[name][1]:
        raise WorkloadCannotRun(f"workload {name} runs with --transport {' or '.join(WORKLOADS[name][1])}")
    low, high = RANKS.get(name, (1, None))
    if high is not None and low == high and nproc != low:
        raise WorkloadCannotRun(f"workload {name} runs on exactly {low} ranks: use --nproc {low}")
    if nproc < low:
        raise WorkloadCannotRun(f"workload {name} needs at least {low} ranks: use --nproc {low} or more")
    if not installed("torch"):
        raise WorkloadCannotRun(f"workload {name} needs PyTorch, which {sys.executable} cannot import: {INSTALL} "
                                "(for the CPU-only build, install torch from PyTorch's CPU wheel index first)")  # fmt: skip
    if not installed("nvtx"):
        raise WorkloadCannotRun(f"workload {name} needs the nvtx package for its ranges and rank marks "
                                f"(without it the capture holds nothing to analyse): {INSTALL}")  # fmt: skip
    needs_gpu = transport == "nccl" or not WORKLOADS[name][2]
    if not needs_gpu:
        return
    try:
        have = gpus()
    except Exception as exc:  # a broken torch install: say so rather than fail inside nsys
        raise WorkloadCannotRun(f"workload {name}: PyTorch does not import ({type(exc).__name__}: {exc})") from None
    why = "--transport nccl" if WORKLOADS[name][2] else f"workload {name}"
    if have == 0:
        other = (
            "use --transport gloo or p2p" if WORKLOADS[name][2] else "run pipeline, pg-scaling, overlap or redistribute"
        )
        raise WorkloadCannotRun(f"{why} needs CUDA GPUs and this machine has none that PyTorch sees: {other}")
    if have < nproc:
        raise WorkloadCannotRun(f"{why} needs one GPU per rank: --nproc {nproc}, but PyTorch sees {have}; "
                                f"use --nproc {have} or fewer")  # fmt: skip
