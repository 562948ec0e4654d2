"""The overview timeline: one row per rank, GPU and lane (compute, NCCL, copies), then the rank's
host rows: NVTX ranges per thread and nesting depth, CUDA API calls per thread.

A 1M-kernel trace cannot be drawn kernel by kernel, so each row decides for itself: when the
visible window holds few enough intervals it draws every one (with its name on hover), otherwise
it draws how busy the lane was in each of ``bins`` time slices, computed from the merged
intervals by binary search (:func:`nsysan.intervals.covered_ns`). Zooming in therefore always
ends in full detail, and the cost of a figure grows with rows x bins, not with kernels.

:class:`TimelineData` is built once per trace (the slow part: reading the columns) and kept by
the server; :meth:`TimelineData.figure` is what runs on every zoom.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from pandas.api.types import union_categoricals

from nsysan.arrays import distinct
from nsysan.errors import InputError
from nsysan.ingest.frames import NVTX_RANGE_TYPES
from nsysan.ingest.nccl import is_communication
from nsysan.ingest.trace import Trace
from nsysan.intervals import covered_ns, merge
from nsysan.report.document import fold_groups

LANES = ("compute", "NCCL", "copies", "NVTX", "CUDA API")
LANE_COLOURS = {"compute": "#1f77b4", "NCCL": "#ff7f0e", "copies": "#2ca02c", "NVTX": "#9467bd", "CUDA API": "#8c564b"}
HOST_LANES = ("NVTX", "CUDA API")  # rows per thread (and for NVTX, per nesting depth), not per GPU
# every other interval of a stream (of a thread, for host rows) is drawn in a darker shade of its
# lane's colour, so back-to-back kernels read as two bars, not one
LANE_SHADES = {lane: "#" + "".join(f"{int(c[i:i + 2], 16) * 3 // 4:02x}" for i in (1, 3, 5))
               for lane, c in LANE_COLOURS.items()}  # fmt: skip
NVTX_DEPTH_ROWS = 6  # NVTX rows per thread; ranges nested deeper are drawn in the last
SEVERITY_COLOURS = {"info": "#7f7f7f", "warning": "#e6a100", "critical": "#d62728"}
LABEL_WIDTH = 30  # a bar as wide as 1/30 of the window (~40 px) holds a short name
LABEL_LIMIT = 30  # names drawn at most: beyond, a view is too busy to read them (and slower to draw)
LABEL_CHARS = 12  # a label's characters (the name elided; the hover has it whole)
# a bar gets a hover point every 1/80 of the window: every 15 px of a 1200 px plot, inside plotly's
# 20 px hover distance, so hover works anywhere on it (1/200 cost the 446-finding finding page ~0.4 s)
HOVER_POINTS = 80
HOVER_POINTS_MAX = 50_000  # points inside bars, in all (fewer, further apart, beyond)
ROW_DETAIL_LIMIT = 2_000  # intervals a row may show one by one before it is drawn as occupancy
DEFAULT_BINS = 600
MARKER_LIFT_PX = 12  # a finding's ▼ is drawn this far above its row's centre, in the gap between rows
_KERNEL_COLUMNS = ("pid", "device", "stream", "start_ns", "end_ns", "short_name", "correlation_id")


class EmptyTimeline(InputError):
    """A trace with nothing to draw (no kernels, copies, NVTX ranges or CUDA API calls)."""


@dataclass
class TimelineData:
    """Every interval of a trace on the job clock, sorted by (row, start), plus per-row indexes."""

    rows: pd.DataFrame  # row, label, rank, device, lane; ordered as drawn
    row: np.ndarray  # per interval
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray  # index into names
    names: np.ndarray
    correlation: np.ndarray  # -1 where the interval has none (NVTX, CUDA API)
    shade: np.ndarray  # 0 or 1, alternating along each stream (or thread) of a row: drawn lighter or darker
    bounds: np.ndarray  # intervals of row i are [bounds[i], bounds[i+1])
    max_duration: np.ndarray  # per row: how far before a window an interval can start and still show
    merged: list[pd.DataFrame]  # per row: disjoint intervals, for occupancy
    rank_offset: dict[int, int]  # rank -> ns added to its export's clock to reach the job clock
    origin_ns: int

    @property
    def extent_ns(self) -> tuple[int, int]:
        if len(self.start) == 0:
            return self.origin_ns, self.origin_ns + 1
        return self.origin_ns, int(self.end.max())

    @property
    def intervals(self) -> int:
        return len(self.start)

    @classmethod
    def from_trace(cls, trace: Trace) -> TimelineData:
        parts = []
        k = trace.kernel_columns(_KERNEL_COLUMNS)
        if len(k):
            parts.append(pd.DataFrame({
                "export": k["export"], "rank": k["rank"], "pid": k["pid"], "device": k["device"],
                "lane": _lanes(np.where(is_communication(k), LANES.index("NCCL"), LANES.index("compute"))), "stream": k["stream"],
                "start": k["start_ns"], "end": k["end_ns"], "name": k["short_name"],
                "correlation": k["correlation_id"], "tid": -1, "depth": 0,
            }))  # fmt: skip
        for frame, label in ((trace.memcpy, None), (trace.memset, "memset")):
            if len(frame):
                what = frame["copy_kind"].astype(str) if label is None else pd.Series(label, index=frame.index)
                parts.append(pd.DataFrame({
                    "export": frame["export"], "rank": frame["rank"], "pid": frame["pid"], "device": frame["device"],
                    "lane": _lane("copies", len(frame)), "stream": frame["stream"],
                    "start": frame["start_ns"], "end": frame["end_ns"],
                    "name": what + " " + _bytes(frame["bytes"]), "correlation": frame["correlation_id"],
                    "tid": -1, "depth": 0,
                }))  # fmt: skip
        nvtx = trace.nvtx
        if len(nvtx):
            ranges = nvtx[nvtx["event_type"].isin(NVTX_RANGE_TYPES) & nvtx["end_ns"].notna()]
            depth = nesting_depth(ranges[["export", "pid", "tid"]], ranges["start_ns"], ranges["end_ns"])
            parts.append(pd.DataFrame({
                "export": ranges["export"], "rank": ranges["rank"], "pid": ranges["pid"],
                "device": _no_device(len(ranges)), "lane": _lane("NVTX", len(ranges)), "stream": -1,
                "start": ranges["start_ns"], "end": ranges["end_ns"],
                "name": ranges["text"].astype(str), "correlation": -1, "tid": ranges["tid"],
                "depth": np.minimum(depth, NVTX_DEPTH_ROWS - 1),
            }))  # fmt: skip
        api = trace.api_calls(["tid", "start_ns", "end_ns", "name"])
        if len(api):
            parts.append(pd.DataFrame({
                "export": api["export"], "rank": trace.rank_of(api["export"], api["pid"]), "pid": api["pid"],
                "device": _no_device(len(api)), "lane": _lane("CUDA API", len(api)), "stream": -1,
                "start": api["start_ns"], "end": api["end_ns"],
                "name": api["name"], "correlation": -1, "tid": api["tid"], "depth": 0,
            }))  # fmt: skip
        parts = [p for p in parts if len(p)]
        if not parts:
            raise EmptyTimeline("the trace has no kernels, copies, NVTX ranges or CUDA API calls to draw")
        d = pd.concat([p.drop(columns="name") for p in parts], ignore_index=True)
        # names stay categorical: a million kernels share a few hundred names
        d["name"] = union_categoricals([_categorical(p["name"]) for p in parts], ignore_order=True)
        d = trace.on_job_clock(d.dropna(subset=["start", "end"]), columns=("start", "end"))
        key = _row_key(d)
        rows = _rows(d.loc[key.drop_duplicates().index], key.drop_duplicates())
        d["row"] = pd.Index(rows["key"]).get_indexer(key)
        d = d.sort_values(["row", "start"], kind="stable")
        # every other interval of a stream (a thread, a depth) a shade darker: back-to-back kernels are two bars
        shade = (d.groupby(["row", "stream"], sort=False, dropna=False).cumcount().to_numpy() % 2).astype(np.int8)
        names = d["name"].array
        row = d["row"].to_numpy(dtype=np.int64)
        start, end = d["start"].to_numpy(dtype=np.int64), d["end"].to_numpy(dtype=np.int64)
        bounds = np.searchsorted(row, np.arange(len(rows) + 1))
        duration = pd.Series(end - start).groupby(row).max().reindex(range(len(rows)), fill_value=0)
        merged_all = merge(pd.DataFrame({"row": row, "start_ns": start, "end_ns": end}), ["row"])
        cut = np.searchsorted(merged_all["row"].to_numpy(), np.arange(len(rows) + 1))
        ranks = trace.ranks.dropna(subset=["rank"])
        offset = trace.job_clock()
        return cls(
            rows=rows.drop(columns=["key"]),
            row=row, start=start, end=end,
            name=names.codes.astype(np.int32), names=np.asarray(names.categories, dtype=object),
            correlation=d["correlation"].fillna(-1).to_numpy(dtype=np.int64), shade=shade,
            bounds=bounds, max_duration=duration.to_numpy(dtype=np.int64),
            merged=[merged_all.iloc[cut[i]:cut[i + 1]] for i in range(len(rows))],
            rank_offset={int(r): int(offset.get(int(e), 0)) for r, e in zip(ranks["rank"], ranks["export"], strict=True)},
            origin_ns=int(start.min()) if len(start) else 0,
        )  # fmt: skip

    # -- drawing ----------------------------------------------------------------------------

    def figure(
        self,
        window_ns: tuple[int, int] | None = None,
        findings: Sequence[dict[str, Any]] = (),
        *,
        highlight: dict[str, Any] | None = None,
        bins: int = DEFAULT_BINS,
        row_detail_limit: int = ROW_DETAIL_LIMIT,
    ) -> go.Figure:
        """The timeline over ``window_ns`` (job clock; default: everything), with a marker per group
        of findings and rank row (:meth:`_markers`); ``highlight`` (a finding) gets its window shaded
        and the ops its evidence names drawn red on every rank involved (:meth:`evidence_intervals`;
        :meth:`evidence_drawn` says which, for a header)."""
        t0, t1 = window_ns or self.extent_ns
        t1 = max(t1, t0 + 1)
        labels = self.rows["label"].tolist()

        def ms(ns: Any) -> np.ndarray:  # the x axis: ms since the timeline's origin
            return (np.asarray(ns, dtype=np.float64) - self.origin_ns) / 1e6

        fig = go.Figure()
        edges = np.linspace(t0, t1, bins + 1).astype(np.int64)
        detail: dict[str, list[np.ndarray]] = {lane: [] for lane in LANES}
        heat_rows: list[str] = []
        heat_lanes: list[str] = []
        heat_busy: list[np.ndarray] = []
        for i, lane in enumerate(self.rows["lane"]):
            visible = self._visible(i, t0, t1)
            if len(visible) <= row_detail_limit:
                detail[lane].append(visible)
            else:
                busy = covered_ns(edges[:-1], edges[1:], self.merged[i]) / np.maximum(np.diff(edges), 1)
                heat_rows.append(labels[i])
                heat_lanes.append(lane)
                heat_busy.append(busy)
        centres = ms((edges[:-1] + edges[1:]) / 2)
        if heat_rows:
            fig.add_trace(_occupancy(centres, labels, heat_rows, heat_lanes, np.vstack(heat_busy)))
        drawn = []
        for lane in LANES:
            idx = np.concatenate(detail[lane]) if detail[lane] else np.array([], dtype=np.int64)
            if len(idx):
                for parity, colour in ((0, LANE_COLOURS[lane]), (1, LANE_SHADES[lane])):
                    part = idx[self.shade[idx] == parity]
                    if len(part):
                        fig.add_trace(self._segments(part, labels, ms, colour, lane, width=12, window=(t0, t1)))
                drawn.append(idx)
        if drawn:
            self._labels(fig, np.concatenate(drawn), labels, ms, (t0, t1))
        if highlight is not None:
            self._highlight(fig, highlight, labels, ms, t0, t1)
        self._markers(fig, findings, labels, ms, t0, t1, zoomed=window_ns is not None)
        fig.update_layout(
            height=114 + 26 * max(len(labels), 1), margin={"l": 10, "r": 10, "t": 34, "b": 40},  # t: room for the modebar
            showlegend=False, plot_bgcolor="white", uirevision="timeline", dragmode="zoom",
            xaxis={"title": "time since the trace's first activity (ms)", "range": [float(ms(t0)), float(ms(t1))],
                   "showgrid": True, "gridcolor": "#eee", "zeroline": False},
            # every row stays on the axis at any zoom, in the same order: a fixed category list and
            # range (first row on top), never autoranged from what the window happens to draw
            yaxis={"type": "category", "categoryorder": "array", "categoryarray": labels, "autorange": False,
                   "fixedrange": True, "range": [len(labels) - 0.5, -0.5]},
        )  # fmt: skip
        return fig

    def window_for(self, finding: dict[str, Any], margin: float = 1.0) -> tuple[int, int]:
        """A window around a finding, on the job clock: its span plus ``margin`` of it each side."""
        rank = finding.get("rank")
        shift = self.rank_offset.get(int(rank), 0) if rank is not None else 0
        start, end = finding["start_ns"] + shift, max(finding["end_ns"], finding["start_ns"] + 1) + shift
        pad = int((end - start) * margin) + 1_000
        return start - pad, end + pad

    def _visible(self, i: int, t0: int, t1: int) -> np.ndarray:
        """Indexes of row i's intervals overlapping [t0, t1]: binary search on starts narrows them
        to those starting after t0 minus the row's longest interval, then ends decide (one long
        NVTX range must not make every earlier kernel count as visible)."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        starts = self.start[lo:hi]
        first = lo + int(np.searchsorted(starts, t0 - self.max_duration[i]))
        last = lo + int(np.searchsorted(starts, t1, side="right"))
        return first + np.flatnonzero(self.end[first:last] >= t0)

    def _segments(
        self, idx: np.ndarray, labels: list[str], ms: Any, colour: str, name: str, width: int,
        window: tuple[int, int],
    ) -> go.Scattergl:  # fmt: skip
        """Intervals as line segments (start, points inside, end, gap): one WebGL trace however many
        there are. plotly hovers a line at its points only, so a bar longer than 1/HOVER_POINTS of
        the window gets points along its visible part: hover anywhere on it names it (at most
        HOVER_POINTS_MAX points in all)."""
        start, end = self.start[idx], self.end[idx]
        lo, hi = np.maximum(start, window[0]), np.minimum(end, window[1])
        inside = np.maximum(hi - lo, 0) * HOVER_POINTS // max(window[1] - window[0], 1)
        if inside.sum() > HOVER_POINTS_MAX:
            inside = inside * HOVER_POINTS_MAX // inside.sum()
        count = inside + 3  # start, the points inside, end, and the gap that ends the segment
        which = np.repeat(np.arange(len(idx)), count)
        at = np.arange(len(which)) - np.repeat(np.cumsum(count) - count, count)  # 0 .. count - 1
        k = inside[which]
        along = lo[which] + (hi[which] - lo[which]) * at / np.maximum(k + 1, 1)
        x_ns = np.where(at == 0, start[which], np.where(at == k + 1, end[which], along)).astype(np.float64)
        x = np.where(at == k + 2, np.nan, ms(x_ns))
        y = np.asarray(labels, dtype=object)[self.row[idx]][which]
        duration_us = (self.end[idx] - self.start[idx]) / 1e3
        # plotly draws a subset of HTML in hover labels (links, styled spans): a name is text, escaped
        used, of = np.unique(self.name[idx], return_inverse=True)
        names = np.asarray([html.escape(str(nm), quote=False) for nm in self.names[used]], dtype=object)
        text = [f"{nm}<br>{d:,.1f} us" for nm, d in zip(names[of], duration_us, strict=True)]
        return go.Scattergl(
            x=x, y=y, mode="lines", line={"color": colour, "width": width}, name=name, connectgaps=False,
            hovertext=np.asarray(text, dtype=object)[which], hoverinfo="text",
        )  # fmt: skip

    def _labels(self, fig: go.Figure, idx: np.ndarray, labels: list[str], ms: Any, window: tuple[int, int]) -> None:
        """Names on the bars wide enough to hold one (1/LABEL_WIDTH of the window, ~40 px), when
        there are few enough to read (LABEL_LIMIT): zoomed in, a row says what ran without a hover."""
        t0, t1 = window
        lo, hi = np.maximum(self.start[idx], t0), np.minimum(self.end[idx], t1)
        wide = idx[(hi - lo) * LABEL_WIDTH >= (t1 - t0)]
        if not len(wide) or len(wide) > LABEL_LIMIT:
            return
        lo, hi = np.maximum(self.start[wide], t0), np.minimum(self.end[wide], t1)
        xs, ys = ms((lo + hi) / 2), np.asarray(labels, dtype=object)[self.row[wide]]
        # annotations, not a text trace: those are drawn above the WebGL bars, a trace's text below them
        names = [html.escape(_elided(str(n), LABEL_CHARS), quote=False) for n in self.names[self.name[wide]]]
        fig.update_layout(annotations=list(fig.layout.annotations) + [
            {"x": float(x), "y": y, "xref": "x", "yref": "y", "text": n, "showarrow": False, "name": "label",
             "font": {"size": 10, "color": "#fff"}} for x, y, n in zip(xs, ys, names, strict=True)
        ])  # fmt: skip

    def _rows_of(self, rank: int | None, device: int | None) -> list[int]:
        """The rows of a rank (all, without one) on a GPU (and its rows of no GPU, like NVTX); in numpy:
        called per finding, and pandas' per-call cost made 446 findings 0.8 s of a page."""
        ranks = self.rows["rank"].to_numpy(dtype=np.float64, na_value=np.nan)
        where = ranks == rank if rank is not None else np.ones(len(ranks), dtype=bool)
        if device is not None:
            devices = self.rows["device"].to_numpy(dtype=np.float64, na_value=np.nan)
            where &= np.isnan(devices) | (devices == device)
        return np.flatnonzero(where).tolist()

    def _markers(self, fig: go.Figure, findings: Sequence[dict[str, Any]], labels: list[str], ms: Any, t0: int,
                 t1: int, zoomed: bool) -> None:  # fmt: skip
        """One marker per group of findings (episodes of one problem) and rank row, at the worst
        occurrence in the window, with "×N" when N occurrences fall there: fifty occurrences are a
        few labelled markers, not fifty triangles on top of each other. Markers stay inside the
        plot area, however close to its edge their occurrence starts."""
        clusters = marker_clusters(self, findings, (t0, t1) if zoomed else None)
        if not clusters:
            return
        span = t1 - t0
        inset = max(span // 100, 1)
        xs = [float(ms(min(max(c["at_ns"], t0 + inset), t1 - inset))) for c in clusters]
        ys = [labels[c["row"]] for c in clusters]
        # what is seen and clicked: an annotation per cluster ("▼×6"), lifted into the gap above its
        # row; annotations are drawn above the WebGL bars, which would cover a trace's marker. Set
        # at once: add_annotation validates every annotation so far on each call (36 groups: 0.9 s)
        annotations = []
        for x, y, c in zip(xs, ys, clusters, strict=True):
            colour = SEVERITY_COLOURS.get(c["severity"], "#000")
            count = f"×{c['count']}" if c["count"] > 1 else ""
            annotations.append({
                "x": x, "y": y, "xref": "x", "yref": "y", "yshift": MARKER_LIFT_PX, "showarrow": False,
                "captureevents": True, "text": f"<span style='color:{colour}'>▼</span>{count}",
                "font": {"size": 15, "color": "#222"}, "hovertext": c["hover"], "name": f"finding-{c['id']}",
                "xanchor": "left" if count else "center", "xshift": -7 if count else 0,
            })  # fmt: skip
        fig.update_layout(annotations=list(fig.layout.annotations) + annotations)
        # the same clusters as a trace on the rows (hover and click there too; plotly's clickData)
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", name="findings", customdata=[c["id"] for c in clusters],
            hovertext=[c["hover"] for c in clusters], hoverinfo="text", text=[f"×{c['count']}" if c["count"] > 1
                                                                               else "" for c in clusters],
            marker={"symbol": "triangle-down", "size": 14, "opacity": 0.6,
                    "color": [SEVERITY_COLOURS.get(c["severity"], "#000") for c in clusters]},
        ))  # fmt: skip

    def _highlight(self, fig: go.Figure, finding: dict[str, Any], labels: list[str], ms: Any, t0: int, t1: int) -> None:
        rows = self._rows_of(finding.get("rank"), finding.get("device"))
        start, end = self.window_for(finding, margin=0)
        if rows:
            fig.add_shape(type="rect", xref="x", yref="y", x0=float(ms(start)), x1=float(ms(end)),
                          y0=min(rows) - 0.5, y1=max(rows) + 0.5, line={"color": "#d62728", "width": 2},
                          fillcolor="rgba(214,39,40,0.08)", layer="below")  # fmt: skip
        idx = self.evidence_intervals(finding)
        idx = idx[(self.end[idx] >= t0) & (self.start[idx] <= t1)]
        if len(idx):
            fig.add_trace(self._segments(idx, labels, ms, "#d62728", "evidence", width=20, window=(t0, t1)))

    # -- evidence ---------------------------------------------------------------------------

    def to_job_clock(self, finding: dict[str, Any], ns: int) -> int:
        """A time of a finding (its window, its evidence: the export's clock of its rank) on the job clock."""
        rank = finding.get("rank")
        return int(ns) + (self.rank_offset.get(int(rank), 0) if rank is not None else 0)

    def ms_since_origin(self, job_ns: int) -> float:
        """A job-clock time as the timeline's x axis shows it: ms since the trace's first activity."""
        return (job_ns - self.origin_ns) / 1e6

    def evidence_intervals(self, finding: dict[str, Any]) -> np.ndarray:
        """Indexes of the intervals a finding's evidence names, on every rank involved: the ops named
        by correlation id on the finding's rank, and for an ordering stall the late rank's op (the
        NCCL kernel on ``late_rank`` that ends nearest the blocking op, which waited for it)."""
        evidence = finding.get("evidence") or {}
        rows = self._rows_of(finding.get("rank"), finding.get("device"))
        found: list[np.ndarray] = []
        ids = evidence_correlation_ids(evidence)
        if ids and rows:
            found.append(np.flatnonzero(np.isin(self.row, rows) & np.isin(self.correlation, list(ids))))
        blocking = evidence.get("blocking_op") if isinstance(evidence, dict) else None
        late = evidence.get("late_rank") if isinstance(evidence, dict) else None
        if isinstance(late, int) and isinstance(blocking, dict) and isinstance(blocking.get("end_ns"), int):
            target = self.to_job_clock(finding, blocking["end_ns"])
            for i in self._rows_of(late, None):
                if self.rows["lane"].iloc[i] != "NCCL":
                    continue
                lo, hi = self.bounds[i], self.bounds[i + 1]
                if hi > lo:
                    found.append(np.array([lo + int(np.argmin(np.abs(self.end[lo:hi] - target)))]))
        if not found:
            return np.array([], dtype=np.int64)
        return distinct(np.concatenate(found)).astype(np.int64)

    def evidence_drawn(self, finding: dict[str, Any], window_ns: tuple[int, int] | None = None) -> list[str]:
        """What :meth:`figure` outlines in red for ``finding`` in the window, one phrase per rank row
        ("ncclDevKernel_SendRecv ×2 on rank 2 · GPU 2 · NCCL"): for a header that says what is drawn."""
        idx = self.evidence_intervals(finding)
        if window_ns is not None:
            idx = idx[(self.end[idx] >= window_ns[0]) & (self.start[idx] <= window_ns[1])]
        labels = self.rows["label"].tolist()
        out = []
        for r in sorted(set(self.row[idx].tolist())):
            on_row = idx[self.row[idx] == r]
            names = pd.Series(self.names[self.name[on_row]]).value_counts(sort=False)
            what = ", ".join(f"{n} ×{c}" if c > 1 else str(n) for n, c in names.items())
            out.append(f"{what} on {labels[r]}")
        return out

    def lane_ns(self) -> pd.DataFrame:
        """Summed interval time per rank, GPU and lane (kernels per lane are what the report sums)."""
        dur = pd.Series(self.end - self.start).groupby(self.row).sum()
        rows = self.rows.assign(ns=dur.reindex(range(len(self.rows)), fill_value=0).to_numpy())
        return rows[["rank", "device", "lane", "ns"]]


