"""The P2P transport between real processes (CPU shared-memory path, what CI can run)."""

from __future__ import annotations

import datetime as dt
import glob
import math
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

from tests.conftest import IN_CI

torch = __import__("torch") if IN_CI else pytest.importorskip("torch")

DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "complex64",
    "complex128",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(fn, rank, world, port, queue, *args, leave=True):
    store = None
    try:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=dt.timedelta(seconds=60))
        result = fn(store, rank, world, *args)
    except BaseException:
        result = "ERROR " + traceback.format_exc()
    if store is not None and leave:
        _leave(store, rank, world)
    queue.put((rank, result))


def _leave(store, rank, world, patience_s=60.0):
    """The store's server lives in rank 0's process: rank 0 keeps it up until every other rank is
    done with it (a rank still waiting on it when rank 0 exits gets "Failed to recv")."""
    try:
        if rank != 0:
            store.add("run_ranks/left", 1)
            return
        deadline = time.monotonic() + patience_s
        while store.add("run_ranks/left", 0) < world - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:
        pass  # the test's own result says what went wrong


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


_NOISE = {}


def payload(index: int, nbytes: int, dtype: str):
    """Deterministic bytes viewed as ``dtype``: a slice of one random block (made once per process,
    the same in every process) at an offset set by the message's index; compared bit for bit."""
    if "block" not in _NOISE:
        _NOISE["block"] = torch.randint(
            0, 256, (8 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7)
        )
    offset = (index * 40503) % (4 << 20)
    return _NOISE["block"][offset : offset + nbytes].clone().view(getattr(torch, dtype))


