"""Detectors: pure functions from a Trace to Findings, registered by kind.

Built-in detectors register through the same :func:`register` an outside detector would use.
"""

from __future__ import annotations

from collections.abc import Callable

from nsysan.findings import Finding
from nsysan.ingest.trace import Trace

Detector = Callable[[Trace], list[Finding]]

_REGISTRY: dict[str, Detector] = {}


def register(kind: str) -> Callable[[Detector], Detector]:
    """Decorator: make ``detector`` run for every report under finding kind ``kind``."""

    def add(detector: Detector) -> Detector:
        _REGISTRY[kind] = detector
        return detector

    return add


def run_detectors(trace: Trace) -> list[Finding]:
    """Every registered detector's findings, worst first."""
    findings = [f for detector in _REGISTRY.values() for f in detector(trace)]
    return sorted(findings, key=lambda f: (-f.severity.rank, -f.impact_ns, f.start_ns))
