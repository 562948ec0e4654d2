"""Small pieces several pages show: dates, severities, a finding's one-line identity, the zoomable timeline.

Durations are the report's (:func:`nsysan.report.format.duration`), so a page and ``nsysan report``
print the same figure the same way.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go
from dash import dcc, html, no_update

from dashboards.server import Server
from nsysan.store import FINDING_STATUSES


def captured(utc_ns: int | None) -> str:
    if not utc_ns:
        return "–"
    return dt.datetime.fromtimestamp(utc_ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


LONG_TEXT = 40  # characters: a cell past this (a demangled kernel name) may break anywhere


def cell(value: Any) -> html.Td:
    """A table cell; one holding long text (a kernel name runs to hundreds of characters with no
    space) is marked to break anywhere, so that it, not the window, gives way. Short cells keep
    their words whole."""
    return html.Td(value, className="long") if isinstance(value, str) and len(value) > LONG_TEXT else html.Td(value)


def recoverable_ns(findings: Iterable[dict[str, Any]]) -> int | None:
    """The findings' summed recoverable time; None when the analysis that stored them predates
    recoverable time (none of them carries it)."""
    known = [f["recoverable_ns"] for f in findings if f.get("recoverable_ns") is not None]
    return sum(known) if known else None


def severity_badge(severity: str) -> html.Span:
    return html.Span(severity, className=f"badge {severity}")


def where(f: dict[str, Any]) -> str:
    parts = [f"rank {f['rank']}" if f.get("rank") is not None else None,
             f"GPU {f['device']}" if f.get("device") is not None else None,
             f"pid {f['pid']}" if f.get("pid") is not None else None]  # fmt: skip
    return ", ".join(p for p in parts if p) or "whole job"


def thread(entries: list[dict[str, Any]], kind: str, empty: str) -> Any:
    """Comments on a finding or notes on a trace: author, time (UTC, to the minute), text; a finding's
    thread also holds its review events (``kind`` "event"): who changed what, from and to."""
    if not entries:
        return html.P(empty, className="hint")
    return html.Ul([_entry(e, kind) for e in entries])


def _entry(e: dict[str, Any], kind: str) -> html.Li:
    when = e["created_at"][:16].replace("T", " ")
    if e.get("kind") == "event":
        return html.Li([html.B(e["author"]), f" · {when}: changed {e['field']} ",
                        html.Span(e["from"] or "nobody", className="from"), " → ",
                        html.Span(e["to"] or "nobody", className="to")], className="event")  # fmt: skip
    return html.Li([html.B(e["author"]), f" · {when}: ", e["body"]], className=kind)


def status_counts(counts: Mapping[str, int]) -> str:
    """Findings by review status in a few words, in the statuses' order: ``12 open, 3 confirmed``."""
    order = {s: i for i, s in enumerate(FINDING_STATUSES)}
    return ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: order.get(s, len(order))) if counts[s])


def review_status(statuses: Iterable[str]) -> str:
    """The review status of several findings: their one status, or how many have each."""
    counts = Counter(statuses)
    return next(iter(counts)) if len(counts) == 1 else status_counts(counts)


def assignee_field(server: Server, field_id: str, current: str | None, placeholder: str) -> Any:
    """With login on, a choice of the server's users (and the current assignee, if no longer one);
    without, free text."""
    if not login_on(server):
        return dcc.Input(id=field_id, value=current or "", placeholder=placeholder, className="text")
    names = sorted(set(server.users) | ({current} if current else set()))
    return dcc.Dropdown(id=field_id, options=names, value=current, clearable=True, placeholder=placeholder)


def login_on(server: Server) -> bool:
    """Whether the server has users (login on); a stand-in server without them has none."""
    return bool(getattr(server, "users", None))


def missing(what: str) -> html.Div:
    return html.Div(html.P(what, className="error"))


def zoomed_figure(server: Server, trace_id: int, relayout: dict[str, Any] | None,
                  highlight: dict[str, Any] | None = None) -> go.Figure | Any:  # fmt: skip
    """The timeline redrawn for the window the user zoomed or panned to (plotly's relayoutData)."""
    if not relayout:
        return no_update
    data = server.timelines.get(trace_id)

    def on_clock(ms: Any) -> int:  # the axis shows ms since the timeline's origin
        return int(data.origin_ns + float(ms) * 1e6)

    window: tuple[int, int] | None
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        window = on_clock(relayout["xaxis.range[0]"]), on_clock(relayout["xaxis.range[1]"])
    elif isinstance(relayout.get("xaxis.range"), list) and len(relayout["xaxis.range"]) == 2:
        window = on_clock(relayout["xaxis.range"][0]), on_clock(relayout["xaxis.range"][1])
    elif relayout.get("xaxis.autorange"):
        window = data.window_for(highlight) if highlight else None
    else:
        return no_update
    return data.figure(window, server.store.findings(trace_id), highlight=highlight)
