"""The P2P transport between real processes (CPU shared-memory path, what CI can run)."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import random
import socket
import time
import traceback

import pytest

from tests.conftest import IN_CI

torch = __import__("torch") if IN_CI else pytest.importorskip("torch")

DTYPES = ["float32", "float64", "int64", "int32", "uint8", "float16", "bfloat16"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn, rank, world, port, queue, *args):
    try:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=dt.timedelta(seconds=60))
        queue.put((rank, fn(store, rank, world, *args)))
    except BaseException:
        queue.put((rank, "ERROR " + traceback.format_exc()))


def run_ranks(fn, world, *args, timeout=180):
    """Run fn(store, rank, world, *args) in ``world`` processes; return {rank: result}."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world, port, queue, *args)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    errors = [v for v in results.values() if isinstance(v, str) and v.startswith("ERROR")]
    assert not errors, errors[0]
    return results


def payload(index: int, numel: int, dtype: str):
    g = torch.Generator().manual_seed(index)
    if dtype.startswith(("int", "uint")):
        return torch.randint(0, 250, (numel,), generator=g).to(getattr(torch, dtype))
    return torch.randn(numel, generator=g).to(getattr(torch, dtype))


def plan(world: int, count: int, seed: int):
    rng = random.Random(seed)
    messages = []
    for i in range(count):
        src, dst = rng.sample(range(world), 2)
        numel = int(2 ** rng.uniform(0, 18))
        messages.append((i, src, dst, rng.randrange(4), numel, rng.choice(DTYPES)))
    return messages


def integrity(store, rank, world, count, seed):
    from nsysan.transport import P2PTransport

    with P2PTransport(store, rank, world, timeout=60) as t:
        sends, recvs = [], []
        for i, src, dst, tag, numel, dtype in plan(world, count, seed):
            if rank == src:
                data = payload(i, numel, dtype)
                sends.append(t.isend(data, dst, tag))
                data.fill_(0)  # reusing the buffer at once must not change what the peer reads
            elif rank == dst:
                out = torch.empty(numel, dtype=getattr(torch, dtype))
                recvs.append((i, numel, dtype, out, t.irecv(out, src, tag)))
        for h in sends:
            h.wait(timeout=120)
        bad = []
        for i, numel, dtype, out, h in recvs:
            h.wait(timeout=120)
            if not torch.equal(out, payload(i, numel, dtype)):
                bad.append(i)
        store.set(f"done/{rank}", "1")
        store.wait([f"done/{r}" for r in range(world)])
        return {"sent": len(sends), "received": len(recvs), "bad": bad}


def test_a_thousand_random_transfers_arrive_intact():
    results = run_ranks(integrity, 4, 1000, 11)
    assert sum(r["sent"] for r in results.values()) == 1000
    assert sum(r["received"] for r in results.values()) == 1000
    assert [r["bad"] for r in results.values()] == [[], [], [], []]


def head_of_line(store, rank, world):
    from nsysan.transport import P2PTransport

    with P2PTransport(store, rank, world, timeout=30) as t:
        if rank == 0:
            late = t.isend(torch.ones(1 << 20), 1)  # rank 1 posts its receive 3 s from now
            ready = t.isend(torch.ones(1 << 20) * 2, 2)
            start = time.monotonic()
            ready.wait(timeout=10)
            ready_s = time.monotonic() - start
            late_pending = not late.is_completed()
            late.wait(timeout=20)
            result = {"ready_s": ready_s, "late_pending_when_ready_done": late_pending, "late_s": time.monotonic() - start}
        else:
            if rank == 1:
                time.sleep(3)
            out = torch.empty(1 << 20)
            t.irecv(out, 0).wait(timeout=20)
            result = {"value": float(out[0])}
        store.set(f"done/{rank}", "1")
        store.wait([f"done/{r}" for r in range(world)])
        return result


def test_send_to_a_ready_peer_does_not_wait_for_a_late_one():
    r = run_ranks(head_of_line, 3)
    assert r[0]["late_pending_when_ready_done"] is True
    assert r[0]["ready_s"] < 1.0 < 2.0 < r[0]["late_s"]
    assert (r[1]["value"], r[2]["value"]) == (1.0, 2.0)


def dead_peer(store, rank, world):
    from nsysan.transport import P2PTransport, TransportTimeout

    t = P2PTransport(store, rank, world, timeout=3)
    if rank == 1:
        os._exit(0)  # dies without receiving; its death is what rank 0 must report
    h = t.isend(torch.ones(100), 1, tag=7)
    try:
        h.wait(timeout=30)
    except TransportTimeout as exc:
        return str(exc)
    return "no error"


