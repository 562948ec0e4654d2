"""The CUDA path of the P2P transport: the receiver pulls from the sender's tensor through CUDA IPC.

Sender: record an interprocess event on the tensor's current stream (the data is ready when it
fires), export the tensor with ``torch.multiprocessing``'s CUDA sharing (caching-allocator block,
offset, reference counting) and the event's IPC handle; keep both alive until the receiver's ack.
Receiver: rebuild the tensor, make a per-peer copy stream wait on the sender's event, copy (copy
engines, not SMs), and acknowledge once that copy finished (the transport polls its event, so the
copies of successive messages overlap), so the sender may then reuse its buffer. The event is only waited on after its metadata arrived, so it has been recorded (waiting
on an unrecorded IPC event returns at once).

Opening an IPC memory or event handle costs far more than a copy of a few MiB, so both sides keep
what they opened: the sender reuses an event once the receiver acknowledged its last use (never
while a wait on it may still be queued: a re-record on another stream would let that wait pass
early), the receiver keeps each event it opened and the last ``keep_sources`` storages it pulled
from per peer mapped (torch then finds them in its cache instead of reopening the handle). While a
storage is kept mapped, the sender's caching allocator does not reuse that block (torch holds it
until every consumer let go), so ``keep_sources`` bounds what a receiver holds of each sender.

``cuda`` and ``reduce`` are injectable so the order of these steps is testable without a GPU;
``benchmarks/p2p_cuda.py`` checks and measures it on one.
"""

from __future__ import annotations

import base64
import collections
import pickle
from collections.abc import Callable
from typing import Any


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


class PendingCopy:
    """A pull issued on a copy stream; the source stays referenced until the copy finished."""

    __slots__ = ("event", "source")

    def __init__(self, event: Any, source: Any) -> None:
        self.event, self.source = event, source

    def finished(self) -> bool:
        return bool(self.event.query())

    def wait(self) -> None:
        self.event.synchronize()


class CudaIpcChannel:
    def __init__(
        self,
        cuda: Any = None,
        reduce: Callable[[Any], tuple[Callable[..., Any], tuple]] | None = None,
        keep_sources: int = 8,
    ) -> None:
        if cuda is None:
            import torch

            cuda = torch.cuda
        if reduce is None:
            from torch.multiprocessing.reductions import reduce_tensor as reduce
        self.cuda: Any = cuda
        self.reduce: Callable[[Any], tuple[Callable[..., Any], tuple]] = reduce  # type: ignore[assignment]  # set above
        self.keep_sources = keep_sources
        self._streams: dict[tuple[int, Any], Any] = {}
        self._free_events: dict[Any, list[tuple[Any, str]]] = collections.defaultdict(list)  # by device
        self._opened_events: dict[tuple[Any, str], Any] = {}
        self._sources: dict[int, collections.OrderedDict[int, Any]] = collections.defaultdict(collections.OrderedDict)

    def post(self, tensor: Any) -> tuple[dict[str, str], Callable[[], None]]:
        """Metadata for the receiver, and a release to call on its ack (keeps the data alive)."""
        flat = tensor.contiguous().reshape(-1)  # a non-contiguous tensor is copied first ...
        free = self._free_events[tensor.device]
        event, handle = free.pop() if free else self._new_event(tensor.device)
        event.record(self.cuda.current_stream(tensor.device))  # ... so the event comes after that copy
        rebuild = self.reduce(flat)
        keep: list[Any] = [flat]

        def release() -> None:
            keep.clear()
            free.append((event, handle))

        return {"ipc": _encode(rebuild), "event": handle}, release

    def fetch(self, meta: dict[str, Any], out_bytes: Any, peer: int) -> PendingCopy:
        """Start copying the sender's bytes into ``out_bytes`` (a uint8 view of the receive buffer,
        on a GPU or in host memory: a CPU receive of a CUDA send copies device to host)."""
        rebuild, args = _decode(meta["ipc"])
        source = rebuild(*args)
        self._keep_mapped(peer, source)
        device = out_bytes.device if out_bytes.device.type == "cuda" else source.device
        event = self._opened_events.get((device, meta["event"]))
        if event is None:
            event = self.cuda.Event.from_ipc_handle(device, _decode(meta["event"]))
            self._opened_events[(device, meta["event"])] = event
        stream = self._stream(peer, device)
        stream.wait_stream(self.cuda.current_stream(device))  # work still using `out` first
        stream.wait_event(event)
        with self.cuda.stream(stream):
            out_bytes.copy_(source.view(-1).view(out_bytes.dtype)[: out_bytes.numel()], non_blocking=True)
            done = self.cuda.Event()
            done.record(stream)
        return PendingCopy(done, source)

    def close(self) -> None:
        """Let go of every peer's storage and event (the senders may then free them)."""
        self._sources.clear()
        self._opened_events.clear()

    def _new_event(self, device: Any) -> tuple[Any, str]:
        with self.cuda.device(device):  # torch creates the event lazily, on the current device
            event = self.cuda.Event(interprocess=True, enable_timing=False)
            return event, _encode(event.ipc_handle())

    def _keep_mapped(self, peer: int, source: Any) -> None:
        kept = self._sources[peer]
        storage = source.untyped_storage()
        key = storage.data_ptr()
        kept[key] = storage
        kept.move_to_end(key)
        while len(kept) > self.keep_sources:
            kept.popitem(last=False)

    def _stream(self, peer: int, device: Any) -> Any:
        """One copy stream per peer: a slow peer's copies never queue behind another's."""
        key = (peer, device)
        if key not in self._streams:
            self._streams[key] = self.cuda.Stream(device=device)
        return self._streams[key]
