"""P2P benchmark: nsysan's transport vs gloo send/recv vs a raw copy of the same bytes (CPU).

    python benchmarks/p2p.py [--max-mib 256] [--repeat 3]

Two processes on this host, side by side in one run:

* latency (4 B .. 64 KiB): ping-pong, rank 0 sends, rank 1 answers with the same size; the one-way
  time is half a round trip;
* bandwidth (64 KiB .. 256 MiB): rank 0 posts ``count`` sends back to back, rank 1 receives them and
  answers with one small message; bytes moved over rank 0's elapsed time.

Ways: ``p2p`` (the transport sending an ordinary tensor, torch's default allocation: 4 KiB
pages, which go through the sender's shared-memory pool, two pipelined copies), ``p2p THP`` (an
ordinary tensor whose memory lies in transparent huge pages, as torch allocates with
``THP_MEM_ALLOC_ENABLE=1``: over 1 MiB the receiver reads it straight from the sender's memory with
``process_vm_readv``, one copy; latency sizes do not differ), ``p2p CMA 4K`` (the 4 KiB-page tensor
read directly all the same, ``cma_pages="any"``: what the transport avoids), ``p2p empty()`` (sending a tensor
made by ``transport.empty()``: the receiver copies straight out of it), ``gloo``
(``torch.distributed`` send/recv over loopback TCP), ``raw copy``: ``dst.copy_(src)`` of the
same bytes in one process (4 KiB pages), the machine's memory-copy speed (the physical limit; its
latency column is one copy), and ``2 copies`` (bandwidth only, x86-64): the same bytes pipelined
through 8 shared 1 MiB chunks by two plain copies, rank 0 in and rank 1 out, with no protocol
(two counters in shared memory, spun on): what the pool's two copies cost on this machine before
any transport overhead, the reference for ``p2p``. Every cell
is the best of ``--repeat`` measurements; for bandwidth each round measures the raw copy and every
way once, in turn, so the best of each come from the same minutes (a shared machine's copy speed
drifts). Targets: 4 KiB one-way <= gloo's; at 64 MiB the transport
>= 0.8x raw (ordinary tensors) and >= 0.9x raw (empty()), >= 3x gloo.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KIB, MIB = 1024, 1 << 20
LATENCY_SIZES = [4, 64, KIB, 4 * KIB, 16 * KIB, 64 * KIB]
BANDWIDTH_SIZES = [64 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB]
WAYS = ["p2p", "p2p THP", "p2p CMA 4K", "p2p empty()", "gloo", "2 copies"]
# The reference pipeline spins on plain loads and stores, which order as it needs only on x86-64 (TSO).
TWO_COPIES = platform.machine() in ("x86_64", "AMD64")
LATENCY_WAYS = ["p2p", "p2p empty()", "gloo"]  # small messages: the pages of the tensor do not matter
_KEEP: list[object] = []  # mappings behind the THP tensors


def _thp_tensor(nbytes: int):  # -> torch.Tensor (torch is imported in the workers)
    """An ordinary uint8 tensor in private memory advised to use transparent huge pages."""
    import ctypes
    import mmap

    import torch

    huge = 2 * MIB
    m = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    skip = (-base) % huge
    ctypes.CDLL(None).madvise(ctypes.c_void_p(base + skip), ctypes.c_size_t(nbytes), 14)  # MADV_HUGEPAGE
    _KEEP.append(m)
    return torch.frombuffer(m, dtype=torch.uint8)[skip : skip + nbytes]


class _TwoCopies:
    """Two plain copies pipelined through shared chunks: rank 0 copies in, rank 1 copies out.

    Counters (in shared memory): ``staged`` (written by rank 0) and ``taken`` (by rank 1), each
    on its own cache line. On x86-64 stores are seen in order and loads run in order, so a counter
    read before the chunk it covers is enough; each numpy access is a separate C call, so nothing
    reorders them in between."""

    CHUNK, CHUNKS = MIB, 8

    def __init__(self, rank: int, port: int, barrier) -> None:
        import numpy as np

        from nsysan.transport.shm import Segment, shm_dir

        path, size = f"{shm_dir()}/nsysan-bench-two-copies-{port}", 4096 + self.CHUNK * self.CHUNKS
        if rank == 0:  # mapped as the transport maps its pool
            self._segment = Segment(path, size, create=True)
        barrier()
        if rank == 1:
            self._segment = Segment(path, None, create=False)
        barrier()
        self._segment.unlink()
        mapped = np.frombuffer(self._segment.map, np.uint8)
        counters = mapped[:4096].view(np.int64)
        self.staged, self.taken = counters[0:1], counters[64:65]
        self.pool = mapped[4096:]

    def send(self, src) -> None:  # rank 0
        chunk, chunks, pool, data = self.CHUNK, self.CHUNKS, self.pool, src.numpy()
        base = int(self.staged[0])
        for i, at in enumerate(range(0, len(data), chunk)):
            n = min(chunk, len(data) - at)
            while base + i - int(self.taken[0]) >= chunks:
                pass
            slot = (base + i) % chunks * chunk
            pool[slot : slot + n] = data[at : at + n]
            self.staged[0] = base + i + 1

    def recv(self, out) -> None:  # rank 1
        chunk, chunks, pool, data = self.CHUNK, self.CHUNKS, self.pool, out.numpy()
        base = int(self.taken[0])
        for i, at in enumerate(range(0, len(data), chunk)):
            n = min(chunk, len(data) - at)
            while int(self.staged[0]) <= base + i:
                pass
            slot = (base + i) % chunks * chunk
            data[at : at + n] = pool[slot : slot + n]
            self.taken[0] = base + i + 1


def _count(nbytes: int) -> int:
    """Messages per bandwidth measurement: enough to amortise start-up, bounded to ~1 GiB moved."""
    return max(4, min(2000, (1 << 30) // nbytes))


def _worker(rank: int, port: int, sizes: dict[str, list[int]], repeat: int, queue: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from nsysan.transport import P2PTransport

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=dt.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    t = P2PTransport(store, rank, 2, timeout=300)
    t_cma4k = P2PTransport(
        store, rank, 2, timeout=300, namespace="cma4k", cma_pages="any"
    )  # direct reads of 4 KiB pages
    done = torch.zeros(1, dtype=torch.uint8)
    results = []
    two = _TwoCopies(rank, port, dist.barrier) if TWO_COPIES else None

    def raw(nbytes: int, count: int) -> float:
        src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
        dst.copy_(src)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(count):
                dst.copy_(src)
            best = min(best, time.perf_counter() - start)
        return best

    for nbytes in sizes["latency"]:
        count = 2000 if nbytes <= 4 * KIB else 500
        bufs = {"p2p": torch.ones(nbytes, dtype=torch.uint8), "p2p empty()": t.empty(nbytes, torch.uint8)}
        bufs["p2p empty()"].fill_(1)
        out = torch.empty(nbytes, dtype=torch.uint8)
        for way in LATENCY_WAYS:
            best = float("inf")
            for _ in range(repeat):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(count):
                    if way == "gloo":
                        if rank == 0:
                            dist.send(bufs["p2p"], 1)
                            dist.recv(out, 1)
                        else:
                            dist.recv(out, 0)
                            dist.send(bufs["p2p"], 0)
                    elif rank == 0:
                        t.isend(bufs[way], 1).wait()
                        t.irecv(out, 1).wait()
                    else:
                        t.irecv(out, 0).wait()
                        t.isend(bufs[way], 0).wait()
                best = min(best, time.perf_counter() - start)
            results.append({"kind": "latency", "way": way, "bytes": nbytes, "seconds": best / (2 * count)})
        if rank == 0:
            results.append(
                {"kind": "latency", "way": "raw copy", "bytes": nbytes, "seconds": raw(nbytes, count) / count}
            )
    for nbytes in sizes["bandwidth"]:
        count = _count(nbytes)
        bufs = {"p2p": torch.ones(nbytes, dtype=torch.uint8)}
        bufs["p2p empty()"] = t.empty(nbytes, torch.uint8) if rank == 0 else bufs["p2p"]
        bufs["p2p empty()"].fill_(1)
        bufs["p2p THP"] = _thp_tensor(nbytes) if rank == 0 else bufs["p2p"]
        bufs["p2p THP"].fill_(1)
        bufs["p2p CMA 4K"] = bufs["p2p"]
        out = torch.empty(nbytes, dtype=torch.uint8)
        raw_src, raw_dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
        ways = ["raw copy", *(w for w in WAYS if w != "2 copies" or two is not None)]
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(repeat):  # each round measures every way once: the best of each covers the same minutes
            for way in ways:
                dist.barrier()
                start = time.perf_counter()
                if way == "2 copies" and two is not None:
                    for _ in range(count):
                        if rank == 0:
                            two.send(bufs["p2p"])
                        else:
                            two.recv(out)
                    dist.barrier()  # rank 0's time includes the last chunk's copy out
                elif way == "raw copy":
                    if rank == 0:
                        for _ in range(count):
                            raw_dst.copy_(raw_src)
                elif way == "gloo":
                    if rank == 0:
                        for _ in range(count):
                            dist.send(bufs["p2p"], 1)
                        dist.recv(done, 1)
                    else:
                        for _ in range(count):
                            dist.recv(out, 0)
                        dist.send(done, 0)
                elif rank == 0:
                    tt = t_cma4k if way == "p2p CMA 4K" else t
                    handles = [tt.isend(bufs[way], 1) for _ in range(count)]
                    for h in handles:
                        h.wait()
                    tt.irecv(done, 1, tag=1).wait()
                else:
                    tt = t_cma4k if way == "p2p CMA 4K" else t
                    for _ in range(count):
                        tt.irecv(out, 0).wait()
                    tt.isend(done, 0, tag=1).wait()
                best[way] = min(best[way], time.perf_counter() - start)
        if rank == 0:
            for way, seconds in best.items():
                results.append({"kind": "bandwidth", "way": way, "bytes": nbytes, "count": count, "seconds": seconds})
        if rank == 1:
            assert bool(out.eq(1).all()), "payload corrupted"
        del bufs
        _KEEP.clear()
    dist.barrier()
    t.close()
    t_cma4k.close()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(results)


def _size(nbytes: int) -> str:
    return f"{nbytes} B" if nbytes < KIB else f"{nbytes // KIB} KiB" if nbytes < MIB else f"{nbytes // MIB} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = {"latency": LATENCY_SIZES, "bandwidth": [s for s in BANDWIDTH_SIZES if s <= args.max_mib * MIB]}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, sizes, args.repeat, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = queue.get(timeout=3600)
    for p in procs:
        p.join()

    cell: dict[tuple[str, int], dict[str, dict]] = {}
    for r in results:
        cell.setdefault((r["kind"], r["bytes"]), {})[r["way"]] = r
    print("one-way latency (us; raw copy: one copy of the bytes)")
    print(f"{'size':>8} | " + " | ".join(f"{w:>11}" for w in [*LATENCY_WAYS, "raw copy"]) + " | p2p/gloo time")
    for nbytes in sizes["latency"]:
        row = cell[("latency", nbytes)]
        us = {w: row[w]["seconds"] * 1e6 for w in row}
        print(f"{_size(nbytes):>8} | " + " | ".join(f"{us[w]:11.1f}" for w in [*LATENCY_WAYS, "raw copy"])
              + f" | {us['p2p'] / us['gloo']:13.2f}")  # fmt: skip
    print("\nbandwidth (GiB/s; 2 copies: the pool's two copies with no protocol, n/a off x86-64)")
    names = ("p2p/raw", "THP/raw", "cma4K/raw", "empty/raw", "p2p/gloo", "THP/gloo", "cma4K/gloo", "empty/gloo",
             "2copies/raw", "p2p/2copies")  # fmt: skip
    print(f"{'size':>8} | " + " | ".join(f"{w:>11}" for w in [*WAYS, "raw copy"]) + " | " + " | ".join(names))
    summary = {}
    for nbytes in sizes["bandwidth"]:
        row = cell[("bandwidth", nbytes)]
        g = {w: nbytes * row[w]["count"] / row[w]["seconds"] / 2**30 for w in row}
        ratios = [
            g[w] / g[base] for base in ("raw copy", "gloo") for w in ("p2p", "p2p THP", "p2p CMA 4K", "p2p empty()")
        ]
        two = g.get("2 copies")
        ratios += [two / g["raw copy"], g["p2p"] / two] if two else [float("nan")] * 2
        print(f"{_size(nbytes):>8} | " + " | ".join(f"{g[w]:11.2f}" if w in g else f"{'n/a':>11}" for w in [*WAYS, "raw copy"])
              + " | " + " | ".join(f"{x:{len(n)}.2f}" for x, n in zip(ratios, names, strict=True)))  # fmt: skip
        if nbytes == 64 * MIB:
            summary = {n.replace("/", "_over_"): round(x, 2) for n, x in zip(names, ratios, strict=True) if x == x}
    lat4k = cell[("latency", 4 * KIB)]
    summary["p2p_4KiB_one_way_us"] = round(lat4k["p2p"]["seconds"] * 1e6, 1)
    summary["gloo_4KiB_one_way_us"] = round(lat4k["gloo"]["seconds"] * 1e6, 1)
    print("\ntargets: 4 KiB one-way <= gloo; at 64 MiB p2p >= 0.8x raw, empty() >= 0.9x raw, both >= 3x gloo")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
