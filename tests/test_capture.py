"""nsysan capture: the exact nsys command line, and real captures with Debian's nsys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsysan.capture import capture, nsys_argv
from nsysan.errors import InputError
from nsysan.ingest import load_trace
from nsysan.workloads.preflight import WorkloadCannotRun, check_workload
from tests.conftest import need


def test_default_nsys_argv():
    assert nsys_argv("nsys", "/runs/a/report", ["torchrun", "train.py"]) == [
        "nsys", "profile", "--trace=cuda,nvtx,osrt", "--cuda-graph-trace=node", "--sample=none", "--cpuctxsw=none",
        "--export=sqlite", "--force-overwrite=true", "--output=/runs/a/report", "torchrun", "train.py",
    ]  # fmt: skip


def test_user_options_override_defaults_and_extras_are_kept():
    argv = nsys_argv("nsys", "out", ["python", "x.py"], ["--trace=nvtx,osrt", "--stats=true", "--delay=5"])
    assert argv == ["nsys", "profile", "--trace=nvtx,osrt", "--cuda-graph-trace=node", "--sample=none",
                    "--cpuctxsw=none", "--export=sqlite", "--force-overwrite=true", "--stats=true", "--delay=5",
                    "--output=out", "python", "x.py"]  # fmt: skip


def test_output_cannot_be_overridden():
    with pytest.raises(ValueError):
        nsys_argv("nsys", "out", ["python"], ["--output=elsewhere"])


def nsysan(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, timeout=300, **kw)


def test_missing_nsys_is_one_line(tmp_path):
    r = nsysan(
        "capture", "-d", str(tmp_path / "runs"), "--", "true", env={**os.environ, "NSYS": str(tmp_path / "no-nsys")}
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "install" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists(), "nothing is created when nsys is missing"


def test_short_nsys_options_replace_the_defaults():
    argv = nsys_argv("nsys", "out", ["python"], ["-t=nvtx", "-s=cpu"])
    assert "--trace=nvtx" in argv and "--sample=cpu" in argv and not any(a.startswith("-t") for a in argv)


@pytest.mark.parametrize(
    ("env", "marked"), [({"RANK": "3", "LOCAL_RANK": "1"}, True), ({"RANK": "3"}, False), ({}, False)]
)
def test_the_hook_marks_torchrun_workers_only(env, marked):
    from nsysan.capture.run import HOOK_DIR

    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "NSYSAN_RANK_MARKED")}
    r = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('NSYSAN_RANK_MARKED', ''))"],
                       env={**clean, **env, "PYTHONPATH": str(HOOK_DIR)}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bool(r.stdout.strip()) is marked


def test_unknown_workload(tmp_path):
    r = nsysan("capture", "-d", str(tmp_path), "--workload", "nope")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert (
        r.stderr.startswith("nsysan: error: Invalid value for '--workload'")
        and "'nope' is not one of 'pg-scaling'" in r.stderr
    )
    assert not any(tmp_path.iterdir())  # refused before a run directory exists


def test_usage_errors_are_one_line_and_help_lists_choices_without_bool():
    """Click's usage errors (unknown option, a value outside the choices, a missing argument) come
    as nsysan's one line, exit 2; --help shows each option's choices and no ``<bool>`` for flags."""
    for args, says in ((["report", "--bogus", "x.sqlite"], "No such option: --bogus"),
                       (["report", "--format", "yaml", "x.sqlite"], "'yaml' is not one of 'terminal'"),
                       (["report"], "Missing argument 'TRACE...'"),
                       (["capture", "--transport", "mpi", "--workload", "pipeline"], "'mpi' is not one of 'gloo', 'nccl', 'p2p'")):  # fmt: skip
        r = nsysan(*args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("nsysan: error: ") and says in line and "--help` lists the options" in line
    for command in ("report", "capture", "diff"):
        help_text = nsysan(command, "--help", env={**os.environ, "COLUMNS": "200"}).stdout
        assert "<bool>" not in help_text and "\x1b[" not in help_text
    assert "<gloo|nccl|p2p>" in nsysan("capture", "--help", env={**os.environ, "COLUMNS": "200"}).stdout
    bare = nsysan()  # no command: the help, and exit 2 as click gives it (a usage error)
    assert bare.returncode == 2 and "Usage:" in bare.stderr and "report" in bare.stderr


def _only_run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]  # not `latest`
    return run


@pytest.mark.nsys
def test_capture_pg_scaling_attributes_every_rank(nsys_bin, tmp_path):
    need(__import__("importlib").util.find_spec("torch") is not None, "torch")
    r = nsysan(
        "capture",
        "-d",
        str(tmp_path),
        "--workload",
        "pg-scaling",
        "--nproc",
        "4",
        env={**os.environ, "NSYS": str(nsys_bin)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    run = _only_run(tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["exit_code"] == 0
    assert manifest["nsys_version"].startswith("2022.4") and "--cuda-graph-trace=node" in manifest["nsys_argv"]
    assert manifest["workload"] == {"name": "pg-scaling", "nproc": 4, "transport": "gloo"}
    assert set(manifest["outputs"]) == {"nsys-rep", "sqlite"}
    with load_trace([run / "report.sqlite"]) as trace:
        ranks = trace.ranks
        nvtx = trace.nvtx
    assert sorted(ranks["rank"]) == [0, 1, 2, 3] and set(ranks["rank_source"]) == {"nvtx"}
    assert ranks["world_size"].tolist() == [4] * 4
    ranges = nvtx[(nvtx["domain"] == "nsysan") & (nvtx["event_type"] == "push_pop")]
    # 6 pair groups x 3 steps, each on both of its ranks
    assert ranges["text"].astype(str).str.startswith("all_reduce pg").sum() == 6 * 3 * 2


@pytest.mark.nsys
def test_failing_workload_keeps_its_report_and_exit_code(nsys_bin, tmp_path):
    r = nsysan("capture", "-d", str(tmp_path), "--", sys.executable, "-c", "import sys; sys.exit(3)",
               env={**os.environ, "NSYS": str(nsys_bin)})  # fmt: skip
    assert r.returncode == 3
    manifest = json.loads((_only_run(tmp_path) / "manifest.json").read_text())
    assert manifest["status"] == "workload failed" and manifest["exit_code"] == 3
    assert Path(manifest["outputs"]["nsys-rep"]).exists()
    # it recorded nothing nsysan can report: no next step that would fail and point back at capture
    assert "nsysan: next:" not in r.stderr
    assert "the job failed (exit code 3" in r.stderr and "recorded nothing to report" in r.stderr
    # nsys's progress bars as a terminal ends them: no carriage returns, no lines of several KB in a log
    assert "\r" not in r.stdout + r.stderr and max(map(len, (r.stdout + r.stderr).splitlines())) < 300
    assert "100%] report.nsys-rep" in r.stdout, r.stdout


def test_progress_bars_reach_a_log_as_their_last_state():
    import io

    from nsysan.capture.progress import forward, shown

    assert shown(b"\r[1/2] [0%   ] a\r[1/2] [==50%] a\r[1/2] [=100%] a") == b"[1/2] [=100%] a"
    assert shown(b"plain") == b"plain" and shown(b"done\r") == b"done"
    source = io.BytesIO(b"hi\n" + b"".join(b"\r[1/1] [%3d%%] r" % i for i in range(101)) + b"\nGenerated:\n")
    sink = io.BytesIO()
    forward(source, sink)
    assert sink.getvalue() == b"hi\n[1/1] [100%] r\nGenerated:\n"

    class Chunks(io.RawIOBase):  # a pipe's reads, cut where the test says
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        def read(self, n: int = -1) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

    for chunks, shown_as in (
        ([b"epoch 1: 50%\r", b"epoch 1: 100%\r", b"\n", b"done\n"], b"epoch 1: 100%\ndone\n"),  # a bar ending in \r
        ([b"line one\r", b"\nline two\r\n"], b"line one\nline two\n"),  # CRLF cut between reads
        ([b"\r[1] 1%", b"\r[1] 50", b"%\r[1] 100%", b"\nGen\n"], b"[1] 100%\nGen\n"),
    ):
        sink = io.BytesIO()
        forward(Chunks(chunks), sink)
        assert sink.getvalue() == shown_as, chunks

    class ClosedPipe(io.BytesIO):  # `nsysan capture ... | head -1`
        def write(self, b: bytes) -> int:  # type: ignore[override]
            raise BrokenPipeError

    source = Chunks([b"line\n"] * 1000)
    forward(source, ClosedPipe())
    assert source.chunks == []  # still read to the end: nsys and the job never block on a full pipe
    text = io.StringIO()  # a sink with no bytes buffer (Jupyter's stdout)
    forward(Chunks([b"x\ny\n"]), text)
    assert text.getvalue() == "x\ny\n"


@pytest.mark.nsys
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupting_still_leaves_a_finished_report(nsys_bin, tmp_path, how):
    started = tmp_path / "started"
    script = (f"import pathlib, time, nvtx\nwith nvtx.annotate('waiting', domain='nsysan'):\n"
              f"    pathlib.Path({str(started)!r}).touch()\n    time.sleep(120)\n")  # fmt: skip
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "nsysan", "capture", "-d", str(runs), "--", sys.executable, "-c", script],
                            env={**os.environ, "NSYS": str(nsys_bin)}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:  # the workload runs under nsys
        time.sleep(0.2)
    assert started.exists(), "the workload never started"
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    else:
        proc.send_signal(signal.SIGTERM)  # a scheduler stopping nsysan alone
    _out, err = proc.communicate(timeout=180)
    tmp_path = runs
    assert proc.returncode == 130, err[-2000:]
    manifest = json.loads((_only_run(tmp_path) / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert Path(manifest["outputs"]["sqlite"]).exists()


@pytest.mark.nsys
def test_capture_pipeline_through_the_p2p_transport_shows_its_transfers(nsys_bin, tmp_path):
    need(__import__("importlib").util.find_spec("torch") is not None, "torch")
    r = nsysan("capture", "-d", str(tmp_path), "--workload", "pipeline", "--nproc", "4", "--transport", "p2p",
               env={**os.environ, "NSYS": str(nsys_bin)})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    run = _only_run(tmp_path)
    assert (run / "report.nsys-rep").exists() and (run / "manifest.json").exists()
    rep = nsysan("report", str(run / "report.sqlite"), "-f", "json")
    assert rep.returncode == 0, rep.stderr
    summary = json.loads(rep.stdout)["summary"]
    # every worker attributed to its rank, once (helper processes inherit RANK but are not marked)
    assert sorted((r["rank"], r["rank_source"]) for r in summary["ranks"]) == [(i, "nvtx") for i in range(4)]
    transfers = {t["transfer"]: t for t in summary["transfers"]}
    # 3 steps x 4 micro-batches: activations 0->1->2->3 and gradients back, one range per message
    for a, b in ((0, 1), (1, 2), (2, 3)):
        assert sum(t["count"] for name, t in transfers.items() if name.startswith(f"p2p recv {b}<-{a} ")) == 12
        assert sum(t["count"] for name, t in transfers.items() if name.startswith(f"p2p recv {a}<-{b} ")) == 12
    assert all(t["bytes"] == t["count"] * 64 * 256 * 4 for t in transfers.values())


def test_newer_options_only_where_nsys_has_them():
    old = nsys_argv("nsys", "out", ["python"], supported="")
    new = nsys_argv("nsys", "out", ["python"], supported="  --cuda-event-trace=<true|false>  Track CUDA events")
    assert "--cuda-event-trace=true" not in old and "--cuda-event-trace=true" in new
    # a user's own value wins
    assert "--cuda-event-trace=false" in nsys_argv("nsys", "out", ["python"], ["--cuda-event-trace=false"],
                                                   supported="--cuda-event-trace")  # fmt: skip


def _probes(*, missing: tuple[str, ...] = (), gpus: int = 0) -> dict:
    return {"installed": lambda module: module not in missing, "gpus": lambda: gpus}


@pytest.mark.parametrize(("name", "nproc", "transport", "probes", "says"), [
    ("pipeline", 4, "p2p", _probes(missing=("torch",)), 'needs PyTorch, which'),
    ("pipeline", 4, "gloo", _probes(missing=("nvtx",)), 'needs the nvtx package'),
    ("pipeline", 4, "nccl", _probes(), "--transport nccl needs CUDA GPUs"),
    ("pipeline", 4, "nccl", _probes(gpus=2), "needs one GPU per rank: --nproc 4, but PyTorch sees 2"),
    ("redistribute", 2, "p2p", _probes(), "runs on exactly 4 ranks: use --nproc 4"),
    ("pipeline", 1, "gloo", _probes(), "needs at least 2 ranks"),
    ("graph-allreduce", 2, "nccl", _probes(), "workload graph-allreduce needs CUDA GPUs"),
    ("pg-scaling", 2, "p2p", _probes(), "runs with --transport gloo or nccl"),
])  # fmt: skip
def test_a_workload_that_cannot_run_here_is_refused(name, nproc, transport, probes, says):
    with pytest.raises(WorkloadCannotRun) as refused:
        check_workload(name, nproc, transport, **probes)
    assert says in str(refused.value)


def test_every_missing_requirement_is_named_at_once():
    """graph-allreduce on the default transport, without torch and nvtx, on one rank fewer than it
    needs: each reason in the one line, not one per attempt."""
    with pytest.raises(WorkloadCannotRun) as refused:
        check_workload("graph-allreduce", 2, "gloo", **_probes(missing=("torch", "nvtx")))
    told = str(refused.value)
    assert "\n" not in told and told.count("; ") == 3
    for says in ("runs with --transport nccl", "needs PyTorch", "needs the nvtx package",
                 "workload graph-allreduce needs CUDA GPUs, one per rank (counted once PyTorch imports)"):  # fmt: skip
        assert says in told, says


def test_a_workload_that_can_run_passes():
    check_workload("redistribute", 4, "p2p", **_probes())
    check_workload("graph-allreduce", 2, "nccl", **_probes(gpus=2))


@pytest.mark.parametrize("hidden", ["torch", "nvtx"])
def test_a_workload_without_its_packages_never_starts_nsys(tmp_path, hidden):
    code = (f"import sys; sys.modules[{hidden!r}] = None; sys.argv = ['nsysan', 'capture', '-d', {str(tmp_path / 'runs')!r}, "
            "'--workload', 'pipeline', '--nproc', '2']; from nsysan.cli import main; main()")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NSYS": str(tmp_path / "no-nsys")})  # nsys is never looked for  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert 'pip install "nsysan[workloads]"' in r.stderr and not (tmp_path / "runs").exists()


def test_an_output_override_is_refused_before_a_run_directory_exists(tmp_path):
    r = nsysan("capture", "-d", str(tmp_path / "runs"), "--nsys=--output=foo", "--", "true")
    assert r.returncode == 2 and "the output is set by nsysan capture" in r.stderr
    assert not (tmp_path / "runs").exists()
    run = tmp_path / "run"  # the library call refuses it before creating its directory too
    with pytest.raises(InputError, match="--nsys: the output is set"):
        capture(["true"], run, nsys_options=["-o=foo"], nsys=(Path("/nonexistent/nsys"), "2022.4"))
    assert not run.exists()


def test_each_run_directory_becomes_latest(tmp_path):
    """ROOT/latest names the newest run (relative, so the runs can move); two runs in one second get
    two directories."""
    from nsysan.capture.run import run_directory

    first = run_directory(tmp_path / "runs", "pipeline")
    second = run_directory(tmp_path / "runs", "pipeline")
    assert first != second
    latest = tmp_path / "runs" / "latest"
    assert os.readlink(latest) == second.name and latest.resolve() == second.resolve()
    moved = tmp_path / "moved"
    (tmp_path / "runs").rename(moved)
    assert (moved / "latest").resolve() == (moved / second.name).resolve()
    assert sorted(p.name for p in moved.iterdir() if not p.name.startswith(".")) == sorted(
        [first.name, second.name, "latest"]
    )
