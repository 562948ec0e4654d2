"""nsysan's optional parts and the packages each needs (pyproject's extras), so that a command that
needs one says which to install in one line instead of failing on an import deep inside.

The core (``pip install nsysan``) reports, diffs and captures; ``nsysan[dashboard]`` adds ``nsysan
serve``; ``nsysan[cluster]`` adds the Dask cluster behind ``--workers`` and ``--scheduler``.
"""

from __future__ import annotations

import importlib.util

from nsysan.errors import InputError

# the top-level modules each extra installs (pyproject.toml's [project.optional-dependencies])
MODULES = {
    "dashboard": ("dash", "plotly", "flask", "flask_limiter", "flask_session", "flask_wtf", "cachelib", "waitress",
                  "alembic"),
    "cluster": ("distributed", "dask"),
}  # fmt: skip


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that are not installed (or that an import hook refuses)."""
    return [m for m in MODULES[extra] if not _importable(m)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, what: str) -> None:
    """Refuse ``what`` in one line, naming the install command, when ``extra`` is not installed."""
    absent = missing(extra)
    if absent:
        raise InputError(
            f"{what} needs nsysan's {extra} packages ({', '.join(absent)} not installed): "
            f"pip install 'nsysan[{extra}]' (from a checkout: pip install -e '.[{extra}]')"
        )
