"""Bad input: one clear line on stderr, exit code 2, no traceback, and the input left untouched."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.exporter import ExportWriter
from fixtures.samples import sample_paths
from tests.conftest import sha256

SAMPLE = sample_paths("allreduce-2rank")[0]


def run_report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nsysan", "report", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nsysan: error: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def _not_sqlite(tmp: Path) -> Path:
    p = tmp / "notes.sqlite"
    p.write_text("this is not a database\n")
    return p


def _empty(tmp: Path) -> Path:
    p = tmp / "empty.sqlite"
    p.write_bytes(b"")
    return p


def _other_sqlite(tmp: Path) -> Path:
    p = tmp / "app.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.execute("INSERT INTO users VALUES (1, 'ada')")
    con.commit()
    con.close()
    return p


def _truncated(tmp: Path) -> Path:
    p = tmp / "truncated.sqlite"
    data = SAMPLE.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return p


def _corrupt(tmp: Path) -> Path:
    """Full length and a valid header, but garbage over the schema page and most data pages."""
    p = tmp / "corrupt.sqlite"
    data = bytearray(SAMPLE.read_bytes())
    rng = random.Random(7)
    for i in range(100, len(data)):
        if i < 4096 or i % 4096 < 3000:
            data[i] = rng.randrange(256)
    p.write_bytes(bytes(data))
    return p


def _no_activity(tmp: Path) -> Path:
    w = ExportWriter(tmp / "idle.sqlite", "2022.4")
    w.process(4242, "python3")
    w.thread(4242, 4242, "python3")
    return w.close()


def _raw_report(tmp: Path) -> Path:
    p = tmp / "capture.nsys-rep"
    p.write_bytes(b"\x00nsys report placeholder")
    return p


CASES = {
    "not SQLite": (_not_sqlite, ("not an SQLite file",)),
    "empty file": (_empty, ("not an SQLite file",)),
    "SQLite but not nsys": (_other_sqlite, ("not an nsys export", "StringIds")),
    "truncated": (_truncated, ("truncated",)),
    "corrupt": (_corrupt, ("SQLite cannot read",)),
    "no CUDA and no NVTX": (_no_activity, ("no CUDA activity and no NVTX", "--trace=cuda,nvtx")),
    "raw .nsys-rep nsys cannot read": (_raw_report, ("nsys export --type sqlite capture.nsys-rep",)),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_file_gives_one_line_and_exit_2(tmp_path, case):
    make, needles = CASES[case]
    path = make(tmp_path)
    before = sha256(path)
    result = run_report(str(path))
    assert_one_line_error(result, str(path), *needles)
    assert sha256(path) == before


def test_missing_file(tmp_path):
    assert_one_line_error(run_report(str(tmp_path / "nope.sqlite")), "no such file")


def test_directory_without_exports(tmp_path):
    assert_one_line_error(run_report(str(tmp_path)), "no .sqlite exports")


def test_glob_matching_nothing(tmp_path):
    assert_one_line_error(run_report(str(tmp_path / "rank*.sqlite")), "matches no files")


def test_unwritable_output(tmp_path):
    result = run_report(str(SAMPLE), "--output", str(tmp_path / "missing-dir" / "r.json"))
    assert_one_line_error(result, "cannot write report")


def test_good_input_is_byte_identical_after_report(tmp_path):
    copy = tmp_path / "sample.sqlite"
    shutil.copy(SAMPLE, copy)
    before = sha256(copy)
    result = run_report(str(copy), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert sha256(copy) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample.sqlite"], "no journal or side files"


def test_two_captures_given_as_one_job_are_refused_unless_allowed(tmp_path):
    """Two captures of the same 4-rank job (the README's glob over two run directories): every rank is
    announced twice. Refused with each rank's two exports named; ``--allow-mixed`` analyses all 8
    processes, the repeats numbered as guessed ranks (it was an internal error in late_rank)."""
    before = tmp_path / "run1" / "report.sqlite"
    after = tmp_path / "run2" / "report.sqlite"
    for path, sample in ((before, "pipeline-stall"), (after, "pipeline-stall-fixed")):
        path.parent.mkdir()
        shutil.copy(sample_paths(sample)[0], path)
    digest = sha256(before)
    refused = run_report(str(tmp_path / "run*" / "report.sqlite"))
    assert_one_line_error(refused, "4 rank(s) announced by more than one process", f"rank 0 by {before} pid 3005 (python3) and {after} pid 3005",
                          "--allow-mixed")  # fmt: skip
    assert sha256(before) == digest
    mixed = run_report(str(before), str(after), "--allow-mixed", "--format", "json")
    assert mixed.returncode == 0, mixed.stderr
    import json

    ranks = json.loads(mixed.stdout)["summary"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(8))
    assert [r["rank_source"] for r in ranks if r["export"] == 1] == ["process order (its announced rank was taken)"] * 4


def test_repeated_ranks_are_told_apart_from_guessed_ones():
    import pandas as pd

    from nsysan.ingest.ranks import RepeatedRanks, assign_guessed

    def announced(export: int, ranks: list[int | None]) -> pd.DataFrame:
        return pd.DataFrame({"export": export, "pid": range(100, 100 + len(ranks)), "process": "python",
                             "rank": ranks, "local_rank": None, "world_size": None,
                             "rank_source": ["nvtx" if r is not None else None for r in ranks]})  # fmt: skip

    # one rank each, and one process that announced none: no repeat, the guess takes a free number
    table = assign_guessed([announced(0, [0, None]), announced(1, [1])])
    assert list(table["rank"]) == [0, 2, 1] and list(table["rank_source"]) == ["nvtx", "process order", "nvtx"]
    with pytest.raises(
        RepeatedRanks,
        match=r"1 rank\(s\) announced by more than one process.*rank 1 by a.sqlite pid 101 \(python\) and b.sqlite pid 100",
    ):
        assign_guessed([announced(0, [0, 1]), announced(1, [1])], ["a.sqlite", "b.sqlite"])
    table = assign_guessed([announced(0, [0, 1]), announced(1, [1])], allow_mixed=True)
    assert list(table["rank"]) == [0, 1, 2]
