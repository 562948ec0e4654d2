"""The report as titled tables of display strings, so every text format shows the same figures."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import nsysan.report.format as fmt


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    empty: str = "none"


Column = tuple[str, str, Callable[[Any], str]]


def _table(title: str, items: list[dict[str, Any]], columns: list[Column], empty: str = "none") -> Table:
    rows = [tuple(render(item.get(key)) for _, key, render in columns) for item in items]
    return Table(title, tuple(h for h, _, _ in columns), rows, empty)


def tables(doc: dict[str, Any]) -> list[Table]:
    s = doc["summary"]
    c = fmt.cell
    return [
        _table(
            "Exports",
            s["exports"],
            [
                ("file", "path", lambda v: PurePath(v).name),
                ("nsys", "nsys_version", c),
                ("schema", "schema_version", c),
                ("ranks", "ranks", fmt.ranks),
                ("devices", "devices", fmt.ranks),
                ("kernels", "kernels", c),
                ("NCCL kernels", "nccl_kernels", c),
                ("memcpy", "memcpy", c),
                ("peer copies", "peer_copies", c),
                ("NVTX ranges", "nvtx_ranges", c),
            ],
        ),
        _table(
            "Ranks",
            s["ranks"],
            [
                ("rank", "rank", c),
                ("export", "export", c),
                ("pid", "pid", c),
                ("process", "process", c),
                ("local rank", "local_rank", c),
                ("world size", "world_size", c),
                ("identified by", "rank_source", c),
            ],
            empty="no process launched CUDA work or wrote NVTX",
        ),
        _table(
            "GPU busy time per device",
            s["devices"],
            [
                ("export", "export", c),
                ("device", "device", c),
                ("ranks", "ranks", c),
                ("kernels", "kernels", c),
                ("kernel time", "kernel_ns", fmt.duration),
                ("busy", "busy_ns", fmt.duration),
                ("span", "span_ns", fmt.duration),
                ("busy %", "busy_pct", fmt.percent),
            ],
            empty="no GPU activity recorded",
        ),
        _table(
            "Top kernels by total time",
            s["top_kernels"],
            [
                ("kernel", "kernel", c),
                ("NCCL", "nccl", lambda v: "yes" if v else ""),
                ("count", "count", c),
                ("total", "total_ns", fmt.duration),
                ("mean", "mean_ns", fmt.duration),
                ("% of kernel time", "pct", fmt.percent),
            ],
            empty="no kernels",
        ),
        _table(
            "NCCL time by operation and size",
            s["nccl"],
            [
                ("kind", "kind", c),
                ("operation", "op", c),
                ("message size", "bytes", fmt.size),
                ("count", "count", c),
                ("total", "total_ns", fmt.duration),
                ("mean", "mean_ns", fmt.duration),
            ],
            empty="no NCCL kernels",
        ),
        _table(
            "Memory copies",
            s["copies"],
            [
                ("kind", "copy_kind", c),
                ("count", "count", c),
                ("bytes", "bytes", fmt.size),
                ("total", "total_ns", fmt.duration),
            ],
            empty="no copies",
        ),
        _table(
            "Transport transfers (nsysan P2P)",
            s.get("transfers", []),
            [
                ("transfer", "transfer", c),
                ("ranks", "ranks", c),
                ("count", "count", c),
                ("bytes", "bytes", fmt.size),
                ("total", "total_ns", fmt.duration),
                ("mean", "mean_ns", fmt.duration),
            ],
            empty="none in this capture",
        ),
        _table(
            "NVTX ranges by total time",
            s["nvtx_ranges"],
            [
                ("domain", "domain", c),
                ("range", "range", c),
                ("count", "count", c),
                ("total", "total_ns", fmt.duration),
                ("mean", "mean_ns", fmt.duration),
            ],
            empty="no NVTX ranges",
        ),
    ]


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(f"({_value(v)})" if isinstance(v, dict) else _value(v) for v in value) + "]"
    return "-" if value is None else str(value)


def finding_lines(finding: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs describing one finding; evidence keys get a line each."""
    where = ", ".join(f"{k} {finding[k]}" for k in ("rank", "device", "pid") if finding.get(k) is not None)
    start, end = finding["start_ns"], finding["end_ns"]
    lines = [
        ("where", where or "-"),
        ("when", f"{fmt.timestamp(start)} to {fmt.timestamp(end)} ({fmt.duration(end - start)}, the export's clock)"),
        ("impact", fmt.duration(finding["impact_ns"])),
    ]
    lines += [
        (f"evidence.{k}", fmt.share_of_run(v) if k == "share_of_run" else _value(v))
        for k, v in finding.get("evidence", {}).items()
    ]
    lines.append(("fix", finding["advice"]))
    return lines


