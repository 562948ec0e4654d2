"""Renderers: the report document to terminal, JSON, Markdown or HTML text. Formatting only."""

from __future__ import annotations

import html
import io
import json
import shutil
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from nsysan.report.sections import Table, finding_lines, group_headline, groups, other_occurrences, tables

FORMATS = ("terminal", "json", "markdown", "html")


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


def markdown_table(t: Table) -> list[str]:
    """A titled table as Markdown lines (``|`` in cells escaped), or its empty note."""
    if not t.rows:
        return [f"## {t.title}", "", f"_{t.empty}_", ""]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    return [f"## {t.title}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers),
            *("| " + " | ".join(esc(v) for v in row) + " |" for row in t.rows), ""]  # fmt: skip


def html_table(t: Table) -> list[str]:
    """A titled table as HTML lines, every string escaped, or its empty note."""
    e = html.escape
    if not t.rows:
        return [f"<h2>{e(t.title)}</h2>", f"<p><i>{e(t.empty)}</i></p>"]
    return [f"<h2>{e(t.title)}</h2>", "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in t.headers) + "</tr>",
            *("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in t.rows), "</table>"]  # fmt: skip


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
    return json.dumps(doc, indent=2, default=_json_text) + "\n"


def _json_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def render_markdown(doc: dict[str, Any]) -> str:
    out = ["# nsysan report", "", f"nsysan {doc['nsysan_version']} · {_headline(doc)}", ""]
    out += ["## Findings", ""]
    if not doc["findings"]:
        out += ["No findings.", ""]
    for severity, headline, lines in _grouped(doc):
        out += [f"### [{severity}] {headline}", ""]
        out += [f"- **{label}**: {text}" for label, text in lines] + [""]
    for t in tables(doc):
        out += markdown_table(t)
    out += ["## What this capture cannot show", ""]
    out += [f"- {note}" for note in doc["summary"]["limitations"]] or ["Nothing noted."]
    return "\n".join(out) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2rem;color:#222}"
    "table{border-collapse:collapse;margin:.5rem 0 1.5rem}"
    "td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left;font-size:.9rem}"
    "th{background:#f3f3f3}.critical{color:#b00020}.warning{color:#a15c00}.info{color:#0b5394}"
)


def render_html(doc: dict[str, Any]) -> str:
    e = html.escape
    out = [
        "<!doctype html>", "<html><head><meta charset='utf-8'><title>nsysan report</title>",
        f"<style>{_CSS}</style></head><body>", "<h1>nsysan report</h1>",
        f"<p>nsysan {e(doc['nsysan_version'])} · {e(_headline(doc))}</p>", "<h2>Findings</h2>",
    ]  # fmt: skip
    if not doc["findings"]:
        out.append("<p>No findings.</p>")
    for severity, headline, lines in _grouped(doc):
        out.append(f"<h3 class='{e(severity)}'>[{e(severity)}] {e(headline)}</h3><ul>")
        out += [f"<li><b>{e(label)}</b>: {e(text)}</li>" for label, text in lines]
        out.append("</ul>")
    for t in tables(doc):
        out += html_table(t)
    out.append("<h2>What this capture cannot show</h2><ul>")
    out += [f"<li>{e(n)}</li>" for n in doc["summary"]["limitations"]] or ["<li>Nothing noted.</li>"]
    out.append("</ul></body></html>")
    return "\n".join(out) + "\n"


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
