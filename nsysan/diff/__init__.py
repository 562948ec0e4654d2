"""``nsysan diff``: two captures of one job, before and after a change, compared figure by figure.

One implementation for the CLI and the dashboard's compare page: :func:`load_side` turns a trace
(or a saved JSON report) into a profiled report document, :func:`diff_documents` compares two.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nsysan.diff.compare import (
    CONFIDENCE,
    DIFF_VERSION,
    NotComparable,
    confidence_greater,
    diff_documents,
    gate,
    metric_change,
    parse_threshold,
)
from nsysan.diff.manifest import capture_notes, read_manifest
from nsysan.diff.profile import DEFAULT_STEP_PATTERN, build_profile
from nsysan.errors import InputError


def load_side(arg: str, *, settings: dict[str, dict[str, float]] | None = None,
              step_pattern: str = DEFAULT_STEP_PATTERN,
              analyse_traces: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """One side of a diff: a saved ``report --format json`` document, or the traces ``arg`` names
    (a file, a directory of per-rank exports, a glob) analysed and profiled now: by
    ``analyse_traces`` when given (the CLI's engine, which keeps map results in the cache, so a
    second diff of the same capture does not analyse it again), else in this process."""
    path = Path(arg)
    if path.suffix == ".json" and path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{arg}: not a JSON report ({exc})") from None
        if not isinstance(doc, dict) or "findings" not in doc:
            raise InputError(f"{arg}: not an nsysan JSON report")
        if "profile" not in doc:
            raise InputError(f"{arg}: a JSON report without the diff profile; write it again with this nsysan "
                             "(`nsysan report TRACE --format json`)")  # fmt: skip
        return doc
    from nsysan.analysis import analyse
    from nsysan.ingest import load_trace

    manifest = read_manifest(arg)
    if analyse_traces is not None:
        doc = analyse_traces(arg)
    else:
        with load_trace([arg]) as trace:
            doc = analyse(trace, settings, step_pattern=step_pattern)
            doc["profile"] = build_profile(trace, step_pattern, doc["summary"])
    if manifest is not None:
        doc["capture"] = manifest
    return doc


def profile_files(paths: Sequence[str]) -> dict[str, Any]:
    """The diff profile of exports already registered somewhere (the dashboard's store), computed
    once per set of files and modification times: the compare page is opened far more often than
    a trace changes."""
    try:
        stamps = tuple(os.stat(p).st_mtime_ns for p in paths)
    except OSError as exc:
        raise InputError(f"{exc.filename}: the trace's file is gone") from None
    return _profile_cached(tuple(str(p) for p in paths), stamps)


@functools.lru_cache(maxsize=32)
def _profile_cached(paths: tuple[str, ...], stamps: tuple[int, ...]) -> dict[str, Any]:
    from nsysan.ingest import load_trace

    with load_trace(paths) as trace:
        return build_profile(trace)


__all__ = [
    "CONFIDENCE", "DEFAULT_STEP_PATTERN", "DIFF_VERSION", "NotComparable", "build_profile", "capture_notes",
    "confidence_greater", "diff_documents", "gate", "load_side", "metric_change", "parse_threshold", "profile_files",
    "read_manifest",
]  # fmt: skip
