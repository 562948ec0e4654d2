"""The diff document as terminal text (rich), JSON, Markdown or HTML. Formatting only: every
format shows the same tables, built once by :func:`sections`."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.text import Text

import nsysan.report.format as fmt
from nsysan.diff.compare import change_counts
from nsysan.report.renderers import dump_json, print_table
from nsysan.report.sections import Table
from nsysan.report.templating import render


def _num(v: Any, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ns":
        return fmt.duration(v)
    if unit == "%":
        return f"{float(v):.1f}%"
    if unit == "B":
        return fmt.size(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:.4g}"


def change(d: dict[str, Any], unit: str = "ns") -> str:
    """'8.81 ms → 3.96 ms (-55.0%)': before, after and the relative change."""
    text = f"{_num(d['before'], unit)} → {_num(d['after'], unit)}"
    if unit == "%" and d["delta"] is not None:
        return text + f" ({d['delta']:+.1f} points)"
    return text + (f" ({d['pct'] / 100:+.1%})" if d.get("pct") is not None else "")


def _cells(d: dict[str, Any], unit: str) -> tuple[str, str, str, str]:
    delta = d["delta"]
    sign = "" if delta is None or delta <= 0 else "+"
    dtext = "-" if delta is None else (f"{sign}{delta:.1f} pt" if unit == "%" else sign + _num(delta, unit))
    if unit == "%":
        return _num(d["before"], unit), _num(d["after"], unit), dtext, ""
    pct = "new" if d["before"] in (None, 0) and d["after"] else "gone" if d["after"] in (None, 0) and d["before"] else \
        ("-" if d["pct"] is None else f"{d['pct']:+.1f}%")  # fmt: skip
    return _num(d["before"], unit), _num(d["after"], unit), dtext, pct


def confidence(c: float | None) -> str:
    """How likely the change is real, from the per-step spread ('-' without samples)."""
    if c is None:
        return "-"
    return ">99.9%" if c >= 0.9995 else f"{100 * c:.1f}%"


def headline(doc: dict[str, Any]) -> str:
    s, f = doc["steps"]["slowest"], doc["findings"]
    known = s["before"] is not None and s["after"] is not None
    parts = [f"step {change(s)}, confidence {confidence(s['confidence'])}" if known else "step time unknown"]
    moved = biggest_shift(doc)
    if moved is not None:
        c, d = moved
        parts.append(f"{label(c)} {change(d)} per step")
    parts.append(
        f"findings: {len(f['fixed'])} fixed, {len(f['new'])} new, {len(f['unchanged'])} in both "
        f"({change_counts(f['unchanged'])})"
    )
    return " · ".join(parts)


# a group found in both captures, by how its impact moved (nsysan.diff.compare.impact_change)
_STILL = {"better": "better", "worse": "worse", "same": "unchanged"}


def label(category: str) -> str:
    """A breakdown category as people read it: ``waiting_for_peer`` -> ``waiting for peer``."""
    return category.replace("_", " ")


def biggest_shift(doc: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The breakdown category whose time per step changed most (None: no breakdown, or no change)."""
    job = (doc.get("breakdown") or {}).get("job") or {}
    moved = [(abs(d["delta"]), c) for c, d in job.items() if d["delta"]]
    if not moved:
        return None
    c = max(moved)[1]
    return c, job[c]


MAX_RANK_ROWS = 8  # per category, the ranks whose change differs most from the job's; the JSON has every rank


def _breakdown_table(doc: dict[str, Any]) -> Table:
    """Where step time went: per category the mean per step over ranks, then the ranks whose change
    is not the job's (most different first, at most MAX_RANK_ROWS), then the step they add up to."""
    bd = doc.get("breakdown")
    headers = ("category", "ranks", "before", "after", "Δ", "Δ %", "share of step", "confidence")
    if not bd:
        return Table("Where step time went", headers, [], empty="unavailable: a diff document without a breakdown")
    if not bd["available"]:
        why = "; ".join(f"{side}: {w}" for side, w in bd["why"].items() if w)
        return Table("Where step time went", headers, [], empty=f"step breakdown unavailable: {why}")
    source = bd["source"]
    src = source["before"] if source["before"] == source["after"] else f"{source['before']} / {source['after']}"
    title = f"Where step time went (mean per step over ranks; steps from {str(src).replace('_', ' ')})"

    def share(d: dict[str, Any]) -> str:
        b, a = d.get("share_before"), d.get("share_after")
        return "-" if b is None and a is None else f"{_num(b, '%')} → {_num(a, '%')}"

    rows: list[tuple[str, ...]] = []
    for c in bd["categories"]:
        d = bd["job"][c]
        rows.append((label(c), "all", *_cells(d, "ns"), share(d), confidence(d["confidence"])))
        job = d["delta"] or 0
        ranks = [r for r in bd["per_rank"] if r["categories"][c]["differs"]]
        ranks.sort(key=lambda r: -abs((r["categories"][c]["delta"] or 0) - job))
        for r in ranks[:MAX_RANK_ROWS]:
            rd = r["categories"][c]
            rows.append(("", f"rank {r['rank']}", *_cells(rd, "ns"), share(rd), confidence(rd["confidence"])))
        if len(ranks) > MAX_RANK_ROWS:
            rows.append(("", f"{len(ranks) - MAX_RANK_ROWS} more ranks differ (every rank: --format json)", *[""] * 6))
    rows.append(("step (their sum)", "all", *_cells(bd["step_ns"], "ns"), "", ""))
    return Table(title, headers, rows)


