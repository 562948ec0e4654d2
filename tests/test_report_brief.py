"""The terminal report in brief: where the step went, what to fix first (warning and critical
groups, ranked by recoverable time), what was not judged; --all, -v, --step-pattern. Markdown and
HTML hold the same figures with every group's evidence collapsed; JSON is unchanged by the flags."""

from __future__ import annotations

import copy
import html
import json
import statistics
import sys
from functools import cache
from typing import Any

import pytest
from typer.testing import CliRunner

from fixtures.samples import sample_paths
from nsysan.cli import app, main
from nsysan.report.format import duration
from nsysan.report.renderers import RENDERERS, render_terminal

STALL = str(sample_paths("pipeline-stall")[0])
ALLREDUCE = str(sample_paths("allreduce-2rank")[0])
CATEGORIES = ("compute", "communication_exposed", "waiting_for_peer", "copy_exposed", "idle")
runner = CliRunner()


def report(*args: str) -> str:
    result = runner.invoke(app, ["report", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@cache
def document(path: str) -> dict[str, Any]:
    return json.loads(report(path, "--format", "json"))


def flat(text: str) -> str:
    """Text with every run of whitespace one space: the terminal wraps long lines."""
    return " ".join(text.split())


def table_rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the Rich table titled ``title`` in terminal output, as stripped cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([c.strip() for c in line.strip("│").split("│")])
    return rows


def expected_row(rank: str, r: dict[str, Any], critical: bool) -> list[str]:
    """A rank's row computed from the JSON's steps section, independently of the renderer."""
    lengths = [e - s for s, e in zip(r["start_ns"], r["end_ns"], strict=True)]
    total = sum(lengths)
    pct = [f"{100 * sum(r['breakdown_ns'][c]) / total:.1f}%" for c in CATEGORIES]
    causes = {c: sum(v) for c, v in r["idle_causes_ns"].items()}
    top = max(causes, key=lambda c: causes[c])
    names = {"data_loading": "data loading", "blocked_launch": "full launch queue", "sync": "host sync",
             "unknown": "unknown cause"}  # fmt: skip
    idle = pct[-1] + (f" (mostly {names.get(top, top)})" if causes[top] > 0 else "")
    mean = total / len(lengths) / 1e6
    return [f"{rank} (critical)" if critical else rank, str(len(lengths)), f"{mean:.3g}", *pct[:-1], idle]


def most_critical(steps: dict[str, Any]) -> tuple[int, int, int]:
    named = steps["job"]["critical_rank"]
    rank = min(set(named), key=lambda r: (-named.count(r), r))
    return rank, named.count(rank), len(named)


@pytest.mark.parametrize("path", [STALL, ALLREDUCE])
def test_where_the_step_went_matches_the_json(path):
    doc = document(path)
    steps = doc["steps"]
    text = report(path)
    assert text.index("Where the step went") < text.index("What to fix first") < text.index("Exports")
    critical, count, total = most_critical(steps)
    want = [
        expected_row(k, v, int(k) == critical) for k, v in sorted(steps["ranks"].items(), key=lambda kv: int(kv[0]))
    ]
    assert table_rows(text, "Where the step went") == want
    lines = [line.strip() for line in text.splitlines()]
    assert (
        f"job wall time: {duration(steps['job']['wall_ns'])} (first step start to last step end over all ranks, on the job clock)"
        in lines
    )
    assert steps["detail"].startswith("NVTX ranges matching ") and "\\\\" not in steps["detail"]  # the regex as typed
    assert flat(f"steps: {steps['detail']}") in flat(text)
    clock = steps["clock"]
    assert f"clock: {clock['method']} (uncertainty {duration(clock['uncertainty_ns'])})" in lines
    assert f"critical rank: rank {critical} in {count} of {total} step" in flat(text)
    # every export's steps tile: the shares of a rank sum to 100% (give or take rounding)
    for row in want:
        assert abs(sum(float(c.split("%")[0]) for c in row[3:]) - 100) < 0.3


def test_the_same_table_in_markdown_and_html():
    doc = document(STALL)
    critical = most_critical(doc["steps"])[0]
    rows = [expected_row(k, v, int(k) == critical) for k, v in sorted(doc["steps"]["ranks"].items())]
    md = RENDERERS["markdown"](doc)
    page = RENDERERS["html"](doc)
    assert "## Where the step went" in md and "<h2>Where the step went</h2>" in page
    for row in rows:
        assert "| " + " | ".join(row) + " |" in md
        assert "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" in page


def brief_line(doc: dict[str, Any], g: dict[str, Any]) -> str:
    worst = doc["findings"][g["worst"]]
    headline = worst["title"]
    if g["count"] > 1:  # a problem on several ranks (exposed communication): count, total, the worst
        headline = f"{g['count']} occurrences, {duration(g['impact_ns'])} lost in total; worst: {headline}"
    share = 100 * g["recoverable_ns"] / doc["steps"]["job"]["wall_ns"]
    return f"[{g['severity']}] recovers {duration(g['recoverable_ns'])} ({share:.1f}% of the job) · {g['kind']} · {headline}"


def test_what_to_fix_first_lists_warning_and_critical_groups_in_the_documents_order():
    doc = document(STALL)
    text = flat(report(STALL))
    shown = [g for g in doc["groups"] if g["severity"] != "info"]
    hidden = [g for g in doc["groups"] if g["severity"] == "info"]
    assert shown and hidden
    positions = [text.index(flat(brief_line(doc, g))) for g in shown]
    assert positions == sorted(positions)  # ranked as the document ranks them: severity, then recoverable time
    for g in hidden:
        assert flat(doc["findings"][g["worst"]]["title"]) not in text
    total = sum(g["recoverable_ns"] for g in hidden)
    groups = "group" if len(hidden) == 1 else "groups"
    assert f"+ {len(hidden)} info {groups} recovering {duration(total)} in all: --all shows them" in text


def test_all_shows_info_groups_too():
    doc = document(STALL)
    text = flat(report(STALL, "--all"))
    positions = [text.index(flat(brief_line(doc, g))) for g in doc["groups"]]
    assert positions == sorted(positions)
    assert "--all shows them" not in text


def test_evidence_only_with_verbose():
    doc = document(STALL)
    shown = [g for g in doc["groups"] if g["severity"] != "info"]
    info = [g for g in doc["groups"] if g["severity"] == "info"]
    default, verbose, everything = (report(STALL, *flags) for flags in ((), ("-v",), ("--all", "--verbose")))
    assert "evidence." not in default and "  fix: " not in default and "  where: " not in default
    assert "-v shows each group's evidence and the fix to try" in default
    for g in shown:
        advice = flat(doc["findings"][g["worst"]]["advice"])
        assert (
            advice not in flat(default) and f"fix: {advice}" in flat(verbose) and f"fix: {advice}" in flat(everything)
        )
    for g in info:
        advice = flat(doc["findings"][g["worst"]]["advice"])
        assert f"fix: {advice}" in flat(everything)
    assert "-v shows" not in verbose
    assert flat(verbose).count(" fix: ") == len(shown) and flat(everything).count(" fix: ") == len(doc["groups"])


def test_flags_change_only_the_terminal_report():
    plain = document(STALL)
    flagged = json.loads(report(STALL, "--format", "json", "--all", "-v"))
    assert flagged == plain
    assert report(STALL, "-f", "markdown", "--all", "-v") == report(STALL, "-f", "markdown")


def test_markdown_and_html_hold_every_group_with_its_evidence_collapsed():
    doc = document(STALL)
    md = RENDERERS["markdown"](doc)
    page = RENDERERS["html"](doc)
    n = len(doc["groups"])
    assert md.count("<details><summary>") == n and md.count("</details>") == n
    assert page.count("<details><summary class=") == n and page.count("</details>") == n
    for g in doc["groups"]:  # info groups too, each with its fix
        summary = brief_line(doc, g)
        assert f"<details><summary>{html.escape(summary)}</summary>" in md
        assert html.escape(summary) in page
        assert f"- **fix**: {doc['findings'][g['worst']]['advice']}" in md
    assert md.index("## Where the step went") < md.index("## What to fix first") < md.index("## Exports")


def test_markup_in_a_headline_stays_text_in_markdown_summaries():
    doc = copy.deepcopy(document(STALL))
    doc["findings"][doc["groups"][0]["worst"]]["title"] = "kernel<float> & <script>"
    md = RENDERERS["markdown"](doc)
    assert "kernel&lt;float&gt; &amp; &lt;script&gt;</summary>" in md and "<script>" not in md


def old_document(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as an nsysan before report version 2 saved it: no steps, report_version or recoverable_ns."""
    old = copy.deepcopy(doc)
    del old["steps"], old["report_version"]
    for item in old["findings"] + old["groups"]:
        del item["recoverable_ns"]
    return old


def test_an_old_document_still_renders_in_every_format():
    doc = document(STALL)
    old = old_document(doc)
    for name, render in RENDERERS.items():
        assert render(old), name
    text = render_terminal(old)
    assert "Where the step went: not in this report (saved by an nsysan before report version 2" in flat(text)
    g = old["groups"][0]
    worst = old["findings"][g["worst"]]
    # idle waiting for the host is one job-wide group (ranks 2, 3 and 1): its count and total first
    assert (g["group"], g["count"]) == ("gpu_idle|launch", 3)
    headline = f"3 occurrences, {duration(g['impact_ns'])} lost in total; worst: {worst['title']}"
    assert flat(f"[{g['severity']}] lost {duration(g['impact_ns'])} · {g['kind']} · {headline}") in flat(text)
    assert "recovers" not in text and "Not judged" not in text
    info = [g for g in old["groups"] if g["severity"] == "info"]
    assert [g["kind"] for g in info] == ["nccl_ordering_stall"]
    assert f"+ 1 info group, {duration(info[0]['impact_ns'])} lost in all: --all shows them" in text
    md = RENDERERS["markdown"](old)
    assert "_not in this report (saved by an nsysan before report version 2" in md
    assert md.count("<details>") == len(old["groups"])
    assert json.loads(RENDERERS["json"](old)) == old
    del old["groups"]  # older still: saved before groups existed
    assert flat(worst["title"]) in flat(render_terminal(old))


def test_many_ranks_are_summarised():
    doc = copy.deepcopy(document(STALL))
    ranks = doc["steps"]["ranks"]
    base = dict(ranks)
    for i in range(len(base), 40):
        ranks[str(i)] = copy.deepcopy(base[str(i % len(base))])
    doc["steps"]["job"]["critical_rank"] = [7]
    rows = table_rows(render_terminal(doc), "Where the step went")
    assert [r[0] for r in rows] == ["min of 40 ranks", "median", "max", "7 (critical)"]
    waiting = [
        100
        * sum(r["breakdown_ns"]["waiting_for_peer"])
        / sum(e - s for s, e in zip(r["start_ns"], r["end_ns"], strict=True))
        for r in ranks.values()
    ]
    column = CATEGORIES.index("waiting_for_peer") + 3
    assert [r[column] for r in rows[:3]] == [
        f"{v:.1f}%" for v in (min(waiting), statistics.median(waiting), max(waiting))
    ]
    assert rows[3] == expected_row("7", ranks["7"], critical=True)
    assert "40 ranks: each column's min, median and max over the ranks" in flat(render_terminal(doc))


def test_not_judged_names_each_ranks_time_and_why():
    doc = document(ALLREDUCE)
    unjudged = doc["steps"]["unjudged"]
    assert unjudged
    text = flat(report(ALLREDUCE))
    assert "Not judged" in text
    for why in {u["why"] for u in unjudged}:
        mine = [u for u in unjudged if u["why"] == why]
        parts = ", ".join(f"{duration(u['ns'])} on rank {u['rank']}" for u in mine)
        assert flat(f"- {parts} ({mine[0]['detector']}): {why}") in text


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["nsysan", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    code = exited.value.code
    return (0 if code is None else code if isinstance(code, int) else 1), out, err


@pytest.mark.parametrize("option", ["--step-pattern", "--step-regex"])
def test_a_bad_step_pattern_is_one_line_and_exit_2(monkeypatch, capsys, option):
    code, out, err = run_main(monkeypatch, capsys, "report", ALLREDUCE, option, "step(")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("nsysan: error: --step-pattern 'step(': not a regular expression")


@pytest.mark.parametrize("option", ["--step-pattern", "--step-regex"])
def test_the_step_pattern_chooses_the_steps(option):
    assert document(ALLREDUCE)["steps"]["source"] == "nvtx"
    doc = json.loads(report(ALLREDUCE, "-f", "json", option, "^no range is called this$"))
    assert doc["steps"]["source"] in ("kernel_sequence", "capture")
    assert doc["profile"]["steps"]["source"] != "nvtx"  # the diff profile's steps follow the pattern too
    text = flat(report(ALLREDUCE, option, "^no range is called this$"))
    assert "steps: NVTX ranges" not in text
    if doc["steps"]["source"] == "kernel_sequence":
        assert f"steps: the repeating kernel sequence ({doc['steps']['detail']})" in text
    else:
        assert "steps: none found; each rank's GPU activity in the capture is one step" in text


def test_fail_on_still_gates_the_brief_report(monkeypatch, capsys):
    doc = document(STALL)
    worst = doc["groups"][0]["severity"]
    assert worst == "critical"
    code, out, err = run_main(monkeypatch, capsys, "report", STALL, "--fail-on", "critical")
    matched = sum(f["severity"] == "critical" for f in doc["findings"])
    assert code == 3 and err.strip() == f"nsysan: error: {matched} finding(s) at critical or worse"
    assert "What to fix first" in out
