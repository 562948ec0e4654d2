"""What every bundled workload shares: process-group set-up and NVTX ranges in domain ``nsysan``."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

try:
    import nvtx
except ImportError:  # workloads still run; the trace just has no ranges
    nvtx = None


@contextlib.contextmanager
def annotate(message: str) -> Iterator[None]:
    if nvtx is None:
        yield
        return
    with nvtx.annotate(message, domain="nsysan"):
        yield


def parse(description: str, transports: tuple[str, ...]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--transport", choices=transports, default=transports[0])
    parser.add_argument("--steps", type=int, default=3)
    return parser.parse_args()


def init(transport: str) -> tuple[int, int, torch.device]:
    """Start the default process group: NCCL on GPUs, gloo otherwise (also under the P2P transport,
    which only needs the group's store)."""
    use_nccl = transport == "nccl"
    if use_nccl and not torch.cuda.is_available():
        raise SystemExit("this workload's --transport=nccl needs a GPU; use --transport=gloo on a CPU machine")
    dist.init_process_group("nccl" if use_nccl else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_nccl else torch.device("cpu")
    if use_nccl:
        torch.cuda.set_device(device)
    return rank, world, device