_RANK_FIGURES = (("busy", "busy_ns", "ns"), ("idle share", "idle_pct", "%"), ("kernel time", "kernel_ns", "ns"),
                 ("NCCL time", "nccl_ns", "ns"), ("copy time", "copy_ns", "ns"), ("span", "span_ns", "ns"))  # fmt: skip


def sections(doc: dict[str, Any]) -> list[Table]:
    """The diff's tables as display strings, shared by every format and the dashboard."""
    st = doc["steps"]
    out = []
    s = st["slowest"]
    source = st["source"]
    src = source["before"] if source["before"] == source["after"] else f"{source['before']} / {source['after']}"
    out.append(Table("Step time (" + (src or "no steps found") + ")",
                     ("rank", "steps", "median before", "median after", "Δ", "Δ %", "p90 before", "p90 after", "p90 Δ %"),
                     [(str(r["rank"]), f"{r['before']['steps']} → {r['after']['steps']}", *_cells(r["median"], "ns"),
                       *_cells(r["p90"], "ns")[:2], _cells(r["p90"], "ns")[3]) for r in st["per_rank"]]
                     + ([("slowest", f"rank {s['rank_before']} → {s['rank_after']}", *_cells(s, "ns"), "", "", "")]
                        if s["before"] is not None else []),
                     empty="no NVTX step ranges and no repeating kernel sequence in one or both captures"))  # fmt: skip
    out.append(_breakdown_table(doc))
    out.append(Table("GPU time per rank", ("rank", "figure", "before", "after", "Δ", "Δ %"),
                     [(str(r["rank"]), label, *_cells(r[key], unit)) for r in doc["ranks"]
                      for label, key, unit in _RANK_FIGURES],
                     empty="no GPU activity"))  # fmt: skip
    out.append(Table("NCCL time by operation and size", ("kind", "operation", "size", "count", "total before", "total after", "Δ", "Δ %"),
                     [(r["kind"], r["op"], fmt.size(r["bytes"]), f"{_num(r['count']['before'], '')} → {_num(r['count']['after'], '')}",
                       *_cells(r["total_ns"], "ns")) for r in doc["nccl"]], empty="no NCCL kernels"))  # fmt: skip
    out.append(Table("Memory copies", ("kind", "count", "bytes before", "bytes after", "total before", "total after", "Δ", "Δ %"),
                     [(r["copy_kind"], f"{_num(r['count']['before'], '')} → {_num(r['count']['after'], '')}",
                       _num(r["bytes"]["before"], "B"), _num(r["bytes"]["after"], "B"), *_cells(r["total_ns"], "ns"))
                      for r in doc["copies"]], empty="no copies"))  # fmt: skip
    k = doc["kernels"]
    kernel_headers = ("kernel", "grid / block", "count", "total before", "total after", "Δ", "Δ %", "mean per call")

    def krow(r: dict[str, Any]) -> tuple[str, ...]:
        return (
            r["short_name"],
            r["shape"].replace("grid ", "").replace(" block ", " / "),
            f"{_num(r['count']['before'], '')} → {_num(r['count']['after'], '')}",
            *_cells(r["total_ns"], "ns"),
            change(r["mean_ns"]) if r["mean_ns"]["before"] and r["mean_ns"]["after"] else "-",
        )

    out.append(
        Table("Kernel regressions (by total time)", kernel_headers, [krow(r) for r in k["regressions"]], empty="none")
    )
    out.append(
        Table("Kernel improvements (by total time)", kernel_headers, [krow(r) for r in k["improvements"]], empty="none")
    )
    out.append(Table(f"Kernels that appeared ({k['appeared_total']}) or vanished ({k['vanished_total']})", ("", *kernel_headers),
                     [("appeared", *krow(r)) for r in k["appeared"]] + [("vanished", *krow(r)) for r in k["vanished"]],
                     empty="the same kernel signatures ran in both"))  # fmt: skip
    f = doc["findings"]

    def frow(state: str, g: dict[str, Any], impact: str, recoverable: str) -> tuple[str, ...]:
        return state, g["severity"], g["kind"], g["title"], f"{g['count']}", impact, recoverable

    def gone(ns: Any) -> str:
        return "-" if ns is None else fmt.duration(ns) + " → 0"

    def came(ns: Any) -> str:
        return "-" if ns is None else "0 → " + fmt.duration(ns)

    def moved(d: dict[str, Any] | None) -> str:
        return change(d) if d and d["before"] is not None and d["after"] is not None else "-"

    rows = [frow("fixed", g, gone(g["impact_ns"]), gone(g.get("recoverable_ns"))) for g in f["fixed"]]
    rows += [frow("new", g, came(g["impact_ns"]), came(g.get("recoverable_ns"))) for g in f["new"]]
    rows += [frow(_STILL[g.get("change", "same")], g, change(g["impact"]) + f" (by {g['matched_by']})",
                  moved(g.get("recoverable"))) for g in f["unchanged"]]  # fmt: skip
    total = f.get("recoverable_total")
    recoverable = f" · recoverable in all {change(total)}" if moved(total) != "-" else ""
    out.append(Table(f"Findings: {len(f['fixed'])} fixed, {len(f['new'])} new, {len(f['unchanged'])} in both "
                     f"({change_counts(f['unchanged'])}; by group)"
                     + recoverable, ("", "severity", "kind", "worst occurrence", "occurrences", "impact", "recoverable"),
                     rows, empty="no findings in either"))  # fmt: skip
    c = doc["capture"]
    crow = [(item["name"], kind, str(item["before"]), str(item["after"]))
            for kind in ("command", "environment", "nsys_options") for item in c[kind]]  # fmt: skip
    title = "How the two were captured: differences" if crow else "How the two were captured"
    out.append(Table(title, ("name", "what", "before", "after"), crow,
                     empty="the same command, NCCL_/CUDA_/TORCH_ environment and nsys options (as far as recorded)"))  # fmt: skip
    return out


