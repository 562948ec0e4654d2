"""The frame cache: a hit gives the same frames and report, a changed export is read again,
damage and an unwritable directory cost nothing but the cache, and `nsysan cache` info/clear."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from nsysan import engine
from nsysan.cli import app
from nsysan.ingest import load_trace
from nsysan.ingest.cache import FrameCache, _load_value, export_key
from nsysan.ingest.frames import FRAMES

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "fixtures" / "samples" / "allreduce-2rank.sqlite"
ALL = [*FRAMES, "nccl_calls", "ranks"]
runner = CliRunner()


def frames_of(path: Path, cache: FrameCache | None) -> dict[str, pd.DataFrame]:
    with load_trace([path], cache=cache) as t:
        out = {name: getattr(t, name) for name in ALL}
        t.audit_times()
        out["dropped"] = t.dropped_rows()
    return out


def assert_same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], obj=name)


@pytest.fixture
def export(tmp_path: Path) -> Path:
    path = tmp_path / "trace.sqlite"
    shutil.copy(SAMPLE, path)
    return path


def test_hit_gives_identical_frames(tmp_path, export):
    cache = FrameCache(tmp_path / "cache")
    fresh = frames_of(export, None)
    cold = frames_of(export, cache)
    assert cache.hits == 0 and cache.misses > 0
    hot_cache = FrameCache(tmp_path / "cache")
    hot = frames_of(export, hot_cache)
    assert hot_cache.misses == 0 and hot_cache.hits == cache.misses
    assert_same(fresh, cold)
    assert_same(fresh, hot)


def test_report_identical_from_cache_and_cache_outside_the_trace_dir(tmp_path, export):
    before = set(export.parent.iterdir())
    args = ["report", str(export), "--format", "json", "--cache", str(tmp_path / "cache")]
    cold = runner.invoke(app, args, catch_exceptions=False)
    hot = runner.invoke(app, args, catch_exceptions=False)
    bare = runner.invoke(app, ["report", str(export), "--format", "json", "--no-cache"], catch_exceptions=False)
    assert cold.exit_code == hot.exit_code == bare.exit_code == 0
    assert cold.stdout == hot.stdout == bare.stdout
    assert set(export.parent.iterdir()) - before == {tmp_path / "cache"} - before
    assert FrameCache(tmp_path / "cache").info().entries == 1


def test_changed_export_is_read_again(tmp_path, export):
    cache = FrameCache(tmp_path / "cache")
    key = export_key(export)
    frames_of(export, cache)
    with sqlite3.connect(export) as con:  # a real change: one kernel fewer
        con.execute(
            "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
        )
    con.close()
    assert export_key(export) != key
    again = FrameCache(tmp_path / "cache")
    changed = frames_of(export, again)
    assert again.hits == 0
    assert_same(changed, frames_of(export, None))
    st = export.stat()
    os.utime(export, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched only: the same content
    touched = FrameCache(tmp_path / "cache")
    frames_of(export, touched)
    assert touched.hits > 0 and touched.misses == 0
    copied = tmp_path / "copy.sqlite"
    shutil.copy(export, copied)  # a copy elsewhere: the same content too
    copy_cache = FrameCache(tmp_path / "cache")
    frames_of(copied, copy_cache)
    assert copy_cache.misses == 0
    assert FrameCache(tmp_path / "cache").info().entries == 2


def test_a_change_beyond_the_first_mib_with_size_and_mtime_put_back_is_read_again(tmp_path, export):
    with sqlite3.connect(export) as con:  # the kernel table's pages after 2 MiB of other rows
        con.execute("CREATE TABLE padding AS SELECT zeroblob(2 << 20) AS b")
        con.execute("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
        con.execute("ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL")
    con.close()
    cache = FrameCache(tmp_path / "cache")
    before = frames_of(export, cache)["kernels"]
    st, head = export.stat(), export.read_bytes()[: 1 << 20]
    with sqlite3.connect(export) as con:
        (page,) = con.execute("SELECT min(pageno) FROM dbstat WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()
        (page_size,) = con.execute("PRAGMA page_size").fetchone()
        con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + 1')
    con.close()
    assert (page - 1) * page_size > 1 << 20  # the change is beyond the first MiB
    with export.open("r+b") as fh:  # SQLite's change counter and the rest of the first MiB as they were
        fh.write(head)
    os.utime(export, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert export.stat().st_size == st.st_size and export.read_bytes()[: 1 << 20] == head
    again = FrameCache(tmp_path / "cache")
    after = frames_of(export, again)["kernels"]
    assert again.hits == 0
    assert (after["end_ns"] - before["end_ns"]).eq(1).all()


def test_corrupt_entry_is_ignored_and_rewritten(tmp_path, export):
    cache = FrameCache(tmp_path / "cache")
    fresh = frames_of(export, cache)
    entry = tmp_path / "cache" / export_key(export)
    files = sorted(entry.glob("*.parquet"))
    assert files
    files[0].write_bytes(b"not parquet")
    files[1].write_bytes(files[1].read_bytes()[:40])
    again = FrameCache(tmp_path / "cache")
    assert_same(frames_of(export, again), fresh)
    assert again.misses == 2
    third = FrameCache(tmp_path / "cache")
    frames_of(export, third)
    assert third.misses == 0
    assert not list(entry.glob("*.tmp"))


def test_unwritable_cache_dir_reads_without_it(tmp_path, export, capsys, monkeypatch):
    """A directory the user may not write (EACCES; simulated, since root, as in CI, writes anywhere)."""

    def refused(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refused)
    cache = FrameCache(tmp_path / "locked" / "frames")
    assert_same(frames_of(export, cache), frames_of(export, None))
    assert capsys.readouterr().err.count("not writable (Permission denied)") == 1


def test_cache_path_is_a_file_reads_without_it(tmp_path, export, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = FrameCache(blocker)
    assert_same(frames_of(export, cache), frames_of(export, None))
    assert capsys.readouterr().err.count("not writable") == 1


def test_cache_info_and_clear(tmp_path, export):
    where = tmp_path / "cache"
    empty = runner.invoke(app, ["cache", "info", "--cache", str(where)], catch_exceptions=False)
    assert empty.exit_code == 0 and "0 export(s)" in empty.stdout and str(where) in empty.stdout
    frames_of(export, FrameCache(where))
    (where / "unrelated.txt").write_text("kept")
    full = runner.invoke(app, ["cache", "info", "--cache", str(where)], catch_exceptions=False)
    assert "1 export(s)" in full.stdout
    cleared = runner.invoke(app, ["cache", "clear", "--cache", str(where)], catch_exceptions=False)
    assert cleared.exit_code == 0 and "removed 1" in cleared.stdout
    assert FrameCache(where).info().entries == 0
    assert (where / "unrelated.txt").exists()


def test_default_dir_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert FrameCache().directory == tmp_path / "nsysan" / "frames"


def test_audit_from_cache_matches_whatever_was_read_before(tmp_path, export):
    """The audit judges only tables no read judged: a load that read other frames gets its own entry."""
    cache_dir = tmp_path / "cache"
    for frames_read in (["kernels", "nvtx"], ["memcpy"], ["kernels", "nvtx"]):
        results = []
        for cache in (FrameCache(cache_dir), None):
            with load_trace([export], cache=cache) as t:
                for name in frames_read:
                    getattr(t, name)
                t.audit_times()
                results.append(t.dropped_rows())
        pd.testing.assert_frame_equal(results[0], results[1])


# -- the map results (nsysan.engine.map_file) --------------------------------------------------------


def _report(export: Path, cache: Path, *extra: str) -> str:
    result = runner.invoke(app, ["report", str(export), "--format", "json", "--cache", str(cache), *extra])
    assert result.exit_code == 0, result.output
    return result.stdout


def _map_results(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/map-*.pickle"))


def test_second_report_reads_the_map_result_and_ranks_without_opening_the_export(tmp_path, export, monkeypatch):
    cold = _report(export, tmp_path / "cache")
    assert len(_map_results(tmp_path / "cache")) == 1

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the export was read again")

    monkeypatch.setattr("nsysan.engine.load_trace", no_reading)
    monkeypatch.setattr("nsysan.engine.NsysExport", no_reading)  # nor its ranks: kept too
    assert _report(export, tmp_path / "cache") == cold


def test_no_cache_computes_the_map(tmp_path, export, monkeypatch):
    _report(export, tmp_path / "cache")
    calls = []
    real = engine.load_trace
    monkeypatch.setattr("nsysan.engine.load_trace", lambda *a, **k: calls.append(1) or real(*a, **k))
    _report(export, tmp_path / "cache", "--no-cache")
    assert calls == [1]


def test_map_result_is_computed_again_when_what_it_depends_on_changes(tmp_path, export, monkeypatch):
    cache = tmp_path / "cache"
    _report(export, cache)
    _report(export, cache, "--set", "nccl_ordering_stall.min_stall_ns=60000")  # settings
    assert len(_map_results(cache)) == 2
    monkeypatch.setattr("nsysan.engine.code_identity", lambda: "another nsysan")  # code
    _report(export, cache)
    assert len(_map_results(cache)) == 3
    monkeypatch.undo()
    moved = tmp_path / "moved" / "trace.sqlite"  # the path the report names
    moved.parent.mkdir()
    shutil.copy2(export, moved)
    assert str(moved) in _report(moved, cache)
    assert len(_map_results(cache)) == 4
    st = export.stat()
    os.utime(export, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: the same content
    _report(export, cache)
    assert len(_map_results(cache)) == 4
    with sqlite3.connect(export) as con:  # the export's content (a new entry)
        con.execute(
            "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
        )
    con.close()
    _report(export, cache)
    assert len(_map_results(cache)) == 5


def test_map_result_others_may_write_or_damaged_is_computed_again(tmp_path, export, monkeypatch):
    """A pickle can run code: a file another user could have written is never loaded."""
    cache = tmp_path / "cache"
    cold = _report(export, cache)
    (stored,) = _map_results(cache)
    assert stored.stat().st_mode & 0o077 == 0
    calls = []
    real = engine.load_trace
    monkeypatch.setattr("nsysan.engine.load_trace", lambda *a, **k: calls.append(1) or real(*a, **k))
    stored.chmod(0o666)
    assert _report(export, cache) == cold and calls == [1]
    assert stored.stat().st_mode & 0o077 == 0  # rewritten as this user's alone
    stored.write_bytes(b"not a pickle")
    assert _report(export, cache) == cold and calls == [1, 1]
    assert _report(export, cache) == cold and calls == [1, 1]
    elsewhere = tmp_path / "planted.pickle"  # a link in its place, even to a file of this user's
    stored.rename(elsewhere)
    stored.symlink_to(elsewhere)
    assert _report(export, cache) == cold and calls == [1, 1, 1]
    assert not stored.is_symlink()
    stored.unlink()
    os.mkfifo(stored)  # not waited on
    assert _report(export, cache) == cold and calls == [1, 1, 1, 1]
    stored.parent.chmod(0o777)  # an entry others may write: nothing in it is loaded ...
    assert _load_value(stored) is None
    assert _report(export, cache) == cold  # ... until a report of this user's takes their write permission off
    assert stored.parent.stat().st_mode & 0o022 == 0
    assert _load_value(stored) is not None


def test_map_result_names_the_export_as_the_user_did(tmp_path, export, monkeypatch):
    monkeypatch.chdir(export.parent)
    assert '"path": "trace.sqlite"' in _report(Path("trace.sqlite"), tmp_path / "cache")
    assert f'"path": "{export}"' in _report(export, tmp_path / "cache")


def test_map_results_are_not_kept_while_a_plugin_detector_is_registered(tmp_path, export, monkeypatch):
    """nsysan cannot tell when a plugin's code changes: its maps are computed every time."""
    from nsysan.detect import registry

    spec = registry.DetectorSpec("plugin", lambda trace, params: [], dict, "a plugin")
    monkeypatch.setattr(registry, "_REGISTRY", {**registry.registered(), "plugin": spec})
    _report(export, tmp_path / "cache")
    assert _map_results(tmp_path / "cache") == []


