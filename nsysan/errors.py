"""Exceptions nsysan raises on purpose.

Library code raises these; the CLI prints ``str(exc)`` as one line on stderr and exits with
``exc.exit_code``. Anything else escaping is a bug in nsysan.
"""

from __future__ import annotations


class NsysanError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = 1


class InputError(NsysanError):
    """The input given to nsysan cannot be used (missing, not SQLite, not an nsys export...)."""

    exit_code = 2


class NotAnExportError(InputError):
    """A readable SQLite file that is not an Nsight Systems export."""


class CorruptExportError(InputError):
    """An nsys export that SQLite cannot read through (truncated or damaged)."""


class QueryTimeLimitError(InputError):
    """One read of an export ran past the per-query time limit (``NSYSAN_QUERY_TIME_LIMIT``)."""


class GateFailed(NsysanError):
    """``--fail-on`` matched a finding: the run is fine, the exit code carries the verdict."""

    exit_code = 3