def groups(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's finding groups; a saved report from before groups existed is folded here."""
    if "groups" in doc:
        return doc["groups"]
    from nsysan.report.document import fold_groups

    return fold_groups(doc["findings"])


def group_headline(doc: dict[str, Any], group: dict[str, Any]) -> str:
    """One line for a group: the worst occurrence's title, and for several, count and total."""
    worst = doc["findings"][group["worst"]]
    if group["count"] == 1:
        return worst["title"]
    return (f"{group['count']} occurrences, {fmt.duration(group['impact_ns'])} lost in total; "
            f"worst: {worst['title']}")  # fmt: skip


def other_occurrences(doc: dict[str, Any], group: dict[str, Any], limit: int = 10) -> list[str]:
    """Short lines for a group's occurrences other than the worst, largest impact first."""
    rest = sorted((i for i in group["findings"] if i != group["worst"]),
                  key=lambda i: -doc["findings"][i]["impact_ns"])  # fmt: skip
    lines = []
    for i in rest[:limit]:
        f = doc["findings"][i]
        lines.append(
            f"{fmt.timestamp(f['start_ns'])} to {fmt.timestamp(f['end_ns'])}: {fmt.duration(f['impact_ns'])}"
            + (f" (rank {f['rank']})" if f.get("rank") is not None else "")
        )
    if len(rest) > limit:
        lines.append(f"... and {len(rest) - limit} more (all in --format json)")
    return lines


# The report's brief (docs/report.md, "The terminal report"): where the step went, what to fix
# first, what was not judged. Figures only from the document, so a saved JSON re-renders alike.

STEP_CATEGORIES = (
    ("compute", "compute"),
    ("communication_exposed", "communication exposed"),
    ("waiting_for_peer", "waiting for peer"),
    ("copy_exposed", "copy exposed"),
    ("idle", "idle"),
)
"""The ``steps`` section's breakdown categories (their keys in the document) and their column names."""

IDLE_CAUSES = {
    "launch": "launch",
    "sync": "host sync",
    "data_loading": "data loading",
    "blocked_launch": "full launch queue",
    "dependency": "dependency",
    "unknown": "unknown cause",
}
"""What the GPU waited for while idle (``idle_causes_ns`` keys), as the idle cell names it."""

MAX_RANK_ROWS = 16
"""More ranks than this and the step table shows min / median / max over ranks plus the critical rank."""

STEP_SOURCES = {
    "nvtx": "NVTX ranges",
    "kernel_sequence": "the repeating kernel sequence",
    "capture": "none found; each rank's GPU activity in the capture is one step",
}


def steps_found(source: str | None, detail: str | None) -> str:
    """How the steps were found, in a line: "steps: the repeating kernel sequence (<detail>)"."""
    label = STEP_SOURCES.get(source, source) if source else "none (no GPU work of a known rank)"
    if detail and detail.lower().startswith(label.lower()):
        return f"steps: {detail}"
    return f"steps: {label}" + (f" ({detail})" if detail else "")


@dataclass(frozen=True)
class StepSection:
    """The report's "Where the step went": the per-rank table (no rows: ``table.empty`` says why) and lines
    about the job (wall time, how steps were found, the clock, the critical rank)."""

    table: Table
    notes: list[str]


@dataclass(frozen=True)
class _RankFigures:
    rank: int
    steps: int
    total_ns: int
    shares: dict[str, float | None]  # % of the rank's step time per category
    idle_cause: str | None  # the largest of idle_causes_ns, None when nothing idled


def _rank_figures(rank: int, r: dict[str, Any]) -> _RankFigures:
    starts, ends = r.get("start_ns") or [], r.get("end_ns") or []
    total = sum(int(e) - int(s) for s, e in zip(starts, ends, strict=False))
    b = r.get("breakdown_ns") or {}
    shares = {key: 100 * sum(b.get(key) or []) / total if total > 0 else None for key, _ in STEP_CATEGORIES}
    causes = {c: sum(v or []) for c, v in (r.get("idle_causes_ns") or {}).items()}
    top = max(causes, key=lambda c: causes[c]) if causes and max(causes.values()) > 0 else None
    return _RankFigures(rank, min(len(starts), len(ends)), total, shares, top)


def _ms(ns: float | None) -> str:
    """ns as milliseconds, three significant digits (the step table's unit)."""
    if ns is None:
        return "-"
    ms = ns / 1e6
    return f"{ms:,.0f}" if abs(ms) >= 1000 else f"{ms:.3g}"


def _mean_ns(f: _RankFigures) -> float | None:
    return f.total_ns / f.steps if f.steps else None


def _idle_cell(share: float | None, cause: str | None) -> str:
    text = fmt.percent(share)
    return text + (f" (mostly {IDLE_CAUSES.get(cause, cause.replace('_', ' '))})" if cause else "")


def _rank_row(label: str, f: _RankFigures) -> tuple[str, ...]:
    shares = [fmt.percent(f.shares[key]) for key, _ in STEP_CATEGORIES[:-1]]
    return (label, str(f.steps), _ms(_mean_ns(f)), *shares, _idle_cell(f.shares["idle"], f.idle_cause))


def critical_rank(steps: dict[str, Any]) -> tuple[int, int, int] | None:
    """(rank, steps it was critical in, steps): the rank ``job.critical_rank`` names most often
    (the lowest such rank on a tie), or None without steps."""
    named = [int(r) for r in (steps.get("job") or {}).get("critical_rank") or [] if r is not None]
    if not named:
        return None
    rank = min(set(named), key=lambda r: (-named.count(r), r))
    return rank, named.count(rank), len(named)


def _summary_rows(figures: list[_RankFigures], critical: int | None) -> list[tuple[str, ...]]:
    """min / median / max of each column over ranks (each column on its own), then the critical rank's row."""

    def stats(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
        known = sorted(v for v in values if v is not None)
        return (known[0], statistics.median(known), known[-1]) if known else (None, None, None)

    columns = [stats([float(f.steps) for f in figures]), stats([_mean_ns(f) for f in figures])]
    columns += [stats([f.shares[key] for f in figures]) for key, _ in STEP_CATEGORIES]
    rows = []
    for i, label in enumerate((f"min of {len(figures)} ranks", "median", "max")):
        steps, mean, *shares = (c[i] for c in columns)
        rows.append((label, "-" if steps is None else f"{steps:g}", _ms(mean), *map(fmt.percent, shares)))
    rows += [_rank_row(f"{f.rank} (critical)", f) for f in figures if f.rank == critical]
    return rows


STEP_HEADERS = ("rank", "steps", "ms per step", *(name for _, name in STEP_CATEGORIES))


def step_section(doc: dict[str, Any]) -> StepSection:
    """The report's "Where the step went", from the document's ``steps`` section (absent in reports saved
    before report version 2: the table is empty and says so)."""
    title = "Where the step went"
    steps = doc.get("steps")
    if not steps:
        return StepSection(Table(title, STEP_HEADERS, [], empty="not in this report (saved by an nsysan before "
                                 "report version 2; report the exports again to see it)"), [])  # fmt: skip
    ranks = steps.get("ranks") or {}
    figures = [_rank_figures(int(k), v) for k, v in sorted(ranks.items(), key=lambda kv: int(kv[0]))]
    critical = critical_rank(steps)
    crit = critical[0] if critical else None
    if len(figures) > MAX_RANK_ROWS:
        rows = _summary_rows(figures, crit)
    else:
        rows = [_rank_row(f"{f.rank} (critical)" if f.rank == crit else str(f.rank), f) for f in figures]
    empty = "no steps: no GPU work of a known rank" if steps.get("source") is None else "no steps"
    table = Table(title, STEP_HEADERS, rows, empty=empty)
    if not figures:
        return StepSection(table, [])
    job = steps.get("job") or {}
    notes = [
        f"job wall time: {fmt.duration(job.get('wall_ns'))} (first step start to last step end over all ranks, on the job clock)",
        steps_found(steps.get("source"), steps.get("detail")),
    ]
    if len(figures) > MAX_RANK_ROWS:
        notes.append(f"{len(figures)} ranks: each column's min, median and max over the ranks (each on its own), "
                     f"then the critical rank's row; --format json has every rank's steps")  # fmt: skip
    clock = steps.get("clock") or {}
    if clock:
        notes.append(f"clock: {clock.get('method', '-')} (uncertainty {fmt.duration(clock.get('uncertainty_ns'))})")
    if critical:
        rank, count, total = critical
        notes.append(f"critical rank: rank {rank} in {count} of {total} step{'s' if total != 1 else ''} "
                     f"(the rank whose step ended last, the one the others waited for)")  # fmt: skip
    return StepSection(table, notes)


@dataclass(frozen=True)
class GroupLine:
    """One finding group in brief (``text``) and in full (``evidence``: the worst occurrence's
    (label, text) lines, with the other occurrences before its fix)."""

    severity: str
    kind: str
    text: str  # "recovers 2.15 ms (24.5% of the job) · late_rank · <headline>"
    evidence: list[tuple[str, str]]
    recoverable_ns: int | None  # None: a report saved before recoverable time existed
    impact_ns: int


def recoverable_ns(doc: dict[str, Any], group: dict[str, Any]) -> int | None:
    """The group's recoverable time, or None when its findings do not carry one (an older report)."""
    members = [doc["findings"][i] for i in group.get("findings") or [group["worst"]]]
    if not all("recoverable_ns" in f for f in members):
        return None
    return int(group.get("recoverable_ns", sum(int(f.get("recoverable_ns") or 0) for f in members)))


def _recovers(doc: dict[str, Any], ns: int | None, impact_ns: int) -> str:
    if ns is None:
        return f"lost {fmt.duration(impact_ns)}"
    wall = ((doc.get("steps") or {}).get("job") or {}).get("wall_ns") or 0
    share = f" ({100 * ns / wall:.1f}% of the job)" if wall > 0 else ""
    return f"recovers {fmt.duration(ns)}{share}"


def group_lines(doc: dict[str, Any]) -> list[GroupLine]:
    """Every finding group in the document's order (severity, then recoverable time), in brief and in full."""
    out = []
    for g in groups(doc):
        evidence = finding_lines(doc["findings"][g["worst"]])
        others = other_occurrences(doc, g)
        if others:
            evidence.insert(len(evidence) - 1, ("other occurrences", "; ".join(others)))
        ns = recoverable_ns(doc, g)
        impact = int(g["impact_ns"])
        text = f"{_recovers(doc, ns, impact)} · {g['kind']} · {group_headline(doc, g)}"
        out.append(GroupLine(g["severity"], g["kind"], text, evidence, ns, impact))
    return out


def briefed(line: GroupLine) -> bool:
    """Whether the terminal report lists a group without --all: warnings and criticals."""
    return line.severity != "info"


def tally(lines: list[GroupLine]) -> str:
    """Hidden groups in a few words: "43 info groups recovering 0.8 ms in all" (or, from an older report, the time they lost)."""
    n = len(lines)
    known = [g.recoverable_ns for g in lines if g.recoverable_ns is not None]
    severities = sorted({g.severity for g in lines})
    what = f"{n} {'/'.join(severities)} group{'s' if n != 1 else ''}"
    if len(known) == n:
        return f"{what} recovering {fmt.duration(sum(known))} in all"
    return f"{what}, {fmt.duration(sum(g.impact_ns for g in lines))} lost in all"


def not_judged(doc: dict[str, Any], limit: int = 8) -> list[str]:
    """``steps.unjudged`` as lines: time the analysis could not attribute and why. Entries with
    the same detector and reason are one line naming each rank's time (the first ``limit``)."""
    folded: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for u in (doc.get("steps") or {}).get("unjudged") or []:
        folded.setdefault((str(u.get("detector") or "-"), str(u.get("why") or "-")), []).append(u)
    lines = []
    for (detector, why), entries in folded.items():
        parts = [f"{fmt.duration(u.get('ns'))} " + (f"on rank {u['rank']}" if u.get("rank") is not None else "job-wide")
                 for u in entries[:limit]]  # fmt: skip
        if len(entries) > limit:
            rest = sum(int(u.get("ns") or 0) for u in entries[limit:])
            parts.append(f"{fmt.duration(rest)} on {len(entries) - limit} more")
        lines.append(f"{', '.join(parts)} ({detector}): {why}")
    return lines
