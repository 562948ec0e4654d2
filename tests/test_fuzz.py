"""Hostile exports: a seeded mutator over the bundled samples and the real traces.

Each case damages a copy of an export the way an attacker or an unlucky disk would (byte flips,
truncation, zeroed pages; dropped or renamed tables and columns; NULLs, text, NaN, +-2**63,
``end < start``, dangling string ids, BLOBs and invalid UTF-8 in columns; odd files in an input
directory; ids of 0, -1 or NULL; thousands of NVTX pushes never popped; a view in place of a table;
an export left in WAL mode) and runs ``nsysan report`` on it. Whatever the damage, the run must end with exit 0
or 2, one line on stderr for 2, no traceback or warning, within the time limit, with the input's
bytes unchanged; and for exit 0 every duration >= 0, every share within [0, 100], every count >= 0.

CI runs a few hundred cases; ``NSYSAN_FUZZ_CASES=5000 python3 -m pytest -s tests/test_fuzz.py``
runs more (``NSYSAN_FUZZ_SEED`` picks another sequence). The table by class is printed with -s.

Cases run in long-lived worker processes that call the CLI's ``main`` in-process (a fresh
interpreter per case would spend most of the time importing pandas); a worker that does not
answer in time is killed, the case counted as a hang, and a fresh worker started.
"""

from __future__ import annotations

import collections
import hashlib
import json
import lzma
import os
import random
import select
import shutil
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fixtures.samples import SAMPLES_DIR
from tests.conftest import REPO, realtraces_dir

CASES = int(os.environ.get("NSYSAN_FUZZ_CASES", "240"))
SEED = int(os.environ.get("NSYSAN_FUZZ_SEED", "20261122"))
CASE_TIMEOUT_S = float(os.environ.get("NSYSAN_FUZZ_TIMEOUT", "60"))
WORKERS = max(1, min(4, (os.cpu_count() or 2)))
# Real traces are larger and slower to copy: at most this many of them per run's cases.
REAL_SHARE = 0.3

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# Runs one case per stdin line ({"argv": [...]}) through nsysan's console entry point and answers
# one JSON line: exit code, stdout, stderr. Warnings are reset to the interpreter's defaults before
# each case so that a warning shows every time it happens, as in a fresh process.
_WORKER = r"""
import contextlib, io, json, sys, warnings
from nsysan import cli
defaults = warnings.filters[:]
for line in sys.stdin:
    case = json.loads(line)
    warnings.filters[:] = defaults
    warnings._filters_mutated()
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["nsysan", *case["argv"]]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            import traceback
            traceback.print_exc()
            code = 99
    sys.__stdout__.write(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    sys.__stdout__.flush()
"""


class Worker:
    """One long-lived nsysan process fed cases on stdin."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "NSYSAN_DEBUG"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env,
        )  # fmt: skip

    def run(self, argv: list[str], timeout: float) -> dict | None:
        """The case's result, or None when it did not finish in ``timeout`` s (the worker is killed)."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"argv": argv}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            return None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            return {"code": 99, "stdout": "", "stderr": "worker died"}
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- the mutator ------------------------------------------------------------------------------

CLASSES = (
    "byte flips", "truncation", "zeroed pages", "dropped table", "renamed table", "dropped column",
    "renamed column", "NULLs", "text in numbers", "NaN and reals", "+-2^63", "end < start",
    "dangling string ids", "BLOBs", "invalid UTF-8", "hostile metadata", "odd files in directory",
    "identity values", "deep NVTX nesting", "views for tables", "WAL mode",
)  # fmt: skip
_IDENTITY_COLUMNS = ("globalPid", "globalTid", "deviceId", "streamId", "contextId", "correlationId", "domainId")

