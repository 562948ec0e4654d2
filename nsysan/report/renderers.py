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

from nsysan.report.sections import Table, finding_lines, group_headline, groups, other_occurrences, tables
from nsysan.report.templating import render


def _headline(doc: dict[str, Any]) -> str:
    counts = doc["summary"]["findings_by_severity"]
    n = len(doc["findings"])
    parts = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    text = f"{n} finding{'s' if n != 1 else ''}" + (f" ({parts})" if parts else "")
    g = len(groups(doc))
    return text + (f" in {g} group{'s' if g != 1 else ''}" if g != n else "")


def _grouped(doc: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(severity, headline, lines) per group: the worst occurrence's lines plus the others, briefly."""
    out = []
    for g in groups(doc):
        lines = finding_lines(doc["findings"][g["worst"]])
        others = other_occurrences(doc, g)
        if others:
            lines.insert(len(lines) - 1, ("other occurrences", "; ".join(others)))
        out.append((g["severity"], group_headline(doc, g), lines))
    return out


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
            if x and all(type(v) in (int, float) for v in x):
                series.append(json.dumps(x))
                return f"{token}:{len(series) - 1}"
            return [lift(v) for v in x]
        return x

    text = json.dumps(lift(doc), indent=2, default=default)
    if series:
        text = re.sub(f'"{token}:([0-9]+)"', lambda m: series[int(m[1])], text)
    return text + "\n"


def _json_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _template_context(doc: dict[str, Any]) -> dict[str, Any]:
    """What the Markdown and HTML templates show: the same figures as the terminal report."""
    return {
        "version": doc["nsysan_version"],
        "headline": _headline(doc),
        "groups": [{"severity": s, "headline": h, "lines": lines} for s, h, lines in _grouped(doc)],
        "tables": tables(doc),
        "limitations": doc["summary"]["limitations"],
    }


def render_markdown(doc: dict[str, Any]) -> str:
    return render("report.md", **_template_context(doc))


def render_html(doc: dict[str, Any]) -> str:
    return render("report.html", **_template_context(doc))


def render_terminal(doc: dict[str, Any], width: int | None = 160, color: bool = False) -> str:
    """Rich tables as text. ``width=None`` takes the terminal's; ``color`` adds ANSI styles.

    Every string from the trace goes in as a ``Text`` (never parsed as Rich markup), so a range
    called ``[rank0] fwd`` prints as written.
    """
    if width is None:
        width = shutil.get_terminal_size().columns
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, no_color=not color, highlight=False)
    console.rule(Text(f"nsysan report · {_headline(doc)}"))
    styles = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
    if doc["findings"]:
        console.print(Text("Findings", style="bold"))
    for severity, headline, lines in _grouped(doc):
        line = Text(f"[{severity}] ", style=styles[severity])
        line.append(headline, style="bold")
        console.print(line)
        for label, text in lines:
            console.print(Text(f"  {label}: {text}"))
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
