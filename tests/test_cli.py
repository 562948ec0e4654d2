"""The command line: formats, the findings contract, --output, --fail-on, inputs."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixtures.samples import SAMPLES_DIR, sample_paths
from nsysan import __version__
from nsysan.cli import app, main
from nsysan.detect import registry
from nsysan.findings import Finding, Severity

SAMPLE = str(sample_paths("allreduce-2rank")[0])
REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The console entry point ``nsysan.cli.main`` in this process, as the shell would run it:
    its exit code (it always exits), stdout and stderr. A fresh process costs a Python start and
    a pandas import; only the tests that are about the process itself pay that."""
    monkeypatch.setattr(sys, "argv", ["nsysan", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    code = exited.value.code
    return (0 if code is None else code if isinstance(code, int) else 1), out, err


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"nsysan {__version__}"


def test_help_lists_report():
    result = invoke("--help")
    assert result.exit_code == 0 and "report" in result.output


def test_json_follows_the_findings_contract():
    result = invoke("report", SAMPLE, "--format", "json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert set(doc) == {
        "report_version",
        "nsysan_version",
        "traces",
        "findings",
        "groups",
        "summary",
        "steps",
        "profile",
    }  # profile: for `nsysan diff`
    assert doc["report_version"] == 2
    assert doc["nsysan_version"] == __version__
    assert doc["traces"] == [{"path": SAMPLE, "schema_version": "3.28.1", "ranks": [0, 1], "devices": [0, 1]}]
    assert all(isinstance(f["recoverable_ns"], int) and f["recoverable_ns"] >= 0 for f in doc["findings"])
    assert [g["recoverable_ns"] for g in doc["groups"]] == [
        sum(doc["findings"][i]["recoverable_ns"] for i in g["findings"]) for g in doc["groups"]
    ]
    steps = doc["steps"]
    assert set(steps) == {"version", "source", "detail", "clock", "job", "ranks", "unjudged"}
    assert steps["version"] == 1 and steps["source"] == "nvtx" and sorted(steps["ranks"]) == ["0", "1"]
    for r in steps["ranks"].values():
        lengths = [e - s for s, e in zip(r["start_ns"], r["end_ns"], strict=True)]
        sums = [sum(c) for c in zip(*r["breakdown_ns"].values(), strict=True)]
        assert sums == lengths  # the five categories tile each step
    s = doc["summary"]
    assert s["findings_by_severity"] == {
        k: sum(f["severity"] == k for f in doc["findings"]) for k in ("info", "warning", "critical")
    }
    assert s["exports"][0]["kernels"] == 108 and s["exports"][0]["nccl_kernels"] == 12
    assert s["nccl"] == [{"kind": "collective", "op": "AllReduce", "bytes": 64 * 2**20, "count": 12,
                          "total_ns": s["nccl"][0]["total_ns"], "mean_ns": s["nccl"][0]["mean_ns"]}]  # fmt: skip
    assert [r["rank_source"] for r in s["ranks"]] == ["nvtx", "nvtx"]


@pytest.mark.parametrize(("fmt", "marker"), [("markdown", "## NCCL time by operation and size"),
                                             ("html", "<h2>NCCL time by operation and size</h2>"),
                                             ("terminal", "NCCL time by operation and size")])  # fmt: skip
def test_text_formats_to_file(tmp_path, fmt, marker):
    out = tmp_path / f"report.{fmt}"
    result = invoke("report", SAMPLE, "--format", fmt, "--output", str(out))
    assert result.exit_code == 0 and result.output == ""
    text = out.read_text()
    assert marker in text and "ncclDevKernel_AllReduce_Sum_f32_RING_LL" in text and "64 MiB" in text


def test_directory_and_glob_inputs_are_one_job():
    folder = SAMPLES_DIR / "allreduce-4rank-2022.4"
    by_dir = json.loads(invoke("report", str(folder), "-f", "json").output)
    by_glob = json.loads(invoke("report", str(folder / "rank*.sqlite"), "-f", "json").output)
    assert [t["ranks"] for t in by_dir["traces"]] == [[0], [1], [2], [3]]
    assert by_dir["traces"] == by_glob["traces"]


def _fake(severity: Severity):
    def detector(trace):
        return [Finding(kind="command_buffer_full", severity=severity, title="launch queue full", advice="use CUDA graphs",
                        start_ns=1, end_ns=2, impact_ns=1, rank=0, device=0, pid=4100,
                        evidence={"kernels": ["ampere_sgemm_128x64_tn"]})]  # fmt: skip

    return detector


@pytest.mark.parametrize(
    ("severity", "fail_on", "code"),
    [(Severity.WARNING, "warning", 3), (Severity.WARNING, "critical", 0), (Severity.CRITICAL, "warning", 3),
     (Severity.INFO, "warning", 0)],
)  # fmt: skip
def test_fail_on_gates_on_severity(monkeypatch, severity, fail_on, code):
    spec = registry.DetectorSpec("fake", lambda trace, params: _fake(severity)(trace), dict, "fake")
    monkeypatch.setattr(registry, "_REGISTRY", {"fake": spec})
    result = runner.invoke(app, ["report", SAMPLE, "-f", "json", "--fail-on", fail_on])
    assert result.exit_code == (0 if code == 0 else 1)  # in-process, GateFailed propagates; main() maps it
    if code:
        assert "at " + fail_on in str(result.exception)
    doc = json.loads(result.output)
    assert doc["findings"][0] == {
        "kind": "command_buffer_full", "group": "", "severity": severity.value, "rank": 0, "device": 0, "pid": 4100,
        "start_ns": 1, "end_ns": 2, "impact_ns": 1, "recoverable_ns": 0, "title": "launch queue full",
        "evidence": {"kernels": ["ampere_sgemm_128x64_tn"]}, "advice": "use CUDA graphs",
    }  # fmt: skip


def test_fail_on_exit_code_from_the_real_command(tmp_path):
    plugin = tmp_path / "sitecustomize.py"
    plugin.write_text(
        "from dataclasses import dataclass\n"
        "from nsysan import detect\nfrom nsysan.findings import Finding, Severity\n"
        "@dataclass(frozen=True)\nclass P:\n    pass\n"
        "@detect.register('fake', P)\n"
        "def fake(trace, params):\n"
        "    return [Finding(kind='command_buffer_full', severity=Severity.CRITICAL, title='t', advice='a',"
        " start_ns=0, end_ns=1, impact_ns=1)]\n"
    )
    # this checkout's nsysan, whether or not (or wherever) it is installed; the plugin beside it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    result = subprocess.run([sys.executable, "-m", "nsysan", "report", SAMPLE, "--fail-on", "critical", "-f", "json"],
                            capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stderr
    # the plugin's finding, and the sample's own: both ranks idle 175 us per step waiting for their
    # hosts, one job-wide group (gpu_idle|launch) whose fix recovers 8.4% of the job's wall time,
    # all of it on rank 1, the rank whose steps end last
    assert result.stderr.strip() == "nsysan: error: 3 finding(s) at critical or worse"
    critical = [f for f in json.loads(result.stdout)["findings"] if f["severity"] == "critical"]
    assert sorted((f["kind"], f["group"], f["rank"], f["recoverable_ns"]) for f in critical) == [
        ("command_buffer_full", "", None, 0), ("gpu_idle", "gpu_idle|launch", 0, 0),
        ("gpu_idle", "gpu_idle|launch", 1, 875_000)]  # fmt: skip


def test_python_dash_m_runs_the_console_entry_point(monkeypatch, capsys):
    """``python -m nsysan`` is ``main()``: the real process above runs it that way; here its
    output and exit code for --version."""
    monkeypatch.setattr(sys, "argv", ["nsysan", "--version"])
    monkeypatch.delitem(sys.modules, "nsysan.__main__", raising=False)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("nsysan", run_name="__main__", alter_sys=True)
    assert exited.value.code in (0, None) and capsys.readouterr().out.strip() == f"nsysan {__version__}"


@pytest.mark.parametrize(("suffix", "starts"), [(".json", "{"), (".md", "# nsysan report"), (".html", "<!doctype html>"),
                                                (".txt", "─")])  # fmt: skip
def test_the_output_suffix_chooses_the_format(tmp_path, suffix, starts):
    out = tmp_path / f"report{suffix}"
    result = invoke("report", SAMPLE, "-o", str(out))
    assert result.exit_code == 0 and out.read_text().lstrip().lower().startswith(starts.lower())
    if suffix == ".json":
        assert json.loads(out.read_text())["traces"][0]["path"] == SAMPLE


def test_a_format_contradicting_the_suffix_is_refused(tmp_path, monkeypatch, capsys):
    for command in (["report", SAMPLE], ["diff", SAMPLE, SAMPLE]):
        out = tmp_path / "report.json"
        code, stdout, stderr = run_main(monkeypatch, capsys, *command, "--format", "markdown", "-o", str(out))
        assert code == 2 and stderr.count("\n") == 1 and stdout == "", stderr
        assert "--format markdown contradicts --output" in stderr and not out.exists()
    assert invoke("report", SAMPLE, "--format", "json", "-o", str(tmp_path / "same.json")).exit_code == 0


def test_share_of_run_is_a_number_shown_as_a_sentence():
    stall = str(sample_paths("pipeline-stall")[0])
    doc = json.loads(invoke("report", stall, "--format", "json").output)
    share = doc["findings"][0]["evidence"]["share_of_run"]
    assert isinstance(share, float) and 0 < share < 100 and round(share, 1) == share
    assert f"evidence.share_of_run: {share:.1f}% of the run" in invoke("report", stall, "-v").output
    assert "evidence.share_of_run" not in invoke("report", stall).output  # evidence only with -v
    assert f"**evidence.share_of_run**: {share:.1f}% of the run" in invoke("report", stall, "-f", "markdown").output


def test_share_of_run_formats_numbers_unknowns_and_old_sentences():
    from nsysan.detect.common import share_text
    from nsysan.report.format import share_of_run

    assert share_text(571, 1000) == 57.1 and share_text(5, 0) is None
    assert share_of_run(57.1) == "57.1% of the run" and share_of_run(None) == "run length unknown"
    assert share_of_run("57.1% of the run") == "57.1% of the run"  # a report saved by an earlier nsysan


def test_serve_help_keeps_the_users_table_name():
    result = runner.invoke(app, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0 and "[users] table" in result.output


@pytest.mark.parametrize(("db", "hide", "says"), [
    ("sqlite:////nonexistent/dir/x.sqlite", "", "the directory /nonexistent/dir does not exist"),
    ("postgresql+psycopg://u:secret@127.0.0.1:1/x", "psycopg", 'pip install "nsysan[postgres]"'),
    ("postgresql+psycopg://u:secret@127.0.0.1:1/x", "", "Connection refused"),
])  # fmt: skip
def test_a_store_that_cannot_be_opened_is_a_user_error(monkeypatch, capsys, db, hide, says):
    """`nsysan serve` through the console entry point (its exit codes), optionally as if a module
    were not installed (None in sys.modules: importing it fails)."""
    if hide:
        for name in [m for m in sys.modules if m == hide or m.startswith(hide + ".")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, hide, None)

    def start(*args: object) -> None:  # in this process a server that starts would never return
        raise AssertionError("the store opened and the server started")

    monkeypatch.setattr("dashboards.app.start", start, raising=False)
    code, _, stderr = run_main(monkeypatch, capsys, "serve", "--db", db)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith("nsysan: error: ") and says in stderr
    assert "internal error" not in stderr and "secret" not in stderr


def test_terminal_conventions_no_color_and_columns(monkeypatch):
    """A terminal gets colour unless NO_COLOR (any non-empty value) or --no-color says otherwise; piped
    output is 160 columns unless COLUMNS names another width."""
    from nsysan.cli import terminal_style

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert terminal_style(None) == (None, True)
    assert terminal_style(None, no_color=True) == (None, False)
    assert terminal_style(Path("report.txt")) == (160, False)
    monkeypatch.setenv("NO_COLOR", "1")
    assert terminal_style(None) == (None, False)
    monkeypatch.setenv("COLUMNS", "100")
    assert terminal_style(Path("report.txt")) == (100, False)


def test_piped_report_follows_columns():
    env = {**os.environ, "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "nsysan", "report", SAMPLE, "--no-color"], capture_output=True,
                         text=True, env=env, check=True).stdout  # fmt: skip
    assert max(len(line) for line in out.splitlines()) <= 100 and "\x1b[" not in out


def test_workers_on_a_small_job_run_in_this_process_and_say_why(monkeypatch, capsys, tmp_path):
    """--workers 2 on 1.3 MiB of exports: a cluster would start slower than the job is analysed (3.2x
    slower in issue 32), so it runs here, says so in one line, and reports what --workers 0 does."""
    job = [str(p) for p in sample_paths("allreduce-4rank-2022.4")]
    code, _, err = run_main(monkeypatch, capsys, "report", *job, "--workers", "2", "-o", str(tmp_path / "two.json"))
    assert code == 0 and err.count("\n") == 1, err
    assert err.startswith("nsysan: --workers 2: 4 export(s), 1.3 MiB in all, are analysed sooner in this process")
    code, _, err = run_main(monkeypatch, capsys, "report", *job, "--workers", "0", "-o", str(tmp_path / "zero.json"))
    assert code == 0 and err == ""
    assert (tmp_path / "two.json").read_bytes() == (tmp_path / "zero.json").read_bytes()
