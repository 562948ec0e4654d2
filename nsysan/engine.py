"""Where the map of :mod:`nsysan.analysis` runs: in this process, or on a Dask cluster.

``nsysan report --workers N`` starts a local cluster of N single-threaded worker processes;
``--scheduler ADDRESS`` uses a running one (``dask scheduler`` and ``dask worker``, e.g. on a Slurm
allocation: the workers must read the exports at the same paths). Each task reads one export, so a
worker holds one rank's frames at a time, and this process (the coordinator) receives only the
compact results the reduce needs. Dask does the scheduling, retries and transport; nsysan only
says what a task is (one export) and how results combine (:func:`nsysan.analysis.reduce_job`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd

from nsysan import extras
from nsysan.analysis import (
    ExportResult,
    Settings,
    combine_slices,
    graph_budget,
    map_export,
    reduce_job,
    slice_in_process,
)
from nsysan.detect.common import export_run_ns
from nsysan.detect.registry import registered
from nsysan.diff.profile import merge_profiles, profile_part, summary_tables
from nsysan.errors import InputError
from nsysan.ingest import expand_inputs, load_trace
from nsysan.ingest.cache import FrameCache, process_cache
from nsysan.ingest.export import NsysExport
from nsysan.ingest.ranks import announced_ranks, assign_guessed
from nsysan.ingest.slices import ProcessSlice
from nsysan.steps import DEFAULT_STEP_PATTERN

T = TypeVar("T")

# Below this much export data a local cluster's start-up (~2 s) costs more than it saves.
AUTO_CLUSTER_BYTES = 512 << 20
_CONNECT_TIMEOUT = "10s"


class Engine(Protocol):
    in_process: bool  # whether tasks run in this process, one after the other (else in parallel)

    def map(self, fn: Callable[..., T], tasks: Sequence[tuple[Any, ...]], what: str) -> list[T]:
        """``[fn(*task) for task in tasks]``, in order, wherever this engine runs them."""
        ...


def _progress(total: int, what: str) -> Any:
    """A progress bar on stderr when a person watches it; None otherwise."""
    if total < 2 or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(f"{what:<8}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)  # fmt: skip
    return bar


class Serial:
    """One task after the other in this process."""

    in_process = True

    def map(self, fn: Callable[..., T], tasks: Sequence[tuple[Any, ...]], what: str) -> list[T]:
        bar = _progress(len(tasks), what)
        if bar is None:
            return [fn(*task) for task in tasks]
        with bar:
            job = bar.add_task(what, total=len(tasks))
            out = []
            for task in tasks:
                out.append(fn(*task))
                bar.advance(job)
            return out


class DaskEngine:
    """Tasks on a dask.distributed cluster, one export (or slice of its processes) per task."""

    in_process = False

    def __init__(self, client: Any) -> None:
        self.client = client

    def map(self, fn: Callable[..., T], tasks: Sequence[tuple[Any, ...]], what: str) -> list[T]:
        from distributed import as_completed

        futures = [self.client.submit(fn, *task, pure=False) for task in tasks]
        bar = _progress(len(tasks), what)
        try:
            if bar is not None:
                with bar:
                    job = bar.add_task(what, total=len(tasks))
                    for _ in as_completed(futures):
                        bar.advance(job)
            results: list[T] = self.client.gather(futures)  # re-raises a task's own error (InputError...)
            return results
        except (ModuleNotFoundError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and "deserializ" not in str(exc):
                raise
            raise InputError(
                "the Dask cluster cannot run nsysan's tasks: its scheduler and workers need the same nsysan and "
                f"Python packages as this process ({str(exc).splitlines()[0]})"
            ) from None
        finally:
            self.client.cancel(futures)


def job_bytes(paths: Sequence[Path]) -> int:
    """The exports' total size (what is not a file fails in its task, by name)."""
    return sum(p.stat().st_size for p in paths if p.is_file())


def choose_workers(paths: Sequence[Path]) -> int:
    """The default: in this process for one export or a small job; else a local cluster with a
    worker per core (at most one per export)."""
    if len(paths) < 2 or job_bytes(paths) < AUTO_CLUSTER_BYTES:
        return 0
    return min(len(paths), os.cpu_count() or 1)


