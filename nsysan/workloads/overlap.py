"""overlap: GEMMs timed alone and while a transport moves data, to measure comm-induced slowdown.

Rank 0 streams messages to rank 1 (and back) on a background thread while both ranks run the same
GEMM in a loop; each GEMM is an NVTX range saying whether communication was running. Rank 0 prints
the median GEMM time alone and overlapped, per transport. On GPUs, ``--transport nccl`` runs
all-reduces (on NCCL's own stream) beside the GEMMs instead, the situation ``comm_compute_slowdown``
measures.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch
import torch.distributed as dist

from nsysan.workloads.common import annotate, init, parse
from nsysan.workloads.pipeline import Links

GEMM = 512
MESSAGE = 16 << 20


def _gemms(a: torch.Tensor, b: torch.Tensor, count: int, label: str) -> list[float]:
    """Seconds per GEMM. On a GPU, CUDA events on the GEMM's own stream time the kernel alone (a
    device-wide synchronize would also wait for the communication running beside it)."""
    times = []
    for i in range(count):
        with annotate(f"gemm {label} {i}"):
            if a.is_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                a @ b
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                start_s = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - start_s)
    return times


def main() -> None:
    args = parse(__doc__.splitlines()[0], ("gloo", "p2p", "nccl"))
    rank, world, device = init(args.transport)
    if world < 2:
        raise SystemExit("overlap needs at least 2 ranks (--nproc 2 or more)")
    a = torch.randn(GEMM, GEMM, device=device)
    b = torch.randn(GEMM, GEMM, device=device)
    links = Links(args.transport, rank, world) if args.transport != "nccl" else None
    count = 20 * args.steps
    alone = _gemms(a, b, count, "alone")
    stop = threading.Event()

    def communicate() -> None:
        """Rank 0 decides how long data flows: a header before each message, 0 to end."""
        if device.type == "cuda":
            torch.cuda.set_device(device)  # a new thread starts on device 0
        buf = torch.ones(MESSAGE // 4, device=device)
        header = torch.zeros(1)
        if links is None:  # NCCL (its own stream): the same number of all-reduces on every rank
            for _ in range(count // 2):
                with annotate("communication"):
                    dist.all_reduce(buf)
            torch.cuda.synchronize()
            return
        while True:
            if rank == 0:
                header.fill_(0.0 if stop.is_set() else 1.0)
                links.isend(header, 1, tag=0).wait()
            else:
                links.irecv(header, 0, tag=0).wait()
            if header.item() == 0.0:
                return
            with annotate("communication"):
                if rank == 0:
                    links.isend(buf, 1, tag=1).wait()
                else:
                    links.irecv(buf, 0, tag=1).wait()

    if rank in (0, 1) or links is None:
        mover = threading.Thread(target=communicate, daemon=True)
        mover.start()
        time.sleep(0.05)
        overlapped = _gemms(a, b, count, "overlapped")
        stop.set()
        mover.join(timeout=120)
    else:
        overlapped = alone
    dist.barrier()
    if rank == 0:
        print(f"overlap [{args.transport}]: GEMM {GEMM}x{GEMM} median alone {statistics.median(alone) * 1e6:.0f} us, "
              f"while moving {MESSAGE >> 20} MiB messages {statistics.median(overlapped) * 1e6:.0f} us")  # fmt: skip
    if links is not None:
        links.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
