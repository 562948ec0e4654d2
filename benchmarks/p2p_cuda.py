"""CUDA P2P benchmark: nsysan's transport (CUDA IPC pull on a per-peer copy stream) vs a device
copy in one process vs NCCL send/recv. Needs a GPU; not yet run (none was available when written).

    python benchmarks/p2p_cuda.py [--max-mib 256] [--repeat 3]

Two processes. With two or more GPUs rank r uses GPU r (a P2P or PCIe copy between devices), and
NCCL send/recv is measured too; with one GPU both ranks share it (what CUDA IPC allows and NCCL
refuses), so the copy is device to device on one GPU and NCCL is skipped. Per size, GiB/s of:

* ``copy_``: ``dst.copy_(src)`` from rank 0's GPU to rank 1's (or within the one GPU), one process;
* ``p2p``: rank 0 ``isend`` of a CUDA tensor, rank 1 ``irecv`` (pulls it through CUDA IPC);
* ``nccl``: ``torch.distributed`` send/recv on an NCCL group (two GPUs only).

Each cell is the best of ``--repeat``; record results in docs/transport.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 1 << 20
SIZES = [MIB, 16 * MIB, 64 * MIB, 256 * MIB]


def _worker(rank: int, port: int, sizes: list[int], repeat: int, queue: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from nsysan.transport import P2PTransport

    gpus = torch.cuda.device_count()
    device = torch.device("cuda", rank if gpus > 1 else 0)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=dt.timedelta(seconds=300))
    if gpus > 1:
        dist.init_process_group("nccl", store=dist.PrefixStore("nccl", store), rank=rank, world_size=2)
    t = P2PTransport(store, rank, 2, timeout=300)
    results = []

    def barrier(name: str) -> None:
        store.add(name, 1)
        while int(store.add(name, 0)) < 2:
            time.sleep(0.001)

    for nbytes in sizes:
        count = max(4, min(200, (4 << 30) // nbytes))
        src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        out = torch.empty(nbytes, dtype=torch.uint8, device=device)
        ways = ["p2p", *(["nccl"] if gpus > 1 else [])]
        for way in ways:
            best = float("inf")
            for rep in range(repeat + 1):  # the first round opens IPC handles: not timed
                barrier(f"{way}/{nbytes}/{rep}")
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(count):
                    if way == "p2p":
                        (t.isend(src, 1) if rank == 0 else t.irecv(out, 0)).wait()
                    elif rank == 0:
                        dist.send(src, 1)
                    else:
                        dist.recv(out, 0)
                torch.cuda.synchronize()
                if rep:
                    best = min(best, time.perf_counter() - start)
            results.append({"way": way, "bytes": nbytes, "gib_s": nbytes * count / best / 2**30})
        if rank == 0:
            dst = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", 1 if gpus > 1 else 0))
            best = float("inf")
            for rep in range(repeat + 1):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(count):
                    dst.copy_(src)
                torch.cuda.synchronize()
                if rep:
                    best = min(best, time.perf_counter() - start)
            results.append({"way": "copy_", "bytes": nbytes, "gib_s": nbytes * count / best / 2**30})
        if rank == 1:
            assert bool(out.eq(1).all()), "payload corrupted"
    barrier("end")
    t.close()
    if gpus > 1:
        dist.destroy_process_group()
    if rank == 1:
        queue.put((gpus, results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no GPU here: this benchmark measures the CUDA path (benchmarks/p2p.py is the CPU one)")
    sizes = [s for s in SIZES if s <= args.max_mib * MIB]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, sizes, args.repeat, queue)) for r in range(2)]
    for p in procs:
        p.start()
    gpus, results = queue.get(timeout=3600)
    for p in procs:
        p.join()
    table: dict[int, dict[str, float]] = {}
    for r in results:
        table.setdefault(r["bytes"], {})[r["way"]] = r["gib_s"]
    ways = ["copy_", "p2p", *(["nccl"] if gpus > 1 else [])]
    print(f"{gpus} GPU(s): {'between two devices' if gpus > 1 else 'both ranks on one device'}; GiB/s")
    print(
        f"{'size':>8} | " + " | ".join(f"{w:>8}" for w in ways) + " | p2p/copy_" + (" | p2p/nccl" if gpus > 1 else "")
    )
    for nbytes, row in sorted(table.items()):
        line = (
            f"{nbytes // MIB:>4} MiB | "
            + " | ".join(f"{row[w]:8.2f}" for w in ways)
            + f" | {row['p2p'] / row['copy_']:9.2f}"
        )
        print(line + (f" | {row['p2p'] / row['nccl']:8.2f}" if gpus > 1 else ""))


if __name__ == "__main__":
    main()