# Below this many bytes of exports a local cluster's start (a few seconds on a 2-core machine: the
# workers' Python and pandas imports) costs more than its workers save (issue 32: --workers 2 made
# a 4-rank sample 3.2x slower), so an explicit --workers runs in this process instead, and says so.
SMALL_JOB_BYTES = 32 << 20


def too_small_for_workers(paths: Sequence[Path]) -> int | None:
    """The exports' total size when it is under :data:`SMALL_JOB_BYTES`, else None."""
    total = job_bytes(paths)
    return total if total < SMALL_JOB_BYTES else None


@contextmanager
def open_engine(workers: int | None, scheduler: str | None, paths: Sequence[Path]) -> Iterator[Engine]:
    """The engine for ``paths``: ``scheduler`` (an address) wins; else ``workers`` local worker
    processes (0 or 1: this process; None: :func:`choose_workers`)."""
    if scheduler is None:
        n = choose_workers(paths) if workers is None else workers
        if n > 1 and workers is None and extras.missing("cluster"):
            sys.stderr.write(
                f"nsysan: note: a job of {job_bytes(paths) / 2**20:.0f} MiB runs faster on a local Dask cluster "
                "(pip install 'nsysan[cluster]'); analysing it in this process\n"
            )
            n = 0
        if n <= 1:
            yield Serial()
            return
    extras.require("cluster", "--scheduler" if scheduler is not None else f"--workers {workers}")
    from distributed import Client, LocalCluster

    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=_CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"--scheduler {scheduler}: cannot connect to a Dask scheduler there ({exc})") from None
        with client:
            yield DaskEngine(client)
        return
    # ":0": Dask's status page on a free port, so two reports at once do not collide on 8787.
    # Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which hands freed memory back to the
    # kernel at once; a map frees hundreds of MiB of frames per export, and re-faulting them cost
    # +45% CPU per export here (benchmarks/ranks.py). A task's peak bounds a worker's memory anyway.
    # Dask's statistical profiler samples every worker thread's stack each 10 ms: +9% worker CPU on
    # the 64-rank job (benchmarks/ranks.py, 82.4 s against 75.7 s), for a profile nobody reads here.
    import dask

    with dask.config.set({
        "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
        "distributed.worker.profile.enabled": False,
    }):  # fmt: skip
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                               silence_logs=logging.ERROR)  # fmt: skip
    with cluster, Client(cluster, set_as_default=False) as client:
        yield DaskEngine(client)


@dataclass(frozen=True)
class Survey:
    """What the coordinator needs of an export before mapping it: the ranks its processes
    announced, how its processes are sliced, and (when there is more than one slice) its run length."""

    announced: pd.DataFrame
    slices: list[ProcessSlice]
    run: int | None


def survey_file(path: Path, index: int, cache: FrameCache | None = None, by_slices: bool = False) -> Survey:
    """Task: the :class:`Survey` of one export (see :func:`announced_ranks`; with ``by_slices``,
    :meth:`NsysExport.process_slices`); with a cache, kept like a map result (it scans the
    largest tables: seconds at 8M kernels)."""

    def compute() -> Survey:
        with NsysExport(path) as x:
            announced = announced_ranks(x, index)
            # an export of one process (a file per rank) has nothing to slice: no scan for it
            slices = x.process_slices() if by_slices and len(announced) > 1 else [ProcessSlice()]
        return Survey(announced, slices, export_run_ns(path) if len(slices) > 1 else None)

    if cache is None:
        return compute()
    return cache.value(path, f"survey-{_key(code_identity(), str(index), str(by_slices))}", compute)


def map_file(
    path: Path,
    index: int,
    ranks: pd.DataFrame,
    settings: Settings,
    cache: FrameCache | None,
    steps: str,
    profile: bool,
    part: ProcessSlice | None = None,
    run: int | None = None,
    graph_budget: int | None = None,
) -> ExportResult:
    """Task: the map of one export, or of the slice ``part`` of its processes with ``run`` its
    run length, opened on the worker; ``steps`` is the step pattern, and with ``profile`` the diff
    profile's part is added. With a cache, a result computed before for the same export, code,
    settings, ranks, slice and steps is read back instead (a re-report runs only the reduce)."""

    def compute() -> ExportResult:
        with load_trace([path], cache=cache, ranks=ranks) as whole, whole.export_alone(0, part, run) as trace:
            result = map_export(trace, index, settings, steps, graph_budget)
            if profile:
                result.profiles = [profile_part(trace, steps, [result.attribution])]
            return result

    if cache is None or not _only_nsysan_detectors():
        return compute()
    tag = part.tag if part is not None else ""
    key = _map_key(path, index, ranks, settings, f"{steps!r} profile={profile} graph={graph_budget}", tag)
    return cache.value(path, f"map-{key}", compute)


