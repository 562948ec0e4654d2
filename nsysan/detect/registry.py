"""The detector registry: each detector is a pure function of a Trace plus a parameters dataclass.

Built-in detectors register through the same :func:`register` an outside detector would use.
Parameters are dataclass fields with defaults and a ``help`` text; ``nsysan report --set
KIND.PARAM=VALUE`` overrides them, and ``nsysan detectors`` lists them.

A detector runs on one export at a time (:mod:`nsysan.detect.runner` runs it on each, possibly on
other machines) and returns its findings. A detector that must see every rank at once (the
ordering stall compares ops across ranks) registers a ``reduce``: then the function returns
compact tables from one export, and ``reduce`` turns the tables of all exports into findings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import pandas as pd

from nsysan.errors import InputError
from nsysan.findings import Finding
from nsysan.ingest.trace import Trace


@dataclass(frozen=True)
class JobFacts:
    """What a cross-rank reduce knows of the job besides the exports' compact tables."""

    runs: list[int]  # per export: the run length in ns (``common.run_ns``)
    clock: list[int]  # per export: ns to add to put its times on the job clock (aligned on collectives)
    notes: list[str] = dataclasses.field(default_factory=list)  # what a reduce could not do, for the report
    # time a reduce could not judge, and why (dicts with detector, rank, ns, why: ``steps.unjudged``)
    unjudged: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    attribution: Any = None  # the job's step attribution (nsysan.attribution.job.JobAttribution), when built
    # every detector's parameters as this report runs them, for a reduce that defers to another's
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Verdicts:
    """What a per-export detector may return instead of a plain list of findings: its findings and
    what it could not judge (``unjudged``: dicts with ``rank``, ``ns`` and ``why``), so the report
    never stays silent about time nobody looked at (``steps.unjudged``)."""

    findings: list[Finding]
    unjudged: list[dict[str, Any]] = dataclasses.field(default_factory=list)


Reduce = Callable[[dict[str, pd.DataFrame], JobFacts, Any], list[tuple[Finding, int]]]


@dataclass(frozen=True)
class DetectorSpec:
    kind: str
    run: Callable[[Trace, Any], Any]
    params: type
    summary: str
    reduce: Reduce | None = None


_REGISTRY: dict[str, DetectorSpec] = {}


def param(default: float, help: str, *, limit: bool = False) -> Any:
    """A detector parameter: its default and what it controls (shown by ``nsysan detectors``).
    ``limit``: a bound on the work or memory an analysis may take, not a threshold (a shared server
    lets it be lowered, never raised: :func:`raised_limits`)."""
    return dataclasses.field(default=default, metadata={"help": help, "limit": limit})


def register(
    kind: str, params: type, reduce: Reduce | None = None
) -> Callable[[Callable[[Trace, Any], Any]], Callable[[Trace, Any], Any]]:
    """Decorator: run ``detector(trace, params)`` in every report as finding kind ``kind``.

    Without ``reduce`` the detector returns findings of the export it is given. With it, the
    detector returns ``{name: frame}`` (each frame with an ``export`` column) and
    ``reduce(frames of every export, JobFacts, params)`` returns (finding, run length) pairs. The
    frames are built for that one call, so ``reduce`` may take them out of the dict and free what
    it no longer needs (a job's frames are GiBs at 1,024 ranks).
    """

    def add(detector: Callable[[Trace, Any], Any]) -> Callable[[Trace, Any], Any]:
        summary = (detector.__doc__ or kind).strip().splitlines()[0]
        _REGISTRY[kind] = DetectorSpec(kind, detector, params, summary, reduce)
        return detector

    return add


def registered() -> dict[str, DetectorSpec]:
    return dict(_REGISTRY)


def raised_limits(settings: dict[str, dict[str, float]]) -> list[str]:
    """The settings that raise a resource limit above its default (``KIND.PARAM=VALUE``), for a
    server to refuse: one user must not let an analysis take the memory everyone shares."""
    out = []
    for kind, values in settings.items():
        limits = {f.name: f.default for f in dataclasses.fields(_REGISTRY[kind].params) if f.metadata.get("limit")}
        out += [f"{kind}.{name}={value}" for name, value in values.items()
                if name in limits and value > cast(float, limits[name])]  # fmt: skip
    return out


def parse_settings(items: Iterable[str]) -> dict[str, dict[str, float]]:
    """``["kind.param=value", ...]`` to {kind: {param: value}}, checked against the registry."""
    settings: dict[str, dict[str, float]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        kind, dot, name = key.strip().partition(".")
        if not sep or not dot:
            raise InputError(f"--set {item!r}: expected KIND.PARAM=VALUE, e.g. comm_compute_slowdown.min_ratio=1.3")
        spec = _REGISTRY.get(kind)
        if spec is None:
            raise InputError(f"--set {item!r}: no detector {kind!r}; known: {', '.join(sorted(_REGISTRY))}")
        fields = {f.name: f for f in dataclasses.fields(spec.params)}
        if name not in fields:
            raise InputError(f"--set {item!r}: {kind} has no parameter {name!r}; known: {', '.join(fields)}")
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"--set {item!r}: {value!r} is not a number") from None
        if not math.isfinite(number) or number < 0:
            raise InputError(f"--set {item!r}: needs a finite number >= 0")
        whole = isinstance(fields[name].default, int)
        if whole and not number.is_integer():
            raise InputError(f"--set {item!r}: {kind}.{name} is a whole number")
        settings.setdefault(kind, {})[name] = int(number) if whole else number
    return settings
