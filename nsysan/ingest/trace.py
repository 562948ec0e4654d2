"""The Trace: one distributed job, read from one or more nsys exports, as tidy frames.

Frames are read on first use and cached, so a detector that needs only kernels never pays for
NVTX. What each frame's columns are, and where SQL finds them, is declared once, in
:data:`nsysan.ingest.frames.FRAMES`; ``nccl_calls`` comes from :mod:`nsysan.ingest.nccl_calls`. Every frame has an ``export`` column (index into :attr:`Trace.exports`); frames with a
process also carry ``rank``. Times stay in each export's own clock (``start_ns``/``end_ns``);
:meth:`Trace.job_clock` gives the offset that puts several exports on one clock, and
:meth:`Trace.on_job_clock` applies it to a frame.

=================  ===================================================================
frame              columns (besides ``export`` and ``rank``)
=================  ===================================================================
kernels            pid device context stream correlation_id start_ns end_ns name short_name
                   grid_x..z block_x..z grid block (packed) graph_node_id graph_id nccl_kind nccl_op
                   nccl_reduction nccl_dtype nccl_algo nccl_proto
memcpy             pid device context stream correlation_id start_ns end_ns bytes copy_kind
                   src_kind dst_kind src_device dst_device graph_node_id
memset             pid device context stream correlation_id start_ns end_ns bytes value
                   graph_node_id
cuda_api           pid tid correlation_id start_ns end_ns name return_value api
nvtx               pid tid start_ns end_ns event_type domain text payload_int
osrt               pid tid start_ns end_ns name
nccl_calls         pid tid start_ns end_ns call comm_id bytes peer nranks comm_rank
overhead           pid tid start_ns end_ns name overhead_type correlation_id source
sync               pid device context stream correlation_id start_ns end_ns sync_type
                   event_id event_sync_id
cuda_events        pid device context stream correlation_id event_id event_sync_id timestamp_ns
graph_nodes        pid tid start_ns end_ns name graph_node_id original_graph_node_id
graph_launches     pid device stream correlation_id start_ns end_ns graph_id graph_exec_id
processes          global_pid pid name
threads            pid tid name
devices            device name bus_location sm_count total_memory uuid compute_major/minor
ranks              pid process rank local_rank world_size rank_source
=================  ===================================================================
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from nsysan.arrays import distinct
from nsysan.errors import InputError
from nsysan.ingest import frames
from nsysan.ingest.cache import FrameCache, process_cache
from nsysan.ingest.export import NsysExport
from nsysan.ingest.inputs import expand_inputs
from nsysan.ingest.nccl import NCCL_COLUMNS, classify_kernels
from nsysan.ingest.nccl_calls import read_nccl_calls
from nsysan.ingest.ranks import identify_ranks
from nsysan.ingest.slices import ProcessSlice
from nsysan.ingest.tables import find_table, has_cuda_data


@dataclass(frozen=True)
class ExportInfo:
    index: int
    path: Path
    nsys_version: str
    schema_version: str
    session_start_utc_ns: int | None
    has_cuda_data: bool


_INT64_MAX = 2**63 - 1
# The kernel columns a report reads: the first request for any of them reads them all, so the
# largest table is scanned once rather than once per consumer (overview, then each detector).
_READ_TOGETHER = frozenset(
    {"pid", "device", "stream", "correlation_id", "start_ns", "end_ns", "name", "short_name", "grid", "block",
     "graph_node_id"}
)  # fmt: skip
# Frames of the whole export, not of a process: no rank to attach.
_WITHOUT_RANK = frozenset({"processes", "devices"})


class Trace:
    """One job made of one or more exports. Use :func:`load_trace` to build it."""

    def __init__(
        self,
        exports: list[NsysExport],
        input_notes: Iterable[str] = (),
        cache: FrameCache | None = None,
        ranks: pd.DataFrame | None = None,
        owns_exports: bool = True,
        runs: list[int] | None = None,
        allow_mixed: bool = False,
    ) -> None:
        self._exports = exports
        self.allow_mixed = allow_mixed  # processes announcing the same rank renumbered, not refused
        # per export, its run length when measured elsewhere: a slice of an export's processes
        # is judged against the whole export's run (nsysan.detect.common.run_ns)
        self.known_runs = runs
        self._cache = cache
        self._owns_exports = owns_exports
        if ranks is not None:  # the job's rank table, decided across exports this trace may not hold
            self.__dict__["ranks"] = ranks
        self.input_notes = list(input_notes)
        self._kernel_cache: pd.DataFrame | None = None
        self._frames: dict[str, pd.DataFrame] = {}
        self._launches: dict[tuple[int, str], pd.DataFrame] = {}  # wide launch-call reads, by export and ids
        self._api: dict[tuple[int, tuple[str, ...]], pd.DataFrame] = {}  # narrow reads of every call, by columns
        self.exports = [
            ExportInfo(
                index=i,
                path=x.path,
                nsys_version=x.meta.nsys_version,
                schema_version=x.meta.schema_version,
                session_start_utc_ns=x.meta.session_start_utc_ns,
                has_cuda_data=has_cuda_data(x),
            )
            for i, x in enumerate(exports)
        ]

    def close(self) -> None:
        if self._owns_exports:
            for x in self._exports:
                x.close()

    def export_alone(self, index: int, part: ProcessSlice | None = None, run: int | None = None) -> Trace:
        """Export ``index`` as a trace of its own, as the map stage of :mod:`nsysan.analysis` sees
        it on a worker: its frames read afresh (and dropped with it), its ranks from this job's
        table, its export index 0; with ``part``, only that slice of its processes (see
        :mod:`nsysan.ingest.slices`), whose findings are weighed against ``run``, the export's
        run length. Closing it leaves the export open for this trace."""
        ranks = self.ranks[self.ranks["export"] == index].assign(export=0)
        if part is None or part.whole:
            return Trace([self._exports[index]], cache=self._cache, ranks=ranks.reset_index(drop=True),
                         owns_exports=False)  # fmt: skip
        ranks = ranks[part.holds(ranks["pid"].to_numpy(dtype=np.int64))].reset_index(drop=True)
        runs = None if run is None else [run]
        return Trace([NsysExport(self._exports[index].path, part)], cache=self._cache, ranks=ranks, runs=runs)

    def export_slices(self, index: int) -> list[ProcessSlice]:
        """How export ``index`` is mapped: its groups of processes that share no GPU (see
        :meth:`NsysExport.process_slices`)."""
        return self._exports[index].process_slices()

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, x: NsysExport, name: str, reader: Callable[[NsysExport], pd.DataFrame]) -> pd.DataFrame:
        """``reader(x)``, through the frame cache when this trace has one (``name`` keys the read)."""
        if self._cache is None:
            return reader(x)
        return self._cache.read(x, name + x.part.tag, functools.partial(reader, x))

    def _gather(
        self, reader: Callable[[NsysExport], pd.DataFrame], with_rank: bool = True, name: str = ""
    ) -> pd.DataFrame:
        parts = []
        for i, x in enumerate(self._exports):
            df = self._read(x, name, reader) if name else reader(x)
            df.insert(0, "export", i)
            parts.append(df)
        df = frames.concat_frames(parts)
        df["export"] = df["export"].astype("int64")
        if with_rank and "pid" in df.columns:
            df["rank"] = self.rank_of(df["export"], df["pid"])
        return df

    def rank_of(self, export: pd.Series, pid: pd.Series) -> pd.api.extensions.ExtensionArray:
        """The rank of each (export, process); missing where the process is no rank's."""
        ranks = self.ranks
        known = pd.Index(_process_key(ranks["export"], ranks["pid"]))
        where = known.get_indexer(_process_key(export, pid))
        return ranks["rank"].astype("Int64").array.take(where, allow_fill=True)

    @functools.cached_property
    def ranks(self) -> pd.DataFrame:
        return identify_ranks(self._exports, self.allow_mixed)

    @property
    def kernels(self) -> pd.DataFrame:
        """Every kernel column; see :meth:`kernel_columns` to read only some."""
        return self.kernel_columns(frames.KERNEL_SOURCES)

    @property
    def kernel_columns_read(self) -> list[str]:
        """The kernel columns read from the exports so far (for benchmarks and curiosity)."""
        cache = self._kernel_cache
        return [c for c in frames.KERNEL_SOURCES if cache is not None and c in cache]

    def kernel_columns(self, columns: Iterable[str]) -> pd.DataFrame:
        """Kernels with just ``columns`` (plus ``export``, and what derives from them: ``rank``
        from ``pid``, the NCCL columns from ``short_name``).

        Kernels are the one table with millions of rows, so columns are read on first request and
        kept: a second caller asking for more reads only the columns it adds.
        """
        wanted = [c for c in frames.KERNEL_SOURCES if c in set(columns)]
        cache = self._kernel_cache
        missing = [c for c in wanted if cache is None or c not in cache]
        if _READ_TOGETHER.intersection(missing):
            missing = [
                c
                for c in frames.KERNEL_SOURCES
                if c in missing or (c in _READ_TOGETHER and (cache is None or c not in cache))
            ]
        if missing:
            reader = functools.partial(frames.read_frame, frame="kernels", columns=missing)
            key = "kernels." + hashlib.sha256(" ".join(missing).encode()).hexdigest()[:16]
            part = self._gather(reader, with_rank="pid" in missing, name=key)
            if "short_name" in missing:
                nccl = classify_kernels(part["short_name"])
                for column in nccl.columns:
                    part[column] = nccl[column].array
            if cache is None:
                cache = part
            else:
                for column in part.columns.difference(cache.columns):
                    cache[column] = part[column].array
            self._kernel_cache = cache
        assert cache is not None, "kernel_columns needs at least one kernel column"
        derived = (["rank"] if "pid" in wanted else []) + (list(NCCL_COLUMNS) if "short_name" in wanted else [])
        return cache[["export", *wanted, *derived]]

    def _frame(self, name: str) -> pd.DataFrame:
        """A frame of :data:`~nsysan.ingest.frames.FRAMES` (or ``nccl_calls``), read on first use and kept."""
        if name not in self._frames:
            reader = read_nccl_calls if name == "nccl_calls" else functools.partial(frames.read_frame, frame=name)
            self._frames[name] = self._gather(reader, with_rank=name not in _WITHOUT_RANK, name=name)
        return self._frames[name]

    @property
    def memcpy(self) -> pd.DataFrame:
        return self._frame("memcpy")

    @property
    def memset(self) -> pd.DataFrame:
        return self._frame("memset")

    @property
    def cuda_api(self) -> pd.DataFrame:
        return self._frame("cuda_api")

    def launch_calls(self, kernels: pd.DataFrame, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The CUDA API calls that launched ``kernels``: cuda_api rows with their correlation ids
        (every column, or ``export``, ``pid``, ``correlation_id`` and ``columns``: a million
        launches need not carry a rank and an API label each).

        Uses the cuda_api frame when it is loaded; otherwise reads only the matching rows. With
        ``columns``, and ``kernels`` launched by at least half of an export's calls (compute kernels
        are most launches), that export's calls are read whole and picked in numpy: SQLite's
        ``IN`` over a million ids cost more than reading every row (0.73 s against 0.27-0.55 s
        for 1M launches here).
        """
        keys = ["export", "pid", "correlation_id"]
        if "cuda_api" in self._frames:
            calls = self.cuda_api if columns is None else self.cuda_api[[*keys, *columns]]
            return calls.merge(kernels[keys].drop_duplicates(), on=keys)
        export = kernels["export"].to_numpy()
        read_columns = None if columns is None else ["pid", "correlation_id", *columns]

        def matching(x: NsysExport) -> pd.DataFrame:
            index = self._exports.index(x)
            wanted = kernels["correlation_id"][export == index].dropna().astype("int64").to_numpy()
            if read_columns is not None and 2 * len(wanted) >= (  # a kernel has one launch, at most
                self.count_in_export(index, "runtime") + self.count_in_export(index, "driver")
            ):
                every = self._api_of(index, tuple(read_columns))
                return every[every["correlation_id"].isin(wanted)].reset_index(drop=True)
            unique = distinct(wanted)
            read = functools.partial(frames.read_frame, frame="cuda_api", columns=read_columns,
                                     correlation_ids=unique)  # fmt: skip
            digest = hashlib.sha256(unique.tobytes() + " ".join(read_columns or []).encode()).hexdigest()[:16]
            if read_columns is not None:  # a narrow read: one consumer (the slowdown detector)
                return self._read(x, f"cuda_api.launches.{digest}", read)
            # every column of the NCCL kernels' launches: the overview, the diff profile and the
            # ordering detector each ask for them, so they are read once (a few rows per NCCL kernel)
            if (index, digest) not in self._launches:
                self._launches[index, digest] = self._read(x, f"cuda_api.launches.{digest}", read)
            return self._launches[index, digest].copy()

        return self._gather(matching, with_rank=columns is None)

    def _api_of(self, index: int, columns: tuple[str, ...]) -> pd.DataFrame:
        """Every CUDA API call of export ``index`` with just ``columns``, read once per set of
        columns and kept: the slowdown detector's positions, the steps and the attribution's host
        timeline each need every launch of a million-kernel export, and SQLite reads it once."""
        key = (index, columns)
        if key not in self._api:
            x = self._exports[index]
            read = functools.partial(frames.read_frame, frame="cuda_api", columns=columns)
            name = "cuda_api." + hashlib.sha256(" ".join(columns).encode()).hexdigest()[:16]
            self._api[key] = self._read(x, name, read)
        return self._api[key]

    def calls_named(self, patterns: tuple[str, ...]) -> pd.DataFrame:
        """The CUDA API calls whose names match one of the SQL LIKE ``patterns`` (every column but
        the return value), read in SQL: a few among millions of launches."""
        read = functools.partial(frames.read_frame, frame="cuda_api", names_like=patterns,
                                 columns=("pid", "tid", "correlation_id", "start_ns", "end_ns", "name"))  # fmt: skip
        key = "cuda_api.named." + hashlib.sha256("\0".join(patterns).encode()).hexdigest()[:16]
        return self._gather(lambda x: self._read(x, key, read), with_rank=False)

    def api_calls(self, columns: Sequence[str]) -> pd.DataFrame:
        """Every CUDA runtime and driver call with ``export``, ``pid`` and ``columns`` (no rank: a
        million calls need not carry one), in each export's row order."""
        wanted = tuple(dict.fromkeys(["pid", *columns]))
        parts = []
        for i in range(len(self._exports)):
            df = self._api_of(i, wanted)
            parts.append(df.assign(export=np.int64(i))[["export", *wanted]])
        return frames.concat_frames(parts)

    @property
    def nvtx(self) -> pd.DataFrame:
        return self._frame("nvtx")

    @property
    def osrt(self) -> pd.DataFrame:
        """OS runtime calls (``nsys profile --trace=osrt``): pid tid start_ns end_ns name."""
        return self._frame("osrt")

    @property
    def nccl_calls(self) -> pd.DataFrame:
        """NCCL API calls from NCCL's NVTX ranges, with communicator and size where the export has
        them (see :func:`nsysan.ingest.nccl_calls.nccl_payload_status` for why they may not)."""
        return self._frame("nccl_calls")

    @property
    def overhead(self) -> pd.DataFrame:
        return self._frame("overhead")

    @property
    def sync(self) -> pd.DataFrame:
        return self._frame("sync")

    @property
    def cuda_events(self) -> pd.DataFrame:
        return self._frame("cuda_events")

    @property
    def graph_nodes(self) -> pd.DataFrame:
        return self._frame("graph_nodes")

    @property
    def graph_launches(self) -> pd.DataFrame:
        return self._frame("graph_launches")

    @property
    def processes(self) -> pd.DataFrame:
        return self._frame("processes")

    @property
    def threads(self) -> pd.DataFrame:
        return self._frame("threads")

    @property
    def devices(self) -> pd.DataFrame:
        return self._frame("devices")

    def audit_times(self) -> None:
        """Judge the timestamps of every table no reader has read yet (one SQL scan each), so that
        :meth:`dropped_rows` covers tables only a detector reads, whenever it runs."""
        for x in self._exports:
            # what the audit judges depends on what reads judged already: that set keys the entry
            judged = " ".join(sorted(set(x.time_drops) | set(x.partial_time_drops)))
            self._read(x, "audit." + hashlib.sha256(judged.encode()).hexdigest()[:16], _audit)

    def dropped_rows(self) -> pd.DataFrame:
        """Rows the readers left out or repaired so far: (export, what, reason, rows)."""
        rows = [
            {"export": i, "what": what, "reason": reason, "rows": int(n)}
            for i, x in enumerate(self._exports)
            for (what, reason), n in sorted(x.dropped_counts().items())
            if n
        ]
        return pd.DataFrame(rows, columns=["export", "what", "reason", "rows"])

    def count_in_export(self, index: int, role: str) -> int:
        """Rows of a table role in one export, counted in SQL without loading the frame."""
        x = self._exports[index]
        table = find_table(x, role)
        return x.count(table) if table else 0

    def job_clock(self) -> pd.Series:
        """Per export, the ns to add to its timestamps to put it on the earliest export's clock.

        nsys timestamps count from each session's start; the session's UTC start time aligns
        exports captured separately (one per rank). Exports without one get offset 0.
        """
        return job_clock_offsets([e.session_start_utc_ns for e in self.exports])

    def on_job_clock(self, frame: pd.DataFrame, columns: Sequence[str] = ("start_ns", "end_ns")) -> pd.DataFrame:
        """A copy of ``frame`` with ``columns`` moved onto the job clock: each row shifted by its
        export's :meth:`job_clock` offset. Columns come back int64 (Int64 where a row has no time).

        Offsets stay below 2**62 and readers' times below 2**56, so the sum fits; a frame built
        otherwise is refused rather than wrapped around.
        """
        shift = frame["export"].map(self.job_clock()).fillna(0).astype("int64")
        out = frame.copy()
        for column in columns:
            values = out[column]
            times = values.astype("Int64") if values.isna().any() else values.astype("int64")
            latest = times.max()
            if len(times) and pd.notna(latest) and int(latest) > _INT64_MAX - int(shift.max()):
                raise InputError(f"{column}: times beyond {_INT64_MAX - int(shift.max())} ns do not fit the job clock")
            out[column] = times + shift.to_numpy()
        return out