TIME_KEYS = ("start_ns", "end_ns", "ready_ns", "launch_ns", "launched_ns", "device_ready_ns", "starts_ns")


def evidence_items(data: TimelineData | None, finding: dict[str, Any]) -> list[dict[str, Any]]:
    """A finding's evidence as readable lines: ``{"key": "blocked_op.ready_ns", "text": ..., "ms": ...}``,
    times on the timeline's clock (ms since the first activity; ``ms`` is set so a page can zoom to
    it), durations with units, the rest as they are. The finding page can show the same lines."""
    from nsysan.report.format import duration

    out: list[dict[str, Any]] = []

    own_rank = finding.get("rank")

    def scalar(name: str, value: Any, rank: Any = own_rank) -> tuple[str, float | None]:
        """A value's text, and its time on the timeline's clock when it is one (``rank``: whose
        export's clock it is on)."""
        # the innermost name that is not a number: "waited_ns.3" (rank 3's wait) is a waited_ns
        key = next((part for part in reversed(name.split(".")) if not part.isdigit()), name)
        if key in TIME_KEYS and isinstance(value, int) and not isinstance(value, bool):
            if data is None:
                return f"{value / 1e9:.6f} s (the export's clock)", None
            at = data.ms_since_origin(data.to_job_clock({"rank": rank}, value))
            return f"{at:,.3f} ms since first activity", at
        if key.endswith("_ns") and isinstance(value, int | float) and not isinstance(value, bool):
            return duration(value), None
        if key == "share_of_run" and isinstance(value, int | float):
            return f"{float(value):.1f}% of the run", None
        if isinstance(value, list):
            return ", ".join(str(v) for v in value) or "–", None
        return ("–" if value is None else str(value)), None

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
            return
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            # a list of records (held operations, a cascade): a line each, its fields as above, its
            # times on the clock of the rank it names (a cascade's ops are on other ranks)
            for i, record in enumerate(value):
                rank = record.get("rank", own_rank)
                texts = [(k, *scalar(k, v, rank)) for k, v in _flat(record).items()]
                ms = next((at for _, _, at in texts if at is not None), None)
                text = " · ".join(f"{k} {t}" for k, t, _ in texts) or "–"
                out.append({"key": f"{prefix}[{i}]", "text": text, "ms": ms})
            return
        text, ms = scalar(prefix, value)
        out.append({"key": prefix, "text": text, "ms": ms})

    walk("", finding.get("evidence") or {})
    return out


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A record's fields with nested records' fields named ``outer.inner`` (a late rank's per-peer
    waits), so none is left out of its line."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def marker_clusters(
    data: TimelineData, findings: Sequence[dict[str, Any]], window_ns: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """The timeline's finding markers: per group of findings and rank row, the occurrences (whose
    window overlaps ``window_ns``, job clock, when given), drawn as one marker at the worst of them."""
    if data.rows.empty:
        return []
    t0, t1 = window_ns or (-(2**62), 2**62)
    findings = [{"kind": "", "impact_ns": 0, "severity": "info", "title": ""} | f for f in findings]
    groups = fold_groups(findings)
    clusters: dict[tuple[int, int], dict[str, Any]] = {}
    for g_index, g in enumerate(groups):
        for i in g["findings"]:
            f = findings[i]
            start, end = data.window_for(f, margin=0)
            if end < t0 or start > t1:
                continue
            rows = data._rows_of(f.get("rank"), f.get("device")) or [0]
            c = clusters.setdefault((g_index, rows[0]), {
                "row": rows[0], "group": g["group"], "severity": g["severity"], "count": 0, "impact_ns": 0,
                "worst": i, "of": g["count"], "group_impact_ns": g["impact_ns"],
            })  # fmt: skip
            c["count"] += 1
            c["impact_ns"] += int(f["impact_ns"])
            if f["impact_ns"] > findings[c["worst"]]["impact_ns"]:
                c["worst"] = i
    out = []
    for c in clusters.values():
        f = findings[c["worst"]]
        c["id"] = f.get("id")
        c["at_ns"] = data.window_for(f, margin=0)[0] + 1_000
        more = f"<br>worst of {c['count']} occurrences, {c['impact_ns'] / 1e6:,.2f} ms in all" if c["count"] > 1 else ""
        if c["of"] > c["count"]:
            more += f"<br>the group: {c['of']} occurrences, {c['group_impact_ns'] / 1e6:,.2f} ms in all"
        c["hover"] = f"[{c['severity']}] {html.escape(f['title'], quote=False)}{more}"
        out.append(c)
    return out


