"""The per-rank map on Dask: a real `dask scheduler` and two `dask worker` processes on loopback,
and a local cluster, give the same report as the serial path, byte for byte; a worker's input
error reaches the user as one line; an unreachable scheduler is a usage error."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures import confounders_ordering, confounders_slowdown
from nsysan.analysis import analyse
from nsysan.engine import DaskEngine, Serial, analyse_files, open_engine
from nsysan.ingest import load_trace
from tests.conftest import need
from tests.test_cli import run_main

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real scheduler and two single-threaded workers, as a Slurm job would start them."""
    dask = shutil.which("dask")
    if dask is None:
        need(False, "the `dask` command (pip install distributed)")
    address = f"tcp://127.0.0.1:{_free_port()}"
    logs = tmp_path_factory.mktemp("dask")
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=(logs / "scheduler").open("w"))]  # fmt: skip
    try:
        for i in range(2):
            procs.append(subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--nworkers", "1",
                                           "--no-dashboard", "--host", "127.0.0.1"],
                                          stdout=subprocess.DEVNULL, stderr=(logs / f"worker{i}").open("w")))  # fmt: skip
        from distributed import Client

        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """A multi-rank job, one export per rank, with ordering stalls (NCCL payloads, a cascade) and
    slowdowns planted among confounders: findings of both cross-rank and per-rank detectors."""
    root = tmp_path_factory.mktemp("job")
    paths, truths = confounders_ordering.scenario(22, True, root / "ordering")
    assert len(paths) == 8 and len(truths) == 6
    return paths


@pytest.fixture(scope="module")
def serial_doc(job: list[Path]) -> dict:
    with load_trace(job) as trace:
        return analyse(trace)


def _json(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, default=str)


def test_job_has_findings_of_cross_rank_detectors(serial_doc):
    kinds = {f["kind"] for f in serial_doc["findings"]}
    assert "nccl_ordering_stall" in kinds
    assert len(serial_doc["traces"]) >= 4


def test_real_scheduler_and_two_workers_give_the_serial_report(scheduler, job, serial_doc):
    from distributed import Client

    with Client(scheduler, timeout="30s") as client:
        doc = analyse_files([str(p) for p in job], {}, DaskEngine(client))
        # both workers took part: the tasks went to the cluster, not this process
        assert len(client.scheduler_info()["workers"]) == 2
    assert _json(doc) == _json(serial_doc)


class _Counting(DaskEngine):
    """A Dask engine that remembers how many tasks each stage sent to the cluster."""

    def __init__(self, client: object) -> None:
        super().__init__(client)
        self.sent: dict[str, int] = {}

    def map(self, fn, tasks, what):  # type: ignore[no-untyped-def]
        self.sent[what] = len(tasks)
        return super().map(fn, tasks, what)


def test_an_export_of_several_processes_maps_per_slice_on_the_cluster(scheduler, tmp_path):
    """One export holding every rank (``nsys profile torchrun``): a task per group of processes
    that share no GPU, and the serial report, byte for byte."""
    paths, _ = confounders_slowdown.scenario(1, True, tmp_path / "one-export", file_per_rank=False)
    assert len(paths) == 1
    with load_trace(paths) as trace:
        slices = len(trace.export_slices(0))
        serial = analyse(trace)
    assert slices > 2 and serial["findings"]
    from distributed import Client

    with Client(scheduler, timeout="30s") as client:
        engine = _Counting(client)
        doc = analyse_files([str(p) for p in paths], {}, engine)
    assert engine.sent == {"ranks": 1, "exports": slices}
    assert _json(doc) == _json(serial)


def test_cli_scheduler_report_equals_serial_cli_report(scheduler, job, monkeypatch, capsys, tmp_path):
    out_serial, out_dask = tmp_path / "serial.json", tmp_path / "dask.json"
    # a cache each: the cluster's maps are computed on the workers, not read from the serial run's
    code, _, err = run_main(monkeypatch, capsys, "report", *map(str, job), "--workers", "0", "-o", str(out_serial),
                            "--cache", str(tmp_path / "serial-cache"))  # fmt: skip
    assert code == 0, err
    code, _, err = run_main(monkeypatch, capsys, "report", *map(str, job), "--scheduler", scheduler,
                            "-o", str(out_dask), "--cache", str(tmp_path / "dask-cache"))  # fmt: skip
    assert code == 0, err
    assert out_dask.read_bytes() == out_serial.read_bytes()


def test_payload_job_same_in_process_and_serial_engine(tmp_path):
    """NCCL communicator payloads: comm ranks guessed from members across ranks in the reduce."""
    paths, truths = confounders_ordering.scenario(19, True, tmp_path / "payloads")
    with load_trace(paths) as trace:
        serial = analyse(trace)
    found = [f for f in serial["findings"] if f["kind"] == "nccl_ordering_stall"]
    assert len(found) == len(truths) == 2
    assert all(f["evidence"]["participants_from"] == "NCCL communicator payloads" for f in found)
    assert _json(analyse_files([str(p) for p in paths], {}, Serial())) == _json(serial)


