"""Input that is valid but unusual: NULLs where the schema allows them, empty tables, exports that
differ from each other, strings that look like markup, and usage errors."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.exporter import ExportWriter, global_tid
from fixtures.samples import sample_paths
from fixtures.scenarios import JobSpec, write_job
from nsysan.analysis import analyse
from nsysan.ingest import load_trace
from nsysan.report.renderers import render_terminal
from tests.conftest import sha256

SAMPLE = sample_paths("allreduce-2rank")[0]


def nsysan(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize(
    "args", [(), ("report",), ("report", str(SAMPLE), "--format", "xml"), ("report", str(SAMPLE), "--fail-on", "info"), ("bogus",)]
)  # fmt: skip
def test_usage_errors_exit_2_without_traceback(args):
    result = nsysan(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout


def test_console_script_is_installed():
    exe = shutil.which("nsysan")
    assert exe, "pip install -e . puts `nsysan` on PATH"
    result = subprocess.run([exe, "report", str(SAMPLE), "-f", "json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and json.loads(result.stdout)["traces"][0]["ranks"] == [0, 1]


def test_runs_from_any_directory(tmp_path):
    result = nsysan("report", str(SAMPLE.resolve()), "-f", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_output_may_not_overwrite_an_input(tmp_path):
    copy = tmp_path / "t.sqlite"
    shutil.copy(SAMPLE, copy)
    before = sha256(copy)
    result = nsysan("report", str(copy), "-o", str(copy))
    assert result.returncode == 2 and "is one of the input traces" in result.stderr
    assert sha256(copy) == before


def test_nulls_the_schema_allows(tmp_path):
    paths, _ = write_job(JobSpec(ranks=2, seed=5), tmp_path)
    con = sqlite3.connect(paths[0])
    con.execute("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (NULL, NULL, 'ghost')")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = NULL WHERE rowid % 5 = 0")
    con.execute("UPDATE NVTX_EVENTS SET uint64Value = 9223372036854775807, int64Value = NULL WHERE rowid = 3")
    tid = global_tid(4100, 4100) | (3 << 56)  # a non-zero hardware id in the top byte
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (5, 9, 59, NULL, 'orphan')")
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text) VALUES (5, 9, 59, ?, 'big tid')", (tid,)
    )
    con.commit()
    con.close()
    with load_trace(paths) as trace:
        doc = analyse(trace)
        nvtx = trace.nvtx
    assert doc["traces"][0]["ranks"] == [0, 1]
    big = nvtx[nvtx["text"] == "big tid"]
    assert big[["pid", "tid"]].values.tolist() == [[4100, 4100]], "large globalTids decode exactly"
    assert nvtx["payload_int"].max() == 9223372036854775807


def test_empty_tables_of_a_non_lazy_export(tmp_path):
    w = ExportWriter(tmp_path / "full.sqlite", "2022.4")
    w.process(77, "python3")
    w.nvtx_mark(77, 77, 1_000, "nsysan rank=0")
    w.nvtx_range(77, 77, 2_000, 9_000, "step 0")
    w.close(lazy=False)  # every table of the schema exists, kernels and memcpy included, empty
    with load_trace([tmp_path / "full.sqlite"]) as trace:
        doc = analyse(trace)
    assert doc["summary"]["exports"][0]["kernels"] == 0
    assert doc["summary"]["exports"][0]["nvtx_ranges"] == 1
    assert any(n.startswith("No CUDA data in this capture") for n in doc["summary"]["limitations"])


def test_limitations_are_judged_per_export(tmp_path):
    paths, _ = write_job(JobSpec(ranks=2, file_per_rank=True, seed=6), tmp_path)
    con = sqlite3.connect(paths[1])
    con.execute("DELETE FROM NVTX_EVENTS WHERE eventType != 34")  # rank 1 kept only its rank mark
    con.commit()
    con.close()
    with load_trace(paths) as trace:
        summary = analyse(trace)["summary"]
    assert any(n.startswith("NCCL kernels without NCCL NVTX ranges in 1 of 2 exports") for n in summary["limitations"])
    assert sorted((str(row["bytes"]), row["count"]) for row in summary["nccl"]) == [
        (str(64 * 2**20), 4),
        ("unknown", 4),
    ]


def test_two_jobs_claiming_the_same_rank_are_refused_or_flagged(tmp_path):
    from nsysan.ingest.ranks import RepeatedRanks

    a, _ = write_job(JobSpec(ranks=1, seed=1), tmp_path / "a")
    b, _ = write_job(JobSpec(ranks=1, seed=2), tmp_path / "b")
    with load_trace(a + b) as trace, pytest.raises(RepeatedRanks, match="rank 0 by "):
        analyse(trace)
    with load_trace(a + b, allow_mixed=True) as trace:
        doc = analyse(trace)
    assert sorted(r["rank"] for r in doc["summary"]["ranks"]) == [0, 1]
    assert any("1 process(es) announced a rank another process had already announced (--allow-mixed): numbered "
               "as guessed ranks 1" in n for n in doc["summary"]["limitations"])  # fmt: skip


def test_exports_whose_strings_do_not_resolve_still_combine(tmp_path):
    good, _ = write_job(JobSpec(ranks=1, seed=3), tmp_path / "good")
    bad, _ = write_job(JobSpec(ranks=1, seed=4), tmp_path / "bad")
    con = sqlite3.connect(bad[0])
    con.execute("DELETE FROM StringIds WHERE value LIKE '%sgemm%' OR value LIKE '%nccl%' OR value LIKE '%elementwise%'")
    con.commit()
    con.close()
    with load_trace(good + bad, allow_mixed=True) as trace:  # two one-rank jobs
        k = trace.kernels
    assert k.groupby("export")["short_name"].count().to_dict() == {
        0: len(k[k["export"] == 0]),
        1: len(k[k["export"] == 1]),
    }
    assert k.loc[k["export"] == 1, "short_name"].astype(str).str.startswith("<unknown string ").all()


def test_trace_strings_are_not_rich_markup(tmp_path):
    w = ExportWriter(tmp_path / "m.sqlite", "current")
    w.process(9, "python3")
    w.nvtx_range(9, 9, 100, 900, "[rank0] forward")
    w.nvtx_range(9, 9, 1000, 1900, "loss[/x]")
    w.close()
    with load_trace([tmp_path / "m.sqlite"]) as trace:
        text = render_terminal(analyse(trace))
    assert "[rank0] forward" in text and "loss[/x]" in text
