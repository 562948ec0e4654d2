"""Small pieces several pages show: times, severities, a finding's one-line identity, the zoomable timeline."""

from __future__ import annotations

import datetime as dt
from typing import Any

import plotly.graph_objects as go
from dash import html, no_update

from dashboards.app import Server


def duration(ns: float | None) -> str:
    if ns is None:
        return "–"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:,.2f} {unit}"
    return f"{ns:,.0f} ns"


def captured(utc_ns: int | None) -> str:
    if not utc_ns:
        return "–"
    return dt.datetime.fromtimestamp(utc_ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def severity_badge(severity: str) -> html.Span:
    return html.Span(severity, className=f"badge {severity}")


def where(f: dict[str, Any]) -> str:
    parts = [f"rank {f['rank']}" if f.get("rank") is not None else None,
             f"GPU {f['device']}" if f.get("device") is not None else None,
             f"pid {f['pid']}" if f.get("pid") is not None else None]  # fmt: skip
    return ", ".join(p for p in parts if p) or "whole job"


def thread(entries: list[dict[str, Any]], kind: str, empty: str) -> Any:
    """Comments on a finding or notes on a trace: author, time (UTC, to the minute), text."""
    if not entries:
        return html.P(empty, className="hint")
    return html.Ul([html.Li([html.B(e["author"]), f" · {e['created_at'][:16].replace('T', ' ')}: ", e["body"]],
                            className=kind) for e in entries])  # fmt: skip


def missing(what: str) -> html.Div:
    return html.Div(html.P(what, className="error"))


def zoomed_figure(server: Server, trace_id: int, relayout: dict[str, Any] | None,
                  highlight: dict[str, Any] | None = None) -> go.Figure | Any:  # fmt: skip
    """The timeline redrawn for the window the user zoomed or panned to (plotly's relayoutData)."""
    if not relayout:
        return no_update
    data = server.timelines.get(trace_id)
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        window = tuple(int(data.origin_ns + float(relayout[f"xaxis.range[{i}]"]) * 1e6) for i in (0, 1))
    elif isinstance(relayout.get("xaxis.range"), list) and len(relayout["xaxis.range"]) == 2:
        window = tuple(int(data.origin_ns + float(v) * 1e6) for v in relayout["xaxis.range"])
    elif relayout.get("xaxis.autorange"):
        window = data.window_for(highlight) if highlight else None
    else:
        return no_update
    findings = server.store.findings(trace_id)
    return data.figure(window, findings, highlight=highlight)  # type: ignore[arg-type]
