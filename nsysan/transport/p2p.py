"""P2PTransport: tag-matched, non-blocking point-to-point with no order across peers or tags.

NCCL runs the operations of a communicator in one order, so a send to a ready peer waits behind a
send to a late one. Here each (peer, tag) pair is its own queue: messages of one pair never
overtake each other (sequence numbers), and pairs never wait for each other.

Protocol (per message, keys in the torch.distributed Store that torchrun already runs):

1. ``isend`` copies the payload into a shared-memory segment from its own pool (no copy when the
   tensor was allocated with :meth:`P2PTransport.empty`) and posts ``p2p/SRC/DST/TAG/SEQ`` with the
   segment's name, size, dtype and shape. It returns at once.
2. ``irecv`` waits for that key, maps the segment (cached per name), copies into ``out``, posts
   ``.../ack``. Its handle completes after the copy. Waiting is done by one progress thread per
   transport that polls the store without blocking (see ``_progress``).
3. The send handle completes on the ack; only then does the segment go back to the pool, so a
   payload is never read after its buffer is reused.

Every copy is inside an NVTX range in domain ``nsysan`` (``p2p recv 1<-0 tag 3``, the byte count as
its payload), so transfers show in nsys and in ``nsysan report``'s transport section. Waiting longer than ``timeout`` raises :class:`TransportTimeout` naming the
peer. CPU tensors go through shared memory; CUDA tensors are pulled by the receiver through CUDA
IPC (``cuda_ipc.py``). A peer on another host (ranks publish their host name in the store) goes
through the default process group's ``isend``/``irecv`` instead: no network stack of our own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

from typing import Any

import torch
import torch.distributed as dist

from nsysan.errors import NsysanError
from nsysan.transport.cuda_ipc import CudaIpcChannel

try:
    import nvtx
except ImportError:
    nvtx = None


_MIN_POLL, _MAX_POLL = 20e-6, 5e-4  # seconds between store polls when nothing moved


@dataclass
class _Pending:
    key: str
    peer: int
    what: str
    deadline: float
    on_ready: Callable[[], None]
    future: Future


class TransportError(NsysanError):
    """A transfer could not be done (mismatched buffers, a peer that went away)."""


class TransportTimeout(TransportError):
    """A peer did not do its part in time."""


def _range(message: str, nbytes: int):  # noqa: ANN202 - a context manager either way
    """An NVTX range named per peer and tag (so nsys and nsysan aggregate them) carrying the bytes."""
    return nvtx.annotate(message, domain="nsysan", payload=nbytes) if nvtx is not None else _NullRange()


class _NullRange:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Handle:
    """A pending send or receive. ``wait`` raises what the transfer raised."""

    def __init__(self, what: str, future: Future) -> None:
        self.what = what
        self._future = future

    def is_completed(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> None:
        try:
            self._future.result(timeout=timeout)
        except (TimeoutError, FutureTimeout):  # distinct classes before Python 3.11
            raise TransportTimeout(f"{self.what}: not completed after {timeout} s") from None

    def wait_stream(self, stream: object = None) -> None:
        """CPU transfers are complete when ``wait`` returns; kept for API parity with CUDA."""
        self.wait()


class _Segment:
    """A shared-memory segment and a uint8 tensor over it."""

    def __init__(self, shm: shared_memory.SharedMemory) -> None:
        self.shm = shm
        self.tensor = torch.frombuffer(shm.buf, dtype=torch.uint8, count=shm.size)

    @property
    def name(self) -> str:
        return self.shm.name


class P2PTransport:
    """Point-to-point transfers between the ranks of one host through shared memory.

    ``store`` is a torch.distributed Store shared by all ranks (e.g. the default group's), used
    only for small control messages.
    """

    def __init__(self, store: object, rank: int, world_size: int, *, timeout: float = 60.0, namespace: str = "p2p") -> None:
        """Collective: every rank creates its transport, in the same order (the n-th transport of
        each rank talks to the n-th of the others). Waits until all ranks have announced their
        host, so no send or receive ever blocks on that later."""
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        # keys of this instance never meet those of an earlier one (sequence numbers restart at 0)
        generation = int(store.add(f"{namespace}/generation/{rank}", 1))
        self.prefix = f"{namespace}/{generation}"
        self._lock = threading.Lock()
        self._send_seq: dict[tuple[int, int], int] = defaultdict(int)
        self._recv_seq: dict[tuple[int, int], int] = defaultdict(int)
        self._free: dict[int, list[_Segment]] = defaultdict(list)  # own segments by size, ready for reuse
        self._owned: list[_Segment] = []
        self._mapped: dict[str, _Segment] = {}  # peers' segments, mapped once
        self._pinned: dict[int, _Segment] = {}  # data_ptr of empty() tensors -> their segment
        self._pending: list[_Pending] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._closing = False
        self._cuda_channel: CudaIpcChannel | None = None
        self.host = os.environ.get("NSYSAN_P2P_HOST") or socket.gethostname()
        store.set(f"{self.prefix}/host/{rank}", self.host)
        keys = [f"{self.prefix}/host/{r}" for r in range(world_size)]
        try:
            store.wait(keys, dt.timedelta(seconds=timeout))
        except Exception:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise TransportTimeout(
                f"rank {rank}: ranks {missing} did not create their P2PTransport within {timeout:g} s"
            ) from None
        self._hosts = {r: store.get(k).decode() for r, k in enumerate(keys)}

    # -- buffers ------------------------------------------------------------------------------

    def empty(self, shape: tuple[int, ...] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in shared memory: sending it costs no staging copy (the receiver reads it
        directly), so do not modify it before the send's handle completes."""
        numel = torch.Size([shape] if isinstance(shape, int) else shape).numel()
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        segment = self._new_segment(max(nbytes, 1))
        tensor = segment.tensor[:nbytes].view(dtype).reshape(shape)
        self._pinned[tensor.data_ptr()] = segment
        return tensor

    def _new_segment(self, nbytes: int) -> _Segment:
        with _TRACKER_LOCK:
            segment = _Segment(shared_memory.SharedMemory(create=True, size=nbytes))
        with self._lock:
            self._owned.append(segment)
        return segment

    def _take(self, nbytes: int) -> _Segment:
        """A staging segment of at least ``nbytes`` from the pool (sizes rounded up to a power of
        two, so segments get reused across messages of similar size)."""
        size = _size_class(nbytes)
        with self._lock:
            pool = self._free.get(size)
            if pool:
                return pool.pop()
        return self._new_segment(size)

    def _give_back(self, segment: _Segment) -> None:
        with self._lock:
            self._free[segment.shm.size].append(segment)

    def _map(self, name: str) -> _Segment:
        segment = self._mapped.get(name)
        if segment is None:
            segment = self._mapped[name] = _Segment(_attach(name))
        return segment

    # -- control messages ---------------------------------------------------------------------

    def _key(self, src: int, dst: int, tag: int, seq: int) -> str:
        return f"{self.prefix}/{src}/{dst}/{tag}/{seq}"

    def _submit(self, key: str, peer: int, what: str, on_ready: Callable[[], None]) -> Handle:
        """Queue an operation that proceeds once ``key`` exists in the store."""
        future: Future = Future()
        op = _Pending(key, peer, what, time.monotonic() + self.timeout, on_ready, future)
        with self._lock:
            if self._closing:
                raise TransportError(f"rank {self.rank}: {what}: the transport is closed")
            self._pending.append(op)
            if self._thread is None:
                self._thread = threading.Thread(target=self._progress, name="nsysan-p2p progress", daemon=True)
                self._thread.start()
        self._wake.set()
        return Handle(what, future)

    def _progress(self) -> None:
        """One thread drives every pending operation with non-blocking ``store.check`` polls.

        A blocking ``store.wait`` would hold the process's store connection until the key appears,
        and the peer's ``set`` that makes it appear may itself wait for our connection: deadlock.
        Polling keeps every store call short, and a peer that is late never holds up another.
        """
        delay = _MIN_POLL
        while not self._closing:
            with self._lock:
                ops = list(self._pending)
            if not ops:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            progressed = False
            for op in ops:
                if self._step(op):
                    progressed = True
                    with self._lock:
                        self._pending.remove(op)
            delay = _MIN_POLL if progressed else min(delay * 2, _MAX_POLL)
            if not progressed:
                time.sleep(delay)

    def _step(self, op: _Pending) -> bool:
        """Advance one operation; True when it finished (done, failed or timed out)."""
        try:
            if not self.store.check([op.key]):
                if time.monotonic() < op.deadline:
                    return False
                if op.key.endswith("/ack"):  # withdraw the unanswered message
                    self.store.delete_key(op.key[: -len("/ack")])
                raise TransportTimeout(
                    f"rank {self.rank}: {op.what} timed out after {self.timeout:g} s waiting for rank {op.peer}; "
                    f"is rank {op.peer} alive and did it post the matching call?"
                )
            op.on_ready()
            op.future.set_result(None)
        except BaseException as exc:  # delivered to whoever waits on the handle
            op.future.set_exception(exc)
        return True

    # -- the API ------------------------------------------------------------------------------

    def _remote(self, peer: int) -> bool:
        """Whether ``peer`` runs on another host (then an existing engine moves the bytes)."""
        return self._hosts[peer] != self.host

    def _engine(self, work: Any, what: str) -> Handle:
        """A handle over a torch.distributed request (cross-host fall-back)."""
        future: Future = Future()

        def finish() -> None:
            try:
                work.wait()
                future.set_result(None)
            except BaseException as exc:
                future.set_exception(TransportError(f"rank {self.rank}: {what}: {exc}"))

        threading.Thread(target=finish, name=f"nsysan-p2p {what}", daemon=True).start()
        return Handle(what, future)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        """Post ``tensor`` for rank ``dst`` under ``tag``; returns at once."""
        self._check_peer(dst)
        if self._remote(dst):  # across hosts: the default process group's engine (gloo or NCCL)
            return self._engine(dist.isend(tensor, dst, tag=tag), f"send {self.rank}->{dst} tag {tag} (remote)")
        src_bytes = _as_bytes(tensor)  # before taking a sequence number: a failure here must not skip one
        with self._lock:
            seq = self._send_seq[(dst, tag)]
            self._send_seq[(dst, tag)] += 1
        what = f"send {self.rank}->{dst} tag {tag} #{seq}"
        key = self._key(self.rank, dst, tag, seq)
        if tensor.device.type == "cuda":  # the receiver pulls through CUDA IPC (cuda_ipc.py)
            meta, release = self._cuda().post(tensor)
            meta.update(nbytes=tensor.numel() * tensor.element_size(), dtype=str(tensor.dtype), shape=list(tensor.shape))
            self.store.set(key, json.dumps(meta))

            def released() -> None:
                self._acknowledged(key, what)
                release()

            return self._submit(key + "/ack", dst, what, released)
        nbytes = src_bytes.numel()
        pinned = self._pinned.get(tensor.data_ptr())
        if pinned is not None and tensor.is_contiguous():
            segment, staged = pinned, False
        else:
            segment, staged = self._take(nbytes), True
            with _range(f"p2p send {self.rank}->{dst} tag {tag} (staging copy)", nbytes):
                segment.tensor[:nbytes].copy_(src_bytes)
        offset = tensor.data_ptr() - segment.tensor.data_ptr() if not staged else 0
        meta = {"shm": segment.name, "offset": offset, "nbytes": nbytes, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}
        self.store.set(key, json.dumps(meta))

        def acknowledged() -> None:
            try:
                self._acknowledged(key, what)
            finally:
                if staged:
                    self._give_back(segment)

        return self._submit(key + "/ack", dst, what, acknowledged)

    def irecv(self, out: torch.Tensor, src: int, tag: int = 0) -> Handle:
        """Receive the next message of rank ``src`` under ``tag`` into ``out``; returns at once."""
        self._check_peer(src)
        if not out.is_contiguous():
            raise TransportError("irecv needs a contiguous tensor to receive into")
        dst_bytes = _as_bytes(out)
        if self._remote(src):
            return self._engine(dist.irecv(out, src, tag=tag), f"recv {self.rank}<-{src} tag {tag} (remote)")
        with self._lock:
            seq = self._recv_seq[(src, tag)]
            self._recv_seq[(src, tag)] += 1
        what = f"recv {self.rank}<-{src} tag {tag} #{seq}"
        key = self._key(src, self.rank, tag, seq)

        def receive() -> None:
            meta = json.loads(self.store.get(key))
            if meta["nbytes"] != dst_bytes.numel() or meta["dtype"] != str(out.dtype):
                problem = (f"rank {src} sent {meta['nbytes']} bytes ({meta['dtype']} {meta['shape']}), the receive "
                           f"buffer holds {dst_bytes.numel()} ({out.dtype} {list(out.shape)})")  # fmt: skip
                self.store.delete_key(key)
                self.store.set(key + "/ack", "error: " + problem)  # the sender learns why at once
                raise TransportError(f"rank {self.rank}: {what}: {problem}")
            if meta["nbytes"] and "ipc" in meta:
                with _range(f"p2p recv {self.rank}<-{src} tag {tag}", meta["nbytes"]):
                    self._cuda().fetch(meta, dst_bytes, src)
            elif meta["nbytes"]:
                segment = self._map(meta["shm"])
                with _range(f"p2p recv {self.rank}<-{src} tag {tag}", meta["nbytes"]):
                    dst_bytes.copy_(segment.tensor[meta["offset"] : meta["offset"] + meta["nbytes"]])
            self.store.delete_key(key)
            self.store.set(key + "/ack", "1")

        return self._submit(key, src, what, receive)

    def _acknowledged(self, key: str, what: str) -> None:
        """Consume the receiver's ack; raise what it reported if it refused the message."""
        ack = self.store.get(key + "/ack").decode()
        self.store.delete_key(key + "/ack")
        if ack.startswith("error: "):
            raise TransportError(f"rank {self.rank}: {what}: the receiver refused it: {ack[7:]}")

    def _cuda(self) -> CudaIpcChannel:
        if self._cuda_channel is None:
            self._cuda_channel = CudaIpcChannel()
        return self._cuda_channel

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise TransportError(f"rank {self.rank}: no peer {peer} in a world of {self.world_size}")

    def close(self) -> None:
        """Stop the progress thread and release every segment. Call after all handles completed."""
        with self._lock:
            self._closing = True
            left, self._pending = self._pending, []
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for op in left:
            if not op.future.done():
                op.future.set_exception(TransportError(f"rank {self.rank}: {op.what}: the transport was closed first"))
        for segment in list(self._mapped.values()):
            _release(segment, unlink=False)
        for segment in self._owned:
            _release(segment, unlink=True)
        self._mapped.clear()
        self._owned.clear()
        self._free.clear()
        self._pinned.clear()

    def __enter__(self) -> P2PTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TRACKER_LOCK = threading.Lock()


def _attach(name: str) -> shared_memory.SharedMemory:
    """Map a peer's segment without telling the resource tracker: the owner unlinks it. Python
    < 3.13 registers attached segments too, so a tracker shared by several processes would unlink
    (or complain about) segments that are not theirs."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    with _TRACKER_LOCK:
        register = resource_tracker.register
        resource_tracker.register = lambda *args, **kwargs: None
        try:
            return shared_memory.SharedMemory(name=name)
        finally:
            resource_tracker.register = register


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view (or copy, when not contiguous) of a tensor of any shape, 0-dim included."""
    flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=tensor.device)


def _size_class(nbytes: int) -> int:
    return max(4096, 1 << (max(nbytes, 1) - 1).bit_length())


def _release(segment: _Segment, unlink: bool) -> None:
    del segment.tensor  # the tensor exports the buffer; it must go before the mapping closes
    with contextlib.suppress(BufferError):  # a user still holds a view (an empty() tensor): stay mapped
        segment.shm.close()
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            segment.shm.unlink()
