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
