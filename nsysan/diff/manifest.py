"""Reading the ``manifest.json`` that ``nsysan capture`` writes into a run directory, so a report or
a diff of that directory knows the command, the status and the ranks it expected."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nsysan.errors import InputError

MANIFEST = "manifest.json"
# statuses after which there is no export to read
NO_EXPORT = ("nsys failed", "export failed")


def expected_ranks(manifest: dict[str, Any]) -> int | None:
    """Ranks the run was launched with: the bundled workload's --nproc, else torchrun's
    nproc-per-node times nnodes, else WORLD_SIZE."""
    workload = manifest.get("workload") or {}
    if workload.get("nproc"):
        return int(workload["nproc"])
    cmd = " ".join(manifest.get("command") or [])
    per_node = re.search(r"--nproc[-_]per[-_]node[= ](\d+)", cmd)
    nodes = re.search(r"--nnodes[= ](\d+)(?!:)", cmd)
    if per_node:
        return int(per_node.group(1)) * (int(nodes.group(1)) if nodes else 1)
    size = (manifest.get("environment") or {}).get("WORLD_SIZE", "")
    return int(size) if size.isdigit() else None


def read_manifest(path: str | Path) -> dict[str, Any] | None:
    """The manifest of a run directory (None when ``path`` is not one), reduced to what a report
    shows. Raises InputError when the capture left no export to read."""
    directory = Path(path)
    file = directory / MANIFEST
    if not directory.is_dir() or not file.is_file():
        return None
    try:
        m = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{file}: unreadable manifest ({exc})") from None
    if not isinstance(m, dict):
        raise InputError(f"{file}: not a capture manifest")
    status = str(m.get("status", "unknown"))
    info = {
        "path": str(file), "status": status, "exit_code": m.get("exit_code"), "command": m.get("command"),
        "nsys_version": m.get("nsys_version"), "nsys_argv": m.get("nsys_argv"), "environment": m.get("environment") or {},
        "started_utc": m.get("started_utc"), "finished_utc": m.get("finished_utc"), "workload": m.get("workload") or {},
        "expected_ranks": expected_ranks(m),
    }  # fmt: skip
    if status in NO_EXPORT:
        raise InputError(
            f"{directory}: the capture {status} (exit code {m.get('exit_code')}): no export to report on; see {file}"
        )
    return info


def capture_notes(info: dict[str, Any], ranks_found: int) -> list[str]:
    """Lines for the report: a capture that did not end cleanly, and ranks missing from it."""
    notes = []
    status, code = info["status"], info.get("exit_code")
    if status == "running":
        notes.append(
            "The capture never finished (manifest status `running`: nsysan was killed?): the report covers a partial run."
        )
    elif status != "ok":
        notes.append(f"The capture {status} (exit code {code}): the report covers a partial run, not a clean one.")
    expected = info.get("expected_ranks")
    if expected and ranks_found < expected:
        notes.append(f"The run was launched with {expected} ranks but the export holds {ranks_found}.")
    return notes