# Tables nsysan reads, mutated more often than the rest.
_READ_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS", "StringIds", "PROCESSES",
    "ThreadNames", "TARGET_INFO_GPU", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT", "EXPORT_META_DATA",
    "PROFILER_OVERHEAD", "CUPTI_ACTIVITY_KIND_OVERHEAD", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_CUDA_EVENT", "CUDA_GRAPH_EVENTS", "CUDA_GRAPH_NODE_EVENTS",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "ENUM_NSYS_EVENT_TYPE", "ENUM_CUPTI_OVERHEAD_TYPE",
    "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUPTI_SYNC_TYPE",
)  # fmt: skip
_ID_COLUMNS = ("shortName", "demangledName", "nameId", "textId", "mangledName")


@dataclass
class Case:
    index: int
    klass: str
    base: str
    detail: str = ""
    argv: list[str] = field(default_factory=list)
    inputs: list[Path] = field(default_factory=list)


def _tables(con: sqlite3.Connection) -> dict[str, list[str]]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {n: [c[1] for c in con.execute(f'PRAGMA table_info("{n}")')] for n in names}


def _pick_table(
    rng: random.Random, tables: dict[str, list[str]], con: sqlite3.Connection, with_rows: bool = True
) -> str:
    read = [t for t in _READ_TABLES if t in tables]
    if with_rows:
        read = [t for t in read if con.execute(f'SELECT EXISTS (SELECT 1 FROM "{t}")').fetchone()[0]] or read
    return rng.choice(read if read and rng.random() < 0.9 else list(tables))


def _exec(con: sqlite3.Connection, table: str, sql: str) -> None:
    """Run an UPDATE even where nsys's DDL forbids the value (NOT NULL, CHECK): a damaged file
    does not honour its schema, so the table is rebuilt without constraints first."""
    try:
        con.execute(sql)
    except sqlite3.IntegrityError:
        con.execute(f'CREATE TABLE "fuzz_tmp" AS SELECT * FROM "{table}"')
        con.execute(f'DROP TABLE "{table}"')
        con.execute(f'ALTER TABLE "fuzz_tmp" RENAME TO "{table}"')
        con.execute(sql)


def _where(rng: random.Random) -> str:
    return rng.choice(["", "WHERE rowid % 2 = 0", "WHERE rowid % 7 = 1", "WHERE rowid = (SELECT min(rowid) FROM {t})"])


def _update(con: sqlite3.Connection, rng: random.Random, tables: dict[str, list[str]], value: str,
            columns: tuple[str, ...] | None = None) -> str:  # fmt: skip
    table = _pick_table(rng, tables, con)
    cols = [c for c in tables[table] if columns is None or c in columns] or tables[table]
    column = rng.choice(cols)
    where = _where(rng).format(t=f'"{table}"')
    _exec(con, table, f'UPDATE "{table}" SET "{column}" = {value} {where}')
    return f"{table}.{column} = {value} {where}".strip()


