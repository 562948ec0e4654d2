"""P2PTransport: tag-matched, non-blocking point-to-point with no order across peers or tags.

NCCL runs the operations of a communicator in one order, so a send to a ready peer waits behind a
send to a late one. Here each (peer, tag) pair is its own queue: messages of one pair never
overtake each other (one FIFO control ring per ordered pair of ranks, matched in arrival order),
and pairs never wait for each other.

Signalling goes through shared memory, not the Store (``ring.py``: one descriptor ring per ordered
pair, a futex doorbell per receiver). Data, by size and kind of tensor:

* up to a slot's inline capacity (~8 KiB): inside the descriptor; the send completes at once;
* a tensor made by :meth:`P2PTransport.empty`: the receiver copies straight out of the sender's
  segment (one copy) and answers ``DONE``, which completes the send;
* an ordinary tensor up to one chunk (1 MiB): staged into a chunk of the sender's pre-mapped pool,
  the send completes at once, the receiver copies it out and frees the chunk;
* bigger, in huge pages, when the receiver may read the sender's memory (probed once per pair at
  set-up): the receiver copies straight out of the sender's tensor with ``process_vm_readv``
  (``cma.py``, one copy) and answers ``DONE``, which completes the send (on 4 KiB pages that read
  is slower than the pool's two pipelined copies);
* bigger, otherwise: request to send, the receiver's clear-to-send once a receive matched, then
  chunks through the pool, staged by the sender while the receiver copies the previous ones
  (pipelined, bounded memory whatever the message size).

The Store is used for set-up (a job token, each rank's host and pid) only. A peer whose process
ended fails the operations pending with it with :class:`PeerDied`; one that does not do its part
within ``timeout`` with :class:`TransportTimeout`. CUDA tensors are pulled through CUDA IPC
(``cuda_ipc.py``); peers on another host go through the default process group.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import datetime as dt
import errno
import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nsysan.transport import cma, futex, ring
from nsysan.transport.cuda_ipc import CudaIpcChannel, PendingCopy
from nsysan.transport.errors import (
    PeerDied,
    SharedMemoryFull,
    TransportError,
    TransportTimeout,
)
from nsysan.transport.shm import Segment, disown, own, remove_all, shm_dir

try:
    import nvtx
except ImportError:
    nvtx = None

__all__ = ["Handle", "P2PTransport", "PeerDied", "SharedMemoryFull", "TransportError", "TransportTimeout"]

FREED = 11  # sender -> receiver: an empty() segment it was sent is gone, drop the mapping
_SPIN_S = 100e-6  # poll this long before sleeping on the doorbell
_CHECK_EVERY_S = 0.05  # deadlines and peers' liveness, while something is pending
_MAPPED_SEGMENTS = 32  # peers' empty() segments kept mapped per process
_log = logging.getLogger("nsysan.transport")
_cma_refusal_logged = False
_DTYPES = [getattr(torch, n) for n in (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
) if hasattr(torch, n)]  # fmt: skip
_DTYPE_INDEX = {d: i for i, d in enumerate(_DTYPES)}


def _range(message: str, nbytes: int):
    """An NVTX range named per peer and tag (so nsys and nsysan aggregate them) carrying the bytes."""
    return nvtx.annotate(message, domain="nsysan", payload=nbytes) if nvtx is not None else contextlib.nullcontext()


class _Done:
    """Whether an operation finished: a flag, with a ``threading.Event`` made only for a thread that
    must block on it. Driving threads just look at the flag, and an Event per operation (1.5 us to
    make) was a tenth of a small message's one-way time."""

    __slots__ = ("_event", "_set")
    _making = threading.Lock()  # one Event per operation, however many threads wait

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None) -> bool:
        if self._set:
            return True
        with _Done._making:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._set:  # set() ran before the Event existed
            return True
        return event.wait(timeout)


class _Op:
    """One send or receive: what it moves and how far it got."""

    def __init__(self, what: str, peer: int, tag: int, deadline: float) -> None:
        self.what, self.peer, self.tag, self.deadline = what, peer, tag, deadline
        self.done = _Done()
        self.error: BaseException | None = None
        self.msg_id = 0
        self.nbytes = 0
        # the bytes to send, or the receive buffer's: a byte ndarray (a CUDA tensor on the GPU path)
        self.data: Any = None
        self.device_out: Any = None  # a CUDA receive buffer for host bytes: ``data`` stages them
        self.keep: Any = None  # what must stay alive until the peer is done with it
        self.release: Callable[[], None] | None = None
        self.head: dict[str, Any] = {}  # descriptor fields of a send not yet posted
        self.kind = 0  # how a send travels (ring.INLINE, EAGER, RTS, SEGMENT, CUDA)
        self.blob = b""
        self.staged = self.acked = self.received = 0


class _Arrival:
    """A message the receiver has not matched yet (its payload copied out of the ring or the pool)."""

    __slots__ = ("a", "blob", "dtype", "held", "kind", "msg_id", "nbytes", "payload", "seq", "shape")

    def __init__(self, d: ring.Descriptor, payload: np.ndarray | None, blob: bytes, held: bool = False) -> None:
        self.kind, self.dtype, self.shape, self.seq = d.kind, d.dtype, d.shape, d.seq
        self.msg_id, self.nbytes, self.a = d.msg_id, d.nbytes, d.a
        self.payload, self.blob = payload, blob
        self.held = held  # an EAGER message still in the sender's chunk (not copied out)


class Handle:
    """A pending send or receive. ``wait`` raises what the transfer raised."""

    def __init__(self, op: _Op, drive: Callable[[_Op, float | None], None] | None = None) -> None:
        self.what = op.what
        self._op, self._drive = op, drive

    def is_completed(self) -> bool:
        return self._op.done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        if self._drive is not None:
            self._drive(self._op, timeout)
        elif not self._op.done.wait(timeout):
            raise TransportTimeout(f"{self.what}: not completed after {timeout} s")
        if self._op.error is not None:
            raise self._op.error

    def wait_stream(self, stream: object = None) -> None:
        """CPU and CUDA receives are complete (copy synchronised) when ``wait`` returns."""
        self.wait()


