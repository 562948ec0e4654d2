"""pipeline: pipeline-parallel stages exchanging activations and gradients (1F1B-like).

Each stage receives activations from the previous stage, sends its own to the next, then runs the
backward pass the other way, so middle stages send to two peers, interleaved. ``--late-rank`` makes
one stage start every step late: through NCCL (one order per communicator) its neighbours' sends to
the *other* peer wait behind the send to the late one; through nsysan's P2P transport they do not.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from nsysan.workloads.common import annotate, init, parse

WIDTH = 256
MICROBATCHES = 4


class Links:
    """isend/irecv to other ranks through the chosen transport, with one interface."""

    def __init__(self, transport: str, rank: int, world: int) -> None:
        self.p2p = None
        if transport == "p2p":
            from nsysan.transport import P2PTransport

            self.p2p = P2PTransport(dist.distributed_c10d._get_default_store(), rank, world, timeout=120)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int):
        return self.p2p.isend(tensor, dst, tag) if self.p2p else dist.isend(tensor, dst, tag=tag)

    def irecv(self, out: torch.Tensor, src: int, tag: int):
        return self.p2p.irecv(out, src, tag) if self.p2p else dist.irecv(out, src, tag=tag)

    def close(self) -> None:
        if self.p2p:
            self.p2p.close()


def _timed_wait(handle: Any) -> float:
    """Wait for a transfer; the seconds it took (what the transport costs a stage)."""
    start = time.perf_counter()
    handle.wait()
    return time.perf_counter() - start


def main() -> None:
    args = parse(__doc__.splitlines()[0], ("gloo", "p2p", "nccl"))
    rank, world, device = init(args.transport)
    if world < 2:
        raise SystemExit("pipeline needs at least 2 ranks (--nproc 2 or more)")
    late_rank, late_s = world // 2, 0.02
    links = Links(args.transport, rank, world)
    weight = torch.eye(WIDTH, device=device) * 1.01
    prev, nxt = rank - 1, rank + 1
    step_seconds, wait_seconds = [], []
    for step in range(args.steps):
        pending, waited = [], 0.0
        start = time.perf_counter()
        with annotate(f"step {step}"):
            if rank == late_rank:
                with annotate("late start"):
                    time.sleep(late_s)
            acts = []
            for mb in range(MICROBATCHES):
                with annotate(f"forward mb{mb}"):
                    x = torch.full((64, WIDTH), float(mb + 1), device=device)
                    if prev >= 0:
                        waited += _timed_wait(links.irecv(x, prev, tag=mb))
                    x = x @ weight
                    acts.append(x)
                    if nxt < world:
                        with annotate(f"send activation to {nxt}"):
                            pending.append(links.isend(x.clone(), nxt, tag=mb))
            for mb in reversed(range(MICROBATCHES)):
                with annotate(f"backward mb{mb}"):
                    g = torch.ones_like(acts[mb])
                    if nxt < world:
                        waited += _timed_wait(links.irecv(g, nxt, tag=100 + mb))
                    g = g @ weight.T
                    if prev >= 0:
                        with annotate(f"send gradient to {prev}"):
                            pending.append(links.isend(g.clone(), prev, tag=100 + mb))
            for handle in pending:
                waited += _timed_wait(handle)
        step_seconds.append(time.perf_counter() - start)
        wait_seconds.append(waited)
        if rank == world - 1:  # micro-batch 0 started as ones and went through every stage's weight
            assert torch.allclose(acts[0], torch.full_like(acts[0], 1.01**world)), "activations corrupted"
    medians = torch.tensor([statistics.median(step_seconds), statistics.median(wait_seconds)], device=device)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)  # a pipeline step ends with its slowest stage
    if rank == 0:
        step_ms, wait_ms = (x * 1e3 for x in medians.tolist())
        print(f"pipeline [{args.transport}]: {MICROBATCHES} micro-batches of {64 * WIDTH * 4 // 1024} KiB, "
              f"per-step time (median of {args.steps}, slowest rank): {step_ms:.2f} ms, "
              f"of which waiting for transfers {wait_ms:.2f} ms (stage {late_rank} starts {late_s * 1e3:.0f} ms late)")  # fmt: skip
    dist.barrier()
    links.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
