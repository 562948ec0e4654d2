"""Shared fixtures. Real parts policy: a test that needs nsys, torch or the real traces skips on
a developer machine that lacks them and FAILS under CI (CI=true), where .ci/run installs them."""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(autouse=True, scope="session")
def _frame_cache_of_our_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`nsysan report` caches frames in the user's cache directory: the tests (and the processes
    they start) use one of their own, so they neither fill the user's nor read stale entries."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


def need(condition: bool, what: str) -> None:
    """Skip locally, fail in CI, when a real part is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true", pytrace=False)
    pytest.skip(f"{what} not available on this machine")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def realtraces_dir() -> Path:
    """The real exports: ../shared/realtraces beside this repository's CI checkout, or NSYSAN_REALTRACES."""
    return Path(os.environ.get("NSYSAN_REALTRACES", REPO.parent / "shared" / "realtraces"))


def _missing_traces(src: Path) -> str:
    return f"the real traces ({src}: no *.sqlite.xz; kept outside the repository, NSYSAN_REALTRACES=DIR names a copy)"


REAL_TRACE_FIXTURES = ("realtraces", "nsysai_traces")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test parametrized over the real traces gets no parameters when they are missing, and
    pytest would skip it as "got empty parameter set"; let its fixture say what is missing instead
    (and fail it under CI)."""
    for item in items:
        if not set(REAL_TRACE_FIXTURES) & set(getattr(item, "fixturenames", ())):
            continue
        item.own_markers = [m for m in item.own_markers
                            if not (m.name == "skip" and str(m.kwargs.get("reason", "")).startswith("got empty parameter set"))]  # fmt: skip


@pytest.fixture(scope="session")
def realtraces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real exports of ../shared/realtraces, decompressed once per session: name -> path."""
    src = realtraces_dir()
    files = sorted(src.glob("*.sqlite.xz")) if src.is_dir() else []
    need(bool(files), _missing_traces(src))
    return _decompress(files, tmp_path_factory.mktemp("realtraces"))


def _decompress(files: list[Path], out: Path) -> dict[str, Path]:
    traces = {}
    for f in files:
        name = f.name.removesuffix(".sqlite.xz")
        target = out / f"{name}.sqlite"
        with lzma.open(f) as fin, target.open("wb") as fout:
            shutil.copyfileobj(fin, fout)
        traces[name] = target
    return traces


NSYS_AI_PREFIX = "GindaChen__nsys-ai__"


@pytest.fixture(scope="session")
def nsysai_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real multi-GPU exports of ../shared/realtraces/nsys-ai (nsys 2026.x, 2x H100),
    decompressed once per session: short name (``mfu_2gpu_before``...) -> path."""
    src = realtraces_dir() / "nsys-ai"
    files = sorted(src.glob("*.sqlite.xz")) if src.is_dir() else []
    need(bool(files), _missing_traces(src))
    traces = _decompress(files, tmp_path_factory.mktemp("nsysai"))
    return {name.removeprefix(NSYS_AI_PREFIX): path for name, path in traces.items()}


@pytest.fixture(scope="session")
def nsys_bin() -> Path:
    from nsysan.nsys import NsysNotFound, find_nsys

    try:
        path = find_nsys()
    except NsysNotFound:
        path = None
    need(path is not None, "a real Nsight Systems (nsys)")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium driven by Playwright, one per test module (the dashboard's browser tests)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    need(sync_playwright is not None, "Playwright (pip install playwright)")
    from tools.browser import chromium_executable, launch_chromium

    need(chromium_executable().exists(), f"Chromium at {chromium_executable()} (Debian's chromium package)")
    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


# -- the review store, on SQLite and on a real PostgreSQL (tests/run.sh starts one) -------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    """An empty database: a fresh SQLite file, or the test PostgreSQL with every store table dropped."""
    import sqlalchemy as sa

    from nsysan.store import store_url

    if request.param == "sqlite":
        yield store_url(tmp_path / "review.sqlite")
        return
    url = os.environ.get("NSYSAN_TEST_PG_URL")
    need(bool(url), "a PostgreSQL server (NSYSAN_TEST_PG_URL, set by tests/run.sh)")
    engine = sa.create_engine(url)
    _drop_all(engine)  # a clean schema per test
    yield url
    _drop_all(engine)
    engine.dispose()


def _drop_all(engine: sa.Engine) -> None:
    """Every store table, including those of older schemas a migration test left behind (and
    Alembic's version table, which the models declare)."""
    import sqlalchemy as sa

    from nsysan.store.models import Base

    with engine.begin() as c:
        for old in ("comments", "trace_notes"):
            c.execute(sa.text(f"DROP TABLE IF EXISTS {old}"))
    Base.metadata.drop_all(engine)


@pytest.fixture
def store(url):
    from nsysan.store import ReviewStore

    return ReviewStore(url)