def _only_nsysan_detectors() -> bool:
    """Whether every registered detector is nsysan's own, so that :func:`code_identity` covers its
    code: a plugin's detector may change without nsysan knowing, so its maps are not kept."""
    return all(
        getattr(fn, "__module__", "").startswith("nsysan.")
        for spec in registered().values()
        for fn in (spec.run, spec.reduce)
        if fn is not None
    )


def _map_key(path: Path, index: int, ranks: pd.DataFrame, settings: Settings, steps: str | None, part: str) -> str:
    """Everything a map's result depends on besides the export's contents (the cache entry's key)."""
    return _key(code_identity(), str(path), str(index), json.dumps(settings, sort_keys=True),
                ranks.to_csv(index=False), repr(steps), part)  # fmt: skip


def _key(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


@functools.cache
def code_identity() -> str:
    """A hash of nsysan's source and the versions of Python, SQLite, numpy, pandas and pyarrow: a
    cached map result is used only by the code that computed it."""
    import sqlite3

    import numpy
    import pyarrow

    root = Path(__file__).resolve().parent
    versions = f"{sys.version} {sqlite3.sqlite_version} {numpy.__version__} {pd.__version__} {pyarrow.__version__}"
    digest = hashlib.sha256(versions.encode())
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def analyse_files(
    inputs: Sequence[str | os.PathLike[str]],
    settings: Settings,
    engine: Engine,
    profile_steps: str | None = None,
    step_pattern: str = DEFAULT_STEP_PATTERN,
    allow_mixed: bool = False,
) -> dict[str, Any]:
    """The report document of the job in ``inputs`` (files, directories, globs), mapped by ``engine``,
    its steps found by ``step_pattern``; with the diff profile (``profile``) when ``profile_steps``,
    its step pattern, is given (then it is the steps' pattern too). Exports whose processes announce
    the same rank are refused (:class:`~nsysan.ingest.ranks.RepeatedRanks`) unless ``allow_mixed``.

    Same document as :func:`nsysan.analysis.analyse` on ``load_trace(inputs)`` (plus
    :func:`nsysan.diff.build_profile`): the same functions run, only elsewhere.
    """
    skipped: list[str] = []
    paths = expand_inputs(inputs, skipped)
    cache = process_cache()
    # on a cluster an export of several processes maps a slice of them per task; in this process,
    # only when it is large (the same document either way: nsysan.analysis.slice_in_process)
    split = [not engine.in_process or slice_in_process(p) for p in paths]
    surveys = engine.map(survey_file, [(p, i, cache, s) for i, (p, s) in enumerate(zip(paths, split, strict=True))],
                         "ranks")  # fmt: skip
    ranks = assign_guessed([s.announced for s in surveys], [str(p) for p in paths], allow_mixed)
    tasks, owners = [], []
    for i, (p, survey) in enumerate(zip(paths, surveys, strict=True)):
        mine = ranks[ranks["export"] == i].assign(export=0).reset_index(drop=True)
        for part in survey.slices:
            tasks.append((p, i, mine, settings, cache, profile_steps or step_pattern, profile_steps is not None, part,
                          survey.run, graph_budget(len(paths), len(survey.slices))))  # fmt: skip
            owners.append(i)
    mapped = engine.map(map_file, tasks, "exports")
    results = [combine_slices([r for r, o in zip(mapped, owners, strict=True) if o == i]) for i in range(len(paths))]
    doc = reduce_job(results, ranks, skipped, settings)
    if profile_steps is not None:
        parts = [p for r in results for p in r.profiles]
        doc["profile"] = merge_profiles(parts, *summary_tables(doc["summary"]), profile_steps)
    return doc
