"""Wake-ups of the transport's eager path: the acknowledgement of a small message's pool chunk does
not wake its sender (it picks it up at its next look), unless the sender ran out of chunks and asked
for it; then every acknowledgement wakes it, and it stops asking once its queue is empty."""

from __future__ import annotations

import time

import pytest

from tests.conftest import IN_CI
from tests.test_transport import run_ranks

torch = __import__("torch") if IN_CI else pytest.importorskip("torch")


def _count_rings(t, peer):
    """Patch futex.bump_and_wake to count the doorbells rung on ``peer``; returns (rings, undo)."""
    from nsysan.transport import futex

    rings, real = [], futex.bump_and_wake

    def counting(addr):
        if addr == t._bells[peer]:
            rings.append(addr)
        real(addr)

    futex.bump_and_wake = counting
    return rings, lambda: setattr(futex, "bump_and_wake", real)


def eager_rings(store, rank, world):
    """Rank 0 sends 40 eager messages (64 KiB) one at a time; rank 1 counts the doorbells it rings
    on rank 0 while receiving them (none: nothing it posts there needs one)."""
    from nsysan.transport import P2PTransport

    result = {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        if rank == 1:
            rings, undo = _count_rings(t, 0)
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
            undo()
            result["rings_to_sender"] = len(rings)
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


def polling_ping_pong(store, rank, world):
    """500 round trips of 4 KiB between two ranks whose waiting threads poll for a minute before
    sleeping: a descriptor for a peer that polls needs no wake-up syscall."""
    from nsysan.transport import P2PTransport

    n, result = 500, {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        t._spin_s = 60.0
        rings, undo = _count_rings(t, 1 - rank)
        src, out = torch.full((1024,), rank, dtype=torch.int32), torch.empty(1024, dtype=torch.int32)
        bad = 0
        for _ in range(n):
            if rank == 0:
                t.isend(src, 1).wait(timeout=30)
                t.irecv(out, 1).wait(timeout=30)
            else:
                t.irecv(out, 0).wait(timeout=30)
                t.isend(src, 0).wait(timeout=30)
            bad += int(out.min()) != 1 - rank or int(out.max()) != 1 - rank
        undo()
        result = {"messages": n, "rings": len(rings), "bad": bad}
        store.set(f"pp/{rank}", "1")
        store.wait([f"pp/{r}" for r in range(world)])
    return result


def test_a_peer_that_polls_is_not_rung_for_each_message():
    r = run_ranks(polling_ping_pong, 2)
    for rank in (0, 1):
        assert r[rank]["bad"] == 0
        # a ring per message before; now only when the peer's background thread happened to be asleep
        # (more often on a loaded 2-core CI machine: 128 of 500 seen there, against 500 for the bug)
        assert r[rank]["rings"] < r[rank]["messages"] // 3, r


def sleeping_receiver(store, rank, world):
    """Rank 1 waits for a message with spinning off, so it sleeps on its doorbell at once; rank 0
    sends only once it sees rank 1's sleepers word raised, and must ring (the 2 ms backstop would
    hide a lost wake-up from the data, not from the count of rings)."""
    from nsysan.transport import P2PTransport

    result = {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        t._spin_s = 0.0
        if rank == 0:
            rings, undo = _count_rings(t, 1)
            for i in range(20):
                store.wait([f"sr/posted/{i}"])
                deadline, asleep = time.monotonic() + 10, False
                while not asleep and time.monotonic() < deadline:  # what was seen, not a second look:
                    asleep = bool(t._peer_sleepers[1][0])  # the 2 ms backstop may lower it in between
                    if not asleep:
                        time.sleep(0.0005)
                t.isend(torch.full((8,), i, dtype=torch.int64), 1).wait(timeout=30)
                result.setdefault("asleep", []).append(asleep)
            undo()
            result["rings"] = len(rings)
        else:
            values = []
            for i in range(20):
                out = torch.empty(8, dtype=torch.int64)
                h = t.irecv(out, 0)
                store.set(f"sr/posted/{i}", "1")
                h.wait(timeout=30)
                values.append(int(out[0]))
            result["values"] = values
        store.set(f"sr/{rank}", "1")
        store.wait([f"sr/{r}" for r in range(world)])
    return result


def test_a_receiver_asleep_on_its_doorbell_is_rung_for_a_message():
    r = run_ranks(sleeping_receiver, 2)
    assert r[1]["values"] == list(range(20))
    assert all(r[0]["asleep"])
    # the receiver wakes from its 2 ms backstop, looks and sleeps again: a message sent in that
    # moment finds the word down and needs no ring. Most find it up; never ringing gives 0.
    assert r[0]["rings"] >= 10
