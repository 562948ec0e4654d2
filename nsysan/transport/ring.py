"""The control ring: one single-producer, single-consumer queue of message descriptors per ordered
pair of ranks, in the receiver's *inbox* (a shared-memory segment every peer maps once).

Inbox layout: a 32-bit doorbell at offset 0 (a futex word a producer bumps after publishing, when
the receiver sleeps), the receiver's 32-bit *sleepers* word at offset 64 (how many of its threads
sleep, or are about to, on the doorbell; while it is 0 the receiver is polling and nobody rings),
then one ring per possible sender, each ``128 + slots * slot_bytes`` bytes rounded to a page:

* ``head`` (u64, offset 0): descriptors published, written only by the sender;
* ``tail`` (u64, offset 64, its own cache line): descriptors consumed, written only by the receiver;
* ``wake`` (u64, offset 72, the receiver's line too): 1 while the receiver asks to be woken for every
  descriptor; otherwise acknowledgements of small messages are posted without a wake-up (their
  sender picks them up at its next look);
* ``slots``: descriptor ``i`` lives in slot ``i % slots``: a fixed header (kind, dtype, shape, tag,
  sequence, message id, size, two arguments) and a blob (an inline payload, a segment name, CUDA
  metadata or an error text).

Ordering: the sender fills a slot, fences, then stores ``head`` (release); the receiver loads
``head``, fences, reads the slot (acquire), and only then stores ``tail``, so a slot is never
overwritten while it is read. See ``futex.py`` for why these fences are enough.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from nsysan.transport import futex

# kinds of descriptor; sender -> receiver:
INLINE, EAGER, RTS, SEGMENT, CUDA, CHUNK = 1, 2, 3, 4, 5, 6
CMA = 12  # an ordinary tensor the receiver reads from the sender's memory (process_vm_readv)
# receiver -> sender:
CTS, CHUNK_ACK, DONE, REFUSE = 7, 8, 9, 10

MAX_DIMS = 16
_HEADER = struct.Struct("<IBBBxqQQQQQ")  # blob length, kind, dtype, ndim, tag, seq, msg id, nbytes, a, b
_SHAPE_AT = _HEADER.size
_BLOB_AT = _SHAPE_AT + 8 * MAX_DIMS
_RING_HEADER = 128
DOORBELL_BYTES = 4096
SLEEPERS_AT = 64  # in the doorbell's page, on its own cache line


@dataclass
class Descriptor:
    kind: int
    dtype: int
    shape: tuple[int, ...]
    tag: int
    seq: int
    msg_id: int
    nbytes: int
    a: int
    b: int
    blob_at: int  # where the blob starts in the inbox (inline payloads are copied straight from there)
    blob_len: int


def ring_bytes(slots: int, slot_bytes: int) -> int:
    return -(-(_RING_HEADER + slots * slot_bytes) // 4096) * 4096


def inbox_bytes(world: int, slots: int, slot_bytes: int) -> int:
    return DOORBELL_BYTES + world * ring_bytes(slots, slot_bytes)


def inline_capacity(slot_bytes: int) -> int:
    """The largest payload a descriptor carries in its own slot."""
    return slot_bytes - _BLOB_AT


class _Ring:
    def __init__(self, inbox: np.ndarray, src: int, slots: int, slot_bytes: int) -> None:
        self.bytes = inbox  # uint8 view of the whole inbox
        self.base = DOORBELL_BYTES + src * ring_bytes(slots, slot_bytes)
        words = inbox[self.base : self.base + _RING_HEADER].view(np.uint64)
        self._head, self._tail = words[0:1], words[8:9]  # one-element views: aligned 8-byte loads/stores
        self._wake = words[9:10]
        self.slots, self.slot_bytes = slots, slot_bytes
        self._buf = inbox.data  # header fields are packed and unpacked in place

    def _slot(self, index: int) -> int:
        return self.base + _RING_HEADER + (index % self.slots) * self.slot_bytes


class RingWriter(_Ring):
    """The sender's end of one ring."""

    def __init__(self, inbox: np.ndarray, src: int, slots: int, slot_bytes: int) -> None:
        super().__init__(inbox, src, slots, slot_bytes)
        self.head = int(self._head[0])

    def put(self, kind: int, *, dtype: int = 0, shape: tuple[int, ...] = (), tag: int = 0, seq: int = 0,
            msg_id: int = 0, nbytes: int = 0, a: int = 0, b: int = 0, blob: np.ndarray | bytes = b"") -> bool:  # fmt: skip
        """Publish one descriptor; False when the ring is full (the receiver has not caught up)."""
        if self.head - int(self._tail[0]) >= self.slots:
            return False
        blob_len = len(blob)
        if blob_len > self.slot_bytes - _BLOB_AT:
            raise ValueError(f"a descriptor's blob of {blob_len} bytes does not fit a {self.slot_bytes}-byte slot")
        at = self._slot(self.head)
        _HEADER.pack_into(self._buf, at, blob_len, kind, dtype, len(shape), tag, seq, msg_id, nbytes, a, b)
        if shape:
            struct.pack_into(f"<{len(shape)}q", self._buf, at + _SHAPE_AT, *shape)
        if blob_len:
            self.bytes[at + _BLOB_AT : at + _BLOB_AT + blob_len] = (
                np.frombuffer(blob, np.uint8) if isinstance(blob, bytes) else blob
            )
        futex.fence()  # the slot is complete before head says so (release)
        self.head += 1
        self._head[0] = self.head
        return True

    def wants_wake(self) -> bool:
        """Whether the receiver asked for a wake-up even for a descriptor it does not wait for
        (call after ``put`` and a full fence: see ``RingReader.ask_wake``)."""
        return bool(self._wake[0])


class RingReader(_Ring):
    """The receiver's end of one ring."""

    def __init__(self, inbox: np.ndarray, src: int, slots: int, slot_bytes: int) -> None:
        super().__init__(inbox, src, slots, slot_bytes)
        self.tail = int(self._tail[0])

    def peek(self) -> Descriptor | None:
        """The oldest unconsumed descriptor, or None. Valid until ``advance``."""
        if int(self._head[0]) == self.tail:
            return None
        futex.fence()  # read the slot only after seeing head (acquire)
        at = self._slot(self.tail)
        blob_len, kind, dtype, ndim, tag, seq, msg_id, nbytes, a, b = _HEADER.unpack_from(self._buf, at)
        shape = struct.unpack_from(f"<{ndim}q", self._buf, at + _SHAPE_AT) if ndim else ()
        return Descriptor(kind, dtype, shape, tag, seq, msg_id, nbytes, a, b, at + _BLOB_AT, blob_len)

    def blob(self, d: Descriptor) -> np.ndarray:
        return self.bytes[d.blob_at : d.blob_at + d.blob_len]

    def pending(self) -> bool:
        """Whether a descriptor waits (a look at ``head`` only: no lock, nothing consumed)."""
        return int(self._head[0]) != self.tail

    def ask_wake(self, on: bool) -> None:
        """Ask the sender to ring the doorbell for every descriptor (``on``) or only for the ones
        that need it. After turning it on, fence (``futex.full_fence``) and look at the ring again
        before sleeping: a descriptor posted before the sender saw the flag is then seen here."""
        self._wake[0] = 1 if on else 0

    def advance(self) -> None:
        """Give the slot back to the sender (after everything needed from it was read)."""
        futex.fence()  # reads of the slot are done before tail frees it
        self.tail += 1
        self._tail[0] = self.tail
