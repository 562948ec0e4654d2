"""`nsysan diff`: each figure against independent SQL on the real 2x H100 before/after pair and the
bundled pipeline-stall samples; finding groups matched by key and evidence; the gate's exit codes;
manifest.json in `report` and `diff`; the dashboard's compare going through the same function."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures.samples import sample_paths
from nsysan.diff import confidence_greater, diff_documents, gate, load_side
from nsysan.diff.compare import impact_change
from nsysan.diff.render import change
from nsysan.store import ReviewStore

STALL, FIXED = (str(sample_paths(name)[0]) for name in ("pipeline-stall", "pipeline-stall-fixed"))


def nsysan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, timeout=120)


def sql(path: str | Path, query: str, *params: object) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        return c.execute(query, params).fetchall()


@pytest.fixture(scope="module")
def real(nsysai_traces):
    before, after = (str(nsysai_traces[n]) for n in ("mfu_2gpu_before", "mfu_2gpu_after"))
    sides = load_side(before), load_side(after)
    return before, after, sides, diff_documents(*sides, labels=(before, after))


@pytest.fixture(scope="module")
def samples():
    sides = load_side(STALL), load_side(FIXED)
    return sides, diff_documents(*sides)


def _anchor_steps(path: str, device: int, name: str) -> np.ndarray:
    """Step times the plain way: start to start of one kernel signature on one device."""
    rows = sql(path, "SELECT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                     "WHERE k.deviceId = ? AND s.value = ? AND k.gridX = 244 AND k.gridZ = 6 AND k.blockX = 128 "
                     "ORDER BY k.start", device, name)  # fmt: skip
    return np.diff([r[0] for r in rows])


def test_real_pair_step_time_from_the_repeating_kernel_sequence(real):
    before, after, (b, _a), doc = real
    assert doc["comparable"]["ok"], doc["comparable"]
    assert doc["steps"]["source"] == {"before": "kernel sequence", "after": "kernel sequence"}
    assert "flash_fwd_kernel" in doc["steps"]["detail"]["before"]
    devices = {r["rank"]: r["devices"][0] for r in b["profile"]["ranks_table"]}
    for row in doc["steps"]["per_rank"]:
        for side, path in (("before", before), ("after", after)):
            steps = _anchor_steps(path, devices[row["rank"]], "flash_fwd_kernel")
            assert row[side]["steps"] == len(steps)
            assert row[side]["median_ns"] == pytest.approx(np.median(steps))
            assert row[side]["p90_ns"] == pytest.approx(np.percentile(steps, 90))
    s = doc["steps"]["slowest"]
    # this window of the "after" job repeats its layer sequence ~14% slower; 16 vs 14 steps make it certain
    assert s["pct"] == pytest.approx(100 * (s["after"] - s["before"]) / s["before"], abs=1e-3) and 12 < s["pct"] < 16
    assert s["confidence"] > 0.99


def test_real_pair_kernel_deltas_and_gpu_time_match_sql(real):
    before, after, (b, a), doc = real
    totals = "SELECT s.value, k.gridX, k.gridY, k.gridZ, k.blockX, COUNT(*), SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k " \
             "JOIN StringIds s ON s.id = k.demangledName GROUP BY 1, 2, 3, 4, 5"  # fmt: skip
    tb = {(n, gx, gy, gz, bx): (c, t) for n, gx, gy, gz, bx, c, t in sql(before, totals)}
    ta = {(n, gx, gy, gz, bx): (c, t) for n, gx, gy, gz, bx, c, t in sql(after, totals)}
    deltas = sorted(((ta[k][1] - tb[k][1], k) for k in tb.keys() & ta.keys()), reverse=True)
    k = doc["kernels"]
    top = k["regressions"][0]
    assert top["short_name"] == "ncclDevKernel_SendRecv" and top["total_ns"]["delta"] == deltas[0][0]
    assert top["count"] == {"before": 66, "after": 62, "delta": -4, "pct": top["count"]["pct"]}
    flash = k["improvements"][0]
    assert flash["total_ns"]["delta"] == deltas[-1][0] and flash["short_name"] == "flash_fwd_kernel"
    # fewer calls in the same 300 ms window, each about as long: the total fell, the kernel did not get faster
    key = next(key for key in tb if key[0] == flash["signature"].split(" | ")[0] and key[1:4] == (244, 1, 6))
    assert flash["mean_ns"]["before"] == pytest.approx(tb[key][1] / tb[key][0]) and abs(flash["mean_ns"]["pct"]) < 1
    assert k["appeared_total"] == len(ta.keys() - tb.keys()) and k["vanished_total"] == len(tb.keys() - ta.keys())
    per_device = "SELECT deviceId, SUM(end - start), SUM(CASE WHEN s.value LIKE 'nccl%' THEN end - start ELSE 0 END) " \
                 "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName GROUP BY deviceId"  # fmt: skip
    for side, path, profile in (("before", before, b["profile"]), ("after", after, a["profile"])):
        sums = {d: (kt, nt) for d, kt, nt in sql(path, per_device)}
        for row, prow in zip(doc["ranks"], profile["ranks_table"], strict=True):
            kt, nt = sums[prow["devices"][0]]
            assert row["kernel_ns"][side] == kt and row["nccl_ns"][side] == nt
            assert kt <= row["busy_ns"][side] <= row["span_ns"][side]
    nccl = {side: sql(path, "SELECT COUNT(*), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                            "ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_SendRecv%'")[0]
            for side, path in (("before", before), ("after", after))}  # fmt: skip
    (row,) = doc["nccl"]
    assert (row["op"], row["count"]["before"], row["total_ns"]["before"]) == ("SendRecv", *nccl["before"])
    assert (row["count"]["after"], row["total_ns"]["after"]) == nccl["after"]
    # the step attribution finds the same problems on both sides (both GPUs launch-bound, each rank
    # late at some send/recv) and one new one after: rank 1's GPU idles 1.23 ms after a host sync
    f = doc["findings"]
    assert f["fixed"] == []
    assert [(g["group"], g["severity"], g["count"], g["impact_ns"], g["recoverable_ns"]) for g in f["new"]] == [
        ("gpu_idle|sync", "info", 1, 1_233_787, 0)]  # fmt: skip
    assert {(g["group"], g["before"]["severity"], g["severity"]) for g in f["unchanged"]} == {
        ("gpu_idle|launch", "warning", "critical"), ("late_rank|rank 0", "info", "info"),
        ("late_rank|rank 1", "info", "info")}  # fmt: skip
    # its gap is one with nothing on rank 1's GPU: from a copy's end to the next kernel's start
    ((gap_start, gap_end),) = f["new"][0]["worst"]["evidence"]["longest_gaps_ns"]
    device = next(r["devices"][0] for r in a["profile"]["ranks_table"] if r["rank"] == 1)
    assert gap_end - gap_start == 1_233_787
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        assert sql(after, f"SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_{table} WHERE deviceId = ? AND start < ? AND end > ?",
                   device, gap_end, gap_start) == [(0,)]  # fmt: skip
    assert sql(after, "SELECT MAX(end) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ? AND end <= ?", device,
               gap_start) == [(gap_start,)]  # fmt: skip
    assert sql(after, "SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ? AND start >= ?", device,
               gap_end) == [(gap_end,)]  # fmt: skip


# Each rank's step as nsysan projects its NVTX step range onto the GPU (nsysan/steps.py): from the
# first CUDA call the process made inside the range, the GPU work with that correlation id or later
# (one step per rank here, so the step ends with the rank's last kernel)
PROJECTED_STEPS = """
WITH r AS (SELECT n.globalTid / 16777216 AS proc, n.start AS s, n.end AS e FROM NVTX_EVENTS n
           LEFT JOIN StringIds t ON t.id = n.textId
           WHERE COALESCE(n.text, t.value) LIKE 'step%' AND n.eventType IN (59, 60)),
     first AS (SELECT r.proc, (SELECT MIN(c.correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME c
                               WHERE c.globalTid / 16777216 = r.proc AND c.start >= r.s AND c.start < r.e) AS id
               FROM r)
SELECT MAX(k.end) - MIN(k.start) FROM first f JOIN CUPTI_ACTIVITY_KIND_KERNEL k
ON k.globalPid / 16777216 = f.proc AND k.correlationId >= f.id GROUP BY f.proc
"""


def test_samples_step_time_and_findings_fixed(samples):
    (_b, _a), doc = samples
    for path, side in ((STALL, "before"), (FIXED, "after")):
        steps = [d for (d,) in sql(path, PROJECTED_STEPS)]
        assert doc["steps"]["slowest"][side] == pytest.approx(max(steps)) and len(steps) == 4
        assert sorted(r[side]["median_ns"] for r in doc["steps"]["per_rank"]) == sorted(steps)
    # the slowest rank's NVTX step range lasts 8.814 ms on its host, its GPU work 8.789 ms
    assert doc["steps"]["slowest"]["before"] == 8_789_000 and doc["steps"]["slowest"]["after"] == 3_938_000
    assert doc["steps"]["source"]["before"] == "nvtx"
    f = doc["findings"]
    assert [g["group"] for g in f["fixed"]] == ["nccl_ordering_stall|rank 2|stream 13|late rank 3"]
    assert "waited 4996 us" in f["fixed"][0]["title"]
    # with rank 3 on time, rank 2's receive still waits 160 us behind its send to rank 3 on their one
    # NCCL stream: no late rank now, so it is the shared stream's (it recovers nothing of the job)
    assert [(g["group"], g["severity"], g["recoverable_ns"]) for g in f["new"]] == [
        ("shared_nccl_stream|rank 2|stream 13", "info", 0)]  # fmt: skip
    assert "waited 160 us behind ncclDevKernel_SendRecv of another communicator" in f["new"][0]["title"]
    # the step attribution's findings are on both sides, graded alike: the GPUs idle waiting for
    # their hosts' launches (one group: rank 2's 3.17 ms recovers nearly all of it, the others' ~nothing),
    # every rank's NCCL transfer is exposed (one group: 456 us of the ~8.8 ms job)
    assert [(g["group"], g["before"]["severity"], g["severity"], g["recoverable_ns"]) for g in f["unchanged"]] == [
        ("gpu_idle|launch", "critical", "critical", 2_153_000),
        ("exposed_communication", "critical", "critical", 456_000),
    ]
    (send,) = [r for r in doc["kernels"]["improvements"] if r["short_name"] == "ncclDevKernel_SendRecv"]
    (before_ns,), (after_ns,) = (sql(p, "SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
                                        "s.id = k.shortName WHERE s.value = 'ncclDevKernel_SendRecv'")[0] for p in (STALL, FIXED))  # fmt: skip
    assert send["total_ns"]["before"] == before_ns and send["total_ns"]["after"] == after_ns


def _finding(group: str, impact: int, **evidence: object) -> dict:
    kind = group.split("|")[0]
    return {"kind": kind, "group": group, "severity": "warning", "rank": 0, "device": 0, "pid": 1, "start_ns": 0,
            "end_ns": impact, "impact_ns": impact, "title": f"{group} {impact}", "evidence": evidence, "advice": ""}  # fmt: skip


def test_a_problem_found_in_both_says_whether_it_got_better_or_worse(samples, monkeypatch, capsys):
    """A matched group whose impact moved 14x is not "unchanged" (issue 31: compare called a
    5.1 ms -> 352 us change so): better or worse past 1.5x and 10 us, else about the same."""
    (b, _), _ = samples
    groups = [f"comm_compute_slowdown|rank 0|device 0|{k}|grid [1, 1, 1]|block [1, 1, 1]|nccl" for k in "abcd"]
    before = {**b, "groups": None, "findings": [_finding(g, ns) for g, ns in zip(groups, (5_100_000, 100_000, 100_000, 5_000), strict=True)]}  # fmt: skip
    after = {**b, "groups": None, "findings": [_finding(g, ns) for g, ns in zip(groups, (352_000, 160_000, 140_000, 14_000), strict=True)]}  # fmt: skip
    f = diff_documents(before, after)["findings"]
    assert {u["group"].split("|")[3]: u["change"] for u in f["unchanged"]} == {
        "a": "better",  # 14.5x less
        "b": "worse",  # 1.6x, 60 us more
        "c": "same",  # 1.4x: within what two runs of one job differ by
        "d": "same",  # 2.8x but 9 us: below any finding's weight
    }
    assert (impact_change(150_000, 100_000), impact_change(100_000, 150_000)) == ("better", "worse")


def test_groups_match_by_key_then_by_evidence_not_by_kind_and_rank(samples):
    (b, _), _ = samples
    kernel = "comm_compute_slowdown|rank 0|device 0|gemm|grid [1, 1, 1]|block [1, 1, 1]|nccl"
    before = {**b, "groups": None, "findings": [
        _finding(kernel, 100), _finding(kernel, 50),                                   # one group, two occurrences
        _finding("nccl_ordering_stall|rank 2|stream 13|late rank 3", 70),            # stream renumbered after
        _finding("comm_compute_slowdown|rank 0|device 0|other|grid [2, 1, 1]|block [1, 1, 1]|nccl", 30),
    ]}  # fmt: skip
    after = {**b, "groups": None, "findings": [
        _finding(kernel, 40),
        _finding("nccl_ordering_stall|rank 2|stream 14|late rank 3", 90),
        _finding("comm_compute_slowdown|rank 0|device 0|third|grid [2, 1, 1]|block [1, 1, 1]|nccl", 20),
    ]}  # fmt: skip
    f = diff_documents(before, after)["findings"]
    unchanged = {u["group"]: u for u in f["unchanged"]}
    assert unchanged[kernel]["matched_by"] == "group" and unchanged[kernel]["impact"]["before"] == 150
    assert unchanged[kernel]["impact"]["after"] == 40 and unchanged[kernel]["before"]["count"] == 2
    assert unchanged["nccl_ordering_stall|rank 2|stream 14|late rank 3"]["matched_by"] == "evidence"
    # same kind, rank and device, different kernel: a fixed one and a new one, not "unchanged"
    assert [g["group"].split("|")[3] for g in f["fixed"]] == ["other"] and [
        g["group"].split("|")[3] for g in f["new"]
    ] == ["third"]
    verdict = gate(diff_documents(before, after), before, after, threshold=None, fail_on="new-findings")
    assert verdict["failed"]
    assert not gate(diff_documents(before, after), before, after, threshold=None, fail_on="critical")["failed"]


def test_confidence_separates_a_shift_from_noise():
    rng = np.random.default_rng(7)
    base = rng.normal(10.0, 0.2, 30)
    assert confidence_greater(base.tolist(), (base * 1.1).tolist()) > 0.999
    assert 0.2 < confidence_greater(base.tolist(), rng.permutation(base).tolist()) < 0.8
    assert confidence_greater([1.0], [2.0]) is None


def test_a_change_within_step_noise_does_not_fail_the_gate(samples):
    (b, _), _ = samples

    def noisy(steps: list[float]) -> dict:
        return {
            **b,
            "profile": {
                **b["profile"],
                "steps": {
                    "source": "nvtx",
                    "detail": None,
                    "per_rank": {
                        "0": {"step_ns": steps, "busy_pct": [50.0] * len(steps), "nccl_ns": [0.0] * len(steps)}
                    },
                },
            },
        }

    before, after = noisy([10.0, 14.0, 9.0, 15.0, 12.0]), noisy([11.0, 15.0, 10.0, 16.0, 13.0])
    doc = diff_documents(before, after)
    verdict = gate(doc, before, after, threshold=5, metric="step")
    assert verdict["regression"]["worse_pct"] > 5 and verdict["regression"]["confidence_worse"] < 0.95
    assert not verdict["failed"]


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`nsysan ARGS` in this process (exit code, stdout, stderr): the subprocess start-up is the slow part."""
    from nsysan.cli import main

    monkeypatch.setattr(sys, "argv", ["nsysan", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return exit_.value.code or 0, out, err


def test_gate_exit_codes(real, tmp_path, monkeypatch, capsys):
    before, after, _, _ = real
    failed = nsysan("diff", before, after, "--fail-on-regression", "5%", "--format", "json")
    assert failed.returncode == 3 and "step worse by 13." in failed.stderr
    assert json.loads(failed.stdout)["gate"]["failed"] is True
    other = nsysan("diff", before, STALL)
    assert (
        other.returncode == 2
        and other.stderr.count("\n") == 1
        and "world size differs: 2 ranks before, 4 after" in other.stderr
    )
    # saved JSON reports are baselines: the same figures as diffing the traces themselves
    saved = {}
    for name, path in (("before", before), ("after", after)):
        saved[name] = str(tmp_path / f"{name}.json")
        assert cli(monkeypatch, capsys, "report", path, "--format", "json", "-o", saved[name])[0] == 0
    code, out, _ = cli(
        monkeypatch, capsys, "diff", saved["before"], after, "--format", "json", "--fail-on-regression", "5%"
    )
    fresh = json.loads(failed.stdout)
    assert code == 3 and {k: v for k, v in json.loads(out).items() if k not in ("before", "after")} == \
        {k: v for k, v in fresh.items() if k not in ("before", "after")}  # fmt: skip
    b, a = saved["before"], saved["after"]
    assert cli(monkeypatch, capsys, "diff", b, a, "--fail-on-regression", "20%")[0] == 0
    assert cli(monkeypatch, capsys, "diff", a, b, "--fail-on-regression", "5%")[0] == 0  # faster: no regression
    assert cli(monkeypatch, capsys, "diff", b, a, "--metric", "busy", "--fail-on-regression", "5")[0] == 3
    assert (
        cli(monkeypatch, capsys, "diff", b, a, "--metric", "kernel:flash_fwd_kernel", "--fail-on-regression", "5")[0]
        == 0
    )
    assert cli(monkeypatch, capsys, "diff", b, a, "--metric", "bogus")[0] == 2
    assert cli(monkeypatch, capsys, "diff", b, a, "--fail-on-regression", "five")[0] == 2
    assert cli(monkeypatch, capsys, "diff", b, a, "-o", a)[0] == 2 and json.loads(Path(a).read_text())["profile"]
    assert cli(monkeypatch, capsys, "diff", b, STALL, "--force")[0] == 0
    assert cli(monkeypatch, capsys, "diff", FIXED, STALL, "--fail-on", "new-findings")[0] == 3
    # the stall that comes back recovers nothing of the job's wall time (rank 2 still waits for late
    # rank 3 at the op ahead of it): info, so only new-findings (above) fails on it
    assert cli(monkeypatch, capsys, "diff", FIXED, STALL, "--fail-on", "warning")[0] == 0
    assert cli(monkeypatch, capsys, "diff", FIXED, STALL, "--fail-on", "critical")[0] == 0
    # the real pair's GPUs idle for their hosts' launches from warning before to critical after: a worsened group
    code, _, err = cli(monkeypatch, capsys, "diff", b, a, "--fail-on", "critical")
    assert code == 3 and "1 new or worsened finding group(s) at --fail-on critical" in err
    # the fix leaves rank 2's receive queued behind its send (the shared stream, info, recovering
    # nothing): new-findings fails on it, a severity gate does not
    code, _, err = cli(
        monkeypatch, capsys, "diff", STALL, FIXED, "--fail-on", "new-findings", "--fail-on-regression", "1%"
    )
    assert code == 3 and "new" in err
    assert cli(monkeypatch, capsys, "diff", STALL, FIXED, "--fail-on", "warning", "--fail-on-regression", "1%")[0] == 0
    # one step a rank: no spread to judge noise by, so the threshold alone decides, and says so
    code, _, err = cli(monkeypatch, capsys, "diff", FIXED, STALL, "--fail-on-regression", "5%")
    assert code == 3 and "no per-step samples to judge noise" in err
    old_report = tmp_path / "old.json"
    old_report.write_text(json.dumps({k: v for k, v in json.loads(Path(b).read_text()).items() if k != "profile"}))
    code, _, err = cli(monkeypatch, capsys, "diff", str(old_report), a)
    assert code == 2 and "without the diff profile" in err


def test_a_capture_against_itself_changes_nothing():
    side = load_side(str(sample_paths("allreduce-4rank-2022.4")[0].parent))
    doc = diff_documents(side, side)
    assert doc["comparable"] == {"ok": True, "reasons": [], "notes": []}
    assert (
        all(r["median"]["delta"] == 0 for r in doc["steps"]["per_rank"]) and doc["steps"]["slowest"]["confidence"] < 0.6
    )
    assert doc["kernels"]["regressions"] == doc["kernels"]["improvements"] == doc["kernels"]["appeared"] == []
    assert all(r["busy_ns"]["delta"] == 0 for r in doc["ranks"])


@pytest.mark.parametrize("fmt", ["markdown", "html", "terminal"])
def test_formats(fmt, samples, monkeypatch, capsys):
    _, doc = samples
    f = doc["findings"]
    marker = {"markdown": "## Kernel improvements (by total time)",
              "html": f"<h2>Findings: {len(f['fixed'])} fixed, {len(f['new'])} new, {len(f['unchanged'])} in both (",
              "terminal": f"step {change(doc['steps']['slowest'])}"}[fmt]  # fmt: skip
    code, out, _ = cli(monkeypatch, capsys, "diff", STALL, FIXED, "--format", fmt)
    assert code == 0 and marker in out


def _run_dir(tmp_path: Path, name: str, status: str, env: dict[str, str], sample: str | None = STALL) -> Path:
    d = tmp_path / name
    d.mkdir()
    outputs = {}
    if sample:
        shutil.copy(sample, d / "report.sqlite")
        outputs["sqlite"] = str(d / "report.sqlite")
    manifest = {"nsysan_version": "0", "command": ["torchrun", "--nproc_per_node=4", "train.py"], "nsys": "nsys",
                "nsys_version": "2024.1", "nsys_argv": ["nsys", "profile", "--trace=cuda,nvtx", "--output=x", "torchrun",
                "--nproc_per_node=4", "train.py"], "hostname": "h", "environment": env, "started_utc": "", "status": status,
                "exit_code": 0 if status == "ok" else 130, "outputs": outputs, "workload": {}}  # fmt: skip
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def test_report_reads_the_manifest_of_a_run_directory(tmp_path):
    interrupted = _run_dir(tmp_path, "run1", "interrupted", {})
    result = nsysan("report", str(interrupted), "--format", "json")
    assert result.returncode == 0 and "interrupted" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["capture"]["status"] == "interrupted" and doc["capture"]["command"][0] == "torchrun"
    assert doc["summary"]["limitations"][0].startswith("The capture interrupted (exit code 130)")
    assert nsysan("report", str(interrupted), "--fail-on", "critical").returncode == 3  # a partial run never passes
    failed = _run_dir(tmp_path, "run2", "nsys failed", {}, sample=None)
    result = nsysan("report", str(failed))
    assert result.returncode == 2 and "the capture nsys failed" in result.stderr
    ok = _run_dir(tmp_path, "run3", "ok", {})
    assert nsysan("report", str(ok), "--fail-on", "critical").returncode == 3  # the stall itself is critical
    assert "capture" in json.loads(nsysan("report", str(ok), "-f", "json").stdout)


def test_diff_shows_how_two_runs_were_captured(tmp_path):
    a = _run_dir(tmp_path, "a", "ok", {"NCCL_ALGO": "Ring", "CUDA_LAUNCH_BLOCKING": "0", "HOME": "/x"})
    b = _run_dir(tmp_path, "b", "ok", {"NCCL_ALGO": "Tree", "CUDA_LAUNCH_BLOCKING": "0"}, sample=FIXED)
    doc = json.loads(nsysan("diff", str(a), str(b), "--format", "json").stdout)
    assert doc["capture"]["environment"] == [{"name": "NCCL_ALGO", "before": "Ring", "after": "Tree"}]
    assert doc["capture"]["command"] == [] and doc["capture"]["nsys_options"] == []


def test_dashboard_compare_uses_the_same_function(tmp_path, samples):
    from dashboards.analysis import analyse_stored_trace
    from dashboards.comparison import compare_traces
    from dashboards.pages import compare as page

    _, doc = samples
    store = ReviewStore(tmp_path / "review.sqlite")
    ids = []
    for name, path in (("pipeline-stall", STALL), ("pipeline-stall-fixed", FIXED)):
        ids.append(store.register([path], name=name))
        analyse_stored_trace(store, ids[-1])
    c = compare_traces(store, *ids)
    assert c.diff["steps"] == doc["steps"] and c.diff["kernels"] == doc["kernels"] and c.diff["ranks"] == doc["ranks"]
    assert c.diff["breakdown"] == doc["breakdown"] and c.diff["breakdown"]["available"]  # from the stored steps
    assert [f["group"] for f in c.fixed] == [g["group"] for g in doc["findings"]["fixed"]]
    assert [f["group"] for f in c.new] == [g["group"] for g in doc["findings"]["new"]] == [
        "shared_nccl_stream|rank 2|stream 13"]  # fmt: skip
    text = str(page._result(type("S", (), {"store": store})(), *ids))
    assert (
        change(doc["steps"]["slowest"]) in text
        and "waited 4996 us" in text
        and "Kernel improvements (by total time)" in text
    )