def _occupancy(
    centres: np.ndarray, labels: list[str], rows: list[str], lanes: list[str], busy: np.ndarray
) -> go.Heatmap:
    """Busy share per row and time bin, as ONE heatmap over every row, coloured by lane.

    plotly.js (7.1) fails on a category axis when a heatmap covers only some of its categories or
    several heatmaps share it, so this one spans all rows, blank (NaN) where a row is drawn
    interval by interval. Each lane gets its own band of z, [lane, lane + 1), and the colour scale
    runs from pale to the lane's colour within each band; the share rides along as customdata.
    """
    at = [labels.index(r) for r in rows]
    share = np.full((len(labels), len(centres)), np.nan)
    share[at] = busy
    band = np.full((len(labels), 1), np.nan)
    band[at, 0] = [LANES.index(lane) for lane in lanes]
    z = np.where(share > 0, band + np.clip(share, 0.02, 0.999), np.nan)
    scale = []
    for i, lane in enumerate(LANES):
        scale += [[i / len(LANES), "#eef1f5"], [(i + 1) / len(LANES) - 1e-6, LANE_COLOURS[lane]]]
    scale[-1][0] = 1.0
    return go.Heatmap(
        x=centres, y=labels, z=_nested(z), customdata=_nested(share, 3), zmin=0, zmax=len(LANES),
        colorscale=scale, showscale=False, hoverongaps=False, name="busy share",
        hovertemplate="%{y}<br>%{x:.3f} ms: busy %{customdata:.0%}<extra></extra>",
    )  # fmt: skip


