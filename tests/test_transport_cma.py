"""The transport's one-copy path for ordinary CPU tensors: the receiver reads the sender's memory
with process_vm_readv (cross-memory attach), probed once per pair, with the shared-memory pool as
the fall-back."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from tests.conftest import IN_CI
from tests.test_transport import _worker, free_port, run_ranks

torch = __import__("torch") if IN_CI else pytest.importorskip("torch")

MIB = 1 << 20


def payload(index: int, nbytes: int, dtype: str):
    """Random bytes, the same in every process for the same index, viewed as ``dtype``."""
    gen = torch.Generator().manual_seed(1000 + index)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).view(getattr(torch, dtype))


# (bytes, dtype): below, at and just over the 1 MiB threshold, odd sizes, and one big message
CASES = [
    (MIB - 8, "float64"),
    (MIB, "float32"),
    (MIB + 2, "bfloat16"),
    (MIB + 1, "uint8"),
    (3 * MIB + 12, "int32"),
    (5 * MIB + 16, "complex128"),
    (7 * MIB + 1, "bool"),
    (40 * MIB + 8, "int64"),
]


def transfers(store, rank, world, refuse):
    """Rank 0 sends every case to rank 1 twice (tags 0 and 1, the second batch posted before the
    receiver is there); the sources are overwritten as soon as each send completes."""
    import logging

    from nsysan.transport import P2PTransport, cma

    os.environ["NSYSAN_P2P_CMA"] = "always"  # read directly whatever the pages (tensors here: 4 KiB pages)

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("nsysan.transport").addHandler(Keep())
    if refuse:  # as when ptrace rules (Yama, a non-dumpable process) refuse the read
        cma.probe = lambda pid, address, expected: "EPERM: Operation not permitted"
    result = {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        result["cma_peers"] = sorted(t._cma_peers)
        if rank == 0:
            big_only = [c for c in CASES if c[0] > MIB]
            for i, (nbytes, dtype) in enumerate(big_only):
                data = payload(i, nbytes, dtype)
                t.isend(data, 1, tag=0).wait(timeout=60)
                data.view(torch.uint8).fill_(0xA5)  # the receiver has its copy: must not see this
            result["pool_after_big"] = t._pool is not None
            for i, (nbytes, dtype) in enumerate(CASES):
                data = payload(100 + i, nbytes, dtype)
                t.isend(data, 1, tag=1).wait(timeout=60)  # rank 1 posts these receives 0.2 s late
                data.view(torch.uint8).fill_(0x5A)
        else:
            bad = []
            for i, (nbytes, dtype) in enumerate(c for c in CASES if c[0] > MIB):
                out = torch.empty(nbytes, dtype=torch.uint8).view(getattr(torch, dtype))
                t.irecv(out, 0, tag=0).wait(timeout=60)
                if not torch.equal(out.view(torch.uint8), payload(i, nbytes, dtype).view(torch.uint8)):
                    bad.append((0, nbytes, dtype))
            for i, (nbytes, dtype) in enumerate(CASES):
                time.sleep(0.2)
                out = torch.empty(nbytes, dtype=torch.uint8).view(getattr(torch, dtype))
                t.irecv(out, 0, tag=1).wait(timeout=60)
                if not torch.equal(out.view(torch.uint8), payload(100 + i, nbytes, dtype).view(torch.uint8)):
                    bad.append((1, nbytes, dtype))
            result["bad"] = bad
        store.set(f"cma/{rank}", "1")
        store.wait([f"cma/{r}" for r in range(world)])
    result["logged"] = [m for m in records if "refused" in m]
    return result


def test_ordinary_tensors_over_the_threshold_are_read_from_the_sender_bit_exact():
    r = run_ranks(transfers, 2, False)
    assert r[0]["cma_peers"] == [1] and r[1]["cma_peers"] == [0]
    assert r[1]["bad"] == []
    assert r[0]["pool_after_big"] is False  # only direct reads so far: no staging pool was reserved
    assert r[0]["logged"] == r[1]["logged"] == []


def test_a_refused_probe_keeps_the_shared_memory_path_and_says_so_once():
    r = run_ranks(transfers, 2, True)
    assert r[0]["cma_peers"] == [] and r[1]["cma_peers"] == []
    assert r[1]["bad"] == []
    assert r[0]["pool_after_big"] is True  # the big messages went through the pool
    for rank in (0, 1):
        assert len(r[rank]["logged"]) == 1
        assert "process_vm_readv" in r[rank]["logged"][0] and "EPERM" in r[rank]["logged"][0]


def overwrite_at_once(store, rank, world):
    """Many sends of one buffer, each overwritten the moment its handle completes, against a
    receiver that is slow to post: every message must arrive with the value it had when sent."""
    from nsysan.transport import P2PTransport

    values = []
    with P2PTransport(store, rank, world, timeout=60, cma_pages="any") as t:
        if rank == 0:
            src = torch.empty(2 * MIB, dtype=torch.int32)
            for k in range(12):
                src.fill_(k)
                h = t.isend(src, 1, tag=3)
                while not h.is_completed():
                    time.sleep(0.001)
                h.wait()
                src.fill_(-1)
        else:
            out = torch.empty(2 * MIB, dtype=torch.int32)
            for k in range(12):
                if k % 3 == 0:
                    time.sleep(0.1)
                t.irecv(out, 0, tag=3).wait(timeout=60)
                values.append(sorted(set(out[::4097].tolist()) | {int(out[0]), int(out[-1])}))
        store.set(f"ow/{rank}", "1")
        store.wait([f"ow/{r}" for r in range(world)])
    return values


def test_a_source_overwritten_right_after_its_send_completes_does_not_reach_the_receiver():
    r = run_ranks(overwrite_at_once, 2)
    assert r[1] == [[k] for k in range(12)]


def dies_during_read(store, rank, world, *, before_its_pidfd_says_so: bool = False):
    """Rank 0 sends 32 MiB and is killed (by rank 1) while rank 1 reads it. With
    ``before_its_pidfd_says_so``, the read fails (ESRCH: the dying sender's memory is gone) while its
    pidfd does not say it ended yet, the race seen in 1 of 4 kills."""
    import signal

    from nsysan.transport import P2PTransport, PeerDied, cma

    t = P2PTransport(store, rank, world, timeout=30, cma_pages="any")
    if rank == 0:
        t.isend(torch.ones(8 * MIB), 1, tag=5)
        time.sleep(60)  # killed by rank 1 long before this
        return {}
    real_read = cma.read

    def read_then_kill(pid, local, remote, nbytes):
        real_read(pid, local, remote, MIB)  # the first MiB arrives
        os.kill(pid, signal.SIGKILL)
        watch = t._cma_watch[0]
        deadline = time.monotonic() + 10
        while not watch.ended() and time.monotonic() < deadline:
            time.sleep(0.001)
        if before_its_pidfd_says_so:
            told = watch.ended
            watch.ended = lambda: setattr(watch, "ended", told) or False  # once: "not ended yet"
        real_read(pid, local, remote, nbytes)  # the sender is gone: raises

    cma.read = read_then_kill
    result = {}
    start = time.monotonic()
    try:
        t.irecv(torch.empty(8 * MIB), 0, tag=5).wait(timeout=30)
        result["error"] = "no error"
    except PeerDied as exc:
        result["error"] = str(exc)
    result["seconds"] = time.monotonic() - start
    try:
        t.irecv(torch.empty(8 * MIB), 0, tag=6).wait(timeout=30)  # a later receive fails at once
    except PeerDied as exc:
        result["later"] = str(exc)
    t.close()
    return result


def dies_during_read_before_its_pidfd_says_so(store, rank, world):
    return dies_during_read(store, rank, world, before_its_pidfd_says_so=True)


@pytest.mark.parametrize("job", [dies_during_read, dies_during_read_before_its_pidfd_says_so])
def test_a_sender_dying_during_a_direct_read_fails_the_receive_naming_it(job):
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    # no leaving together: rank 0, which holds the store, dies
    procs = [ctx.Process(target=_worker, args=(job, r, 2, port, queue), kwargs={"leave": False})
             for r in range(2)]  # fmt: skip
    for p in procs:
        p.start()
    rank, result = queue.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    assert rank == 1, result
    assert "recv 1<-0 tag 5" in result["error"] and "rank 0 (pid" in result["error"] and "died" in result["error"]
    assert result["seconds"] < 15
    assert "recv 1<-0 tag 6" in result["later"] and "rank 0 (pid" in result["later"]


def _thp_tensor(nbytes: int, keep: list):
    """An ordinary tensor in private memory advised to use transparent huge pages."""
    import ctypes
    import mmap

    m = mmap.mmap(-1, nbytes + 2 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    skip = (-base) % (2 * MIB)
    ctypes.CDLL(None).madvise(ctypes.c_void_p(base + skip), ctypes.c_size_t(nbytes), 14)  # MADV_HUGEPAGE
    keep.append(m)
    return torch.frombuffer(m, dtype=torch.uint8)[skip : skip + nbytes]


def by_pages(store, rank, world):
    """The default policy: a tensor in huge pages is read directly, one on 4 KiB pages goes through
    the pool (where the kernel can tell the pages apart)."""
    from nsysan.transport import P2PTransport, cma

    keep, result = [], {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        huge = _thp_tensor(16 * MIB, keep)
        huge.copy_(payload(1, 16 * MIB, "uint8"))
        small = payload(2, 16 * MIB, "uint8")
        if rank == 0:
            result["huge_share"] = cma.huge_fraction(huge.data_ptr(), huge.numel())
            result["small_share"] = cma.huge_fraction(small.data_ptr(), small.numel())
            t.isend(huge, 1).wait(timeout=60)
            result["pool_after_huge"] = t._pool is not None
            t.isend(small, 1).wait(timeout=60)
            result["pool_after_small"] = t._pool is not None
        else:
            out = torch.empty(16 * MIB, dtype=torch.uint8)
            t.irecv(out, 0).wait(timeout=60)
            result["huge_ok"] = torch.equal(out, huge)
            t.irecv(out, 0).wait(timeout=60)
            result["small_ok"] = torch.equal(out, small)
        store.set(f"bp/{rank}", "1")
        store.wait([f"bp/{r}" for r in range(world)])
    return result


def test_by_default_only_tensors_in_huge_pages_are_read_directly():
    r = run_ranks(by_pages, 2)
    assert r[1] == {"huge_ok": True, "small_ok": True}
    if r[0]["huge_share"] is None:
        pytest.skip("this kernel has no PAGEMAP_SCAN: the transport cannot tell the pages apart")
    if r[0]["huge_share"] < 0.75:
        pytest.skip("no transparent huge pages here (THP disabled)")
    assert r[0]["small_share"] == 0.0
    assert r[0]["pool_after_huge"] is False and r[0]["pool_after_small"] is True


def test_random_transfers_all_read_directly_arrive_bit_exact(monkeypatch):
    """The soak's random mix (4 ranks, every dtype, up to 4 MiB, out of order, sources overwritten
    as soon as their sends complete) with every ordinary tensor over 1 MiB read directly."""
    from tests.test_transport import soak

    monkeypatch.setenv("NSYSAN_P2P_CMA", "always")  # inherited by the spawned ranks
    count = 2000
    results = run_ranks(soak, 4, count, 23, 4 << 20, 200, timeout=600)
    assert sum(r["sent"] for r in results.values()) == count
    assert sum(r["received"] for r in results.values()) == count
    assert [r["bad"] for r in results.values()] == [[], [], [], []]