def _sql_mutation(path: Path, klass: str, rng: random.Random) -> str:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = DELETE")
    tables = _tables(con)
    try:
        if klass == "dropped table":
            table = _pick_table(rng, tables, con, with_rows=False)
            con.execute(f'DROP TABLE "{table}"')
            return table
        if klass == "renamed table":
            table = _pick_table(rng, tables, con, with_rows=False)
            new = rng.choice([table.lower(), table + "_old", "x" + table])
            if new == table or new in tables:
                new = table + "_renamed"
            con.execute(f'ALTER TABLE "{table}" RENAME TO "fuzz_tmp"')  # via a third name: case-only renames
            con.execute(f'ALTER TABLE "fuzz_tmp" RENAME TO "{new}"')
            return f"{table} -> {new}"
        if klass == "dropped column":
            table = _pick_table(rng, tables, con, with_rows=False)
            column = rng.choice(tables[table])
            try:
                con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
            except sqlite3.OperationalError:  # the only column, or part of a key: drop the table's rows instead
                con.execute(f'DELETE FROM "{table}"')
            return f"{table}.{column}"
        if klass == "renamed column":
            table = _pick_table(rng, tables, con, with_rows=False)
            column = rng.choice(tables[table])
            new = rng.choice([column.upper(), column.lower(), column + "_x", column.swapcase()])
            if new != column:
                con.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{column}" TO "{new}"')
            return f"{table}.{column} -> {new}"
        if klass == "NULLs":
            return _update(con, rng, tables, "NULL")
        if klass == "text in numbers":
            return _update(con, rng, tables, rng.choice(["'abc'", "''", "'12x'", "' 42'", "'1e3'"]))
        if klass == "NaN and reals":
            return _update(con, rng, tables, rng.choice(["1e999", "-1e999", "0.5", "1e300", "'NaN'", "-0.0"]))
        if klass == "+-2^63":
            return _update(con, rng, tables, rng.choice([str(INT64_MAX), str(INT64_MIN), "9223372036854775808",
                                                         str(2**62), str(-1), str(2**56 + 1)]))  # fmt: skip
        if klass == "end < start":
            table = rng.choice([t for t in tables if {"start", "end"} <= set(tables[t])] or list(tables))
            if {"start", "end"} <= set(tables[table]):
                shift = rng.choice([1, 1000, 10**9, 2**62])
                where = _where(rng).format(t=f'"{table}"')
                _exec(con, table, f'UPDATE "{table}" SET "end" = "start" - {shift} {where}')
                return f"{table} end = start - {shift} {where}"
            return "no timed table"
        if klass == "dangling string ids":
            if rng.random() < 0.5:
                cut = rng.choice(["WHERE id % 2 = 0", "", "WHERE value LIKE '%nccl%'", "WHERE value LIKE 'c%'"])
                con.execute(f"DELETE FROM StringIds {cut}")
                return f"StringIds deleted {cut}"
            return _update(con, rng, tables, rng.choice(["1000000007", "-5", "0"]), _ID_COLUMNS)
        if klass == "BLOBs":
            return _update(con, rng, tables, rng.choice(["X'00ff10'", "randomblob(16)", "X''", "X'6e63636c'"]))
        if klass == "invalid UTF-8":
            value = rng.choice(["CAST(X'66ff6f' AS TEXT)", "CAST(X'c3' AS TEXT)", "CAST(X'6e6363ff6c' AS TEXT)"])
            if rng.random() < 0.5 and "StringIds" in tables:
                _exec(con, "StringIds", f"UPDATE StringIds SET value = {value} WHERE id % 3 = 0")
                return f"StringIds.value = {value}"
            return _update(con, rng, tables, value)
        if klass == "identity values":  # ids nsys itself writes as 0 or -1 when unknown, or none at all
            value = rng.choice(["0", "-1", "NULL"])
            table = _pick_table(
                rng, {t: c for t, c in tables.items() if set(c) & set(_IDENTITY_COLUMNS)} or tables, con
            )
            column = rng.choice([c for c in tables[table] if c in _IDENTITY_COLUMNS] or tables[table])
            where = rng.choice(["", "WHERE rowid % 2 = 0"])
            _exec(con, table, f'UPDATE "{table}" SET "{column}" = {value} {where}')
            return f"{table}.{column} = {value} {where}".strip()
        if klass == "deep NVTX nesting":  # pushes never popped (an instrumentation slip), nested thousands deep
            if "NVTX_EVENTS" not in tables or not {"start", "end", "eventType", "globalTid", "text"} <= set(
                tables["NVTX_EVENTS"]
            ):
                return "no NVTX table"
            depth = rng.choice([2000, 20000])
            tid = "(SELECT globalTid FROM NVTX_EVENTS WHERE globalTid IS NOT NULL LIMIT 1)"
            if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and "globalTid" in tables["CUPTI_ACTIVITY_KIND_RUNTIME"]:
                tid = f"COALESCE((SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME LIMIT 1), {tid})"
            _exec(con, "NVTX_EVENTS",
                  f"WITH RECURSIVE r(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM r WHERE x < {depth - 1}) "
                  'INSERT INTO NVTX_EVENTS(start, "end", eventType, globalTid, text) '
                  f"SELECT (SELECT IFNULL(min(start), 0) FROM NVTX_EVENTS) + x, "
                  f'(SELECT IFNULL(max("end"), 0) FROM NVTX_EVENTS) + {depth} - x, 59, {tid}, \'r\' FROM r')  # fmt: skip
            return f"{depth} nested pushes"
        if klass == "views for tables":  # a table nsysan reads replaced by a view (or given a trigger) of it
            table = _pick_table(rng, tables, con, with_rows=False)
            con.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_real"')
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "{table}_real"')
            return f"{table} is a view"
        if klass == "WAL mode":  # written by a tool that left the export in WAL mode
            con.commit()
            con.execute("PRAGMA journal_mode = WAL")
            if rng.random() < 0.5 and "StringIds" in tables:
                con.execute("UPDATE StringIds SET value = value WHERE id % 5 = 0")  # a commit in the WAL
            return "journal_mode = WAL"
        if klass == "hostile metadata":
            choice = rng.randrange(4)
            if choice == 0 and "TARGET_INFO_SESSION_START_TIME" in tables:
                value = rng.choice([str(INT64_MAX), str(INT64_MIN), "9223372036854775808", "'x'", "X'00'", "NULL"])
                _exec(
                    con,
                    "TARGET_INFO_SESSION_START_TIME",
                    f"UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = {value}",
                )
                return f"utcEpochNs = {value}"
            if choice == 1 and "NVTX_EVENTS" in tables:
                text = rng.choice(["nsysan rank=99999999999999999999", "MPI Rank 18446744073709551616",
                                   "nsysan rank=3 local_rank=99999999999999999999 world_size=-1"])  # fmt: skip
                _exec(con, "NVTX_EVENTS", f"UPDATE NVTX_EVENTS SET text = '{text}' WHERE eventType = 34")
                return f"rank mark {text!r}"
            if choice == 2:
                enums = [t for t in tables if t.startswith("ENUM_")]
                if enums:
                    table = rng.choice(["ENUM_NSYS_EVENT_TYPE"] * 3 + enums)
                    table = table if table in tables else enums[0]
                    value = rng.choice(["'x'", "1.5", "NULL", "X'01'", str(INT64_MAX)])
                    _exec(con, table, f'UPDATE "{table}" SET id = {value} WHERE rowid % 2 = 0')
                    return f"{table}.id = {value}"
            if "META_DATA_EXPORT" in tables:
                _exec(con, "META_DATA_EXPORT", "UPDATE META_DATA_EXPORT SET value = X'ff00'")
                return "META_DATA_EXPORT.value = BLOB"
            return "nothing to change"
        raise ValueError(klass)
    finally:
        con.commit()
        con.close()


