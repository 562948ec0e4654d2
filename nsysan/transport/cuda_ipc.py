"""The CUDA path of the P2P transport: the receiver pulls from the sender's tensor through CUDA IPC.

Sender: record an interprocess event on the tensor's current stream (the data is ready when it
fires), export the tensor with ``torch.multiprocessing``'s CUDA sharing (caching-allocator block,
offset, reference counting) and the event's IPC handle; keep both alive until the receiver's ack.
Receiver: rebuild the tensor (torch caches opened IPC handles per process), make a per-peer copy
stream wait on the sender's event, copy (copy engines, not SMs), and synchronise that copy before
acknowledging, so the sender may then reuse its buffer. The event is only waited on after its
metadata arrived, so it has been recorded (waiting on an unrecorded IPC event returns at once).

``cuda`` and ``reduce`` are injectable so the order of these steps is testable without a GPU.
Not yet run on a GPU: no GPU was available where this was written.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable
from typing import Any


def _encode(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def _decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


class CudaIpcChannel:
    def __init__(
        self, cuda: Any = None, reduce: Callable[[Any], tuple[Callable[..., Any], tuple]] | None = None
    ) -> None:
        if cuda is None:
            import torch

            cuda = torch.cuda
        if reduce is None:
            from torch.multiprocessing.reductions import reduce_tensor as reduce
        self.cuda: Any = cuda
        self.reduce: Callable[[Any], tuple[Callable[..., Any], tuple]] = reduce  # type: ignore[assignment]  # set above
        self._streams: dict[tuple[int, Any], Any] = {}

    def post(self, tensor: Any) -> tuple[dict[str, str], Callable[[], None]]:
        """Metadata for the receiver, and a release to call on its ack (keeps the data alive)."""
        flat = tensor.contiguous().reshape(-1)  # a non-contiguous tensor is copied first ...
        event = self.cuda.Event(interprocess=True, enable_timing=False)
        event.record(self.cuda.current_stream(tensor.device))  # ... so the event comes after that copy
        rebuild = self.reduce(flat)
        keep: list[Any] = [flat, event]
        return {"ipc": _encode(rebuild), "event": _encode(event.ipc_handle())}, keep.clear

    def fetch(self, meta: dict[str, Any], out_bytes: Any, peer: int) -> None:
        """Copy the sender's bytes into ``out_bytes`` (a uint8 view of the receive buffer)."""
        rebuild, args = _decode(meta["ipc"])
        source = rebuild(*args)
        event = self.cuda.Event.from_ipc_handle(out_bytes.device, _decode(meta["event"]))
        stream = self._stream(peer, out_bytes.device)
        stream.wait_stream(self.cuda.current_stream(out_bytes.device))  # work still using `out` first
        stream.wait_event(event)
        with self.cuda.stream(stream):
            out_bytes.copy_(source.view(-1).view(out_bytes.dtype)[: out_bytes.numel()], non_blocking=True)
            done = self.cuda.Event()
            done.record(stream)
        done.synchronize()

    def _stream(self, peer: int, device: Any) -> Any:
        """One copy stream per peer: a slow peer's copies never queue behind another's."""
        key = (peer, device)
        if key not in self._streams:
            self._streams[key] = self.cuda.Stream(device=device)
        return self._streams[key]
