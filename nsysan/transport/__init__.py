"""nsysan's out-of-order point-to-point transport (see docs/transport.md)."""

from nsysan.transport.p2p import Handle, P2PTransport, TransportError, TransportTimeout

__all__ = ["Handle", "P2PTransport", "TransportError", "TransportTimeout"]