def test_a_fifo_has_no_identity_and_is_not_read(tmp_path):
    """Computing a key reads the export's first MiB: a FIFO would wait forever, so compute() decides."""
    fifo = tmp_path / "x.sqlite"
    os.mkfifo(fifo)
    assert FrameCache(tmp_path / "cache").value(fifo, "map-x", lambda: "computed") == "computed"


def test_second_diff_of_the_same_captures_reads_no_export(tmp_path, export, monkeypatch):
    after = tmp_path / "after.sqlite"
    shutil.copy(REPO / "fixtures" / "samples" / "allreduce-2rank.sqlite", after)
    args = ["diff", str(export), str(after), "--format", "json", "--cache", str(tmp_path / "cache")]
    cold = runner.invoke(app, args)
    assert cold.exit_code == 0, cold.output
    assert len(_map_results(tmp_path / "cache")) == 2  # diff keeps map results as report does

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("an export was read again")

    monkeypatch.setattr("nsysan.engine.load_trace", no_reading)
    monkeypatch.setattr("nsysan.engine.NsysExport", no_reading)
    monkeypatch.setattr("nsysan.ingest.load_trace", no_reading)
    warm = runner.invoke(app, args)
    assert warm.exit_code == 0, warm.output
    assert warm.stdout == cold.stdout
    # and a diff without the cache computes the same document
    monkeypatch.undo()
    fresh = runner.invoke(app, [*args[:-2], "--no-cache"])
    assert fresh.exit_code == 0 and fresh.stdout == cold.stdout


