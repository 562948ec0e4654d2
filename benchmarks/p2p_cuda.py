"""CUDA P2P check and benchmark: nsysan's transport (CUDA IPC pull on a per-peer copy stream) vs a
device copy in one process vs NCCL send/recv. Needs a GPU.

    python benchmarks/p2p_cuda.py [--max-mib 256] [--repeat 3]

Two processes. With two or more GPUs rank r uses GPU r (a P2P or PCIe copy between devices), and
NCCL send/recv is measured too; with one GPU both ranks share it (what CUDA IPC allows and NCCL
refuses), so the copy is device to device on one GPU and NCCL is skipped.

1. Check (default route, then IPC pulls at every size): random payloads of several dtypes and shapes (a non-contiguous source among them, and
   CUDA to host and host to CUDA), sent in tag order and received in reverse order, each source
   overwritten as soon as its send completes; every receive compared bit for bit.
2. Latency (4 B .. 1 MiB): ping-pong of CUDA tensors; one-way time is half a round trip, through
   the transport's default route (host memory up to ``cuda_host_bytes``, 64 KiB) and through an
   IPC pull at every size (``cuda_host_bytes=-1``).
3. Bandwidth (256 KiB .. 256 MiB), GiB/s of:
   ``copy_`` (``dst.copy_(src)`` from rank 0's GPU to rank 1's, or within the one GPU, one process),
   ``p2p`` (rank 0 ``isend`` of a CUDA tensor, rank 1 ``irecv``: a pull through CUDA IPC) and
   ``nccl`` (``torch.distributed`` send/recv on an NCCL group, two GPUs only).

Each timing is the best of ``--repeat``; record results in docs/transport.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import queue as queues
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2p import _size  # run as a script: benchmarks/ is on the path

KIB, MIB = 1024, 1 << 20
SIZES = [256 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB]
LATENCY_SIZES = [4, 4 * KIB, 64 * KIB, 256 * KIB, MIB]
# (dtype name, shape, sender's device, receiver's device, transposed source)
CHECK_CASES = [
    ("float32", (1,), "cuda", "cuda", False),
    ("float16", (3, 5), "cuda", "cuda", False),
    ("bfloat16", (1000,), "cuda", "cuda", False),
    ("int64", (257, 3), "cuda", "cuda", False),
    ("uint8", (4 * MIB + 3,), "cuda", "cuda", False),
    ("float64", (512, 384), "cuda", "cuda", True),
    ("int32", (70_000,), "cuda", "cpu", False),
    ("int16", (8,), "cpu", "cuda", False),
    ("float32", (16_000,), "cpu", "cuda", False),
    ("float32", (300_000,), "cpu", "cuda", False),
    ("float32", (16 * MIB,), "cuda", "cuda", False),
]


def _payload(case: int, device, torch):  # -> torch.Tensor, the same on both ranks
    name, shape, _, _, transposed = CHECK_CASES[case]
    dtype = getattr(torch, name)
    if transposed:
        shape = tuple(reversed(shape))
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator(device="cpu").manual_seed(1000 + case)
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    if dtype.is_floating_point:  # no NaN patterns: equal bits then also compare equal
        raw = raw.view(dtype).nan_to_num(0.0).view(torch.uint8)
    t = raw.view(dtype).reshape(shape).to(device)
    return t.t() if transposed else t


def _check(rank: int, t, device, torch) -> int:
    """Out-of-order receives of random payloads, sources overwritten after each send completes."""
    if rank == 0:
        sources = [_payload(i, device if c[2] == "cuda" else "cpu", torch) for i, c in enumerate(CHECK_CASES)]
        for i, src in enumerate(sources):
            t.isend(src, 1, tag=i).wait()
            src.fill_(0)  # the receiver must already have its copy
        return len(sources)
    outs = {}
    handles = []
    for i in reversed(range(len(CHECK_CASES))):
        expected = _payload(i, "cpu", torch)
        out = torch.empty(expected.shape, dtype=expected.dtype, device=device if CHECK_CASES[i][3] == "cuda" else "cpu")
        outs[i] = (out, expected.contiguous())
        handles.append(t.irecv(out, 0, tag=i))
    for h in handles:
        h.wait()
    bad = [
        i
        for i, (out, expected) in outs.items()
        if not torch.equal(out.cpu().view(torch.uint8), expected.view(torch.uint8))
    ]
    if bad:
        raise SystemExit(f"check failed: payloads {bad} differ ({[CHECK_CASES[i] for i in bad]})")
    return len(outs)


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
    t_ipc = P2PTransport(store, rank, 2, timeout=300, namespace="ipc", cuda_host_bytes=-1)
    results: list[dict] = []

    def barrier(name: str) -> None:
        store.add(name, 1)
        while int(store.add(name, 0)) < 2:
            time.sleep(0.001)

    checked = _check(rank, t, device, torch) + _check(rank, t_ipc, device, torch)  # default route, then all IPC
    barrier("checked")
    for nbytes in LATENCY_SIZES:
        count = 300
        buf = torch.ones(nbytes, dtype=torch.uint8, device=device)
        out = torch.empty(nbytes, dtype=torch.uint8, device=device)
        for way, tt in (("p2p", t), ("p2p IPC", t_ipc)):
            best = float("inf")
            for rep in range(repeat + 1):
                barrier(f"lat/{way}/{nbytes}/{rep}")
                start = time.perf_counter()
                for _ in range(count):
                    if rank == 0:
                        tt.isend(buf, 1).wait()
                        tt.irecv(out, 1).wait()
                    else:
                        tt.irecv(out, 0).wait()
                        tt.isend(buf, 0).wait()
                if rep:
                    best = min(best, time.perf_counter() - start)
            results.append({"kind": "latency", "way": way, "bytes": nbytes, "us": best / (2 * count) * 1e6})
    for nbytes in sizes:
        count = max(4, min(200, (4 << 30) // nbytes))
        src = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
        out = torch.empty(nbytes, dtype=torch.uint8, device=device)
        ways = ["p2p", *(["nccl"] if gpus > 1 else [])]
        for way in ways:  # 256 KiB and more: the IPC pull
            best = float("inf")
            for rep in range(repeat + 1):  # the first round opens IPC handles: not timed
                barrier(f"{way}/{nbytes}/{rep}")
                torch.cuda.synchronize()
                start = time.perf_counter()
                if way == "p2p":  # posted back to back, as the copies queue on the GPU
                    for h in [t.isend(src, 1) if rank == 0 else t.irecv(out, 0) for _ in range(count)]:
                        h.wait()
                for _ in range(count if way == "nccl" else 0):
                    if rank == 0:
                        dist.send(src, 1)
                    else:
                        dist.recv(out, 0)
                torch.cuda.synchronize()
                if rep:
                    best = min(best, time.perf_counter() - start)
            results.append({"kind": "bandwidth", "way": way, "bytes": nbytes, "gib_s": nbytes * count / best / 2**30})
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
            queue.put(("copy_", nbytes, nbytes * count / best / 2**30))
        if rank == 1 and not bool(out.eq(7).all()):
            raise SystemExit("bandwidth payload corrupted")
    barrier("end")
    t.close()
    t_ipc.close()
    if gpus > 1:
        dist.destroy_process_group()
    if rank == 1:
        queue.put((gpus, checked, torch.cuda.get_device_name(device), results))


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
    copies: dict[int, float] = {}
    while True:
        try:
            item = queue.get(timeout=2)
        except queues.Empty:
            if any(p.exitcode for p in procs):  # a rank failed: the other would wait for it
                for p in procs:
                    p.kill()
                raise SystemExit(f"a rank failed (exit codes {[p.exitcode for p in procs]})") from None
            continue
        if item[0] == "copy_":
            copies[item[1]] = item[2]
        else:
            gpus, checked, name, results = item
            break
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a rank exited with {p.exitcode}")
    print(f"{gpus} x {name}: {'between two devices' if gpus > 1 else 'both ranks on one device'}")
    print(f"check: {checked} payloads bit-exact (out-of-order receives, sources overwritten after each send)")
    for way in ("p2p", "p2p IPC"):
        lat = [r for r in results if r["kind"] == "latency" and r["way"] == way]
        print(f"latency one way, {way} (us): " + ", ".join(f"{_size(r['bytes'])} {r['us']:.1f}" for r in lat))
    table: dict[int, dict[str, float]] = {}
    for r in results:
        if r["kind"] == "bandwidth":
            table.setdefault(r["bytes"], {})[r["way"]] = r["gib_s"]
    for nbytes, gib_s in copies.items():
        table[nbytes]["copy_"] = gib_s
    ways = ["copy_", "p2p", *(["nccl"] if gpus > 1 else [])]
    print("bandwidth, GiB/s")
    print(
        f"{'size':>8} | " + " | ".join(f"{w:>8}" for w in ways) + " | p2p/copy_" + (" | p2p/nccl" if gpus > 1 else "")
    )
    for nbytes, row in sorted(table.items()):
        line = (
            f"{_size(nbytes):>8} | "
            + " | ".join(f"{row[w]:8.2f}" for w in ways)
            + f" | {row['p2p'] / row['copy_']:9.2f}"
        )
        print(line + (f" | {row['p2p'] / row['nccl']:8.2f}" if gpus > 1 else ""))


if __name__ == "__main__":
    main()
