"""A 4-process gloo job for the real-nsys test: NVTX ranges per step, and a JSON record per rank of
what it did (pid, rank, ranges) so the test can check the trace against it."""

import json
import os
import sys

import nvtx
import torch
import torch.distributed as dist

STEPS = 3

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
nvtx.mark(message=f"nsysan rank={rank} local_rank={os.environ['LOCAL_RANK']} world_size={world}", domain="nsysan")
for step in range(STEPS):
    with nvtx.annotate(f"step {step}", domain="train"):
        grads = torch.full((4096,), float(rank + 1))
        with nvtx.annotate("all_reduce", domain="train"):
            dist.all_reduce(grads)
        assert grads[0].item() == world * (world + 1) / 2
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
    json.dump(
        {
            "rank": rank,
            "pid": os.getpid(),
            "world_size": world,
            "ranges": sorted([f"step {s}" for s in range(STEPS)] + ["all_reduce"] * STEPS),
        },
        fh,
    )
