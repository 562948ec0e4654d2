"""Reading nsys SQLite exports into a :class:`Trace` of tidy pandas frames."""

from nsysan.ingest.export import NsysExport
from nsysan.ingest.inputs import EXPORT_SUFFIXES, expand_inputs
from nsysan.ingest.trace import Trace, load_trace

__all__ = ["EXPORT_SUFFIXES", "NsysExport", "Trace", "expand_inputs", "load_trace"]