def plan(world: int, count: int, seed: int, max_bytes: int = 1 << 20):
    """Random (index, src, dst, tag, bytes, dtype): one element to max_bytes, log-scale skewed to
    small sizes (2 ** (log2(max elements) * u**2)) so that 10,000 fit in CI's time."""
    rng = random.Random(seed)
    messages = []
    for i in range(count):
        src, dst = rng.sample(range(world), 2)
        dtype = rng.choice(DTYPES)
        size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        numel = max(1, int(2 ** (math.log2(max_bytes // size) * rng.random() ** 2)))
        messages.append((i, src, dst, rng.randrange(4), numel * size, dtype))
    return messages


def soak(store, rank, world, count, seed, max_bytes, window):
    """Post each window of the plan in a random order per rank (keeping each (peer, tag) queue's
    own order, which matching relies on); overwrite every source right after its send completes."""
    from nsysan.transport import P2PTransport

    rng = random.Random(seed * 100 + rank)
    messages = plan(world, count, seed, max_bytes)
    bad, sent, received, peak_files = [], 0, 0, 0
    start = time.monotonic()
    with P2PTransport(store, rank, world, timeout=60) as t:
        token_files = t._files
        for w in range(0, count, window):
            queues = {}
            for i, src, dst, tag, nbytes, dtype in messages[w : w + window]:
                if rank == src:
                    queues.setdefault(("send", dst, tag), []).append((i, nbytes, dtype))
                elif rank == dst:
                    queues.setdefault(("recv", src, tag), []).append((i, nbytes, dtype))
            order = [key for key, items in queues.items() for _ in items]
            rng.shuffle(order)
            sends, recvs = [], []
            for key in order:
                way, peer, tag = key
                i, nbytes, dtype = queues[key].pop(0)
                if way == "send":
                    data = payload(i, nbytes, dtype)
                    sends.append((data, t.isend(data, peer, tag)))
                else:
                    out = torch.empty(nbytes, dtype=torch.uint8).view(getattr(torch, dtype))
                    recvs.append((i, nbytes, dtype, out, t.irecv(out, peer, tag)))
                while sends and sends[0][1].is_completed():
                    sends.pop(0)[0].view(torch.uint8).fill_(0)  # the receiver must not see this
                    sent += 1
            for data, h in sends:
                h.wait(timeout=120)
                data.view(torch.uint8).fill_(0)
            for i, nbytes, _dtype, out, h in recvs:
                h.wait(timeout=120)
                offset = (i * 40503) % (4 << 20)
                if not torch.equal(out.view(torch.uint8), _NOISE["block"][offset : offset + nbytes]):
                    bad.append(i)
            sent, received = sent + len(sends), received + len(recvs)
            peak_files = max(peak_files, len(os.listdir("/proc/self/fd")))
        store.set(f"soak/{rank}", "1")
        store.wait([f"soak/{r}" for r in range(world)])
    return {
        "sent": sent,
        "received": received,
        "bad": bad,
        "files": peak_files,
        "prefix": token_files,
        "seconds": time.monotonic() - start,
    }


def test_ten_thousand_random_transfers_arrive_bit_exact_and_leave_nothing():
    """4 ranks, 16 dtypes, 1 element .. 4 MiB (log-uniform), out of order; NSYSAN_P2P_SOAK=N for more."""
    count = int(os.environ.get("NSYSAN_P2P_SOAK", "10000"))
    results = run_ranks(soak, 4, count, 11, 4 << 20, 500, timeout=600)
    assert sum(r["sent"] for r in results.values()) == count
    assert sum(r["received"] for r in results.values()) == count
    assert [r["bad"] for r in results.values()] == [[], [], [], []]
    assert glob.glob(results[0]["prefix"] + "*") == []  # every rank closed: no shared-memory segment left
    assert max(r["files"] for r in results.values()) < 64


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
            result = {
                "ready_s": ready_s,
                "late_pending_when_ready_done": late_pending,
                "late_s": time.monotonic() - start,
            }
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


def killed_peer(store, rank, world):
    """Rank 2 dies (SIGKILL) with a receive from rank 0 pending and after sending rank 1 a message."""
    import signal

    from nsysan.transport import P2PTransport, PeerDied

    t = P2PTransport(store, rank, world, timeout=10)
    if rank == 2:
        t.isend(torch.ones(1 << 20), 1).wait(timeout=10)  # its pool now exists: it must not outlive it
        t.irecv(torch.empty(1 << 20), 0)
        store.set("posted", "1")
        os.kill(os.getpid(), signal.SIGKILL)
    result = {}
    if rank == 0:
        store.wait(["posted"])
        start = time.monotonic()
        try:
            t.isend(torch.ones(1 << 20), 2, tag=7).wait(timeout=30)
        except PeerDied as exc:
            result = {"error": str(exc), "seconds": time.monotonic() - start}
        result["left"] = glob.glob(t._files + "2-*")
        store.set("noticed", "1")
    if rank == 1:
        out = torch.empty(1 << 20)
        t.irecv(out, 2).wait(timeout=10)  # sent before it died: still delivered
        store.wait(["noticed"])
        try:
            t.irecv(torch.empty(10), 2, tag=3).wait(timeout=30)
        except PeerDied as exc:
            result = {"error": str(exc), "first": float(out[0])}
    t.close()
    return result


def test_a_killed_peer_fails_the_others_naming_it_within_the_timeout():
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    # no leaving together: rank 2 dies
    procs = [ctx.Process(target=_worker, args=(killed_peer, r, 3, port, queue), kwargs={"leave": False})
             for r in range(3)]  # fmt: skip
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in range(2))
    for p in procs:
        p.join(timeout=30)
    assert (
        "rank 2 (pid" in results[0]["error"]
        and "died" in results[0]["error"]
        and "send 0->2 tag 7" in results[0]["error"]
    )
    assert results[0]["seconds"] < 10  # within the configured timeout
    assert results[0]["left"] == []  # the dead rank's segments were removed
    assert "recv 1<-2 tag 3" in results[1]["error"] and "rank 2 (pid" in results[1]["error"]
    assert results[1]["first"] == 1.0


def silent_peer(store, rank, world):
    from nsysan.transport import P2PTransport, TransportTimeout

    with P2PTransport(store, rank, world, timeout=2) as t:
        if rank == 1:
            store.wait(["gave-up"])  # alive, but never posts the receive
            return None
        try:
            t.isend(torch.ones(1 << 20), 1, tag=7).wait(timeout=30)
        except TransportTimeout as exc:
            return str(exc)
        finally:
            store.set("gave-up", "1")
        return "no error"


def test_a_silent_peer_gives_a_timeout_naming_it():
    r = run_ranks(silent_peer, 2)
    assert "rank 1" in r[0] and "timed out after 2 s" in r[0] and "send 0->1 tag 7" in r[0]


def mismatch(store, rank, world):
    from nsysan.transport import P2PTransport, TransportError

    result = {}
    with P2PTransport(store, rank, world, timeout=10) as t:
        for numel in (10, 1 << 20):  # inline, and big enough for a request to send
            if rank == 0:
                try:
                    t.isend(torch.ones(numel), 1).wait(timeout=5)
                    result[numel] = "no error"
                except TransportError as exc:
                    result[numel] = str(exc)
            else:
                try:
                    t.irecv(torch.empty(2 * numel), 0).wait(timeout=10)
                except TransportError as exc:
                    result[numel] = str(exc)
    return result


def test_a_mismatched_receive_buffer_is_a_clear_error():
    r = run_ranks(mismatch, 2)
    assert "rank 0 sent 40 bytes" in r[1][10] and "holds 80" in r[1][10]
    assert r[0][10] == "no error"  # an inline send completes when posted: only the receiver learns
    assert "the receiver refused it" in r[0][1 << 20] and f"holds {8 << 20}" in r[0][1 << 20]  # at once, not a timeout


def small_shm(store, rank, world, directory, rlimit):
    import resource
    import signal

    from nsysan.transport import P2PTransport, SharedMemoryFull

    os.environ["NSYSAN_P2P_SHM_DIR"] = directory
    os.environ["NSYSAN_P2P_CMA"] = "0"  # the pool path (a direct read would need no shared memory at all)
    if rlimit and rank == 0:  # no tmpfs could be mounted: a file-size limit makes fallocate fail instead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, resource.RLIM_INFINITY))
    result = {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        big = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB through a 16 MiB /dev/shm: in chunks
        if rank == 0:
            t.isend(big, 1).wait(timeout=60)
            try:
                t.empty(32 << 20)  # 128 MiB cannot be reserved
                result["empty"] = "no error"
            except SharedMemoryFull as exc:
                result["empty"] = str(exc)
        else:
            out = torch.empty_like(big)
            t.irecv(out, 0).wait(timeout=60)
            result["intact"] = torch.equal(out, big)
        store.set(f"small/{rank}", "1")
        store.wait([f"small/{r}" for r in range(world)])
    return result


def test_a_small_dev_shm_moves_big_messages_and_a_full_one_is_a_clear_error(tmp_path):
    import subprocess

    directory = tmp_path / "shm"
    directory.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(directory)],
                             capture_output=True, check=False).returncode == 0  # fmt: skip
    try:
        r = run_ranks(small_shm, 2, str(directory), not mounted)
    finally:
        if mounted:
            subprocess.run(["umount", str(directory)], check=False)
    assert r[1]["intact"] is True
    assert "cannot reserve 134217728 bytes (128.0 MiB) of shared memory in " + str(directory) in r[0]["empty"]
    assert "bytes free of" in r[0]["empty"]


def many_buffers(store, rank, world, count):
    import resource

    from nsysan.transport import P2PTransport

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    peak_files = peak_segments = 0
    with P2PTransport(store, rank, world, timeout=30) as t:
        out = torch.empty(4096)
        for i in range(count):
            if rank == 0:
                buf = t.empty(4096)  # 16 KiB: the receiver reads it from its own segment
                buf.fill_(i)
                t.isend(buf, 1).wait(timeout=10)
                del buf  # its segment goes now
            else:
                t.irecv(out, 0).wait(timeout=10)
                assert float(out[0]) == i
            if i % 100 == 0:
                peak_files = max(peak_files, len(os.listdir("/proc/self/fd")))
                peak_segments = max(peak_segments, len(glob.glob(t._files + "0-buf*")))
        store.set(f"many/{rank}", "1")
        store.wait([f"many/{r}" for r in range(world)])
    return {"files": peak_files, "segments": peak_segments}


def test_empty_buffers_are_released_when_freed_and_open_files_stay_bounded():
    r = run_ranks(many_buffers, 2, 1500)
    assert max(x["files"] for x in r.values()) < 64  # at ulimit -n 256, 1,500 buffers
    assert max(x["segments"] for x in r.values()) <= 2


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

            def query(self):
                log_.append("done.query")
                return True

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

    def device(self, device):
        import contextlib

        return contextlib.nullcontext()

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
    assert sender_log == ["event.ipc_handle", "event.record"]  # recorded before the metadata leaves
    receiver = CudaIpcChannel(cuda=_FakeCuda(receiver_log), reduce=_fake_reduce)
    out = torch.zeros(6, dtype=torch.float32)
    assert receiver.fetch(meta, out.view(torch.uint8), peer=0).finished()
    receiver.fetch(meta, out.view(torch.uint8), peer=0).wait()
    assert torch.equal(out, data)
    # wait on the sender's event before copying, record the copy's end (the transport acks once it
    # fired); one stream per peer; the event is opened once
    assert receiver_log == ["event.from_ipc_handle b'handle-bytes'", "new stream", "stream.wait_stream",
                            "stream.wait_event", "event.record", "done.query",
                            "stream.wait_stream", "stream.wait_event", "event.record", "done.synchronize"]  # fmt: skip
    # an event is reused only after the receiver acknowledged its last use
    sender.post(data)
    assert sender_log == ["event.ipc_handle", "event.record", "event.ipc_handle", "event.record"]
    release()  # the sender drops its references only now
    sender.post(data)
    assert sender_log[4:] == ["event.record"]


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


def bad_arguments(store, rank, world):
    """Each bad call refused with a named error before any state changes; then a real exchange on
    tag 1 shows that nothing broke (a tag of 2**63 used to raise struct.error mid-send)."""
    from nsysan.transport import P2PTransport

    peer = 1 - rank
    calls = {
        "tag 2**63": lambda t: t.isend(torch.ones(4), peer, tag=2**63),
        "tag -1": lambda t: t.irecv(torch.ones(4), peer, tag=-1),
        "tag 1.5": lambda t: t.isend(torch.ones(4), peer, tag=1.5),
        "a list": lambda t: t.isend([1, 2, 3], peer),
        "sparse": lambda t: t.isend(torch.eye(3).to_sparse(), peer),
        "meta": lambda t: t.isend(torch.empty(3, device="meta"), peer),
        "nested": lambda t: t.isend(torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), peer),
        "recv into a conjugate view": lambda t: t.irecv(torch.ones(2, dtype=torch.complex64).conj(), peer),
    }
    result = {}
    with P2PTransport(store, rank, world, timeout=60) as t:
        for name, call in calls.items():
            try:
                call(t)
                result[name] = "no error"
            except (TypeError, ValueError) as exc:
                result[name] = f"{type(exc).__name__}: {exc}"
        values = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
        if rank == 0:
            t.isend(values.conj(), peer, tag=1).wait(timeout=60)  # sent as its values, conjugated
            t.isend(torch.arange(12.0).reshape(3, 4).t(), peer, tag=1).wait(timeout=60)  # not contiguous
        else:
            out = torch.empty(2, dtype=torch.complex64)
            t.irecv(out, peer, tag=1).wait(timeout=60)
            result["conj"] = torch.equal(out, values.conj().resolve_conj())
            strided = torch.empty(4, 3)
            t.irecv(strided, peer, tag=1).wait(timeout=60)
            result["strided"] = torch.equal(strided, torch.arange(12.0).reshape(3, 4).t())
        store.set(f"bad/{rank}", "1")
        store.wait([f"bad/{r}" for r in range(world)])
    return result


def test_bad_arguments_are_named_errors_and_break_nothing():
    r = run_ranks(bad_arguments, 2)
    for rank in (0, 1):
        errors = {k: v for k, v in r[rank].items() if k not in ("conj", "strided")}
        assert all(v.startswith(("TypeError", "ValueError")) for v in errors.values()), errors
        assert "tag" in errors["tag 2**63"] and "torch.Tensor" in errors["a list"] and "sparse" in errors["sparse"]
    assert r[1]["conj"] and r[1]["strided"]


def test_out_of_file_descriptors_is_a_named_transport_error(tmp_path):
    """A process at its open-file limit (the issue's reproducer: 12) gets TransportError naming the
    limit and the fix from a new segment (empty(), the pool), not a raw OSError EMFILE."""
    code = f"""
import os, resource
from nsysan.transport.errors import TransportError
from nsysan.transport.shm import Segment
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    Segment({str(tmp_path / "seg")!r}, 4096, create=True, owner="rank 0: ")
    print("no error")
except TransportError as exc:
    print(str(exc))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("rank 0: cannot open shared-memory segment") and "too many open files" in out.stdout
    assert "this process may open 32" in out.stdout and "ulimit -n" in out.stdout
    assert not (tmp_path / "seg").exists()


TEARDOWN_JOB = """
import datetime as dt, os, sys, time
import torch
import torch.distributed as dist
from nsysan.transport import P2PTransport

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1, world, rank == 0,
                      timeout=dt.timedelta(seconds=60))
