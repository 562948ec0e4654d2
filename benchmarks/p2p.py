"""P2P benchmark: nsysan's transport vs gloo send/recv vs a raw copy of the same bytes (CPU).

    python benchmarks/p2p.py [--max-mib 256] [--repeat 3]

Two processes on this host, side by side in one run:

* latency (4 B .. 64 KiB): ping-pong, rank 0 sends, rank 1 answers with the same size; the one-way
  time is half a round trip;
* bandwidth (64 KiB .. 256 MiB): rank 0 posts ``count`` sends back to back, rank 1 receives them and
  answers with one small message; bytes moved over rank 0's elapsed time.

Ways: ``p2p`` (the transport sending an ordinary tensor), ``p2p empty()`` (sending a tensor made by
``transport.empty()``: the receiver copies straight out of it), ``gloo`` (``torch.distributed``
send/recv over loopback TCP), and ``raw copy``: ``dst.copy_(src)`` of the same bytes in one process,
the machine's memory-copy speed (the physical limit; its latency column is one copy). Every cell
is the best of ``--repeat`` measurements; the raw copy is measured right before each size, since a
shared machine's copy speed drifts. Targets: 4 KiB one-way <= gloo's; at 64 MiB the transport
>= 0.8x raw (ordinary tensors) and >= 0.9x raw (empty()), >= 3x gloo.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KIB, MIB = 1024, 1 << 20
LATENCY_SIZES = [4, 64, KIB, 4 * KIB, 16 * KIB, 64 * KIB]
BANDWIDTH_SIZES = [64 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB]
WAYS = ["p2p", "p2p empty()", "gloo"]


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
    done = torch.zeros(1, dtype=torch.uint8)
    results = []

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
        for way in WAYS:
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
        if rank == 0:
            results.append(
                {"kind": "bandwidth", "way": "raw copy", "bytes": nbytes, "count": count, "seconds": raw(nbytes, count)}
            )
        bufs = {"p2p": torch.ones(nbytes, dtype=torch.uint8)}
        bufs["p2p empty()"] = t.empty(nbytes, torch.uint8) if rank == 0 else bufs["p2p"]
        bufs["p2p empty()"].fill_(1)
        out = torch.empty(nbytes, dtype=torch.uint8)
        for way in WAYS:
            best = float("inf")
            for _ in range(repeat):
                dist.barrier()
                start = time.perf_counter()
                if way == "gloo":
                    if rank == 0:
                        for _ in range(count):
                            dist.send(bufs["p2p"], 1)
                        dist.recv(done, 1)
                    else:
                        for _ in range(count):
                            dist.recv(out, 0)
                        dist.send(done, 0)
                elif rank == 0:
                    handles = [t.isend(bufs[way], 1) for _ in range(count)]
                    for h in handles:
                        h.wait()
                    t.irecv(done, 1, tag=1).wait()
                else:
                    for _ in range(count):
                        t.irecv(out, 0).wait()
                    t.isend(done, 0, tag=1).wait()
                best = min(best, time.perf_counter() - start)
            if rank == 0:
                results.append({"kind": "bandwidth", "way": way, "bytes": nbytes, "count": count, "seconds": best})
        if rank == 1:
            assert bool(out.eq(1).all()), "payload corrupted"
        del bufs
    dist.barrier()
    t.close()
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
    print(f"{'size':>8} | " + " | ".join(f"{w:>11}" for w in [*WAYS, "raw copy"]) + " | p2p/gloo time")
    for nbytes in sizes["latency"]:
        row = cell[("latency", nbytes)]
        us = {w: row[w]["seconds"] * 1e6 for w in row}
        print(f"{_size(nbytes):>8} | " + " | ".join(f"{us[w]:11.1f}" for w in [*WAYS, "raw copy"])
              + f" | {us['p2p'] / us['gloo']:13.2f}")  # fmt: skip
    print("\nbandwidth (GiB/s)")
    print(f"{'size':>8} | " + " | ".join(f"{w:>11}" for w in [*WAYS, "raw copy"])
          + " | p2p/raw | empty/raw | p2p/gloo | empty/gloo")  # fmt: skip
    summary = {}
    for nbytes in sizes["bandwidth"]:
        row = cell[("bandwidth", nbytes)]
        g = {w: nbytes * row[w]["count"] / row[w]["seconds"] / 2**30 for w in row}
        ratios = (
            g["p2p"] / g["raw copy"],
            g["p2p empty()"] / g["raw copy"],
            g["p2p"] / g["gloo"],
            g["p2p empty()"] / g["gloo"],
        )
        print(f"{_size(nbytes):>8} | " + " | ".join(f"{g[w]:11.2f}" for w in [*WAYS, "raw copy"])
              + " | " + " | ".join(f"{x:{n}.2f}" for x, n in zip(ratios, (7, 9, 8, 10))))  # fmt: skip
        if nbytes == 64 * MIB:
            summary = dict(
                zip(
                    ("p2p_over_raw", "empty_over_raw", "p2p_over_gloo", "empty_over_gloo"),
                    (round(x, 2) for x in ratios),
                )
            )
    lat4k = cell[("latency", 4 * KIB)]
    summary["p2p_4KiB_one_way_us"] = round(lat4k["p2p"]["seconds"] * 1e6, 1)
    summary["gloo_4KiB_one_way_us"] = round(lat4k["gloo"]["seconds"] * 1e6, 1)
    print("\ntargets: 4 KiB one-way <= gloo; at 64 MiB p2p >= 0.8x raw, empty() >= 0.9x raw, both >= 3x gloo")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
