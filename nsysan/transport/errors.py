"""The transport's exceptions: every one names the rank it is about."""

from __future__ import annotations

from nsysan.errors import NsysanError


class TransportError(NsysanError):
    """A transfer could not be done (mismatched buffers, a peer that went away, no shared memory)."""


class TransportTimeout(TransportError):
    """A peer did not do its part in time."""


class PeerDied(TransportTimeout):
    """A peer's process ended while a transfer with it was pending (or before it was posted)."""


class SharedMemoryFull(TransportError):
    """Shared memory for a segment could not be reserved (a full or small ``/dev/shm``)."""