def _wal_writer(path: Path) -> sqlite3.Connection:
    """A WAL-mode export with a writer that keeps it open: its commits sit in ``-wal``, not the file."""
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA journal_mode=WAL")
    con.close()
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("SELECT count(*) FROM StringIds").fetchone()  # the writer's -wal and -shm exist from here
    return writer


def test_a_wal_mode_export_is_read_with_nothing_written_beside_it(tmp_path, export):
    with sqlite3.connect(export) as con:
        con.execute("PRAGMA journal_mode=WAL")
    con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.sqlite"]  # the last close checkpointed
    frames_of(export, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.sqlite"]  # no -wal / -shm of ours


def test_a_commit_in_the_wal_after_caching_is_read_again(tmp_path, export):
    writer = _wal_writer(export)
    try:
        cache = FrameCache(tmp_path / "cache")
        before = frames_of(export, cache)["kernels"]
        beside = sorted(p.name for p in tmp_path.iterdir())
        writer.execute(
            "DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
        )
        writer.commit()  # in trace.sqlite-wal only: the file's size, mtime and first MiB are as they were
        again = FrameCache(tmp_path / "cache")
        after = frames_of(export, again)["kernels"]
        assert again.hits == 0 and len(after) == len(before) - 1
        assert sorted(p.name for p in tmp_path.iterdir()) == beside  # the writer's files, none of ours
    finally:
        writer.close()


def test_cache_clear_says_what_it_could_not_remove(tmp_path, export, monkeypatch):
    where = tmp_path / "cache"
    frames_of(export, FrameCache(where))
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)  # as a read-only directory would leave them
    cleared = runner.invoke(app, ["cache", "clear", "--cache", str(where)])
    assert cleared.exit_code == 1 and "removed 0" in cleared.stdout
    assert "could not remove 1 cache entry" in cleared.stderr and FrameCache(where).info().entries == 1