def _nested(values: np.ndarray, decimals: int = 4) -> list[list[float | None]]:
    """Rows of numbers with None for NaN: plotly.js misreads 2-D typed arrays with gaps on category axes."""
    return [[None if v != v else v for v in row] for row in values.round(decimals).tolist()]


def evidence_correlation_ids(evidence: Any) -> set[int]:
    """Every correlation id a finding's evidence names (keys ``correlation_id``/``..._ids``), at any depth."""
    found: set[int] = set()
    if isinstance(evidence, dict):
        for key, value in evidence.items():
            if "correlation_id" in key:
                values = value if isinstance(value, list) else [value]
                found.update(int(v) for v in values if isinstance(v, int) and not isinstance(v, bool))
            else:
                found |= evidence_correlation_ids(value)
    elif isinstance(evidence, list):
        for item in evidence:
            found |= evidence_correlation_ids(item)
    return found


def _row_key(d: pd.DataFrame) -> pd.Series:
    """One int64 per interval naming its row: who (the rank, or the pid where the rank is unknown),
    then the GPU (device lanes) or the thread and NVTX depth (host lanes), and the lane, packed so
    a million intervals are keyed without building strings (who < 2^25, GPU or tid + 1 < 2^25)."""
    who = np.where(d["rank"].notna(), d["rank"].fillna(0).astype("int64"), -1 - d["pid"].astype("int64"))
    device = d["device"].astype("Float64").fillna(-1).astype("int64").to_numpy()
    tid = d["tid"].astype("int64").to_numpy()
    sub = np.where(tid >= 0, tid, device) + 1
    depth = d["depth"].astype("int64").to_numpy()
    lane = d["lane"].cat.codes.to_numpy().astype(np.int64)
    key = (who.astype(np.int64) + (1 << 24)) << 33 | sub << 8 | depth << 4 | lane
    return pd.Series(key, index=d.index)