def notes(doc: dict[str, Any]) -> list[str]:
    lines = [f"not comparable: {r}" for r in doc["comparable"]["reasons"]] + list(doc["comparable"]["notes"])
    st = doc["steps"]["detail"]
    for side in ("before", "after"):
        if st[side]:
            lines.append(f"steps {side}: {st[side]}")
    g = doc.get("gate")
    if g:
        r = g.get("regression")
        if r:
            worse = "-" if r["worse_pct"] is None else f"{r['worse_pct']:+.1f}%"
            lines.append(f"gate: {r['metric']} {_num(r['before'], r['unit'])} → {_num(r['after'], r['unit'])}, worse by {worse} "
                         f"(threshold {r['threshold_pct']:g}%, confidence it is worse {confidence(r['confidence_worse'])})")  # fmt: skip
        lines.append("gate: FAILED: " + "; ".join(g["reasons"]) if g["failed"] else "gate: passed")
    return lines


def render_json(doc: dict[str, Any]) -> str:
    return dump_json(doc)


def render_terminal(doc: dict[str, Any], width: int | None = 160, color: bool = False) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color, highlight=False)
    console.rule(Text(f"nsysan diff · {doc['before']['label']} → {doc['after']['label']}"))
    console.print(Text(headline(doc), style="bold"))
    for line in notes(doc):
        console.print(Text(f"  - {line}"))
    for t in sections(doc):
        print_table(console, t)
    return buf.getvalue()


def _template_context(doc: dict[str, Any]) -> dict[str, Any]:
    """What the Markdown and HTML templates show: the same lines and tables as the terminal diff."""
    return {
        "before": doc["before"]["label"],
        "after": doc["after"]["label"],
        "headline": headline(doc),
        "notes": notes(doc),
        "tables": sections(doc),
    }


def render_markdown(doc: dict[str, Any]) -> str:
    return render("diff.md", **_template_context(doc))


def render_html(doc: dict[str, Any]) -> str:
    return render("diff.html", **_template_context(doc))


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "terminal": render_terminal, "json": render_json, "markdown": render_markdown, "html": render_html,
}  # fmt: skip
