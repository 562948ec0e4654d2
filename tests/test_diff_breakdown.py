"""`nsysan diff`'s step breakdown: where step time went, before and after, per category (compute,
exposed communication, waiting for a peer, exposed copies, idle), judged against step-to-step noise
as step time is; the gate on one category; documents from before the breakdown; the finding groups'
recoverable time. Checked against figures computed by hand from the two report documents' `steps`
sections."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.samples import sample_paths
from nsysan.diff import DIFF_VERSION, diff_documents, gate, load_side
from nsysan.diff.compare import CATEGORIES, METRICS, confidence_greater
from nsysan.diff.render import MAX_RANK_ROWS, render_terminal, sections
from nsysan.errors import InputError
from nsysan.report.format import duration

STALL, FIXED = (str(sample_paths(name)[0]) for name in ("pipeline-stall", "pipeline-stall-fixed"))
ALLREDUCE = str(sample_paths("allreduce-2rank")[0])


@pytest.fixture(scope="module")
def pair():
    b, a = load_side(STALL), load_side(FIXED)
    return b, a, diff_documents(b, a)


@pytest.fixture(scope="module")
def allreduce():
    return load_side(ALLREDUCE)


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`nsysan ARGS` in this process: (exit code, stdout, stderr)."""
    from nsysan.cli import main

    monkeypatch.setattr(sys, "argv", ["nsysan", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return exit_.value.code or 0, out, err


def by_hand(doc: dict, category: str) -> float:
    """The job's figure the plain way: each rank's mean per step from the document's steps section,
    then the mean of those over the ranks."""
    ranks = doc["steps"]["ranks"]
    return sum(sum(r["breakdown_ns"][category]) / len(r["breakdown_ns"][category]) for r in ranks.values()) / len(ranks)


def test_waiting_for_peer_change_is_the_one_computed_from_the_two_documents(pair):
    b, a, doc = pair
    assert doc["nsysan_diff_version"] == DIFF_VERSION == 3
    bd = doc["breakdown"]
    assert bd["available"] and bd["why"] == {"before": None, "after": None}
    assert bd["categories"] == list(CATEGORIES)
    before, after = by_hand(b, "waiting_for_peer"), by_hand(a, "waiting_for_peer")
    w = bd["job"]["waiting_for_peer"]
    assert (w["before"], w["after"], w["delta"]) == (before, after, after - before)
    assert w["pct"] == pytest.approx(100 * (after - before) / before, abs=1e-3)
    assert w["delta"] < 0  # the fix: the SendRecv no longer waits behind the one stuck on late rank 3
    # one step a rank: no step-to-step spread to judge the change against, as for step time
    assert w["confidence"] is None and doc["steps"]["slowest"]["confidence"] is None
    # per rank: that rank's own mean per step, straight from its series
    for row in bd["per_rank"]:
        for side, d in (("before", b), ("after", a)):
            series = d["steps"]["ranks"][str(row["rank"])]["breakdown_ns"]
            for c in CATEGORIES:
                assert row["categories"][c][side] == pytest.approx(np.mean(series[c]))
            starts, ends = (
                d["steps"]["ranks"][str(row["rank"])]["start_ns"],
                d["steps"]["ranks"][str(row["rank"])]["end_ns"],
            )
            # the five categories add up to the step, so the total is the mean step duration
            assert row["step_ns"][side] == pytest.approx(np.mean(np.subtract(ends, starts)))
    ranks = {r["rank"]: r["categories"]["waiting_for_peer"] for r in bd["per_rank"]}
    assert ranks[2]["delta"] < -4e6 and ranks[0]["delta"] == 0  # rank 2 was the one stuck behind rank 3
    # every category, and the step they add up to
    for c in CATEGORIES:
        assert bd["job"][c]["before"] == pytest.approx(by_hand(b, c)) and bd["job"][c]["after"] == pytest.approx(
            by_hand(a, c)
        )
    assert bd["step_ns"]["before"] == pytest.approx(sum(by_hand(b, c) for c in CATEGORIES))
    shares = [bd["job"][c]["share_before"] for c in CATEGORIES]
    assert sum(shares) == pytest.approx(100, abs=0.01)


def test_the_breakdown_in_every_format(pair, monkeypatch, capsys):
    b, a, doc = pair
    w = doc["breakdown"]["job"]["waiting_for_peer"]
    shown = f"{duration(w['before'])} → {duration(w['after'])}"
    code, out, _ = cli(monkeypatch, capsys, "diff", STALL, FIXED)
    assert code == 0 and f"waiting for peer {shown} ({w['pct'] / 100:+.1%}) per step" in out  # the headline
    assert "Where step time went (mean per step over ranks; steps from nvtx)" in out
    (table,) = [t for t in sections(doc) if t.title.startswith("Where step time went")]
    assert [r[0] for r in table.rows if r[1] == "all"] == [
        "compute", "communication exposed", "waiting for peer", "copy exposed", "idle", "step (their sum)",
    ]  # fmt: skip
    # ranks listed under a category are those whose change is not the job's: ranks 1 and 2 waited
    # 4.85 ms less, ranks 0 and 3 no less, the job 2.43 ms less; under idle (no change anywhere) none
    waiting = table.rows[[r[0] for r in table.rows].index("waiting for peer") + 1 :]
    listed = waiting[: next(i for i, r in enumerate(waiting) if r[0])]
    assert sorted(r[1] for r in listed) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    (rank2,) = [r for r in listed if r[1] == "rank 2"]
    assert rank2[2:4] == (duration(b["steps"]["ranks"]["2"]["breakdown_ns"]["waiting_for_peer"][0]),
                          duration(a["steps"]["ranks"]["2"]["breakdown_ns"]["waiting_for_peer"][0]))  # fmt: skip
    idle = [r[0] for r in table.rows].index("idle")
    assert table.rows[idle + 1][0] == "step (their sum)"
    code, out, _ = cli(monkeypatch, capsys, "diff", STALL, FIXED, "--format", "markdown")
    assert (
        code == 0
        and "## Where step time went" in out
        and f"| waiting for peer | all | {duration(w['before'])} |" in out
    )
    code, out, _ = cli(monkeypatch, capsys, "diff", STALL, FIXED, "--format", "html")
    assert code == 0 and "<h2>Where step time went" in out and f"<td>{duration(w['after'])}</td>" in out
    code, out, _ = cli(monkeypatch, capsys, "diff", STALL, FIXED, "--format", "json")
    assert code == 0 and json.loads(out)["breakdown"] == json.loads(json.dumps(doc["breakdown"]))


def test_gate_on_waiting_for_peer(monkeypatch, capsys):
    assert {"compute", "communication_exposed", "waiting_for_peer", "copy_exposed", "idle"} <= set(METRICS)
    gate_args = ("--metric", "waiting_for_peer", "--fail-on-regression", "5%")
    assert cli(monkeypatch, capsys, "diff", STALL, FIXED, *gate_args)[0] == 0  # it got better
    code, out, err = cli(monkeypatch, capsys, "diff", FIXED, STALL, *gate_args)
    assert code == 3 and "waiting_for_peer per step worse by 147.0%" in err and "no per-step samples" in err
    assert "gate: FAILED" in out
    assert (
        cli(monkeypatch, capsys, "diff", FIXED, STALL, "--metric", "waiting_for_peer", "--fail-on-regression", "150%")[
            0
        ]
        == 0
    )
    # a category that did not change does not fail, however low the threshold
    assert cli(monkeypatch, capsys, "diff", FIXED, STALL, "--metric", "idle", "--fail-on-regression", "0%")[0] == 0
    code, _, err = cli(monkeypatch, capsys, "diff", FIXED, STALL, "--metric", "waiting", "--fail-on-regression", "5%")
    assert code == 2 and "waiting_for_peer" in err  # the error names the metrics there are


def _scaled(doc: dict, category: str, factor: float | list[float]) -> dict:
    """``doc`` with one category of every rank's steps scaled (per step when a list), each step's
    end moved with it so the categories still add up to the step."""
    out = copy.deepcopy(doc)
    for r in out["steps"]["ranks"].values():
        series = r["breakdown_ns"][category]
        factors = factor if isinstance(factor, list) else [factor] * len(series)
        grown = [int(x * f) for x, f in zip(series, factors, strict=False)]
        r["end_ns"] = [e + g - x for e, g, x in zip(r["end_ns"], grown, series, strict=True)]
        r["breakdown_ns"][category] = grown
    return out


def test_with_several_steps_a_change_is_judged_against_step_noise(allreduce):
    b = allreduce
    per_rank = [len(r["start_ns"]) for r in b["steps"]["ranks"].values()]
    assert min(per_rank) >= 2  # steps to judge noise by
    category = max(CATEGORIES, key=lambda c: by_hand(b, c))  # the largest one, not a zero
    worse = _scaled(b, category, 1.5)
    doc = diff_documents(b, worse)
    j = doc["breakdown"]["job"][category]
    pool = [[x for r in d["steps"]["ranks"].values() for x in r["breakdown_ns"][category]] for d in (b, worse)]
    assert j["confidence_worse"] == confidence_greater(*pool) and j["confidence_worse"] > 0.95
    assert j["confidence"] == j["confidence_worse"]  # it went up: the confidence is that it is worse
    verdict = gate(doc, b, worse, threshold=5, metric=category)
    assert verdict["failed"] and verdict["regression"]["noise_judged"]
    assert verdict["regression"]["worse_pct"] == pytest.approx(50, abs=0.5)
    # per rank, its own steps judge it
    for row in doc["breakdown"]["per_rank"]:
        assert row["categories"][category]["confidence_worse"] > 0.9
    # the same mean growth, but from one odd step each rank: well within the spread, so it passes
    n = min(per_rank)
    odd = _scaled(b, category, [1.0] * (n - 1) + [1.0 + 0.5 * n])
    doc = diff_documents(b, odd)
    verdict = gate(doc, b, odd, threshold=5, metric=category)
    assert verdict["regression"]["worse_pct"] > 5 and verdict["regression"]["confidence_worse"] < 0.95
    assert not verdict["failed"]
    # against itself: nothing moved
    same = diff_documents(b, b)["breakdown"]
    assert all(same["job"][c]["delta"] == 0 for c in CATEGORIES)
    assert not any(row["categories"][c]["differs"] for row in same["per_rank"] for c in CATEGORIES)


def test_a_category_that_was_zero_is_weighed_against_the_step(pair):
    b, a, _ = pair
    assert by_hand(b, "copy_exposed") == 0
    copied = copy.deepcopy(a)
    for r in copied["steps"]["ranks"].values():
        r["breakdown_ns"]["copy_exposed"] = [1_000_000 for _ in r["breakdown_ns"]["copy_exposed"]]  # 1 ms a step
    doc = diff_documents(b, copied)
    verdict = gate(doc, b, copied, threshold=5, metric="copy_exposed")
    step = doc["breakdown"]["step_ns"]["before"]
    assert verdict["regression"]["worse_pct"] is None  # no percentage of nothing
    assert verdict["regression"]["from_zero_pct"] == pytest.approx(100 * 1e6 / step, abs=1e-3)
    assert verdict["failed"] and "appeared (none before)" in verdict["reasons"][0]
    assert not gate(doc, b, copied, threshold=50, metric="copy_exposed")["failed"]  # 1 ms of a ~6 ms step: < 50%


def test_an_old_document_without_steps_says_the_breakdown_is_unavailable(tmp_path, monkeypatch, capsys):
    saved = tmp_path / "new.json"
    assert cli(monkeypatch, capsys, "report", STALL, "--format", "json", "-o", str(saved))[0] == 0
    new = json.loads(saved.read_text())
    old = {k: v for k, v in new.items() if k not in ("steps", "report_version")}
    old["findings"] = [{k: v for k, v in f.items() if k != "recoverable_ns"} for f in new["findings"]]
    old["groups"] = [{k: v for k, v in g.items() if k != "recoverable_ns"} for g in new["groups"]]
    old_path = tmp_path / "old.json"
    old_path.write_text(json.dumps(old))
    code, out, err = cli(monkeypatch, capsys, "diff", str(old_path), FIXED)
    assert code == 0, err
    assert "Where step time went: step breakdown unavailable: before: no steps section, so no step breakdown" in out
    code, out, _ = cli(monkeypatch, capsys, "diff", str(old_path), FIXED, "--format", "json")
    doc = json.loads(out)
    assert doc["breakdown"]["available"] is False and doc["breakdown"]["why"]["after"] is None
    assert doc["breakdown"]["job"] == {} and doc["breakdown"]["per_rank"] == []
    assert doc["steps"]["slowest"]["before"] is not None  # everything else still compares
    # recoverable time only where both sides have it
    assert doc["findings"]["recoverable_total"]["before"] is None and doc["findings"]["recoverable_total"]["after"]
    assert all(g["recoverable"]["before"] is None for g in doc["findings"]["unchanged"])
    for fmt, marker in (("markdown", "_step breakdown unavailable"), ("html", "<i>step breakdown unavailable")):
        code, out, _ = cli(monkeypatch, capsys, "diff", str(old_path), FIXED, "--format", fmt)
        assert code == 0 and marker in out
    # gating on a category needs the breakdown: a usage error, not a silent pass
    code, _, err = cli(monkeypatch, capsys, "diff", str(old_path), FIXED, "--metric", "waiting_for_peer",
                       "--fail-on-regression", "5%")  # fmt: skip
    assert code == 2 and "no step breakdown to compare" in err
    with pytest.raises(InputError):
        gate(diff_documents(old, new), old, new, threshold=5, metric="idle")


def test_finding_groups_compare_their_recoverable_time(pair):
    b, a, doc = pair
    f = doc["findings"]

    def recoverable(d: dict, key: str) -> int:
        return sum(x["recoverable_ns"] for x in d["findings"] if x.get("group") == key)

    assert f["unchanged"], "the samples share finding groups (the idle and exposed-communication ones)"
    for g in f["unchanged"]:
        assert g["recoverable"]["before"] == recoverable(b, g["before"]["group"])
        assert g["recoverable"]["after"] == recoverable(a, g["group"]) == g["recoverable_ns"]
    for g in f["fixed"]:
        assert g["recoverable_ns"] == recoverable(b, g["group"])
    total = f["recoverable_total"]
    assert total["before"] == sum(x["recoverable_ns"] for x in b["findings"])
    assert total["after"] == sum(x["recoverable_ns"] for x in a["findings"])
    (table,) = [t for t in sections(doc) if t.title.startswith("Findings:")]
    assert table.headers[-1] == "recoverable" and f"recoverable in all {duration(total['before'])}" in table.title
    assert "recoverable in all" in render_terminal(doc)


def test_many_ranks_list_the_most_different_and_count_the_rest(pair):
    b, _, _ = pair
    base = b["steps"]["ranks"]["0"]

    def job(waits: list[int]) -> dict:
        doc = copy.deepcopy(b)
        doc["steps"]["ranks"] = {}
        for rank, wait in enumerate(waits):
            r = copy.deepcopy(base)
            r["breakdown_ns"]["waiting_for_peer"] = [wait]
            r["end_ns"] = [r["start_ns"][0] + sum(r["breakdown_ns"][c][0] for c in CATEGORIES)]
            doc["steps"]["ranks"][str(rank)] = r
        return doc

    # 20 ranks, the job's mean unchanged: rank i waits (2i - 19) x 50 us more, so ranks 0 and 19 moved most
    before, after = job([1_000_000] * 20), job([1_000_000 + (2 * i - 19) * 50_000 for i in range(20)])
    doc = diff_documents(before, after)
    assert doc["breakdown"]["job"]["waiting_for_peer"]["delta"] == pytest.approx(0, abs=1e-6)
    assert all(row["categories"]["waiting_for_peer"]["differs"] for row in doc["breakdown"]["per_rank"])
    assert not any(row["categories"]["idle"]["differs"] for row in doc["breakdown"]["per_rank"])
    (table,) = [t for t in sections(doc) if t.title.startswith("Where step time went")]
    at = [r[0] for r in table.rows].index("waiting for peer")
    listed = table.rows[at + 1 : at + 1 + MAX_RANK_ROWS]
    assert [r[1] for r in listed] == [
        "rank 0",
        "rank 19",
        "rank 1",
        "rank 18",
        "rank 2",
        "rank 17",
        "rank 3",
        "rank 16",
    ]
    assert (
        table.rows[at + 1 + MAX_RANK_ROWS][1] == f"{20 - MAX_RANK_ROWS} more ranks differ (every rank: --format json)"
    )
    assert table.rows[at + 2 + MAX_RANK_ROWS][0] == "copy exposed"


def test_the_saved_baseline_and_the_trace_give_the_same_breakdown(tmp_path, monkeypatch, capsys, pair):
    _, _, doc = pair
    saved = tmp_path / "stall.json"
    assert cli(monkeypatch, capsys, "report", STALL, "--format", "json", "-o", str(saved))[0] == 0
    code, out, _ = cli(monkeypatch, capsys, "diff", str(saved), FIXED, "--format", "json")
    assert code == 0 and json.loads(out)["breakdown"] == json.loads(json.dumps(doc["breakdown"]))
    assert Path(saved).exists()


@pytest.mark.parametrize("sample", ["overlap-slowdown", "allreduce-2rank", "pipeline-stall", "graph-replay-node"])
def test_busy_share_of_a_step_is_at_most_all_of_it(sample):
    """Busy is the union of a step's kernels and copies clipped to the step (the step breakdown), so it
    cannot pass 100% however many streams overlap (overlap-slowdown's was 297.8% when kernel times were summed)."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", "--format", "json",
                          *map(str, sample_paths(sample))], capture_output=True, text=True, check=True)  # fmt: skip
    steps = json.loads(out.stdout)["profile"]["steps"]
    shares = [b for r in steps["per_rank"].values() for b in r["busy_pct"]]
    assert shares and all(0 <= b <= 100 for b in shares)