def _file_mutation(path: Path, klass: str, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    page = struct.unpack(">H", bytes(data[16:18]))[0] if len(data) >= 18 else 4096
    page = 65536 if page == 1 else page or 4096
    if klass == "byte flips":
        n = rng.choice([1, 2, 8, 64])
        for _ in range(n):
            i = rng.randrange(len(data)) if rng.random() < 0.7 else rng.randrange(min(len(data), 2 * page))
            data[i] ^= 1 << rng.randrange(8)
        detail = f"{n} bits"
    elif klass == "truncation":
        cut = rng.choice([rng.randrange(len(data)), len(data) - page, rng.randrange(200)])
        data = data[: max(cut, 0)]
        detail = f"to {len(data)} bytes"
    else:
        pages = max(1, len(data) // page)
        n = rng.choice([1, 1, 2, 3])
        hit = sorted(rng.randrange(pages) for _ in range(n))
        for p in hit:
            data[p * page : (p + 1) * page] = bytes(len(data[p * page : (p + 1) * page]))
        detail = f"pages {hit}"
    path.write_bytes(bytes(data))
    return detail


def _odd_directory(case_dir: Path, base: Path, rng: random.Random) -> tuple[list[str], str]:
    """A directory holding the export plus things named like exports that are not regular files."""
    d = case_dir / "job"
    d.mkdir()
    shutil.copy(base, d / "rank0.sqlite")
    odd = []
    kinds = rng.sample(["fifo", "dir", "devnull", "dangling", "empty"], k=rng.randint(1, 3))
    for kind in kinds:
        if kind == "fifo":
            os.mkfifo(d / "pipe.sqlite")
        elif kind == "dir":
            (d / "nested.sqlite").mkdir()
        elif kind == "devnull":
            (d / "null.sqlite").symlink_to("/dev/null")
        elif kind == "dangling":
            (d / "gone.sqlite").symlink_to(case_dir / "missing")
        else:
            (d / "empty.sqlite").write_bytes(b"")
        odd.append(kind)
    if rng.random() < 0.3:  # a FIFO given by name: refused, never opened
        os.mkfifo(case_dir / "given.sqlite")
        return [str(case_dir / "given.sqlite")], "fifo given by name"
    return [str(d)], "+".join(odd)


def make_case(index: int, rng: random.Random, bases: list[Path], case_dir: Path) -> Case:
    """Case ``index``: a damaged copy of one base export under ``case_dir`` and the argv to run."""
    klass = CLASSES[index % len(CLASSES)] if index < len(CLASSES) else rng.choice(CLASSES)
    base = rng.choice(bases)
    case = Case(index, klass, base.name)
    fmt = rng.choice(["json"] * 6 + ["terminal", "markdown", "html"])
    if klass == "odd files in directory":
        targets, case.detail = _odd_directory(case_dir, base, rng)
        case.inputs = [p for p in case_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    else:
        target = case_dir / "trace.sqlite"
        shutil.copy(base, target)
        if klass in ("byte flips", "truncation", "zeroed pages"):
            case.detail = _file_mutation(target, klass, rng)
        else:
            case.detail = _sql_mutation(target, klass, rng)
        targets, case.inputs = [str(target)], [target]
    case.argv = ["report", *targets, "--format", fmt]
    return case


# -- the verdict ------------------------------------------------------------------------------

_SHARE_KEYS = ("pct", "share")


def impossible_figures(doc: dict) -> list[str]:
    """Figures outside their physical range anywhere in a JSON report."""
    bad: list[str] = []

    def walk(value: object, key: str, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k), f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, key, f"{where}[{i}]")
        elif isinstance(value, bool) or value is None:
            return
        elif isinstance(value, (int, float)):
            if (
                (key.endswith("_ns") and not 0 <= value < 2**62)
                or (any(key.endswith(s) for s in _SHARE_KEYS) and not 0 <= value <= 100.000001)
                or (where.startswith(".summary") and key not in ("ratio",) and value < 0)
            ):
                bad.append(f"{where}={value}")
        elif isinstance(value, str) and key in ("kernel", "short_name", "name") and value in ("nan", "None", "<NA>"):
            bad.append(f"{where}={value!r}")

    walk(doc.get("summary", {}), "", ".summary")
    for i, f in enumerate(doc.get("findings", [])):
        walk(f, "", f".findings[{i}]")
    return bad


def verdict(case: Case, result: dict | None) -> str:
    """'ok' or what went wrong."""
    if result is None:
        return "hang"
    code, err = result["code"], result["stderr"]
    if code == 70:
        return "exit 70"
    if code not in (0, 2):
        return f"exit {code}"
    if "Traceback" in err:
        return "traceback"
    if code == 2:
        lines = err.strip().splitlines()
        if len(lines) != 1 or not lines[0].startswith("nsysan: error: ") or result["stdout"]:
            return "not one line"
        return "ok"
    if "Warning" in err:
        return "warning on stderr"
    if case.argv[-1] == "json":
        try:
            doc = json.loads(result["stdout"])
        except ValueError:
            return "bad JSON"
        if impossible_figures(doc):
            return "impossible figure"
    return "ok"


def _digest(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- the bases --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bases(realtraces: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    """(samples, real traces): every bundled sample, the real exports, and nsys-ai's decompressed here."""
    samples = sorted(SAMPLES_DIR.rglob("*.sqlite"))
    out = tmp_path_factory.mktemp("fuzz-real")
    real = list(realtraces.values())
    for f in sorted((realtraces_dir() / "nsys-ai").glob("*.sqlite.xz")):
        target = out / f.name.removesuffix(".xz")
        with lzma.open(f) as fin, target.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
        real.append(target)
    return samples, real


def run_fuzz(samples: list[Path], real: list[Path], n: int, seed: int, root: Path) -> list[tuple[Case, str, str]]:
    """Build and run ``n`` cases on a few workers; (case, verdict, stderr) for each."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for i in range(n):
        pool = real if real and rng.random() < REAL_SHARE else samples
        case_dir = root / f"case{i:05d}"
        case_dir.mkdir()
        cases.append(make_case(i, random.Random(rng.getrandbits(64)), pool, case_dir))
    results: list[tuple[Case, str, str]] = []
    lock = threading.Lock()
    queue = collections.deque(cases)

    def work() -> None:
        worker = Worker()
        while True:
            with lock:
                if not queue:
                    break
                case = queue.popleft()
            case_root = root / f"case{case.index:05d}"
            before, listing = _digest(case.inputs), _listing(case_root)
            result = worker.run(case.argv, CASE_TIMEOUT_S)
            if result is None:
                worker = Worker()
            v = verdict(case, result)
            if v == "ok" and (_digest(case.inputs) != before or _listing(case_root) != listing):
                v = "input modified"
            with lock:
                results.append((case, v, "" if result is None else result["stderr"][-2000:]))
            if v == "ok":
                shutil.rmtree(case_root, ignore_errors=True)
        worker.close()

    threads = [threading.Thread(target=work) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r[0].index)


def table(results: list[tuple[Case, str, str]]) -> str:
    """Outcomes by mutation class, as a Markdown table."""
    outcomes = ["ok", "exit 2", "exit 70", "hang", "impossible figure", "input modified", "other failure"]
    rows = collections.defaultdict(collections.Counter)
    for case, v, err in results:
        exit2 = v == "ok" and err.startswith("nsysan: error:")
        key = "exit 2" if exit2 else v if v in outcomes else "other failure"
        rows[case.klass][key] += 1
    lines = ["| class | cases | " + " | ".join(outcomes) + " |", "|---|---|" + "---|" * len(outcomes)]
    for klass in CLASSES:
        c = rows.get(klass, collections.Counter())
        lines.append(f"| {klass} | {sum(c.values())} | " + " | ".join(str(c[o]) for o in outcomes) + " |")
    total = collections.Counter()
    for c in rows.values():
        total.update(c)
    lines.append(f"| **all** | {sum(total.values())} | " + " | ".join(str(total[o]) for o in outcomes) + " |")
    return "\n".join(lines)


def test_fuzzed_exports_exit_0_or_2_cleanly(bases, tmp_path):
    samples, real = bases
    started = time.perf_counter()
    results = run_fuzz(samples, real, CASES, SEED, tmp_path)
    elapsed = time.perf_counter() - started
    print(f"\n{CASES} fuzz cases (seed {SEED}) in {elapsed:.0f} s on {WORKERS} workers\n{table(results)}")
    failures = [(c, v, err) for c, v, err in results if v != "ok"]
    for c, v, err in failures[:20]:
        print(f"case {c.index} [{c.klass}] {c.base} {c.detail!r}: {v}\n  argv: {c.argv}\n  {err.strip()[-600:]}")
    assert not failures, f"{len(failures)} of {len(results)} cases failed; see the table above"


def test_mutator_is_deterministic(tmp_path):
    samples = sorted(SAMPLES_DIR.rglob("*.sqlite"))
    details = []
    for attempt in range(2):
        root = tmp_path / str(attempt)
        root.mkdir()
        rng = random.Random(5)
        for i in range(len(CLASSES)):
            d = root / str(i)
            d.mkdir()
            c = make_case(i, random.Random(rng.getrandbits(64)), samples, d)
            details.append((c.klass, c.base, c.detail))
    half = len(details) // 2
    assert details[:half] == details[half:]
    assert {k for k, _, _ in details} == set(CLASSES)
