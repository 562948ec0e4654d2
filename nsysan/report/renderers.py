"""Renderers: the report document to terminal, JSON, Markdown or HTML text. Formatting only."""

from __future__ import annotations

import io
import json
import re
import secrets
import shutil
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from nsysan.report.sections import (
    GroupLine,
    Table,
    briefed,
    group_lines,
    groups,
    not_judged,
    step_section,
    tables,
    tally,
)
from nsysan.report.templating import render


def _headline(doc: dict[str, Any]) -> str:
    counts = doc["summary"]["findings_by_severity"]
    n = len(doc["findings"])
    parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    text = f"{n} finding{'s' if n != 1 else ''}" + (f" ({parts})" if parts else "")
    g = len(groups(doc))
    return text + (f" in {g} group{'s' if g != 1 else ''}" if g != n else "")


def print_table(console: Console, t: Table) -> None:
    """A titled table on a Rich console; cells go in as ``Text``, never parsed as markup."""
    if not t.rows:
        console.print(Text(f"{t.title}: {t.empty}", style="bold"))
        return
    table = RichTable(title=Text(t.title), title_justify="left", title_style="bold")
    for h in t.headers:
        table.add_column(Text(h), overflow="fold")
    for row in t.rows:
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def render_json(doc: dict[str, Any]) -> str:
    """The document as JSON; anything a detector left that JSON cannot hold becomes its text."""
    return dump_json(doc, default=_json_text)


def dump_json(doc: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``doc`` as indented JSON with each list of plain numbers on one line.

    A profile's per-step series hold tens of thousands of numbers: one per line they make a
    150,000-line report of a 1M-kernel export. Python's indenting encoder is pure Python; the
    compact one, which writes the series here, is C (that report's JSON: 0.02 s against 0.06 s).
    """
    series: list[str] = []
    token = secrets.token_hex(8)  # a placeholder no text of the trace can equal by chance

    def lift(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: lift(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            if x and _NUMBERS.issuperset(map(type, x)):  # types gathered in C: series run to 100k numbers
                series.append(json.dumps(x))
                return f"{token}:{len(series) - 1}"
            return [lift(v) for v in x]
        return x

    text = json.dumps(lift(doc), indent=2, default=default)
    if series:
        text = re.sub(f'"{token}:([0-9]+)"', lambda m: series[int(m[1])], text)
    return text + "\n"


_NUMBERS = frozenset((int, float))


def _json_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _template_context(doc: dict[str, Any]) -> dict[str, Any]:
    """What the Markdown and HTML templates show: the same figures as the terminal report, with
    every finding group and its evidence (collapsed), since these are documents to share."""
    return {
        "version": doc["nsysan_version"],
        "headline": _headline(doc),
        "steps": step_section(doc),
        "groups": group_lines(doc),
        "not_judged": not_judged(doc),
        "tables": tables(doc),
        "limitations": doc["summary"]["limitations"],
    }


def render_markdown(doc: dict[str, Any]) -> str:
    return render("report.md", **_template_context(doc))


def render_html(doc: dict[str, Any]) -> str:
    return render("report.html", **_template_context(doc))


_STYLES = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def _print_group(console: Console, g: GroupLine, verbose: bool) -> None:
    """The group's line, wrapped under its text (not under its severity tag); with ``verbose`` its evidence."""
    line = RichTable.grid(padding=(0, 1, 0, 0))
    line.add_column(width=len("[critical]"), no_wrap=True)
    line.add_column(ratio=1)
    line.add_row(Text(f"[{g.severity}]", style=_STYLES.get(g.severity, "")),
                 Text(g.text, style="bold" if verbose else ""))  # fmt: skip
    console.print(line)
    if verbose:
        for label, text in g.evidence:
            console.print(Text(f"  {label}: {text}"))


def render_terminal(
    doc: dict[str, Any], width: int | None = 160, color: bool = False, *, verbose: bool = False, show_all: bool = False
) -> str:
    """The terminal report: where the step went, what to fix first (warning and critical groups,
    one line each, ranked by recoverable time), what was not judged, then the tables. ``verbose``
    adds each listed group's evidence and fix; ``show_all`` lists info groups too (otherwise
    counted in one line). ``width=None`` takes the terminal's; ``color`` adds ANSI styles.

    Every string from the trace goes in as a ``Text`` (never parsed as Rich markup), so a range
    called ``[rank0] fwd`` prints as written.
    """
    if width is None:
        width = shutil.get_terminal_size().columns
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color, highlight=False)
    console.rule(Text(f"nsysan report · {_headline(doc)}"))
    section = step_section(doc)
    print_table(console, section.table)
    for note in section.notes:
        console.print(Text(f"  {note}"))
    lines = group_lines(doc)
    shown = [g for g in lines if show_all or briefed(g)]
    hidden = [g for g in lines if not (show_all or briefed(g))]
    if not lines:
        console.print(Text("What to fix first: no findings", style="bold"))
    elif not shown:
        console.print(Text("What to fix first: nothing at warning or critical", style="bold"))
    else:
        console.print(Text("What to fix first", style="bold"))
    for g in shown:
        _print_group(console, g, verbose)
    if hidden:
        console.print(Text(f"+ {tally(hidden)}: --all shows them"))
    if shown and not verbose:
        console.print(Text("  -v shows each group's evidence and the fix to try", style="dim"))
    judged = not_judged(doc)
    if judged:
        console.print(Text("Not judged", style="bold"))
        for line in judged:
            console.print(Text(f"  - {line}"))
    for t in tables(doc):
        print_table(console, t)
    notes = doc["summary"]["limitations"]
    console.print(Text("What this capture cannot show" + ("" if notes else ": nothing noted"), style="bold"))
    for note in notes:
        console.print(Text(f"  - {note}"))
    return buf.getvalue()


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "terminal": render_terminal,
    "json": render_json,
    "markdown": render_markdown,
    "html": render_html,
}
