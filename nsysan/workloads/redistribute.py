"""redistribute: a sharded tensor on a 2x2 mesh moved from [S(0), S(1)] to [S(1), S(0)].

Rank (i, j) of the mesh (rank = 2i + j) holds block (i, j) of the tensor before and needs block
(j, i) after. Two ways, compared on volume and time:

* the rule-based collective sequence, one mesh dimension at a time: all-gather over mesh dim 1
  ([S(0), R]), all-gather over mesh dim 0 ([R, R]), then keep the local block ([S(1), S(0)]):
  each rank receives 3 blocks, 12 in all;
* direct point-to-point: only the off-diagonal ranks (0, 1) and (1, 0) swap blocks: 2 in all.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from nsysan.workloads.common import annotate, init, parse
from nsysan.workloads.pipeline import Links

BLOCK = 1024


def block(i: int, j: int, device: torch.device) -> torch.Tensor:
    """Block (i, j) of the global tensor, the same on every rank (for checking)."""
    base = (i * 2 + j) * BLOCK * BLOCK
    return (torch.arange(BLOCK * BLOCK, device=device, dtype=torch.float32) + base).reshape(BLOCK, BLOCK)


def main() -> None:
    args = parse(__doc__.splitlines()[0], ("gloo", "p2p", "nccl"))
    rank, world, device = init(args.transport)
    if world != 4:
        raise SystemExit("redistribute runs on a 2x2 mesh: use --nproc 4")
    i, j = divmod(rank, 2)
    rows = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # mesh dim 1: same i
    cols = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # mesh dim 0: same j
    links = Links(args.transport, rank, world)
    mine = block(i, j, device)
    want = block(j, i, device)
    block_bytes = mine.numel() * mine.element_size()
    timings: dict[str, list[float]] = {"collectives": [], "p2p": []}
    for step in range(args.steps):
        with annotate(f"step {step} collectives"):
            start = time.perf_counter()
            with annotate("all_gather mesh dim 1 -> [S(0), R]"):
                row = [torch.empty_like(mine) for _ in range(2)]
                dist.all_gather(row, mine, group=rows[i])
                row_block = torch.cat(row, dim=1)  # row-block i, every column
            with annotate("all_gather mesh dim 0 -> [R, R]"):
                full = [torch.empty_like(row_block) for _ in range(2)]
                dist.all_gather(full, row_block, group=cols[j])
                whole = torch.cat(full, dim=0)
            with annotate("local slice -> [S(1), S(0)]"):
                result = whole[j * BLOCK : (j + 1) * BLOCK, i * BLOCK : (i + 1) * BLOCK].contiguous()
            timings["collectives"].append(time.perf_counter() - start)
            assert torch.equal(result, want), "collective redistribution is wrong"
        dist.barrier()
        with annotate(f"step {step} p2p"):
            start = time.perf_counter()
            if i == j:
                result = mine.clone()
            else:
                peer = 2 * j + i
                out = torch.empty_like(mine)
                with annotate(f"swap block with rank {peer}"):
                    recv = links.irecv(out, peer, tag=step)
                    send = links.isend(mine, peer, tag=step)
                    recv.wait()
                    send.wait()
                result = out
            timings["p2p"].append(time.perf_counter() - start)
            assert torch.equal(result, want), "p2p redistribution is wrong"
        dist.barrier()
    for way, moved in (("collectives", 12), ("p2p", 2)):
        slowest = torch.tensor([min(timings[way])], device=device)  # a redistribution ends with its slowest rank
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"redistribute [{args.transport}] {way}: {moved} blocks = {moved * block_bytes / 2**20:.0f} MiB moved, "
                  f"slowest rank's best of {args.steps}: {slowest.item() * 1e3:.1f} ms")  # fmt: skip
        per_step = torch.tensor(timings[way], device=device)  # each step ends with its slowest rank
        dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
        if rank == 0:
            steps = ", ".join(f"{x * 1e3:.1f}" for x in per_step.tolist())
            print(f"redistribute [{args.transport}] {way}: per-step time (slowest rank), ms: {steps}")
    dist.barrier()
    links.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
