"""Two stored traces compared through ``nsysan diff``'s own comparison, for the compare page.

The findings come from the store (with their review ids), the figures from the exports' diff
profiles (:func:`nsysan.diff.profile_files`, cached per set of files), where step time went from
the steps section stored with each trace's analysis (:func:`dashboards.analysis.stored_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dashboards.analysis import stored_steps
from nsysan.diff import diff_documents, profile_files
from nsysan.store import ReviewStore


@dataclass(frozen=True)
class Comparison:
    """Finding groups fixed, new and unchanged (each as its worst stored finding), the slowest
    rank's median step time, and the whole diff document (nsysan.diff, docs/diff.md)."""

    fixed: list[dict[str, Any]]
    new: list[dict[str, Any]]
    unchanged: list[dict[str, Any]]
    step_ns_before: float | None
    step_ns_after: float | None
    diff: dict[str, Any]


def compare_traces(store: ReviewStore, before: int, after: int) -> Comparison:
    """Two captures of one job (before/after a fix): the stored findings matched by group and
    evidence, and the figures of both traces."""
    sides = [{"findings": store.findings(t), "profile": profile_files(store.trace_paths(t)), "steps": stored_steps(store, t)}
             for t in (before, after)]  # fmt: skip
    labels = (store.trace(before)["name"], store.trace(after)["name"])
    doc = diff_documents(sides[0], sides[1], labels=labels)
    f = doc["findings"]
    steps = doc["steps"]["slowest"]
    return Comparison(
        fixed=[g["worst"] | {"count": g["count"]} for g in f["fixed"]],
        new=[g["worst"] | {"count": g["count"]} for g in f["new"]],
        unchanged=[
            g["worst"] | {"count": g["count"], "impact_before_ns": g["before"]["impact_ns"], "change": g["change"]}
            for g in f["unchanged"]
        ],
        step_ns_before=steps["before"],
        step_ns_after=steps["after"],
        diff=doc,
    )
