"""A trace's review as a file: JSON, CSV or Markdown, from :meth:`ReviewStore.review` (docs/store.md).

Every finding of the trace (those the latest analysis no longer found too, marked) with its status,
assignee and thread: comments and review events (status and assignee changes: who, when, from, to),
in the order they happened; the trace's notes first.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

FORMATS = {"json": "application/json", "csv": "text/csv", "md": "text/markdown"}
CSV_COLUMNS = ("finding_id", "kind", "severity", "rank", "device", "group", "title", "start_ns", "impact_ns",
               "recoverable_ns", "status", "assignee", "present", "entry", "author", "at", "field", "from", "to",
               "text")  # fmt: skip
_FINDING_COLUMNS = CSV_COLUMNS[1 : CSV_COLUMNS.index("entry")]  # a finding's own row: kind .. present


def render(review: dict[str, Any], fmt: str) -> str:
    """The review in ``fmt`` (a key of :data:`FORMATS`)."""
    if fmt == "json":
        return json.dumps(review, indent=2, default=str) + "\n"
    if fmt == "csv":
        return _csv(review)
    if fmt == "md":
        return _markdown(review)
    raise ValueError(f"export format {fmt!r}: one of {', '.join(FORMATS)}")


def filename(review: dict[str, Any], fmt: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(review["trace"]["name"]))[:80] or "trace"
    return f"review-{review['trace']['id']}-{safe}.{fmt}"


def _csv(review: dict[str, Any]) -> str:
    """One row per finding (``entry`` "finding"), then one per entry of its thread; the trace's notes
    first (``entry`` "note", no finding). A text cell that a spreadsheet would run as a formula
    (starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) is prefixed with ``'``."""
    out = io.StringIO()
    table = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    table.writeheader()

    def write(row: dict[str, Any]) -> None:
        table.writerow({k: _inert(v) for k, v in row.items()})

    for n in review["notes"]:
        write({"entry": "note", "author": n["author"], "at": n["created_at"], "text": n["body"]})
    for f in review["findings"]:
        base = {"finding_id": f["id"], **{k: f[k] for k in _FINDING_COLUMNS if k in f}}
        write(base | {"entry": "finding", "assignee": f["assignee"] or ""})
        for e in f["thread"]:
            row = {"finding_id": f["id"], "entry": e["kind"], "author": e["author"], "at": e["created_at"]}
            if e["kind"] == "event":
                row |= {"field": e["field"], "from": e["from"] or "", "to": e["to"] or ""}
            else:
                row |= {"text": e["body"]}
            write(row)
    return out.getvalue()


def _inert(value: Any) -> Any:
    """A reviewer's text as a spreadsheet shows it, never as a formula it runs."""
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def describe(event: dict[str, Any]) -> str:
    """An event in words: ``status open -> confirmed``, ``assignee nobody -> ada``."""
    return f"{event['field']} {event['from'] or 'nobody'} -> {event['to'] or 'nobody'}"


def _markdown(review: dict[str, Any]) -> str:
    t = review["trace"]
    lines = [f"# Review of trace {t['id']}: {t['name']}", ""]
    if review["notes"]:
        lines += ["## Notes", ""] + [f"- **{n['author']}** ({_at(n)}): {n['body']}" for n in review["notes"]] + [""]
    for f in review["findings"]:
        missing = "" if f.get("present", True) else " (not found in the latest analysis)"
        lines += [f"## #{f['id']} [{f['severity']}] {f['title']}{missing}", "",
                  f"- kind: {f['kind']}, rank {f['rank']}, GPU {f['device']}, {_recoverable(f)}",
                  f"- status: **{f['status']}**, assignee: {f['assignee'] or 'nobody'}", ""]  # fmt: skip
        for e in f["thread"]:
            said = describe(e) if e["kind"] == "event" else e["body"]
            lines.append(f"- **{e['author']}** ({_at(e)}){' changed' if e['kind'] == 'event' else ':'} {said}")
        if f["thread"]:
            lines.append("")
    return "\n".join(lines)


def _recoverable(finding: dict[str, Any]) -> str:
    """What fixing it would save of the job's wall time (none recorded before report version 2)."""
    ns = finding.get("recoverable_ns")
    return "recoverable: not computed" if ns is None else f"recoverable: {ns / 1e6:.3f} ms"


def _at(entry: dict[str, Any]) -> str:
    return str(entry["created_at"])[:16].replace("T", " ") + " UTC"
