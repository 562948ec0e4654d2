"""Small value formatters shared by the renderers, ``nsysan diff`` and the dashboard's pages."""

from __future__ import annotations

from typing import Any


def duration(ns: Any) -> str:
    """ns as the unit a person reads at a glance (1.23 ms); a whole run of 20 minutes is 1,200 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    shown = abs(float(f"{ns:.3g}"))  # the unit is chosen for the value as printed: 999.7 us is 1 ms
    if shown >= 1e12:  # past what three significant digits of seconds show without an exponent
        return f"{ns / 1e9:,.0f} s"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if shown >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def timestamp(ns: Any) -> str:
    """A trace timestamp the way the nsys timeline shows it: seconds since the session started."""
    return "-" if ns is None else f"{int(ns) / 1e9:.6f} s"


def size(n: Any) -> str:
    if n is None or n == "unknown":
        return "unknown"
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def percent(p: Any) -> str:
    return "-" if p is None else f"{float(p):.1f}%"


def share_of_run(value: Any) -> str:
    """A finding's ``share_of_run`` (a percentage, or None) as a sentence; a saved report or store
    from before it was a number holds the sentence already."""
    if value is None:
        return "run length unknown"
    if isinstance(value, str):
        return value
    return f"{float(value):.1f}% of the run"


def ranks(values: Any) -> str:
    return ",".join(str(v) for v in values) if values else "-"


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ranks(value)
    return str(value)
