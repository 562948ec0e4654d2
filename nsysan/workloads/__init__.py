"""Bundled workloads that reproduce the problems nsysan detects; run them with
``nsysan capture --workload NAME``. Each is a torchrun script (``python -m nsysan.workloads.X``)."""

from __future__ import annotations

import sys

# name -> (module, transports it supports, runs without a GPU)
WORKLOADS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "pg-scaling": ("nsysan.workloads.pg_scaling", ("gloo", "nccl"), True),
    "pipeline": ("nsysan.workloads.pipeline", ("gloo", "p2p", "nccl"), True),
    "redistribute": ("nsysan.workloads.redistribute", ("gloo", "p2p", "nccl"), True),
    "overlap": ("nsysan.workloads.overlap", ("gloo", "p2p", "nccl"), True),
    "graph-allreduce": ("nsysan.workloads.graph_allreduce", ("nccl",), False),
}


def torchrun_command(name: str, nproc: int, transport: str) -> list[str]:
    """The torchrun command line of a bundled workload."""
    module = WORKLOADS[name][0]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", module, f"--transport={transport}"]  # fmt: skip