def test_a_hash_of_a_file_changed_this_instant_is_not_remembered(tmp_path, export, monkeypatch):
    """File times come from a coarse clock: an UPDATE of the same size in the tick of the hash
    would keep the stat identity, and a remembered hash would then name stale frames (git's racy
    rule). A file changed within 2 s is hashed again each time; an older one is remembered."""
    from nsysan.ingest import cache as cache_module

    identities = tmp_path / "ids"
    monkeypatch.setattr(cache_module, "_known", {})
    key = export_key(export, identities)  # copied just now by the fixture
    assert not identities.exists() or not any(identities.iterdir())
    monkeypatch.setattr(cache_module, "_RACY_NS", 0)  # as if 2 s had passed
    assert export_key(export, identities) == key and len(list(identities.iterdir())) == 1


def test_a_report_beside_its_export_is_not_read_twice(tmp_path):
    """A glob over capture run directories names report.sqlite and report.nsys-rep: the export is
    read, and the report is not exported (nor needs nsys) as a second copy of the same ranks."""
    from nsysan.ingest import expand_inputs

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(SAMPLE, run / "report.sqlite")
    (run / "report.nsys-rep").write_bytes(b"\x00not a report nsys could read")
    assert expand_inputs([str(tmp_path / "*" / "*")]) == [run / "report.sqlite"]
    assert expand_inputs([str(run / "report.nsys-rep"), str(run / "report.sqlite")]) == [run / "report.sqlite"]
    assert expand_inputs([str(run)]) == [run / "report.sqlite"]