def _rows(first: pd.DataFrame, key: pd.Series) -> pd.DataFrame:
    """The rows to draw, from one interval of each: ordered by rank, then GPU (a process's host rows
    after its GPUs), then lane (compute, NCCL, copies, NVTX, CUDA API), thread and NVTX depth."""
    rows = pd.DataFrame({
        "key": key.to_numpy(), "rank": first["rank"].astype("Int64").array,
        "pid": first["pid"].astype("int64").to_numpy(), "lane": first["lane"].to_numpy(),
        "device": first["device"].astype("Float64").astype("Int64").array,
        "tid": first["tid"].astype("int64").to_numpy(), "depth": first["depth"].astype("int64").to_numpy(),
    })  # fmt: skip
    rows["lane_order"] = rows["lane"].map({lane: i for i, lane in enumerate(LANES)})
    rows["device_order"] = rows["device"].fillna(1 << 30)
    order = ["rank", "pid", "device_order", "lane_order", "tid", "depth"]
    rows = rows.sort_values(order, na_position="last").reset_index(drop=True)
    who = np.where(rows["rank"].notna(), "rank " + rows["rank"].astype("string"), "pid " + rows["pid"].astype("string"))
    gpu = np.where(rows["device"].notna(), " · GPU " + rows["device"].astype("string"), "")
    thread = np.where(rows["tid"] >= 0, " tid " + rows["tid"].astype("string"), "")
    deepest = np.where(rows["depth"] == NVTX_DEPTH_ROWS - 1, "+", "")  # the last holds the deeper ones too
    level = np.where(rows["depth"] > 0, " · level " + rows["depth"].astype("string") + deepest, "")
    rows["label"] = who + gpu + " · " + rows["lane"] + thread + level
    return rows[["key", "device", "lane", "rank", "label"]]