def job_clock_offsets(session_starts: Sequence[int | None]) -> pd.Series:
    """Per export, the ns to add to its timestamps to put it on the earliest export's clock
    (0 for exports without a session start). See :meth:`Trace.job_clock`."""
    starts = pd.Series(list(session_starts), dtype="Int64")
    if starts.isna().all():
        return pd.Series(0, index=starts.index, dtype="int64")
    offsets: pd.Series = (starts - starts.min()).fillna(0).astype("int64")
    return offsets


def _audit(x: NsysExport) -> pd.DataFrame:
    """The timestamp audit of one export, as a read the frame cache can keep (it notes, reads nothing)."""
    frames.audit_times(x)
    return pd.DataFrame({"audited": [1]})


def _process_key(export: pd.Series, pid: pd.Series) -> np.ndarray:
    """One int64 per (export, pid): pids fit in 24 bits."""
    key: np.ndarray = export.to_numpy(dtype=np.int64) << 32 | pid.to_numpy(dtype=np.int64)
    return key


def load_trace(
    inputs: Iterable[str | os.PathLike[str]],
    cache: FrameCache | Literal["process"] | None = "process",
    ranks: pd.DataFrame | None = None,
    allow_mixed: bool = False,
) -> Trace:
    """Open every export named by ``inputs`` (files, directories, globs) as one Trace.

    ``cache``: where frames read from the exports are kept for the next load (see
    :mod:`nsysan.ingest.cache`); by default the process's cache, which is off unless configured.
    ``ranks``: the rank table when it was decided elsewhere (a worker reading one export of a job).
    ``allow_mixed``: analyse exports whose processes announce the same rank (otherwise refused when
    the ranks are read: two captures given as one job).

    Raises an :class:`~nsysan.errors.InputError` naming the file for anything unusable,
    including an export with neither CUDA tables nor NVTX events (nothing to analyse).
    """
    exports: list[NsysExport] = []
    skipped: list[str] = []
    try:
        for path in expand_inputs(inputs, skipped):
            x = NsysExport(path)
            exports.append(x)
            if not has_cuda_data(x) and not x.has_rows(find_table(x, "nvtx")):
                raise InputError(
                    f"{path}: nsys export has no CUDA activity and no NVTX events, nothing to analyse "
                    f"(nsys {x.meta.nsys_version or 'version unknown'}); capture with "
                    "`nsys profile --trace=cuda,nvtx,osrt` or `nsysan capture`"
                )
    except BaseException:
        for x in exports:
            x.close()
        raise
    return Trace(
        exports,
        input_notes=skipped,
        cache=process_cache() if cache == "process" else cache,
        ranks=ranks,
        allow_mixed=allow_mixed,
    )
