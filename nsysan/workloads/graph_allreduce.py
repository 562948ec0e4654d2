"""graph-allreduce: N layers of matmul + all_reduce, run eagerly and as a CUDA graph replay.

With NCCL's default ``NCCL_GRAPH_MIXING_SUPPORT=1``, NCCL adds event-record / stream-wait nodes to
captured work so it can mix with uncaptured work; in replays that can leave the GPU idle before each
all-reduce (``graph_allreduce_gap``). Run it twice, with ``--mixing 1`` and ``--mixing 0``, and
compare. Needs CUDA GPUs and NCCL; capture it with ``--cuda-graph-trace=node`` (nsysan's default).
"""

from __future__ import annotations

import argparse
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("nccl",), default="nccl")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--mixing", choices=("0", "1"), default=os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "1"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "graph-allreduce needs CUDA GPUs and NCCL (it captures NCCL all-reduces in a CUDA graph); "
            "this machine has no GPU: run pipeline, pg-scaling, overlap or redistribute here"
        )
    os.environ["NCCL_GRAPH_MIXING_SUPPORT"] = args.mixing  # read by NCCL when the communicator starts

    import torch.distributed as dist

    from nsysan.workloads.common import annotate, init

    _rank, world, device = init("nccl")
    weights = [torch.randn(2048, 2048, device=device) / 45 for _ in range(args.layers)]
    x = torch.randn(512, 2048, device=device)

    def step(inp: torch.Tensor) -> torch.Tensor:
        for w in weights:
            inp = inp @ w
            dist.all_reduce(inp)
            inp = inp / world
        return inp

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture (NCCL and cuBLAS initialise here)
        for _ in range(3):
            step(x)
    torch.cuda.current_stream().wait_stream(side)
    with annotate(f"eager x{args.steps}"):
        for _ in range(args.steps):
            step(x)
        torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(x)
    with annotate(f"graph replay x{args.steps} (NCCL_GRAPH_MIXING_SUPPORT={args.mixing})"):
        for _ in range(args.steps):
            graph.replay()
        torch.cuda.synchronize()
    del out
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
