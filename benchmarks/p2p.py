"""P2P benchmark: nsysan's transport vs gloo send/recv vs a raw copy of the same bytes (CPU).

    python benchmarks/p2p.py [--max-mib 256] [--repeat 3]

Two processes on this host; rank 0 sends ``count`` messages of each size to rank 1, back to back,
and rank 1 answers with one small message when all arrived; the elapsed time on rank 0 gives the
bandwidth, and at small sizes the per-message time. Three ways to move the bytes, measured side by
side in the same processes:

* ``p2p pinned``: the transport sending from a tensor made by ``transport.empty()`` (one copy);
* ``p2p staged``: the transport sending an ordinary tensor (copied into a staging segment first);
* ``gloo``: ``torch.distributed.send``/``recv`` over loopback TCP;

and ``raw copy``: one ``dst.copy_(src)`` of the same bytes in one process, the machine's memory
copy bandwidth, the physical limit. Targets (issue 4, at 64 MiB): transport >= 0.5x raw copy and
>= 3x gloo.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KIB = 1024


def _count(nbytes: int) -> int:
    """Messages per measurement: enough to amortise start-up, bounded to ~1 GiB moved."""
    return max(3, min(2000, (1 << 30) // nbytes))


def _worker(rank: int, port: int, sizes: list[int], repeat: int, queue: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from nsysan.transport import P2PTransport

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=dt.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    t = P2PTransport(store, rank, 2, timeout=300)
    done = torch.zeros(1)
    results = []
    for nbytes in sizes:
        numel = nbytes // 4
        count = _count(nbytes)
        pinned = t.empty(numel) if rank == 0 else None
        ordinary = torch.ones(numel)
        out = torch.empty(numel)
        for way in ("p2p pinned", "p2p staged", "gloo"):
            times = []
            for _ in range(repeat):
                dist.barrier()
                start = time.perf_counter()
                if rank == 0:
                    if way == "gloo":
                        for _ in range(count):
                            dist.send(ordinary, 1)
                        dist.recv(done, 1)
                    else:
                        src = pinned if way == "p2p pinned" else ordinary
                        for _ in range(count):  # a pinned buffer may only be reused once its send completed
                            t.isend(src, 1).wait()
                        t.irecv(done, 1, tag=1).wait()
                else:
                    if way == "gloo":
                        for _ in range(count):
                            dist.recv(out, 0)
                        dist.send(done, 0)
                    else:
                        for _ in range(count):
                            t.irecv(out, 0).wait()
                        t.isend(done, 0, tag=1).wait()
                times.append(time.perf_counter() - start)
            if rank == 0:
                results.append({"way": way, "bytes": nbytes, "count": count, "seconds": statistics.median(times)})
        if rank == 0:
            src, dst = torch.ones(numel), torch.empty(numel)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                for _ in range(count):
                    dst.copy_(src)
                times.append(time.perf_counter() - start)
            results.append({"way": "raw copy", "bytes": nbytes, "count": count, "seconds": statistics.median(times)})
    dist.barrier()
    t.close()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [4 * KIB, 64 * KIB, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
    sizes = [s for s in sizes if s <= args.max_mib << 20]
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

    table: dict[int, dict[str, dict]] = {}
    for r in results:
        r["gib_s"] = r["bytes"] * r["count"] / r["seconds"] / 2**30
        r["us_per_message"] = r["seconds"] / r["count"] * 1e6
        table.setdefault(r["bytes"], {})[r["way"]] = r
    ways = ["p2p pinned", "p2p staged", "gloo", "raw copy"]
    print(f"{'size':>9} | " + " | ".join(f"{w:>21}" for w in ways) + " | pinned/raw | pinned/gloo")
    for nbytes, row in sorted(table.items()):
        size = f"{nbytes // KIB} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
        cells = " | ".join(f"{row[w]['gib_s']:7.2f} GiB/s {row[w]['us_per_message']:8.0f} us" for w in ways)
        print(f"{size:>9} | {cells} | {row['p2p pinned']['gib_s'] / row['raw copy']['gib_s']:10.2f} | "
              f"{row['p2p pinned']['gib_s'] / row['gloo']['gib_s']:11.2f}")  # fmt: skip
    at64 = table.get(64 << 20)
    if at64:
        summary = {
            "pinned_over_raw_at_64MiB": round(at64["p2p pinned"]["gib_s"] / at64["raw copy"]["gib_s"], 2),
            "staged_over_raw_at_64MiB": round(at64["p2p staged"]["gib_s"] / at64["raw copy"]["gib_s"], 2),
            "pinned_over_gloo_at_64MiB": round(at64["p2p pinned"]["gib_s"] / at64["gloo"]["gib_s"], 2),
            "staged_over_gloo_at_64MiB": round(at64["p2p staged"]["gib_s"] / at64["gloo"]["gib_s"], 2),
        }
        print("targets at 64 MiB: transport >= 0.5x raw copy, >= 3x gloo")
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
