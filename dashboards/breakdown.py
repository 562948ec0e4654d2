"""Where each rank's step time went, as a stacked bar chart: the report document's ``steps`` section
(``nsysan report --format json``; the store keeps it in a table of its own, ``trace_steps``, read by
``ReviewStore.steps``, never with the trace's summary).

One bar per rank and step, stacked by the five categories in a fixed order and colour (compute,
communication exposed, waiting for peer, copy exposed, idle; per step they add up to the step's
duration). The x axis is grouped by rank, then step, so ranks stand side by side and a late one
shows at a glance. Up to :data:`RANK_LIMIT` ranks every rank is drawn; beyond, four real ranks
stand for the job: the critical one (the rank the job waited for in most steps) and the ranks doing
the least, median and most work per step (compute + exposed communication + exposed copies), so a
64-rank job stays readable and every bar is still one rank's real step. One trace per category
(its values in rank, then step order) whatever the number of ranks; hovering any segment lists the
whole step, every category in ms and as a share of the step.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from nsysan.diff.compare import CATEGORIES

CATEGORY_LABELS = {c: c.replace("_", " ") for c in CATEGORIES}
CATEGORY_COLOURS = {
    "compute": "#1f77b4",  # the timeline's compute lane
    "communication_exposed": "#ff7f0e",  # its NCCL lane
    "waiting_for_peer": "#d62728",
    "copy_exposed": "#2ca02c",  # its copies lane
    "idle": "#b0b0b0",
}
RANK_LIMIT = 8  # more ranks than this: the critical rank and the least / median / most working ones
_WORK = ("compute", "communication_exposed", "copy_exposed")
_SOURCES = {
    "nvtx": "NVTX step ranges",
    "kernel_sequence": "the repeating kernel sequence",
    "capture": "each rank's whole GPU activity (no NVTX steps, no repeating kernel sequence)",
}


@dataclass(frozen=True)
class Shown:
    """A rank drawn in the chart, and why it was picked (empty when every rank is drawn)."""

    rank: int
    role: str = ""

    @property
    def label(self) -> str:
        return f"rank {self.rank}" + (f" · {self.role}" if self.role else "")


def unavailable(steps: dict[str, Any] | None) -> str | None:
    """Why there is no chart, in one line (None: there is one)."""
    if not isinstance(steps, dict):
        return ("No step breakdown: this trace was analysed by an nsysan without one (its report has no "
                "steps section); analyse it again to see where its step time went.")  # fmt: skip
    if not _ranks(steps):
        detail = f" ({steps['detail']})" if steps.get("detail") else ""
        return f'No step breakdown: no steps found{detail}. Mark each step with an NVTX range named "step N".'
    return None


def _ranks(steps: dict[str, Any]) -> dict[int, dict[str, list[float]]]:
    """Per rank with steps: its per-step series of each category (ns)."""
    out = {}
    for rank, r in (steps.get("ranks") or {}).items():
        parts = r.get("breakdown_ns") or {}
        series = {c: [float(x) for x in parts.get(c) or []] for c in CATEGORIES}
        n = max(len(v) for v in series.values())
        if n:
            out[int(rank)] = {c: v + [0.0] * (n - len(v)) for c, v in series.items()}
    return dict(sorted(out.items()))


def shown_ranks(steps: dict[str, Any], limit: int = RANK_LIMIT) -> list[Shown]:
    """The ranks the chart draws: all of them up to ``limit``; beyond, the critical rank and the
    ranks with the least, median and most work per step (each once, in that order)."""
    ranks = _ranks(steps)
    if len(ranks) <= limit:
        return [Shown(r) for r in ranks]
    critical = [int(r) for r in (steps.get("job") or {}).get("critical_rank") or [] if r is not None]
    by_work = sorted(ranks, key=lambda r: (float(np.mean(np.sum([ranks[r][c] for c in _WORK], axis=0))), r))
    picks: list[Shown] = []
    if critical:
        rank = Counter(critical).most_common(1)[0][0]
        if rank in ranks:
            picks.append(Shown(rank, "critical"))
    for rank, role in ((by_work[0], "least work"), (by_work[len(by_work) // 2], "median work"),
                       (by_work[-1], "most work")):  # fmt: skip
        if all(p.rank != rank for p in picks):
            picks.append(Shown(rank, role))
    return picks


def figure(steps: dict[str, Any], limit: int = RANK_LIMIT) -> go.Figure:
    """The stacked bars of :func:`shown_ranks`' ranks, x grouped by rank then step index.

    Each bar's figures ride along as numbers (``customdata``: rank, step, the step in ms, each
    category in ms, then each as % of the step) and the hover text is composed by plotly from them,
    so a long capture sends numbers, not a paragraph per bar and trace."""
    ranks = _ranks(steps)
    xs_rank: list[str] = []
    xs_step: list[str] = []
    values: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    custom: list[list[float]] = []
    for s in shown_ranks(steps, limit):
        series = ranks[s.rank]
        for i in range(len(series[CATEGORIES[0]])):
            xs_rank.append(s.label)
            xs_step.append(str(i))
            ms = [series[c][i] / 1e6 for c in CATEGORIES]
            step = sum(ms)
            for c, v in zip(CATEGORIES, ms, strict=True):
                values[c].append(v)
            custom.append([s.rank, i, round(step, 6), *(round(v, 6) for v in ms),
                           *(round(100 * v / step, 4) if step else 0.0 for v in ms)])  # fmt: skip
    n = len(CATEGORIES)
    lines = "".join(f"<br>{CATEGORY_LABELS[c]}: %{{customdata[{3 + k}]:,.3f}} ms (%{{customdata[{3 + n + k}]:.1f}}%)"
                    for k, c in enumerate(CATEGORIES))  # fmt: skip
    fig = go.Figure()
    for c in CATEGORIES:
        fig.add_trace(go.Bar(
            x=[xs_rank, xs_step], y=values[c], name=CATEGORY_LABELS[c], marker={"color": CATEGORY_COLOURS[c]},
            customdata=custom, hovertemplate=f"<b>{CATEGORY_LABELS[c]}</b><br>rank %{{customdata[0]}}, step "
            f"%{{customdata[1]}}: %{{customdata[2]:,.3f}} ms{lines}<extra></extra>",
        ))  # fmt: skip
    return _stacked(fig, height=340, bargap=0.15, legend_y=1.08, x_title="rank, then step (index in the capture)",
                    y_title="ms")  # fmt: skip


def comparison_figure(breakdown: dict[str, Any], limit: int = RANK_LIMIT) -> go.Figure | None:
    """Before and after a fix side by side, stacked by category (``nsysan diff``'s ``breakdown``: each
    bar the mean step in ms): first the job (every rank weighing the same), then each rank, up to
    ``limit`` of them: all when the job has so few, else, of those whose change is not the job's
    (``differs``), the ``limit`` furthest from it, in rank order. None when either side has no breakdown."""
    if not breakdown.get("available"):
        return None
    ranks = breakdown["per_rank"]
    if len(ranks) > limit:  # those whose change is furthest from the job's (nsysan diff's order), in rank order
        differing = [r for r in ranks if any(c["differs"] for c in r["categories"].values())]
        ranks = sorted(sorted(differing, key=lambda r: -_off_the_job(r, breakdown["job"]))[:limit],
                       key=lambda r: r["rank"])  # fmt: skip
    columns = [("job", breakdown["job"])] + [(f"rank {r['rank']}", r["categories"]) for r in ranks]
    groups, sides = [], []
    values: dict[str, list[float | None]] = {c: [] for c in CATEGORIES}
    for label, cats in columns:
        for side in ("before", "after"):
            groups.append(label)
            sides.append(side)
            for c in CATEGORIES:
                ns = cats[c][side]
                values[c].append(None if ns is None else ns / 1e6)
    fig = go.Figure()
    for c in CATEGORIES:
        fig.add_trace(go.Bar(
            x=[groups, sides], y=values[c], name=CATEGORY_LABELS[c], marker={"color": CATEGORY_COLOURS[c]},
            hovertemplate=f"<b>{CATEGORY_LABELS[c]}</b><br>%{{x}}: %{{y:,.3f}} ms a step<extra></extra>",
        ))  # fmt: skip
    return _stacked(
        fig,
        height=320,
        bargap=0.2,
        legend_y=1.1,
        x_title="the job (mean over ranks), then ranks: before and after",
        y_title="ms a step (mean)",
    )


def _stacked(fig: go.Figure, *, height: int, bargap: float, legend_y: float, x_title: str, y_title: str) -> go.Figure:
    """The layout both charts share: bars stacked by category over a two-level x axis, the legend on top."""
    fig.update_layout(
        barmode="stack", bargap=bargap, height=height, margin={"l": 10, "r": 10, "t": 30, "b": 40},
        plot_bgcolor="white", legend={"orientation": "h", "y": legend_y, "x": 0, "traceorder": "normal"},
        xaxis={"type": "multicategory", "title": x_title},
        yaxis={"title": y_title, "gridcolor": "#eee", "rangemode": "tozero"},
    )  # fmt: skip
    return fig


def _off_the_job(rank: dict[str, Any], job: dict[str, Any]) -> float:
    """How far a rank's change is from the job's, its largest over the categories (a side missing: infinite)."""
    deltas = [(c["delta"], job[name]["delta"]) for name, c in rank["categories"].items()]
    return max(math.inf if d is None or j is None else abs(d - j) for d, j in deltas)


def clicked_step(click: dict[str, Any] | None) -> tuple[int, int] | None:
    """(rank, step index) of the bar clicked (plotly's clickData), or None."""
    points = (click or {}).get("points") or [{}]
    custom = points[0].get("customdata") if isinstance(points[0], dict) else None
    if not isinstance(custom, list) or len(custom) < 2:
        return None
    rank, step = custom[:2]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (rank, step)):
        return None
    return int(rank), int(step)


def step_window(steps: dict[str, Any] | None, rank: int, step: int) -> tuple[int, int] | None:
    """A rank's step as (start_ns, end_ns) on its export's clock, from the steps section; None
    when the section has no such step."""
    row = ((steps or {}).get("ranks") or {}).get(str(rank)) or {}
    starts, ends = row.get("start_ns") or [], row.get("end_ns") or []
    if not 0 <= step < min(len(starts), len(ends)) or ends[step] <= starts[step]:
        return None
    return int(starts[step]), int(ends[step])


def caption(steps: dict[str, Any], limit: int = RANK_LIMIT) -> str:
    """One line under the chart: where the steps came from and which ranks are drawn."""
    ranks = _ranks(steps)
    shown = shown_ranks(steps, limit)
    source = _SOURCES.get(str(steps.get("source")), str(steps.get("source")))
    text = f"Steps from {source}; each bar adds up to the rank's step. Click a bar to zoom the timeline to that step."
    if len(shown) < len(ranks):
        text += (f" {len(ranks)} ranks: drawn are the critical rank (the one the job waited for in most steps) "
                 "and the ranks doing the least, median and most work per step.")  # fmt: skip
    return text
