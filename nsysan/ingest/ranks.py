"""Which distributed rank each process of a job is, and how we know.

A job reaches us as one export per rank or one export holding several processes. In order of
trust, a process's rank comes from:

``nvtx``
    an NVTX mark or thread name such as ``nsysan rank=3 local_rank=1 world_size=8`` (what
    ``nsysan capture`` injects) or ``MPI Rank 3`` (what MPI profiling layers write);
``env``
    ``RANK`` / ``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK`` / ``SLURM_PROCID`` in the environment nsys
    recorded for the launched process, when the export holds a single active process;
``process order``
    a guess: the remaining active processes numbered in input order, then by pid.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from nsysan.errors import InputError
from nsysan.ingest.export import NsysExport
from nsysan.ingest.frames import decode_pid, nvtx_type_ids, read_frame
from nsysan.ingest.tables import find_table

RANK_COLUMNS = ("export", "pid", "process", "rank", "local_rank", "world_size", "rank_source")
# rank_source of a process whose announced rank another process had announced first (--allow-mixed)
RANK_TAKEN = "process order (its announced rank was taken)"

_RANK = re.compile(r"(?i)(?<![A-Za-z0-9_])(?:mpi\s+)?rank\s*[=:]?\s*(\d+)")
_LOCAL_RANK = re.compile(r"(?i)local_rank\s*[=:]\s*(\d+)")
_WORLD = re.compile(r"(?i)world_size\s*[=:]\s*(\d+)")
_ENV_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_ENV_LOCAL = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
_ENV_WORLD = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")

# Tables whose rows make a process part of the job (the PROCESSES table lists every process
# on the machine, kernel threads included).
_ACTIVE = {
    "kernels": "globalPid", "memcpy": "globalPid", "memset": "globalPid",
    "runtime": "globalTid", "driver": "globalTid", "nvtx": "globalTid",
}  # fmt: skip


def active_pids(x: NsysExport) -> np.ndarray:
    """Pids that launched CUDA work or wrote NVTX, sorted."""
    pids: set[int] = set()
    for role, column in _ACTIVE.items():
        table = find_table(x, role)
        if table is None or not x.has_columns(table, column):  # cut-down exports may lack it
            continue
        where = ""
        if role == "nvtx":  # domain bookkeeping alone does not make a process interesting
            skip = nvtx_type_ids(x, "domain_create", "domain_destroy")
            where = f" WHERE eventType NOT IN ({', '.join(map(str, skip))})"
        df = x.query(f"SELECT DISTINCT {column} AS g FROM {table}{where}")
        pids.update(int(p) for p in decode_pid(df["g"]))
    pids.discard(0)
    return np.array(sorted(pids), dtype=np.int64)


def _nvtx_hints(x: NsysExport) -> pd.DataFrame:
    """(pid, text) of NVTX marks and thread names, in time order: where ranks are announced."""
    table = find_table(x, "nvtx")
    if table is None:
        return pd.DataFrame({"pid": pd.Series(dtype="int64"), "text": pd.Series(dtype=object)})
    ids = nvtx_type_ids(x, "mark", "thread_name")
    registered = x.has_columns(table, "textId")
    text = "CAST(COALESCE(n.text, s.value) AS TEXT)" if registered else "CAST(n.text AS TEXT)"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if registered else ""
    df = x.query(
        f"SELECT n.globalTid AS g, {text} AS text FROM {table} n {join} "
        f"WHERE n.eventType IN ({', '.join(map(str, ids))}) ORDER BY n.start"
    )
    df["pid"] = decode_pid(df["g"])
    return df[["pid", "text"]].dropna()


# Larger numbers in a rank announcement are not a rank (and would not fit the Int64 columns).
_MAX_RANK = 2**31 - 1


def _first_int(pattern: re.Pattern[str], texts: pd.Series) -> pd.Series:
    values = pd.to_numeric(texts.str.extract(pattern, expand=False), errors="coerce")
    return values.where(values <= _MAX_RANK)


def _env_int(env: dict[str, str], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = env.get(key, "")
        if value.isdigit():
            return int(value)
    return None


def announced_ranks(x: NsysExport, index: int = 0) -> pd.DataFrame:
    """One row per active process of one export, with the rank it announced (NVTX or environment),
    NA where it announced none. Per export, so the map stage of a large job can read it on a worker;
    :func:`assign_guessed` then numbers the rest across the job."""
    rows = []
    pids = active_pids(x)
    if len(pids):
        procs = read_frame(x, "processes").dropna(subset=["pid"])
        names = dict(zip(procs["pid"].astype("int64"), procs["name"].fillna("").astype(str), strict=True))
        hints = _nvtx_hints(x)
        texts = hints["text"].astype(str)
        hints = hints.assign(
            rank=_first_int(_RANK, texts),
            local_rank=_first_int(_LOCAL_RANK, texts),
            world_size=_first_int(_WORLD, texts),
        )
        hints = hints.dropna(subset=["rank"]).drop_duplicates("pid", keep="first").set_index("pid")
        env = x.capture_env()
        for pid in pids:  # one per process
            row = {"export": index, "pid": int(pid), "process": names.get(int(pid), ""),
                   "rank": None, "local_rank": None, "world_size": None, "rank_source": None}  # fmt: skip
            if pid in hints.index:
                hint = hints.loc[pid]
                row.update(rank=hint["rank"], local_rank=hint["local_rank"],
                           world_size=hint["world_size"], rank_source="nvtx")  # fmt: skip
            elif len(pids) == 1 and _env_int(env, _ENV_RANK) is not None:
                row.update(rank=_env_int(env, _ENV_RANK), local_rank=_env_int(env, _ENV_LOCAL),
                           world_size=_env_int(env, _ENV_WORLD), rank_source="env")  # fmt: skip
            rows.append(row)
    df = pd.DataFrame(rows, columns=list(RANK_COLUMNS))
    return df.astype({"export": "int64", "pid": "int64"})


class RepeatedRanks(InputError):
    """Two processes announced the same rank: the exports are not one job (two captures mixed)."""


def assign_guessed(
    announced: list[pd.DataFrame], names: list[str] | None = None, allow_mixed: bool = False
) -> pd.DataFrame:
    """The job's rank table from every export's :func:`announced_ranks` (in input order): processes
    that announced no rank are numbered in input order, then by pid, skipping ranks that are taken.

    A rank announced by two processes means two jobs' exports were given together (a glob over two
    captures): :class:`RepeatedRanks`, naming where (``names``: each export's path), unless
    ``allow_mixed``, which numbers the later announcements as guessed ranks instead."""
    parts = [a for a in announced if len(a)]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(RANK_COLUMNS))
    if df.empty:
        return df.astype({"export": "int64", "pid": "int64"})
    df["rank"] = pd.to_numeric(df["rank"], errors="coerce").astype("Int64")
    repeated = df["rank"].notna() & df.duplicated("rank", keep="first")
    if repeated.any():
        if not allow_mixed:
            raise RepeatedRanks(_repeated_message(df, repeated, names))
        df["rank_source"] = df["rank_source"].astype(object)
        df.loc[repeated, "rank_source"] = RANK_TAKEN
        df.loc[repeated, "rank"] = pd.NA
    taken = set(df["rank"].dropna().astype(int))
    free = (r for r in range(len(df) + len(taken)) if r not in taken)
    missing = df["rank"].isna()
    if missing.any():
        df["rank"] = df["rank"].astype(object)
        df.loc[missing & df["rank_source"].isna(), "rank_source"] = "process order"
        df.loc[missing, "rank"] = [next(free) for _ in range(int(missing.sum()))]
    for column in ("rank", "local_rank", "world_size"):
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("Int64")
    return df.astype({"export": "int64", "pid": "int64"})


def _repeated_message(df: pd.DataFrame, repeated: pd.Series, names: list[str] | None) -> str:
    """Which ranks were announced twice, and by which export and process (the first three ranks)."""
    ranks = df.loc[repeated, "rank"].drop_duplicates()

    def where(row: pd.Series) -> str:
        export = names[int(row["export"])] if names and int(row["export"]) < len(names) else f"export {row['export']}"
        process = f" ({row['process']})" if row["process"] else ""
        return f"{export} pid {int(row['pid'])}{process}"

    told = []
    for rank in ranks.iloc[:3]:
        holders = df[df["rank"] == rank]
        told.append(f"rank {int(rank)} by " + " and ".join(where(r) for _, r in holders.iterrows()))
    more = f" (and {len(ranks) - 3} more ranks)" if len(ranks) > 3 else ""
    return (f"{len(ranks)} rank(s) announced by more than one process, so these exports are not one job (two captures given "
            f"together?): {'; '.join(told)}{more}. Give one capture's exports, or --allow-mixed to analyse them "
            "anyway with the repeats numbered as guessed ranks")  # fmt: skip


def identify_ranks(exports: list[NsysExport], allow_mixed: bool = False) -> pd.DataFrame:
    """One row per active process of every export: its rank and where that came from."""
    names = [str(x.path) for x in exports]
    return assign_guessed([announced_ranks(x, i) for i, x in enumerate(exports)], names, allow_mixed)
