"""Turning a Trace and its Findings into a report document and its text formats."""

from __future__ import annotations

from typing import Any

from nsysan.detect import run_detectors
from nsysan.ingest.trace import Trace
from nsysan.overview import build_overview
from nsysan.report.document import build_document
from nsysan.report.renderers import FORMATS, RENDERERS


def analyse(trace: Trace, settings: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Ingest -> detect -> document: what ``nsysan report`` and the web UI both call.

    ``settings`` overrides detector parameters: {kind: {param: value}}.
    """
    return build_document(build_overview(trace), run_detectors(trace, settings))


__all__ = ["FORMATS", "RENDERERS", "analyse", "build_document"]