def nesting_depth(thread: pd.DataFrame, start: pd.Series, end: pd.Series) -> np.ndarray:
    """Each range's level among its thread's ranges (0: outermost), so that no two ranges of a level
    overlap. For push/pop ranges, which nest, that is how many of the thread's ranges are still open
    when it starts: with ranges sorted by start (the longer first on a tie), its position less the
    ranges that ended by its start, one sort and one binary search per thread, not a walk of the
    stack. A zero-length range counts as open at its own instant. Start/end ranges may overlap
    without nesting: a range whose level is still taken at its start moves a level down
    (:func:`_free_levels`, one vectorised pass per level)."""
    out = np.zeros(len(start), dtype=np.int64)
    starts, ends = start.to_numpy(dtype=np.int64), end.to_numpy(dtype=np.int64)
    for where in thread.groupby(list(thread.columns), sort=False).indices.values():
        # doubled times, a zero-length range's end half a tick late: it is open at its own start
        s2 = 2 * starts[where]
        e2 = 2 * ends[where] + (ends[where] == starts[where])
        order = np.lexsort((-e2, s2))
        s2, e2 = s2[order], e2[order]
        closed = np.searchsorted(np.sort(e2), s2, side="right")
        out[np.asarray(where)[order]] = _free_levels(s2, e2, np.maximum(np.arange(order.size) - closed, 0))
    return out