t = P2PTransport(store, rank, world, timeout=600)
buf = t.empty(16 << 20)  # 64 MiB in shared memory
buf.fill_(rank)
peer = (rank + 1) % world
got = torch.empty(2 << 20)
handles = [t.isend(torch.full((2 << 20,), float(rank)), peer, tag=1), t.irecv(got, (rank - 1) % world, tag=1)]
for h in handles:  # the 8 MiB pool is made and used by every rank
    h.wait(timeout=60)
store.set(f"ready/{rank}", "1")
store.wait([f"ready/{r}" for r in range(world)])
if rank == world - 1:
    raise SystemExit("rank failed on purpose")  # torchrun then SIGTERMs the others
t.irecv(torch.empty(1), peer, tag=99).wait(timeout=600)  # blocked in the transport, as a real job would be
"""


def test_torchruns_sigterm_teardown_leaves_nothing_in_dev_shm(tmp_path):
    """When one rank fails, torchrun SIGTERMs the others, which are blocked in a receive: without a
    handler a SIGTERMed process runs no clean-up, and each rank left its 8 MiB pool and 64 MiB
    empty() buffer in /dev/shm. Checked in a directory of /dev/shm's own tmpfs."""
    shm = tempfile.mkdtemp(prefix="nsysan-teardown-", dir="/dev/shm")
    try:
        script = tmp_path / "job.py"
        script.write_text(TEARDOWN_JOB)
        env = {**os.environ, "NSYSAN_P2P_SHM_DIR": shm, "PYTHONPATH": os.pathsep.join(sys.path)}
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
             f"--master-port={free_port()}", str(script)],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert out.returncode != 0 and "rank failed on purpose" in out.stderr + out.stdout
        assert time.monotonic() - start < 25  # the SIGTERMed ranks ended at once, before torchrun's SIGKILL
        assert os.listdir(shm) == [], out.stderr[-2000:]
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_a_forked_child_ending_leaves_its_parents_segments(tmp_path):
    """A DataLoader worker is a fork of the rank: when it ends (or is SIGTERMed by its pool) the
    rank's segments are not its to remove; the rank's own exit removes them."""
    seg = tmp_path / "nsysan-p2p-x-r0-pool"
    code = f"""
import os, signal, sys, time
from nsysan.transport.shm import own
open({str(seg)!r}, "w").close()
own({str(seg)[:-4]!r})
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    sys.exit(0)
os.waitpid(pid, 0)
print(os.path.exists({str(seg)!r}))
"""
    for how in ("exit", "term"):
        seg.touch()
        out = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "True", (how, out.stderr)  # the child left them
        assert not seg.exists(), how  # the parent's exit removed them