def test_a_dead_peer_gives_a_timeout_naming_it():
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(dead_peer, r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    rank, message = queue.get(timeout=60)
    for p in procs:
        p.join(timeout=30)
    assert rank == 0
    assert "rank 1" in message and "timed out after 3 s" in message and "send 0->1 tag 7" in message


def mismatch(store, rank, world):
    from nsysan.transport import P2PTransport, TransportError

    with P2PTransport(store, rank, world, timeout=10) as t:
        if rank == 0:
            try:
                t.isend(torch.ones(10), 1).wait(timeout=5)
            except TransportError as exc:
                return {"sender": str(exc)}
            return {"sender": "no error"}
        try:
            t.irecv(torch.empty(20), 0).wait(timeout=10)
        except TransportError as exc:
            return {"receiver": str(exc)}
        return {"receiver": "no error"}


def test_a_mismatched_receive_buffer_is_a_clear_error():
    r = run_ranks(mismatch, 2)
    assert "rank 0 sent 40 bytes" in r[1]["receiver"] and "holds 80" in r[1]["receiver"]
    assert "the receiver refused it" in r[0]["sender"] and "holds 80" in r[0]["sender"]  # at once, not a timeout


class _FakeCuda:
    """Just enough of torch.cuda to check the order of the IPC steps on a CPU machine."""

    def __init__(self, log):
        log_ = log

        class Event:
            def __init__(self, interprocess=False, enable_timing=True, handle=None):
                self.handle = handle

            def record(self, stream=None):
                log_.append("event.record")

            def ipc_handle(self):
                log_.append("event.ipc_handle")
                return b"handle-bytes"

            @classmethod
            def from_ipc_handle(cls, device, handle):
                log_.append(f"event.from_ipc_handle {handle!r}")
                return cls(handle=handle)

            def synchronize(self):
                log_.append("done.synchronize")

        class Stream:
            def __init__(self, device=None):
                log_.append("new stream")

            def wait_event(self, event):
                log_.append("stream.wait_event")

            def wait_stream(self, stream):
                log_.append("stream.wait_stream")

        self.Event, self.Stream, self.log = Event, Stream, log

    def current_stream(self, device=None):
        return None

    def stream(self, stream):
        import contextlib

        return contextlib.nullcontext()


def _fake_reduce(tensor):
    return (torch.as_tensor, (tensor.tolist(),))


def test_cuda_ipc_channel_steps_in_order():
    from nsysan.transport.cuda_ipc import CudaIpcChannel

    sender_log, receiver_log = [], []
    sender = CudaIpcChannel(cuda=_FakeCuda(sender_log), reduce=_fake_reduce)
    data = torch.arange(6, dtype=torch.float32)
    meta, release = sender.post(data)
    assert sender_log == ["event.record", "event.ipc_handle"]  # recorded before the metadata leaves
    receiver = CudaIpcChannel(cuda=_FakeCuda(receiver_log), reduce=_fake_reduce)
    out = torch.zeros(6, dtype=torch.float32)
    receiver.fetch(meta, out.view(torch.uint8), peer=0)
    receiver.fetch(meta, out.view(torch.uint8), peer=0)
    assert torch.equal(out, data)
    # wait on the sender's event before copying, synchronise the copy before acking; one stream per peer
    assert receiver_log == ["event.from_ipc_handle b'handle-bytes'", "new stream", "stream.wait_stream",
                            "stream.wait_event", "event.record", "done.synchronize",
                            "event.from_ipc_handle b'handle-bytes'", "stream.wait_stream", "stream.wait_event",
                            "event.record", "done.synchronize"]  # fmt: skip
    release()  # the sender drops its references only now


def across_hosts(store, rank, world):
    import torch.distributed as dist

    from nsysan.transport import P2PTransport

    os.environ["NSYSAN_P2P_HOST"] = f"host{rank // 2}"  # ranks 0,1 on one host, 2 on another
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world)
    with P2PTransport(store, rank, world, timeout=30) as t:
        result = {}
        if rank == 0:
            local = t.isend(torch.full((1000,), 1.0), 1, tag=3)
            remote = t.isend(torch.full((1000,), 2.0), 2, tag=3)
            local.wait(timeout=20)
            remote.wait(timeout=20)
            result = {"remote_kind": "remote" in remote.what, "local_kind": "remote" in local.what}
        else:
            out = torch.empty(1000)
            h = t.irecv(out, 0, tag=3)
            h.wait(timeout=20)
            result = {"value": float(out[0]), "remote": "remote" in h.what}
        store.set(f"done/{rank}", "1")
        store.wait([f"done/{r}" for r in range(world)])
    dist.destroy_process_group()
    return result


def test_a_peer_on_another_host_goes_through_the_process_group():
    r = run_ranks(across_hosts, 3)
    assert r[0] == {"remote_kind": True, "local_kind": False}
    assert r[1] == {"value": 1.0, "remote": False} and r[2] == {"value": 2.0, "remote": True}


def edge_cases(store, rank, world):
    from nsysan.transport import P2PTransport, TransportError

    result = {}
    with P2PTransport(store, rank, world, timeout=20) as t:
        if rank == 0:
            t.isend(torch.tensor(3.5), 1).wait(timeout=10)  # 0-dim
            t.isend(torch.tensor([True, False, True]), 1, tag=1).wait(timeout=10)
        else:
            scalar, flags = torch.tensor(0.0), torch.zeros(3, dtype=torch.bool)
            t.irecv(scalar, 0).wait(timeout=10)
            t.irecv(flags, 0, tag=1).wait(timeout=10)
            result["first"] = [float(scalar), flags.tolist()]
        store.set(f"first/{rank}", "1")
        store.wait([f"first/{r}" for r in range(world)])
    # a second transport on the same store starts its sequence numbers afresh without meeting the first's keys
    second = P2PTransport(store, rank, world, timeout=20)
    if rank == 0:
        second.isend(torch.tensor(7.0), 1).wait(timeout=10)
        pending = second.irecv(torch.empty(1), 1, tag=9)  # rank 1 never sends this
        second.close()
        try:
            pending.wait(timeout=5)
        except TransportError as exc:
            result["closed"] = str(exc)
    else:
        out = torch.tensor(0.0)
        second.irecv(out, 0).wait(timeout=10)
        result["second"] = float(out)
        second.close()
    return result


def test_scalars_bools_a_second_instance_and_close_with_pending_work():
    r = run_ranks(edge_cases, 2)
    assert r[1] == {"first": [3.5, [True, False, True]], "second": 7.0}
    assert "the transport was closed first" in r[0]["closed"]
