"""nsysan's out-of-order point-to-point transport (see docs/transport.md)."""

from nsysan.transport.errors import (
    PeerDied,
    SharedMemoryFull,
    TransportError,
    TransportTimeout,
)
from nsysan.transport.p2p import Handle, P2PTransport

__all__ = ["Handle", "P2PTransport", "PeerDied", "SharedMemoryFull", "TransportError", "TransportTimeout"]
