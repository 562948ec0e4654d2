"""Findings of one problem fold into one headline in every format; severity comes from the group."""

from __future__ import annotations

import html
from functools import partial

from nsysan.detect.common import SeverityParams, grade
from nsysan.findings import Finding, Severity
from nsysan.report.document import fold_groups
from nsysan.report.renderers import RENDERERS, render_terminal

MS = 1_000_000


def _finding(impact_ms: float, start_ms: int, group: str, kind: str = "comm_compute_slowdown") -> Finding:
    return Finding(kind=kind, severity=Severity.INFO, title=f"slowed {impact_ms} ms at {start_ms}", advice="do less",
                   start_ns=start_ms * MS, end_ns=start_ms * MS + 2 * MS, impact_ns=int(impact_ms * MS), rank=0,
                   evidence={"kernel": "k"}, group=group)  # fmt: skip


def test_fifty_small_episodes_of_one_problem_are_a_warning_together():
    run = 1000 * MS
    episodes = [(_finding(0.086, 10 * i, "g"), run) for i in range(50)]  # 0.0086% each, 0.43% together
    assert {f.severity for f in grade(episodes, SeverityParams())} == {Severity.INFO}
    episodes = [(_finding(0.86, 10 * i, "g"), run) for i in range(50)]  # 0.086% each, 4.3% together
    graded = grade([*episodes, (_finding(0.86, 999, ""), run)], SeverityParams())
    assert [f.severity for f in graded[:50]] == [Severity.WARNING] * 50
    assert graded[50].severity is Severity.INFO  # no group: graded alone


def test_fold_counts_totals_and_worst_first():
    found = [_finding(1, 0, "a"), _finding(5, 10, "a"), _finding(2, 20, "a"), _finding(3, 30, "")]
    docs = [f.to_dict() for f in grade([(f, 100 * MS) for f in found], SeverityParams())]
    folded = fold_groups(docs)
    assert [(g["group"], g["count"], g["impact_ns"], g["worst"], g["severity"]) for g in folded] == [
        ("a", 3, 8 * MS, 1, "critical"),
        ("", 1, 3 * MS, 3, "warning"),
    ]


def test_every_format_shows_one_headline_per_group():
    found = grade([(_finding(1 + i, 10 * i, "a"), 100 * MS) for i in range(12)], SeverityParams())
    docs = [f.to_dict() for f in found]
    doc = {"nsysan_version": "x", "traces": [], "findings": docs, "groups": fold_groups(docs),
           "summary": {"findings_by_severity": {"info": 0, "warning": 0, "critical": 12}, "exports": [], "ranks": [],
                       "devices": [], "top_kernels": [], "nccl": [], "copies": [], "nvtx_ranges": [],
                       "limitations": []}}  # fmt: skip
    verbose = partial(render_terminal, verbose=True)  # the terminal shows occurrences with -v only
    for name, render in (("terminal", verbose), ("markdown", RENDERERS["markdown"]), ("html", RENDERERS["html"])):
        text = " ".join(html.unescape(render(doc)).split())
        assert text.count("12 occurrences, 78 ms lost in total; worst: slowed 12 ms at 110") == 1, name
        assert "slowed 1 ms at 0" not in text, name  # not a headline of its own
        assert "... and 1 more" in text, name  # 11 others, 10 listed
        assert "12 findings (12 critical) in 1 group" in text, name
    brief = " ".join(RENDERERS["terminal"](doc).split())
    assert brief.count("12 occurrences, 78 ms lost in total; worst: slowed 12 ms at 110") == 1
    assert "... and 1 more" not in brief and "other occurrences" not in brief