class P2PTransport:
    """Point-to-point transfers between the ranks of one host through shared memory.

    ``store`` is a torch.distributed Store shared by all ranks (e.g. the default group's), used for
    set-up only. ``chunk_bytes`` x ``chunks`` bounds the staging memory each rank reserves for
    ordinary tensors (lazily, at its first such message over one inline slot); ``slots`` x
    ``slot_bytes`` is each control ring.
    """

    def __init__(self, store: Any, rank: int, world_size: int, *, timeout: float = 60.0, namespace: str = "p2p",
                 chunk_bytes: int = 1 << 20, chunks: int = 8, slots: int = 32, slot_bytes: int = 8192,
                 cma_bytes: int | None = None, cma_pages: str | None = None,
                 cuda_host_bytes: int = 64 << 10) -> None:  # fmt: skip
        """Collective: every rank creates its transport, in the same order (the n-th transport of
        each rank talks to the n-th of the others).

        Ordinary CPU tensors over ``cma_bytes`` (default: one chunk) are read by the receiver straight
        from the sender's memory where the peers allow it and (``cma_pages="huge"``, the default)
        the tensor lies in huge pages, where that read is fast; ``cma_pages="any"`` reads tensors on
        any pages. ``NSYSAN_P2P_CMA=0`` (or a negative ``cma_bytes``) keeps them all on the
        shared-memory pool, ``NSYSAN_P2P_CMA=always`` means ``cma_pages="any"``.

        CUDA tensors up to ``cuda_host_bytes`` travel through host memory (a copy to the host and
        one back cost less than a CUDA IPC pull); larger ones are pulled by the receiver."""
        if not futex.supported():
            raise TransportError(f"rank {rank}: no futex calls known for this CPU architecture")
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.chunk_bytes, self.chunks, self.slots, self.slot_bytes = chunk_bytes, chunks, slots, slot_bytes
        self._inline = ring.inline_capacity(slot_bytes)
        mode = os.environ.get("NSYSAN_P2P_CMA", "")
        if cma_bytes is None:
            cma_bytes = chunk_bytes if mode != "0" else -1
        self.cma_bytes = cma_bytes
        self.cuda_host_bytes = cuda_host_bytes
        self.cma_pages = cma_pages or ("any" if mode == "always" else "huge")
        if self.cma_pages not in ("huge", "any"):
            raise TransportError(f"rank {rank}: cma_pages must be 'huge' or 'any', not {self.cma_pages!r}")
        self._huge_likely = _huge_pages_likely()  # when the kernel cannot tell a tensor's pages
        self._cma_peers: set[int] = set()  # peers that read our tensors directly
        self._cma_watch: dict[int, cma.Watch] = {}  # peers we read from: has the process ended?
        generation = int(store.add(f"{namespace}/generation/{rank}", 1))
        self.prefix = f"{namespace}/{generation}"
        self._who = f"rank {rank}: "
        self._lock = threading.Lock()
        self._closing = False
        self._cuda_channel: CudaIpcChannel | None = None
        self._send_seq: dict[tuple[int, int], int] = collections.defaultdict(int)
        self._recv_seq: dict[tuple[int, int], int] = collections.defaultdict(int)
        self._next_msg = 1
        self._pending: set[_Op] = set()
        self._sends: dict[int, _Op] = {}  # by message id: waiting for CTS, chunk acks or DONE
        self._streams: collections.deque[_Op] = collections.deque()  # cleared to send, chunks left to stage
        self._outbox: dict[int, collections.deque[_Op]] = collections.defaultdict(collections.deque)  # not yet posted
        self._posted: dict[tuple[int, int], collections.deque[_Op]] = collections.defaultdict(collections.deque)
        self._unexpected: dict[tuple[int, int], collections.deque[_Arrival]] = collections.defaultdict(
            collections.deque
        )
        self._active: dict[tuple[int, int], _Op] = {}  # (src, msg id) -> receive taking chunks
        self._ready: list[tuple[int, _Op, _Arrival]] = []  # matched segment/CUDA messages to copy
        self._copies: list[tuple[int, _Op, int, PendingCopy]] = []  # CUDA pulls in flight: DONE when finished
        self._backlog: dict[int, collections.deque[tuple[int, dict[str, Any]]]] = collections.defaultdict(
            collections.deque
        )
        self._pool: Segment | None = None
        self._pool_bytes: np.ndarray = np.empty(0, np.uint8)  # mapped at the first ordinary message
        self._free_chunks: list[int] = []
        self._chunk_peer: dict[int, int] = {}
        self._peer_pools: dict[int, tuple[Segment, np.ndarray]] = {}
        self._pinned: dict[int, tuple[str, int]] = {}  # base address of an empty() segment -> name, size
        self._pinned_peers: dict[str, set[int]] = {}  # which peers were sent (and may map) each segment
        self._freed: collections.deque[str] = collections.deque()  # empty() segments the GC released
        self._mapped: collections.OrderedDict[tuple[int, str], tuple[Segment, np.ndarray]] = collections.OrderedDict()
        self._buffers = 0
        self._dead: dict[int, int] = {}
        self._waiters = 0
        self._asked_wake = False
        self._settling = False  # closing: every acknowledgement should wake us
        self._park = ctypes.c_uint32(0)  # the background thread sleeps on this while a user thread drives
        self._park_addr = ctypes.addressof(self._park)
        self._parked = False
        self._next_check = 0.0

        if rank == 0:
            store.set(f"{self.prefix}/token", f"{os.getpid():x}{secrets.token_hex(3)}")
        store.wait([f"{self.prefix}/token"], dt.timedelta(seconds=timeout))
        token = store.get(f"{self.prefix}/token").decode()
        self._files = os.path.join(shm_dir(), f"nsysan-p2p-{token}-r")
        own(f"{self._files}{rank}-")  # removed at exit or on SIGTERM if close() never comes
        size = ring.inbox_bytes(world_size, slots, slot_bytes)
        self._inbox = Segment(f"{self._files}{rank}-inbox", size, create=True, owner=self._who)
        self._inbox_bytes = np.frombuffer(self._inbox.map, np.uint8)
        self._bell = self._inbox_bytes[:4].view(np.uint32)
        self._bell_addr = self._inbox_bytes.ctypes.data
        self._sleepers = _sleepers_word(self._inbox_bytes)  # peers ring the bell only while this is > 0
        self._sleeping = 0  # threads asleep on the doorbell
        self._polling = 0  # user threads in _wait, not asleep: they see every descriptor without a ring
        self._users_asleep = 0  # user threads in _sleep: whoever completes their operations wakes them
        self._sleep_lock = threading.Lock()
        self.host = os.environ.get("NSYSAN_P2P_HOST") or socket.gethostname()
        # what a peer reads to find out whether it may read our memory (cross-memory attach)
        self._probe = ctypes.create_string_buffer(f"nsysan-p2p {token} rank {rank}".encode())
        me = {"host": self.host, "pid": os.getpid(), "pidns": _pid_namespace(), "probe": ctypes.addressof(self._probe)}
        store.set(f"{self.prefix}/host/{rank}", json.dumps(me))
        keys = [f"{self.prefix}/host/{r}" for r in range(world_size)]
        try:
            store.wait(keys, dt.timedelta(seconds=timeout))
        except Exception:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            self._inbox.unlink()
            raise TransportTimeout(
                f"rank {rank}: ranks {missing} did not create their P2PTransport within {timeout:g} s"
            ) from None
        peers = {r: json.loads(store.get(k)) for r, k in enumerate(keys)}
        self._hosts = {r: p["host"] for r, p in peers.items()}
        # a pid says whether a peer lives only if it is in our pid namespace
        self._pids = {r: p["pid"] for r, p in peers.items() if p["pidns"] == me["pidns"] and r != rank}
        self._local = [r for r in range(world_size) if r != rank and not self._remote(r)]
        # unmatched small messages left in a sender's chunks: all receivers together hold at most half
        # of its pool, so the other half always cycles (no head-of-line blocking by late receives)
        self._hold_limit = chunks // (2 * max(1, len(self._local)))
        self._held: dict[int, int] = collections.defaultdict(int)
        self._spares: dict[int, list[np.ndarray]] = {}  # size class -> reusable private buffers
        # spinning before a sleep only pays when every local rank has a CPU; oversubscribed, it
        # takes the CPU from the very peer being waited for
        self._spin_s = _SPIN_S if len(self._local) + 1 <= len(os.sched_getaffinity(0)) else 0.0
        self._readers = {r: ring.RingReader(self._inbox_bytes, r, slots, slot_bytes) for r in self._local}
        self._writers: dict[int, ring.RingWriter] = {}
        self._peer_inboxes: dict[int, tuple[Segment, np.ndarray]] = {}
        self._bells: dict[int, int] = {}
        self._peer_sleepers: dict[int, np.ndarray] = {}
        readable: list[int] = []
        try:
            for r in self._local:
                seg = Segment(f"{self._files}{r}-inbox", size, create=False, owner=self._who)
                view = np.frombuffer(seg.map, np.uint8)
                self._peer_inboxes[r] = (seg, view)
                self._writers[r] = ring.RingWriter(view, rank, slots, slot_bytes)
                self._bells[r] = view.ctypes.data
                self._peer_sleepers[r] = _sleepers_word(view)
            readable = self._probe_peers(peers, token)
        finally:
            store.set(f"{self.prefix}/cma/{rank}", json.dumps(readable))
            self._barrier("mapped")
            self._inbox.unlink()  # every peer maps it now: the name can go, nothing is left behind on a crash
        for r in self._local if self.cma_bytes >= 0 else ():  # the peers that will read our tensors themselves
            if rank in json.loads(store.get(f"{self.prefix}/cma/{r}")):
                self._cma_peers.add(r)
        if self._cma_peers and self.cma_pages == "huge" and not self._huge_likely:
            _log.info(
                "%sordinary tensors over %d bytes in huge pages are read straight from this process's memory "
                "(one copy); on 4 KiB pages that read is slow, so they go through the shared-memory pool "
                "(two copies): start the ranks with THP_MEM_ALLOC_ENABLE=1 (torch then allocates tensors of "
                "2 MiB or more in transparent huge pages)",
                self._who, self.cma_bytes,
            )  # fmt: skip
        self._thread = threading.Thread(target=self._background, name="nsysan-p2p progress", daemon=True)
        self._thread.start()

    def _probe_peers(self, peers: dict[int, dict[str, Any]], token: str) -> list[int]:
        """The local peers whose memory we may read (``process_vm_readv`` of their probe bytes works);
        a refusal is logged once per process and that pair keeps the shared-memory path."""
        global _cma_refusal_logged
        if self.cma_bytes < 0:
            return []
        readable = []
        for r in self._local:
            if r not in self._pids or "probe" not in peers[r]:
                continue  # another pid namespace: its pid means nothing here
            why = cma.probe(self._pids[r], peers[r]["probe"], f"nsysan-p2p {token} rank {r}".encode())
            if why is None:
                self._cma_watch[r] = cma.Watch(self._pids[r])
                readable.append(r)
            elif not _cma_refusal_logged:
                _cma_refusal_logged = True
                _log.warning(
                    "%sreading rank %d's memory directly (process_vm_readv) is refused (%s): ordinary tensors "
                    "over %d bytes from it go through the shared-memory pool (two copies). With Yama's "
                    "ptrace_scope 1, ranks can allow it with prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY).",
                    self._who, r, why, self.cma_bytes,
                )  # fmt: skip
        return readable

    def _readable_fast(self, src_bytes: torch.Tensor) -> bool:
        """Whether a direct read of these bytes pays: the kernel pins the sender's pages one by one,
        ~0.5 us per 4 KiB page on the measured VM (0.3-0.5x a copy_, where the pool's two pipelined
        copies reach ~0.6x), against 0.8-1.0x a copy_ on huge pages (docs/transport.md)."""
        if self.cma_pages == "any":
            return True
        share = cma.huge_fraction(src_bytes.data_ptr(), src_bytes.numel())
        return self._huge_likely if share is None else share >= 0.75

    def _barrier(self, name: str) -> None:
        key = f"{self.prefix}/{name}"
        self.store.add(key, 1)
        deadline = time.monotonic() + self.timeout
        while int(self.store.add(key, 0)) < self.world_size:
            if time.monotonic() > deadline:
                raise TransportTimeout(
                    f"rank {self.rank}: not every rank mapped the others' rings in {self.timeout:g} s"
                )
            time.sleep(0.001)

    # -- buffers ------------------------------------------------------------------------------

    def empty(self, shape: tuple[int, ...] | int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor in shared memory: the receiver copies straight out of it (no staging copy), so
        do not modify it before the send's handle completes. Its segment is released when the
        tensor (and every view of it) is freed."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            self._buffers += 1
            path = f"{self._files}{self.rank}-buf{self._buffers}"
        seg = Segment(path, -(-nbytes // 4096) * 4096, create=True, owner=self._who)
        tensor = torch.frombuffer(seg.map, dtype=torch.uint8)[:nbytes].view(dtype).reshape(shape)
        base = tensor.data_ptr()
        self._pinned[base] = (path, seg.size)
        weakref.finalize(seg.map, _forget_segment, weakref.ref(self), base, path)
        return tensor

    def _segment_of(self, tensor: torch.Tensor) -> tuple[str, int] | None:
        """(name, offset) when ``tensor`` lies inside one of our empty() segments."""
        if not tensor.is_contiguous():
            return None
        address = tensor.data_ptr()
        nbytes = tensor.numel() * tensor.element_size()
        for base, (path, size) in list(self._pinned.items()):
            if base <= address and address + nbytes <= base + size:
                return path, address - base
        return None

    def _ensure_pool(self) -> None:
        if self._pool is None:
            self._pool = Segment(
                f"{self._files}{self.rank}-pool", self.chunk_bytes * self.chunks, create=True, owner=self._who
            )
            self._pool_bytes = np.frombuffer(self._pool.map, np.uint8)
            self._free_chunks = list(range(self.chunks - 1, -1, -1))

    def _peer_pool(self, src: int) -> np.ndarray:
        if src not in self._peer_pools:
            seg = Segment(f"{self._files}{src}-pool", self.chunk_bytes * self.chunks, create=False, owner=self._who)
            self._peer_pools[src] = (seg, np.frombuffer(seg.map, np.uint8))
        return self._peer_pools[src][1]

    def _peer_segment(self, src: int, path: str) -> np.ndarray:
        key = (src, path)
        if key in self._mapped:
            self._mapped.move_to_end(key)
            return self._mapped[key][1]
        seg = Segment(path, None, create=False, owner=f"{self._who}rank {src}'s ")
        self._mapped[key] = (seg, np.frombuffer(seg.map, np.uint8))
        while len(self._mapped) > _MAPPED_SEGMENTS:
            _, (old, _) = self._mapped.popitem(last=False)
            old.close()
        return self._mapped[key][1]

    # -- the API ------------------------------------------------------------------------------

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Handle:
        """Post ``tensor`` for rank ``dst`` under ``tag``; returns at once."""
        self._check_call(tensor, dst, tag, "isend")
        if tensor.is_conj() or tensor.is_neg():  # a lazy view: its bytes are not its values
            tensor = tensor.resolve_conj().resolve_neg()
        if self._remote(dst):  # across hosts: the default process group's engine (gloo or NCCL)
            return self._engine(dist.isend(tensor, dst, tag=tag), f"send {self.rank}->{dst} tag {tag} (remote)")
        src_bytes = _as_bytes(tensor)
        nbytes, dtype, shape = src_bytes.numel(), _dtype_index(tensor.dtype), tuple(tensor.shape)
        if len(shape) > ring.MAX_DIMS:
            raise TransportError(f"{self._who}tensors of more than {ring.MAX_DIMS} dimensions are not supported")
        cuda = tensor.device.type == "cuda"
        if cuda and nbytes <= self.cuda_host_bytes:  # waits for the tensor's stream, as a pull would
            tensor = tensor.cpu()
            src_bytes, cuda = _as_bytes(tensor), False
        segment = None if cuda or nbytes <= self._inline else self._segment_of(tensor)
        direct = (not cuda and segment is None and nbytes > max(self._inline, self.cma_bytes) and dst in self._cma_peers
                  and self._readable_fast(src_bytes))  # fmt: skip
        with self._lock:
            self._fail_if_closed(f"send to {dst}")
            if not cuda and nbytes > self._inline and segment is None and not direct:
                self._ensure_pool()  # a full /dev/shm is an error here, before a sequence number is taken
            seq = self._send_seq[(dst, tag)]
            self._send_seq[(dst, tag)] += 1
            op = _Op(f"send {self.rank}->{dst} tag {tag} #{seq}", dst, tag, time.monotonic() + self.timeout)
            op.msg_id, op.nbytes = self._next_msg, nbytes
            self._next_msg += 1
            head = {"dtype": dtype, "shape": shape, "tag": tag, "seq": seq, "msg_id": op.msg_id, "nbytes": nbytes}
            if dst in self._dead:
                self._fail(op, self._died(dst, op.what))
                return Handle(op, self._wait)
            op.head = head
            if cuda:  # the receiver pulls through CUDA IPC (cuda_ipc.py)
                meta, op.release = self._cuda().post(tensor)
                op.kind, op.blob = ring.CUDA, json.dumps(meta).encode()
            elif nbytes <= self._inline:
                op.kind, op.data, op.keep = ring.INLINE, src_bytes.numpy(), src_bytes
            elif segment is not None:
                op.kind, op.keep, op.blob = ring.SEGMENT, tensor, segment[0].encode()
                head["a"] = segment[1]
                self._pinned_peers.setdefault(segment[0], set()).add(dst)
            elif direct:  # the receiver reads it from our memory: keep it alive (and unchanged) until DONE
                op.kind, op.keep = ring.CMA, (tensor, src_bytes)
                head["a"] = src_bytes.data_ptr()
            elif nbytes <= self.chunk_bytes:
                op.kind, op.data, op.keep = ring.EAGER, src_bytes.numpy(), src_bytes
            else:
                op.kind, op.data, op.keep = ring.RTS, src_bytes.numpy(), src_bytes
            self._expect(op, send=op.kind in (ring.CUDA, ring.SEGMENT, ring.RTS, ring.CMA))
            self._outbox[dst].append(op)
            if len(self._outbox[dst]) == 1:
                self._flush(dst)
            if self._parked and not self._waiters and not op.done.is_set():
                self._unpark()
        return Handle(op, self._wait)

    def irecv(self, out: torch.Tensor, src: int, tag: int = 0) -> Handle:
        """Receive the next message of rank ``src`` under ``tag`` into ``out``; returns at once."""
        self._check_call(out, src, tag, "irecv")
        if out.is_conj() or out.is_neg():
            raise TypeError("irecv: cannot receive into a conjugate or negative view; resolve it first")
        if not out.is_contiguous():
            raise TransportError("irecv needs a contiguous tensor to receive into")
        if self._remote(src):
            return self._engine(dist.irecv(out, src, tag=tag), f"recv {self.rank}<-{src} tag {tag} (remote)")
        dst_bytes = _as_bytes(out)
        with self._lock:
            self._fail_if_closed(f"receive from {src}")
            seq = self._recv_seq[(src, tag)]
            self._recv_seq[(src, tag)] += 1
            op = _Op(f"recv {self.rank}<-{src} tag {tag} #{seq}", src, tag, time.monotonic() + self.timeout)
            op.keep = out
            op.data = dst_bytes if out.device.type == "cuda" else dst_bytes.numpy()
            op.nbytes = dst_bytes.numel()
            op.release = None
            waiting = self._unexpected.get((src, tag))
            if waiting:
                self._expect(op)
                self._match(src, op, waiting.popleft(), out)
            elif src in self._dead:
                self._fail(op, self._died(src, op.what))
            else:
                self._expect(op)
                self._posted[(src, tag)].append(op)
            if self._parked and not self._waiters and not op.done.is_set():
                self._unpark()
        return Handle(op, self._wait)

    # -- progress -----------------------------------------------------------------------------

    def _wait(self, op: _Op, timeout: float | None) -> None:
        """Drive progress from the waiting thread (no hand-off to another thread on the fast path):
        poll the rings, spin briefly, then sleep on our doorbell until a peer rings it."""
        if op.done.is_set():  # e.g. a small send, complete once posted
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        idle_since = None
        self._waiters += 1
        self._note(polling=1)
        try:
            while not op.done.is_set():
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise TransportTimeout(f"{op.what}: not completed after {timeout} s")
                bell = int(self._bell[0])
                if not self._lock.acquire(blocking=False):
                    op.done.wait(0.0005)
                    continue
                try:
                    progressed = self._poll()
                finally:
                    self._lock.release()
                if progressed or op.done.is_set():
                    idle_since = None
                    continue
                if self._idle_on_copy():
                    continue
                if idle_since is None:
                    idle_since = now
                elif now - idle_since >= self._spin_s:
                    self._sleep(bell, 0.002 if deadline is None else max(0.0, min(0.002, deadline - now)), op)
        finally:
            self._waiters -= 1
            if self._note(polling=-1):  # peers ring our sleepers again: wake them for what came meanwhile
                futex.full_fence()
                if self._descriptor_waiting():
                    futex.bump_and_wake(self._bell_addr)
            if not self._waiters and self._background_needed():
                self._unpark()  # the background thread takes over at once

    def _background_needed(self) -> bool:
        """Whether anything could need progress with no user thread waiting (else the background
        thread may stay parked until the next call: one wake-up less per message)."""
        return bool(self._pending or self._streams or self._ready or self._copies or self._freed
                    or any(self._outbox.values())
                    or any(self._backlog.values()))  # fmt: skip

    def _unpark(self) -> None:
        self._park.value += 1
        futex.bump_and_wake(self._park_addr)

    def _background(self) -> None:
        """Progress while nobody waits: drains rings (so senders never find them full), answers
        clear-to-sends, streams chunks, checks deadlines."""
        while not self._closing:
            if self._waiters:  # a user thread drives; sleep (not on the doorbell) until it leaves
                park = self._park.value
                self._parked = True
                if self._waiters:
                    futex.wait(self._park_addr, park, 0.05)
                self._parked = False
                continue
            bell = int(self._bell[0])
            with self._lock:  # held by a user thread for a moment at most: wait for it (the GIL is let go)
                try:
                    progressed = self._poll()
                except Exception:
                    progressed = False
            if progressed or self._idle_on_copy():
                continue
            busy = self._pending or any(self._backlog.values())
            self._sleep(bell, 0.002 if busy else 0.05)

    def _sleep(self, bell: int, timeout: float, op: _Op | None = None) -> None:
        """Sleep on our doorbell until it rings (or ``timeout`` s); ``op``: the operation a user
        thread waits for. ``bell`` is the doorbell's value read before the last look at the rings.

        Peers ring only while our sleepers word is above 0 (a wake-up syscall per message costs
        more than the message while we poll), so raise it, fence, and look at the rings once more: a
        peer that saw the word still 0 had published its descriptor before our fence, so it is
        seen here (Dekker's pattern: the peer stores head, fences, loads the word). Another thread
        of ours may take the descriptor and complete ``op``; it rings our doorbell when it sees a
        user thread asleep (``_poll``), or ``op`` is seen done here."""
        user = op is not None
        self._note(polling=-user, sleeping=1, users=user)
        try:
            futex.full_fence()
            if not (op is not None and op.done.is_set()) and not self._descriptor_waiting():
                futex.wait(self._bell_addr, bell, timeout)
        finally:
            self._note(polling=user, sleeping=-1, users=-user)

    def _descriptor_waiting(self) -> bool:
        """Whether a ring holds a descriptor nobody took yet (a look at the heads: no lock needed)."""
        return any(reader.pending() for reader in self._readers.values())

    def _note(self, polling: int = 0, sleeping: int = 0, users: int = 0) -> bool:
        """Count threads polling and asleep, and publish the sleepers word peers read before
        ringing: the sleepers while no user thread polls (one that polls sees every descriptor, and
        completes or wakes the others: ``_poll``), else 0. True when peers should ring."""
        with self._sleep_lock:
            self._polling += polling
            self._sleeping += sleeping
            self._users_asleep += users
            ring_me = 0 if self._polling else self._sleeping
            self._sleepers[0] = ring_me
        return ring_me > 0

    def _poll(self) -> bool:
        """One round of progress (lock held). True when something moved."""
        progressed = False
        for src, reader in self._readers.items():
            while (d := reader.peek()) is not None:
                try:
                    self._arrived(src, reader, d)
                except TransportError as exc:  # e.g. the peer's pool vanished: its transfers cannot go on
                    for op in [op for op in self._pending if op.peer == src]:
                        self._fail(op, exc)
                reader.advance()
                progressed = True
        for dst, queue in self._backlog.items():
            writer = self._writers[dst]
            while queue and writer.put(queue[0][0], **queue[0][1]):
                queue.popleft()
                self._ring(dst)
                progressed = True
        for dst in self._outbox:
            progressed |= self._flush(dst)
        # small messages waiting for a pool chunk: ask the receivers to wake us with their acks
        starved = self._settling or any(self._outbox.values())
        if starved != self._asked_wake:
            self._ask_wake(starved)
            progressed = True  # look at the rings again before sleeping (an ack posted before the flag showed)
        progressed |= self._pump()
        while self._ready:
            src, op, arrival = self._ready.pop()
            self._copy_direct(src, op, arrival)
            progressed = True
        if self._copies:
            progressed |= self._finish_copies()
        while self._freed:
            path = self._freed.popleft()
            for peer in self._pinned_peers.pop(path, ()):
                if peer not in self._dead:
                    self._post(peer, FREED, blob=path.encode())
        now = time.monotonic()
        if self._pending and now >= self._next_check:
            self._next_check = now + _CHECK_EVERY_S
            self._check(now)
        if progressed and self._users_asleep:  # what moved may be what they wait for (see _sleep)
            futex.bump_and_wake(self._bell_addr)
        return progressed

    def _ask_wake(self, on: bool) -> None:
        self._asked_wake = on
        for reader in self._readers.values():
            reader.ask_wake(on)
        if on:
            futex.full_fence()

    def _post(self, peer: int, kind: int, quiet: bool = False, **fields: Any) -> None:
        """Publish a descriptor to ``peer`` and ring its doorbell; queue it when the ring is full.

        ``quiet`` (the acknowledgement of a small message's pool chunk): ring only if the peer asked
        for it (it ran out of chunks); otherwise it finds the acknowledgement at its next look, and
        a small message costs the sender no wake-up."""
        queue = self._backlog[peer]
        writer = self._writers[peer]
        if queue or not writer.put(kind, **fields):
            if isinstance(fields.get("blob"), np.ndarray):
                fields["blob"] = fields["blob"].tobytes()  # the caller may reuse its buffer at once
            queue.append((kind, fields))
            return
        self._ring(peer, quiet)

    def _ring(self, peer: int, quiet: bool = False) -> None:
        """Ring ``peer``'s doorbell after publishing to it, if a thread of it sleeps there (and, for a
        ``quiet`` descriptor, it asked to be woken for those too). Both are flags the peer stores
        before looking at its rings again, so head must be visible before we load them."""
        futex.full_fence()
        if quiet and not self._writers[peer].wants_wake():
            return
        if self._peer_sleepers[peer][0]:
            futex.bump_and_wake(self._bells[peer])

    def _arrived(self, src: int, reader: ring.RingReader, d: ring.Descriptor) -> None:
        """Handle one descriptor from ``src`` while it is still in its slot."""
        kind = d.kind
        op: _Op | None
        if kind in (ring.INLINE, ring.EAGER, ring.RTS, ring.SEGMENT, ring.CUDA, ring.CMA):
            posted = self._posted.get((src, d.tag))
            while posted and posted[0].done.is_set():  # failed (timed out) receives
                posted.popleft()
            if posted:
                payload = reader.blob(d) if kind == ring.INLINE else None
                op = posted.popleft()
                self._match(
                    src, op, _Arrival(d, payload, b"" if kind == ring.INLINE else reader.blob(d).tobytes()), op.keep
                )
                return
            payload, blob = None, b""
            if kind == ring.INLINE:
                payload = reader.blob(d).copy()
            elif kind == ring.EAGER and self._held[src] < self._hold_limit:
                self._held[src] += 1  # left in the sender's chunk until a receive matches it
            elif kind == ring.EAGER:  # copy out now: late receives never hold more of a sender's pool
                at = d.a * self.chunk_bytes
                payload = self._spare_buffer(d.nbytes)
                payload[:] = self._peer_pool(src)[at : at + d.nbytes]
                self._post(src, ring.CHUNK_ACK, a=d.a, b=d.nbytes, quiet=True)
            else:
                blob = reader.blob(d).tobytes()
            self._unexpected[(src, d.tag)].append(
                _Arrival(d, payload, blob, held=kind == ring.EAGER and payload is None)
            )
        elif kind == ring.CHUNK:
            op = self._active.get((src, d.msg_id))
            if op is not None and not op.done.is_set():
                at = d.a * self.chunk_bytes
                with _range(f"p2p recv {self.rank}<-{src} tag {op.tag} (chunk)", d.nbytes):
                    op.data[d.b : d.b + d.nbytes] = self._peer_pool(src)[at : at + d.nbytes]
                op.received += d.nbytes
                if op.received == op.nbytes:
                    del self._active[(src, d.msg_id)]
                    self._complete(op)
            self._post(src, ring.CHUNK_ACK, a=d.a, b=d.nbytes, msg_id=d.msg_id)
        elif kind == ring.CTS:
            op = self._sends.get(d.msg_id)
            if op is None or op.done.is_set():
                self._post(src, ring.REFUSE, msg_id=d.msg_id, b=1, blob=f"rank {self.rank} gave up this send".encode())
            else:
                self._streams.append(op)
        elif kind == ring.CHUNK_ACK:
            self._free_chunks.append(d.a)
            self._chunk_peer.pop(d.a, None)
            op = self._sends.get(d.msg_id) if d.msg_id else None
            if op is not None:
                op.acked += d.b
                if op.acked == op.nbytes:
                    del self._sends[d.msg_id]
                    self._complete(op)
        elif kind == ring.DONE:
            op = self._sends.pop(d.msg_id, None)
            if op is not None:
                self._complete(op)
        elif kind == ring.REFUSE:
            text = reader.blob(d).tobytes().decode()
            op = self._active.pop((src, d.msg_id), None) if d.b else self._sends.pop(d.msg_id, None)
            if op is not None:
                prefix = "the sender" if d.b else "the receiver refused it"
                self._fail(op, TransportError(f"{self._who}{op.what}: {prefix}: {text}"))
        elif kind == FREED:
            entry = self._mapped.pop((src, reader.blob(d).tobytes().decode()), None)
            if entry is not None:
                entry[0].close()

    def _match(self, src: int, op: _Op, arrival: _Arrival, out: torch.Tensor) -> None:
        """Pair a posted receive with the oldest message of its (peer, tag)."""
        if arrival.nbytes != op.nbytes or arrival.dtype != _dtype_index(out.dtype):
            problem = (f"rank {src} sent {arrival.nbytes} bytes ({_DTYPES[arrival.dtype]} {list(arrival.shape)}), "
                       f"the receive buffer holds {op.nbytes} ({out.dtype} {list(out.shape)})")  # fmt: skip
            if arrival.kind == ring.EAGER and arrival.payload is None:
                self._post(src, ring.CHUNK_ACK, a=arrival.a, b=arrival.nbytes, quiet=True)
                self._held[src] -= arrival.held
            elif arrival.kind in (ring.RTS, ring.SEGMENT, ring.CUDA, ring.CMA):
                self._post(src, ring.REFUSE, msg_id=arrival.msg_id, blob=problem.encode())
            self._fail(op, TransportError(f"{self._who}{op.what}: {problem}"))
            return
        kind = arrival.kind
        if isinstance(op.data, torch.Tensor) and kind != ring.CUDA:  # host bytes for a GPU buffer: staged
            op.device_out, op.data = op.data, np.empty(op.nbytes, np.uint8)
        if kind in (ring.INLINE, ring.EAGER):
            source = arrival.payload
            if source is None:
                at = arrival.a * self.chunk_bytes
                source = self._peer_pool(src)[at : at + arrival.nbytes]
            with _range(f"p2p recv {self.rank}<-{src} tag {op.tag}", op.nbytes):
                if op.nbytes:
                    op.data[:] = source
            if kind == ring.EAGER and arrival.payload is not None:
                self._give_back_buffer(arrival.payload)
            if kind == ring.EAGER and arrival.payload is None:
                self._post(src, ring.CHUNK_ACK, a=arrival.a, b=arrival.nbytes, quiet=True)
                self._held[src] -= arrival.held
            self._complete(op)
        elif kind == ring.RTS:
            self._active[(src, arrival.msg_id)] = op
            self._post(src, ring.CTS, msg_id=arrival.msg_id)
        else:  # SEGMENT, CUDA or CMA: a copy of any size, done by the progress loop
            self._ready.append((src, op, arrival))

    def _spare_buffer(self, nbytes: int) -> np.ndarray:
        """Private memory for a small message no receive matched yet; reused, since fresh memory
        costs a page fault per page (more than the copy)."""
        size = 1 << max(12, (nbytes - 1).bit_length())
        spares = self._spares.get(size)
        return (spares.pop() if spares else np.empty(size, np.uint8))[:nbytes]

    def _give_back_buffer(self, view: np.ndarray) -> None:
        whole = view.base if view.base is not None else view
        spares = self._spares.setdefault(len(whole), [])
        if len(spares) < 8:
            spares.append(whole)

    def _copy_direct(self, src: int, op: _Op, arrival: _Arrival) -> None:
        """Copy straight from the sender's memory (an empty() segment, a CUDA IPC tensor or, by
        process_vm_readv, an ordinary tensor), then DONE."""
        if op.done.is_set():
            return
        try:
            with _range(f"p2p recv {self.rank}<-{src} tag {op.tag}", op.nbytes):
                if arrival.kind == ring.CUDA:  # DONE once the copy finished (_finish_copies)
                    out = op.data if isinstance(op.data, torch.Tensor) else torch.from_numpy(op.data)
                    self._copies.append(
                        (src, op, arrival.msg_id, self._cuda().fetch(json.loads(arrival.blob), out, src))
                    )
                    return
                elif arrival.kind == ring.CMA:
                    self._read_peer(src, op, arrival.a)
                else:
                    segment = self._peer_segment(src, arrival.blob.decode())
                    op.data[:] = segment[arrival.a : arrival.a + op.nbytes]
        except TransportError as exc:
            self._fail(op, exc)
            return
        self._post(src, ring.DONE, msg_id=arrival.msg_id)
        self._complete(op)

    def _finish_copies(self) -> bool:
        """Acknowledge the CUDA pulls whose copies finished; True if any did."""
        finished: list[tuple[int, _Op, int, PendingCopy]] = []
        still: list[tuple[int, _Op, int, PendingCopy]] = []
        for c in self._copies:
            (finished if c[3].finished() else still).append(c)
        if not finished:
            return False
        self._copies = still
        for src, op, msg_id, _ in finished:
            self._post(src, ring.DONE, msg_id=msg_id)  # the sender may reuse its tensor
            if not op.done.is_set():
                self._complete(op)
        return True

    def _idle_on_copy(self) -> bool:
        """Nothing else to do: block on the oldest CUDA pull in flight (it finishes sooner than a
        doorbell sleep would notice). False when there is none."""
        copies = self._copies
        if not copies:
            return False
        copies[0][3].wait()
        return True

    def _read_peer(self, src: int, op: _Op, address: int) -> None:
        """Read a CMA message from ``src``'s memory into the receive buffer. The sender keeps the
        tensor unchanged until our DONE; if it died, the bytes read are not trusted (its pid may even
        name another process by now): the receive fails with PeerDied."""
        watch = self._cma_watch[src]
        try:
            cma.read(self._pids[src], op.data.ctypes.data, address, op.nbytes)
            error = None
        except OSError as exc:
            error = exc
        # ESRCH: the sender's memory is already gone (it is exiting) while its pidfd may not say so
        # yet; a sender alive enough to read from never gives it (the probe at set-up read it)
        if watch.ended() or (error is not None and error.errno == errno.ESRCH):
            if src not in self._dead:
                self._peer_died(src)  # fails this receive (and everything else pending with src), naming it
            raise self._died(src, op.what)
        if error is not None:
            raise TransportError(f"{self._who}{op.what}: reading rank {src}'s memory failed: {error}")

    def _flush(self, dst: int) -> bool:
        """Post ``dst``'s outgoing messages in the order they were sent (the order matching relies
        on); stop at a small message waiting for a free chunk. Chunks come back as soon as the
        receiver's progress loop sees them (it copies out a message no receive matched yet), so a
        late receive never holds one."""
        queue, progressed = self._outbox[dst], False
        while queue:
            op = queue[0]
            if op.done.is_set():  # failed (timed out) before it could be posted
                queue.popleft()
                continue
            if op.kind == ring.EAGER:
                if not self._free_chunks:
                    break
                chunk = self._free_chunks.pop()
                self._chunk_peer[chunk] = dst
                at = chunk * self.chunk_bytes
                with _range(f"p2p send {self.rank}->{dst} tag {op.tag} (staging copy)", op.nbytes):
                    self._pool_bytes[at : at + op.nbytes] = op.data
                self._post(dst, ring.EAGER, a=chunk, **op.head)
            else:
                self._post(dst, op.kind, blob=op.data if op.kind == ring.INLINE else op.blob, **op.head)
            queue.popleft()
            if op.kind in (ring.INLINE, ring.EAGER):  # the payload is in shared memory: the buffer is free
                self._complete(op)
            progressed = True
        return progressed

    def _pump(self) -> bool:
        """Stage the next chunks of cleared-to-send messages into free pool chunks (round robin)."""
        progressed = False
        while self._streams and self._free_chunks:
            op = self._streams[0]
            if op.done.is_set() or op.staged == op.nbytes:
                self._streams.popleft()
                continue
            chunk = self._free_chunks.pop()
            self._chunk_peer[chunk] = op.peer
            n = min(self.chunk_bytes, op.nbytes - op.staged)
            at = chunk * self.chunk_bytes
            self._pool_bytes[at : at + n] = op.data[op.staged : op.staged + n]
            self._post(op.peer, ring.CHUNK, msg_id=op.msg_id, a=chunk, b=op.staged, nbytes=n)
            op.staged += n
            self._streams.rotate(-1)
            progressed = True
        return progressed

    # -- completion, failure, liveness ----------------------------------------------------------

    def _expect(self, op: _Op, *, send: bool = False) -> None:
        """Track an operation until it completes (a send also by its message id, for the peer's answers)."""
        self._pending.add(op)
        if send:
            self._sends[op.msg_id] = op

    def _complete(self, op: _Op) -> None:
        self._pending.discard(op)
        if op.release is not None:
            op.release()
        if op.device_out is not None:
            op.device_out.copy_(torch.from_numpy(op.data))
        op.keep = op.data = op.device_out = None
        op.done.set()

    def _fail(self, op: _Op, error: BaseException) -> None:
        self._pending.discard(op)
        if self._sends.get(op.msg_id) is op:
            del self._sends[op.msg_id]
        op.error, op.keep, op.data, op.device_out = error, None, None, None
        op.done.set()

    def _died(self, peer: int, what: str) -> PeerDied:
        return PeerDied(f"{self._who}{what}: rank {peer} (pid {self._dead[peer]}) died; its transfers cannot complete")

    def _check(self, now: float) -> None:
        """Fail operations past their deadline, and every operation with a peer that died."""
        for peer in {op.peer for op in self._pending}:
            if peer not in self._dead and peer in self._pids and not _alive(self._pids[peer]):
                self._peer_died(peer)
        for op in list(self._pending):
            if now > op.deadline:
                self._fail(op, TransportTimeout(
                    f"{self._who}{op.what} timed out after {self.timeout:g} s waiting for rank {op.peer}; "
                    f"is rank {op.peer} alive and did it post the matching call?"))  # fmt: skip

    def _peer_died(self, peer: int) -> None:
        """Fail what is pending with ``peer``, take back the chunks it held, remove its segments."""
        self._dead[peer] = self._pids[peer]
        for op in list(self._pending):
            if op.peer == peer:
                self._fail(op, self._died(peer, op.what))
        self._outbox.pop(peer, None)
        for chunk, holder in list(self._chunk_peer.items()):
            if holder == peer:
                del self._chunk_peer[chunk]
                self._free_chunks.append(chunk)
        self._backlog.pop(peer, None)
        remove_all(f"{self._files}{peer}-")

    # -- helpers ------------------------------------------------------------------------------

    def _remote(self, peer: int) -> bool:
        """Whether ``peer`` runs on another host (then an existing engine moves the bytes)."""
        return self._hosts[peer] != self.host

    def _engine(self, work: Any, what: str) -> Handle:
        """A handle over a torch.distributed request (cross-host fall-back)."""
        op = _Op(what, -1, 0, 0.0)

        def finish() -> None:
            try:
                work.wait()
            except BaseException as exc:
                op.error = TransportError(f"rank {self.rank}: {what}: {exc}")
            op.done.set()

        threading.Thread(target=finish, name=f"nsysan-p2p {what}", daemon=True).start()
        return Handle(op)

    def _cuda(self) -> CudaIpcChannel:
        if self._cuda_channel is None:
            self._cuda_channel = CudaIpcChannel()
        return self._cuda_channel

    def _check_call(self, tensor: object, peer: object, tag: object, what: str) -> None:
        """The arguments of a send or receive, checked before any state changes: a tag that does not
        fit the ring's int64 field used to raise struct.error after a sequence number was taken,
        breaking every later call; tensors the byte view cannot carry are refused by name."""
        for name, value in (("peer", peer), ("tag", tag)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what}: {name} must be an int, not {type(value).__name__}")
        if not 0 <= tag < 2**63:  # type: ignore[operator]
            raise ValueError(f"{what}: tag must be in [0, 2**63), not {tag}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: tensor must be a torch.Tensor, not {type(tensor).__name__}")
        if tensor.layout != torch.strided or tensor.is_nested:
            kind = "nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch.")
            raise TypeError(f"{what}: a {kind} tensor cannot be sent as bytes; send its dense parts")
        if tensor.device.type == "meta":
            raise TypeError(f"{what}: a meta tensor has no data to send")
        self._check_peer(peer)  # type: ignore[arg-type]

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise TransportError(f"rank {self.rank}: no peer {peer} in a world of {self.world_size}")

    def _fail_if_closed(self, what: str) -> None:
        if self._closing:
            raise TransportError(f"rank {self.rank}: {what}: the transport is closed")

    def _settle(self, seconds: float) -> None:
        """Before closing: post what is queued and get our pool chunks back (a small message already
        counted as sent may still be in a chunk the receiver has not copied out)."""
        deadline = time.monotonic() + seconds
        with self._lock:
            self._settling = True  # our chunks' acknowledgements wake us from now on (see _poll)
        while time.monotonic() < deadline:
            bell = int(self._bell[0])
            with self._lock:
                self._poll()
                owed = [p for p in self._chunk_peer.values() if p not in self._dead]
                queued = any(q for p, q in self._backlog.items() if p not in self._dead)
            if not owed and not queued:
                return
            self._sleep(bell, 0.001)

    def close(self) -> None:
        """Stop progress, fail what is still pending, unmap everything and remove our segments."""
        if self._closing:
            return
        self._settle(min(self.timeout, 10.0))
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for op in list(self._pending):
                self._fail(op, TransportError(f"rank {self.rank}: {op.what}: the transport was closed first"))
        futex.bump_and_wake(self._bell_addr)
        self._unpark()
        self._thread.join(timeout=5)
        with self._lock:
            self._readers.clear()
            self._writers.clear()
            for *_, copy in self._copies:
                copy.wait()  # the copy engines still write into receive buffers
            self._copies.clear()
            if self._cuda_channel is not None:
                self._cuda_channel.close()
            maps = [self._inbox, *(s for s, _ in self._peer_inboxes.values()), *(s for s, _ in self._peer_pools.values()),
                    *(s for s, _ in self._mapped.values())]  # fmt: skip
            if self._pool is not None:
                maps.append(self._pool)
            self._peer_inboxes.clear()
            self._peer_pools.clear()
            self._mapped.clear()
            self._peer_sleepers.clear()
            self._inbox_bytes = self._bell = self._pool_bytes = None  # type: ignore[assignment]  # unmapped below
            self._sleepers = np.zeros(1, np.uint32)  # a thread still leaving _wait may count itself out
            self._pool = None
            for seg in maps:
                seg.close()
            for watch in self._cma_watch.values():
                watch.close()
            self._cma_watch.clear()
            remove_all(f"{self._files}{self.rank}-")  # our pool and the names of our empty() buffers
            disown(f"{self._files}{self.rank}-")

    def __enter__(self) -> P2PTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _forget_segment(owner: weakref.ref, base: int, path: str) -> None:
    """An empty() tensor was freed: remove its name, and let the peers that mapped it know."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    transport = owner()
    if transport is not None:
        transport._pinned.pop(base, None)
        transport._freed.append(path)  # a deque append: safe from the garbage collector's thread
        if not transport._closing:
            futex.bump_and_wake(transport._bell_addr)
            if transport._parked and not transport._waiters:
                transport._unpark()


def _sleepers_word(inbox: np.ndarray) -> np.ndarray:
    """The sleepers word of an inbox (``ring.py``) as a one-element view: aligned 4-byte loads/stores."""
    return inbox[ring.SLEEPERS_AT : ring.SLEEPERS_AT + 4].view(np.uint32)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")  # a zombie has ended
    except (FileNotFoundError, IndexError):
        return False


def _huge_pages_likely() -> bool:
    """Whether torch's large CPU allocations get transparent huge pages (torch's own switch, or the
    system's THP mode ``always``)."""
    if os.environ.get("THP_MEM_ALLOC_ENABLE", "0") not in ("", "0"):
        return True
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return f"unknown-{socket.gethostname()}"


def _dtype_index(dtype: torch.dtype) -> int:
    try:
        return _DTYPE_INDEX[dtype]
    except KeyError:
        raise TransportError(f"dtype {dtype} is not supported by the P2P transport") from None


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view (or copy, when not contiguous) of a tensor of any shape, 0-dim included."""
    flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8, device=tensor.device)
