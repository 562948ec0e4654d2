"""The report as titled tables of display strings, so every text format shows the same figures."""

from __future__ import annotations

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
