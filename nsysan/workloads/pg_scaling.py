"""pg-scaling: one two-rank process group per pair of ranks, each running all_reduce.

Jobs that build many small groups (pipeline and expert parallelism) pay per-group set-up and
per-group communicators; this shows both in nsys, one NVTX range per group and operation.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from nsysan.workloads.common import annotate, init, parse


def main() -> None:
    args = parse(__doc__.splitlines()[0], ("gloo", "nccl"))
    rank, world, device = init(args.transport)
    pairs = list(itertools.combinations(range(world), 2))
    groups = {}
    with annotate(f"create {len(pairs)} pair groups"):
        for pair in pairs:  # every rank creates every group, in the same order
            groups[pair] = dist.new_group(list(pair))
    tensor = torch.ones(1 << 16, device=device) * (rank + 1)
    for step in range(args.steps):
        with annotate(f"step {step}"):
            for pair in pairs:
                if rank in pair:
                    with annotate(f"all_reduce pg{pair[0]}-{pair[1]}"):
                        out = tensor.clone()
                        dist.all_reduce(out, group=groups[pair])
                        assert out[0].item() == sum(p + 1 for p in pair)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
