"""Wake-ups of the transport's eager path: the acknowledgement of a small message's pool chunk does
not wake its sender (it picks it up at its next look), unless the sender ran out of chunks and asked
for it; then every acknowledgement wakes it, and it stops asking once its queue is empty."""

from __future__ import annotations

import time

import pytest

from tests.conftest import IN_CI
from tests.test_transport import run_ranks

torch = __import__("torch") if IN_CI else pytest.importorskip("torch")


def eager_rings(store, rank, world):
    """Rank 0 sends 40 eager messages (64 KiB) one at a time; rank 1 counts the doorbells it rings
    on rank 0 while receiving them (none: nothing it posts there needs one)."""
    from nsysan.transport import P2PTransport, futex

    result = {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        if rank == 1:
            rings = []
            real = futex.bump_and_wake
            futex.bump_and_wake = lambda addr: (rings.append(addr), real(addr))[1]
        for i in range(40):
            if rank == 0:
                t.isend(torch.full((16 << 10,), i, dtype=torch.int32), 1, tag=4).wait(timeout=30)
                store.wait([f"got/{i}"])  # one at a time (through the store): the pool never runs out
            else:
                out = torch.empty(16 << 10, dtype=torch.int32)
                t.irecv(out, 0, tag=4).wait(timeout=30)
                result.setdefault("values", []).append(int(out.min()) if int(out.min()) == int(out.max()) else -1)
                store.set(f"got/{i}", "1")
        if rank == 1:
            futex.bump_and_wake = real
            result["rings_to_sender"] = sum(1 for a in rings if a == t._bells[0])
        store.set(f"er/{rank}", "1")
        store.wait([f"er/{r}" for r in range(world)])
        result["free_chunks"] = len(t._free_chunks) if t._pool is not None else None
    return result


def test_acknowledging_a_small_message_does_not_wake_its_sender():
    r = run_ranks(eager_rings, 2)
    assert r[1]["values"] == list(range(40))
    assert r[1]["rings_to_sender"] == 0


def starved_sender(store, rank, world):
    """300 messages of 256 KiB posted at once through an 8-chunk pool: the sender waits for chunks
    and must be woken by the acknowledgements (not by the 2 ms backstop)."""
    from nsysan.transport import P2PTransport

    n, result = 300, {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        if rank == 0:
            sources = [torch.full((64 << 10,), i, dtype=torch.int32) for i in range(n)]
            start = time.monotonic()
            handles = [t.isend(s, 1, tag=2) for s in sources]
            for h in handles:
                h.wait(timeout=60)
            result = {"seconds": time.monotonic() - start, "asked": t._asked_wake}
        else:
            bad = []
            for i in range(n):
                out = torch.empty(64 << 10, dtype=torch.int32)
                t.irecv(out, 0, tag=2).wait(timeout=60)
                if not bool(out.eq(i).all()):
                    bad.append(i)
            result = {"bad": bad}
        store.set(f"ss/{rank}", "1")
        store.wait([f"ss/{r}" for r in range(world)])
    return result


def test_a_sender_out_of_pool_chunks_is_woken_by_acknowledgements_and_stops_asking():
    r = run_ranks(starved_sender, 2)
    assert r[1]["bad"] == []
    assert r[0]["asked"] is False  # its queue drained: acknowledgements are quiet again
    assert r[0]["seconds"] < 30
