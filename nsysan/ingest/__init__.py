"""Reading nsys SQLite exports into a :class:`Trace` of tidy pandas frames."""

from nsysan.ingest.export import NsysExport
from nsysan.ingest.trace import Trace, expand_inputs, load_trace

__all__ = ["NsysExport", "Trace", "expand_inputs", "load_trace"]
