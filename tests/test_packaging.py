"""What the wheel installs: nsysan and the ``dashboards`` package ``nsysan serve`` needs, with their
data files (dashboard assets, report templates), and none of the repository's tooling (tests,
fixtures, tools/: the browser launcher and the screenshot script)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO_ONLY = ("tests", "fixtures", "tools", "benchmarks")
# what nsysan's own code may import only where the user installed it, never repository tooling
NOT_FOR_SHIPPED_CODE = (*REPO_ONLY, "playwright")


def _setuptools_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _shipped_files() -> set[str]:
    """Every file the packaging configuration selects, found the way setuptools finds them."""
    from setuptools import find_packages

    config = _setuptools_config()
    packages = find_packages(where=str(REPO), include=config["packages"]["find"]["include"])
    files = set()
    for package in packages:
        folder = REPO / package.replace(".", "/")
        files |= {str(p.relative_to(REPO)) for p in folder.glob("*.py")}
        for pattern in config.get("package-data", {}).get(package, []):
            files |= {str(p.relative_to(REPO)) for p in folder.glob(pattern) if p.is_file()}
    return files


def test_no_repository_tooling_is_shipped_and_shipped_code_does_not_import_it():
    files = _shipped_files()
    assert {f.split("/")[0] for f in files} == {"nsysan", "dashboards"}
    assert not [f for f in files if Path(f).stem in ("launch", "screenshots", "conftest") or "/fixtures/" in f]
    for name in (f for f in files if f.endswith(".py")):
        tree = ast.parse((REPO / name).read_text(), name)
        for node in ast.walk(tree):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            bad = [m for m in modules if m.split(".")[0] in NOT_FOR_SHIPPED_CODE]
            assert not bad, f"{name}:{node.lineno} imports {bad}, which the wheel does not install"


def test_every_data_file_of_a_shipped_package_is_shipped():
    """A template or asset added beside the code (nsysan/report/templates/...) must be matched by
    package-data, or the installed nsysan fails where the checkout works."""
    files = _shipped_files()
    data = {
        str(p.relative_to(REPO))
        for top in ("nsysan", "dashboards")
        for p in (REPO / top).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    assert data, "dashboards/assets at least"
    assert data - files == set()


def test_the_wheel_has_the_app_its_assets_and_templates_and_nothing_else(tmp_path):
    """The real build: setuptools makes the wheel from a copy of the sources (the checkout is left alone)."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    for name in ("nsysan", "dashboards", "tools", "fixtures", "tests"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite", "*.xz"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{build.stderr[-3000:]}")
    (wheel,) = (tmp_path / "wheel").glob("nsysan-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert tops == {"nsysan", "dashboards", next(t for t in tops if t.endswith(".dist-info"))}
    assert not [n for n in names if any(w in n for w in ("launch", "screenshots", "conftest", "fixtures"))]
    assert "dashboards/assets/style.css" in names and "dashboards/app.py" in names
    expected_templates = {f"nsysan/report/templates/{p.name}" for p in (REPO / "nsysan/report/templates").glob("*")}
    assert expected_templates <= names
    assert "nsysan/capture/hook/sitecustomize.py" in names


# Runs nsysan's CLI with the dashboard's and the cluster's packages made unimportable, as after
# `pip install nsysan` without extras.
_CORE_ONLY = """
import importlib.abc, sys
BLOCKED = {"dash", "plotly", "flask", "flask_limiter", "flask_session", "flask_wtf", "cachelib", "waitress",
           "alembic", "distributed", "dask", "dashboards"}
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
sys.argv = ["nsysan", *sys.argv[1:]]
from nsysan.cli import main
try:
    main()
finally:
    assert not BLOCKED & {m.split(".")[0] for m in sys.modules}
"""


def _core_only(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CORE_ONLY, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO)  # fmt: skip


def test_report_and_diff_need_no_dashboard_and_no_cluster(tmp_path):
    """The light install (issue 32): report and diff run on the core alone and say the same; serve
    and a cluster are refused in one line naming the extra to install."""
    import os

    from fixtures.samples import sample_paths

    stall, fixed = (str(p) for p in (*sample_paths("pipeline-stall"), *sample_paths("pipeline-stall-fixed")))
    full = subprocess.run([sys.executable, "-m", "nsysan", "report", "--no-cache", stall], capture_output=True,
                          text=True, timeout=300, cwd=REPO)  # fmt: skip
    core = _core_only("report", "--no-cache", stall)
    assert core.returncode == 0 and core.stderr == "" and core.stdout == full.stdout, core.stderr
    diff = _core_only("diff", "--no-cache", stall, fixed)
    assert diff.returncode == 0, diff.stderr
    for args, extra in ((["serve"], "dashboard"), (["report", "--no-cache", "--scheduler", "tcp://127.0.0.1:1", stall],
                                                   "cluster")):  # fmt: skip
        out = _core_only(*args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"pip install 'nsysan[{extra}]'" in out.stderr, out.stderr
    assert os.path.exists(stall)


def test_the_core_install_reports_and_diffs_in_a_fresh_venv(tmp_path):
    """`pip install nsysan` with no extras, in a virtual environment of its own (from PyPI): the
    light install pulls no web stack and no cluster, and report and diff run on it (a module the
    core imports but does not declare fails here, as psutil did)."""
    import venv

    from tests.conftest import need

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(REPO)],
                             capture_output=True, text=True, timeout=900)  # fmt: skip
    need(install.returncode == 0 or "Could not find a version" not in install.stderr + install.stdout,
         "PyPI (a fresh virtual environment installs nsysan's core from it)")  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format", "freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120).stdout.lower()  # fmt: skip
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert not names & {"dash", "plotly", "flask", "distributed", "dask", "alembic", "waitress"}, names
    nsysan = env_dir / "bin" / "nsysan"
    samples = REPO / "fixtures" / "samples"
    report = subprocess.run([str(nsysan), "report", "--no-cache", str(samples / "pipeline-stall.sqlite")],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert report.returncode == 0 and "8 findings (1 info, 7 critical) in 3 groups" in report.stdout, report.stderr
    diff = subprocess.run([str(nsysan), "diff", "--no-cache", str(samples / "pipeline-stall.sqlite"),
                           str(samples / "pipeline-stall-fixed.sqlite")], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)  # fmt: skip
    assert diff.returncode == 0 and "1 fixed" in diff.stdout, diff.stderr
    serve = subprocess.run([str(nsysan), "serve"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert serve.returncode == 2 and "pip install 'nsysan[dashboard]'" in serve.stderr, serve.stderr
