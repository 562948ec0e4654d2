"""A real Nsight Systems captures a real 4-process gloo torchrun job; nsysan reads what it wrote.

Runs for real in CI (.ci/run installs Debian's nsight-systems, torch and nvtx 0.2.10); skips on
a developer machine without them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsysan.analysis import analyse
from nsysan.ingest import load_trace
from tests.conftest import need

JOB = Path(__file__).parent / "jobs" / "gloo_nvtx_job.py"
WORLD = 4

pytestmark = pytest.mark.nsys


@pytest.fixture(scope="module")
def capture(nsys_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    need(importlib.util.find_spec("torch") is not None, "torch (pip install torch==2.13.0)")
    need(importlib.util.find_spec("nvtx") is not None, "nvtx 0.2.10")
    out = tmp_path_factory.mktemp("capture")
    cmd = [
        str(nsys_bin), "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none",
        "--export=sqlite", "--force-overwrite=true", "-o", str(out / "job"),
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
        str(JOB), str(out),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])
    assert len(records) == WORLD, "every rank of the job finished"
    assert (out / "job.nsys-rep").exists() and (out / "job.sqlite").exists()
    return out / "job.sqlite", records


def test_ranks_are_the_processes_that_ran_them(capture):
    export, records = capture
    with load_trace([export]) as trace:
        ranks = trace.ranks
        processes = trace.processes
        assert trace.exports[0].nsys_version.startswith("2022.4")
    assert {(r.pid, r.rank) for r in ranks.itertuples()} == {(r["pid"], r["rank"]) for r in records}
    assert set(ranks["rank_source"]) == {"nvtx"}
    assert ranks["world_size"].tolist() == [WORLD] * WORLD
    assert ranks["local_rank"].tolist() == list(range(WORLD))
    # the workers and their launcher are in the process table
    assert {r["pid"] for r in records} <= set(processes["pid"])
    assert any("torch" in n or "python" in n for n in processes["name"])


def test_nvtx_ranges_are_what_each_rank_did(capture):
    export, records = capture
    with load_trace([export]) as trace:
        nvtx = trace.nvtx
    ranges = nvtx[nvtx["event_type"] == "push_pop"]
    for record in records:
        mine = ranges[ranges["pid"] == record["pid"]]
        assert sorted(mine["text"].astype(str)) == record["ranges"]
        assert set(mine["domain"]) == {"train"}
        assert (mine["end_ns"] > mine["start_ns"]).all()
        steps = mine[mine["text"].astype(str).str.startswith("step")].sort_values("start_ns")
        inner = mine[mine["text"] == "all_reduce"].sort_values("start_ns")
        # each all_reduce range lies inside its step range
        assert (inner["start_ns"].to_numpy() >= steps["start_ns"].to_numpy()).all()
        assert (inner["end_ns"].to_numpy() <= steps["end_ns"].to_numpy()).all()


def test_report_on_a_cpu_capture_says_what_it_cannot_show(capture):
    export, records = capture
    result = subprocess.run([sys.executable, "-m", "nsysan", "report", str(export), "-f", "json"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["traces"][0]["ranks"] == list(range(WORLD))
    assert doc["traces"][0]["devices"] == []
    assert doc["summary"]["exports"][0]["nvtx_ranges"] == sum(len(r["ranges"]) for r in records)
    assert any(n.startswith("No CUDA data") for n in doc["summary"]["limitations"])
    with load_trace([export]) as trace:
        assert analyse(trace)["findings"] == []


def test_a_raw_report_is_exported_once_with_nothing_written_beside_it(capture, tmp_path):
    """`nsysan report job.nsys-rep` reads what `nsys export --type sqlite` makes of it: the same
    report as the .sqlite nsys wrote at capture, from a read-only directory, exported once into
    the cache (a second report exports nothing), a directory of reports read too."""
    import os
    import shutil
    import time

    export, _ = capture
    alone = tmp_path / "reports"
    alone.mkdir()
    shutil.copy(export.with_suffix(".nsys-rep"), alone / "job.nsys-rep")
    alone.chmod(0o555)
    cache = tmp_path / "cache"

    def report(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nsysan", "report", "-f", "json", "--cache", str(cache), *args],
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    try:
        first = report(str(alone / "job.nsys-rep"))
        assert first.returncode == 0 and first.stderr == "", first.stderr
        exported = sorted((cache / "exports").glob("*/job.sqlite"))
        assert len(exported) == 1 and sorted(os.listdir(alone)) == ["job.nsys-rep"]
        made = exported[0].stat().st_mtime_ns
        time.sleep(0.01)
        again = report(str(alone))  # the directory: its one report
        assert again.returncode == 0 and exported[0].stat().st_mtime_ns == made
        direct = report(str(export))
        same = lambda out, path: out.replace(json.dumps(str(path))[1:-1], "EXPORT")  # noqa: E731
        assert same(first.stdout, exported[0]) == same(again.stdout, exported[0]) == same(direct.stdout, export)
    finally:
        alone.chmod(0o755)


def test_nsys_arrow_export_reports_as_its_sqlite_export(capture, nsys_bin, tmp_path):
    """`nsys export --type arrow` (2022.4): one .arrows file, an Arrow stream per table named in
    its metadata, text as binary; nsysan copies it into SQLite and reports exactly what the
    .sqlite nsys wrote at capture gives."""
    import re

    import pyarrow as pa
    import pyarrow.ipc as ipc

    export, _ = capture
    out = tmp_path / "job.arrows"
    done = subprocess.run([str(nsys_bin), "export", "--type", "arrow", "--quiet", "true", "--output", str(out),
                           str(export.with_suffix(".nsys-rep"))], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and out.is_file(), done.stderr
    # the layout nsysan's reader relies on (nsysan/ingest/arrow_exports.py)
    source, names = pa.OSFile(str(out), "rb"), {}
    while source.tell() < out.stat().st_size:
        stream = ipc.open_stream(source)
        names[stream.schema.metadata[b"table_name"].decode()] = stream.schema
        stream.read_all()
    assert {"StringIds", "NVTX_EVENTS", "ThreadNames"} <= set(names)
    assert names["StringIds"].field("value").type == pa.binary()

    def report(path: Path) -> str:
        r = subprocess.run([sys.executable, "-m", "nsysan", "report", "-f", "json", "--no-cache", str(path)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        assert r.returncode == 0 and r.stderr == "", r.stderr
        return re.sub(r'"path": "[^"]*"', '"path": "-"', r.stdout)

    assert report(out) == report(export)