def test_position_matching_past_its_memory_limit_is_skipped_and_said(job, serial_doc):
    """Without payloads, participants by program position cost ops x ranks: past the limit the
    report says what it did not look for instead of running out of memory."""
    assert not any("not looked for" in n for n in serial_doc["summary"]["limitations"])
    with load_trace(job) as trace:
        doc = analyse(trace, {"nccl_ordering_stall": {"max_position_pairs": 1000}})
    assert not [f for f in doc["findings"] if f["kind"] == "nccl_ordering_stall"]
    # the matching belongs to the step attribution now (nsysan.attribution.comm): past the limit no
    # operation is matched across ranks, so neither ordering stalls nor late ranks are looked for,
    # and each rank's NCCL time is said to be not judged (waiting cannot be told from transfer)
    notes = [n for n in doc["summary"]["limitations"] if n.startswith("NCCL operations not matched across ranks")]
    assert len(notes) == 1 and "nccl_ordering_stall.max_position_pairs=1,000" in notes[0]
    assert "288 operations without communicator payloads across 8 ranks" in notes[0]
    assert {f["kind"] for f in doc["findings"]} == {f["kind"] for f in serial_doc["findings"]} - {
        "nccl_ordering_stall", "shared_nccl_stream", "late_rank"}  # fmt: skip
    unmatched = [u for u in doc["steps"]["unjudged"] if u["detector"] == "attribution"]
    assert sorted(u["rank"] for u in unmatched) == list(range(8)) and all(u["ns"] > 0 for u in unmatched)
    assert all("matched with no participant on another rank" in u["why"] for u in unmatched)
    assert not [u for u in serial_doc["steps"]["unjudged"] if u["detector"] == "attribution"]


def test_local_cluster_gives_the_serial_report_on_a_slowdown_job(tmp_path):
    paths, _ = confounders_slowdown.scenario(2, True, tmp_path / "slowdown", file_per_rank=True)
    with load_trace(paths) as trace:
        serial = analyse(trace)
    assert any(f["kind"] == "comm_compute_slowdown" for f in serial["findings"])
    assert _json(analyse_files([str(p) for p in paths], {}, Serial())) == _json(serial)
    with open_engine(2, None, paths) as engine:
        assert isinstance(engine, DaskEngine)
        assert _json(analyse_files([str(p) for p in paths], {}, engine)) == _json(serial)
        # the local cluster's workers run without Dask's 10 ms stack sampler (+9% CPU measured)
        assert set(engine.client.run(_worker_profiling).values()) == {False}


def _worker_profiling() -> bool:
    import dask

    return bool(dask.config.get("distributed.worker.profile.enabled"))


def test_settings_reach_the_workers(scheduler, job):
    from distributed import Client

    strict = {"nccl_ordering_stall": {"min_stall_ns": 10**12}}
    with Client(scheduler, timeout="30s") as client:
        doc = analyse_files([str(p) for p in job], strict, DaskEngine(client))
    assert not [f for f in doc["findings"] if f["kind"] == "nccl_ordering_stall"]


def test_a_bad_export_on_a_worker_is_one_line_and_exit_2(scheduler, job, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "rank9.sqlite"
    bad.write_bytes(b"not sqlite at all" * 100)
    code, _, err = run_main(monkeypatch, capsys, "report", *map(str, job), str(bad), "--scheduler", scheduler)
    assert code == 2
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err


def test_unreachable_scheduler_is_a_usage_error(job, monkeypatch, capsys):
    address = f"tcp://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    code, _, err = run_main(monkeypatch, capsys, "report", str(job[0]), "--scheduler", address)
    assert code == 2 and err.startswith(f"nsysan: error: --scheduler {address}: cannot connect")
    assert err.count("\n") == 1
    assert time.monotonic() - started < 60


def test_a_cluster_without_nsysan_is_named_not_an_internal_error(scheduler, monkeypatch):
    """What a scheduler whose Python lacks nsysan answers (seen for real when the package was not
    installed there) becomes one line about the cluster's environment."""
    from distributed import Client

    from nsysan.errors import InputError

    with Client(scheduler, timeout="30s") as client:
        engine = DaskEngine(client)

        def gather(futures: object) -> None:
            raise RuntimeError("Error during deserialization of the task graph. This frequently\noccurs if ...")

        monkeypatch.setattr(client, "gather", gather)
        with pytest.raises(InputError, match="need the same nsysan and Python packages"):
            engine.map(len, [("ab",)], "exports")


def test_workers_default_is_serial_for_small_jobs(job):
    with open_engine(None, None, job) as engine:
        assert isinstance(engine, Serial)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