def _free_levels(start: np.ndarray, end: np.ndarray, level: np.ndarray) -> np.ndarray:
    """``level`` (of ranges sorted by start) with each range that starts before an earlier range of
    its level has ended moved a level down, level by level from the top, so no level holds two
    overlapping ranges (but the last, which holds the deeper ones anyway)."""
    level = level.copy()
    for lv in range(NVTX_DEPTH_ROWS - 1):
        at = np.flatnonzero(level == lv)  # in start order
        if at.size < 2:
            continue
        reach = np.maximum.accumulate(end[at])  # the latest end so far among the level's ranges
        taken = start[at[1:]] < reach[:-1]
        level[at[1:][taken]] += 1
    return level


_LANE_DTYPE = pd.CategoricalDtype(list(LANES))


def _lanes(codes: np.ndarray) -> pd.Categorical:
    """Lanes by their index in LANES, as a categorical: a byte per interval, its codes the index."""
    return pd.Categorical.from_codes(codes.astype(np.int8), dtype=_LANE_DTYPE)


def _lane(name: str, n: int) -> pd.Categorical:
    return _lanes(np.full(n, LANES.index(name)))


def _no_device(n: int) -> pd.arrays.IntegerArray:
    """A device column for host rows: all missing, but integer (pd.NA alone makes an object column)."""
    return pd.array(np.full(n, pd.NA), dtype="Int64")


def _categorical(values: pd.Series) -> pd.Categorical:
    """As a categorical with plain string categories, so the parts' names can be unioned."""
    c = pd.Categorical(values)
    return pd.Categorical.from_codes(c.codes, categories=pd.Index(c.categories.astype(str), dtype=object))


def _bytes(values: pd.Series) -> pd.Series:
    v = values.astype("Float64")
    return (v / 2**20).round(2).astype("string").fillna("?") + " MiB"


def _elided(name: str, most: int) -> str:
    """A name cut to ``most`` characters with an ellipsis (demangled names run to hundreds)."""
    return name if len(name) <= most else name[: most - 1] + "…"
