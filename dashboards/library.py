"""Getting traces into the library: from the server's traces directory, or uploaded.

Both validate before anything is stored (:func:`register_exports` opens every file as an nsys
export, read-only) and queue the analysis. An upload is written under the uploads directory with a
name nsysan chooses; the browser's file name is only kept, cleaned, for people to read.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from dashboards import auth
from nsysan.errors import InputError, NsysanError
from nsysan.ingest import EXPORT_SUFFIXES, expand_inputs, load_trace
from nsysan.store import ReviewStore

if TYPE_CHECKING:
    from dashboards.server import Server


class UploadRefused(InputError):
    pass


@dataclass
class Registered:
    ids: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def register_exports(store: ReviewStore, paths: Sequence[str | os.PathLike[str]], name: str | None = None, *,
                     owner: str | None = None, upload_bytes: int | None = None) -> int:  # fmt: skip
    """Register the exports ``paths`` names (files, directories, globs) as one trace, after opening
    each as an nsys export: anything else is refused with a one-line :class:`InputError`."""
    files = expand_inputs(paths)
    with load_trace(files):
        pass
    return store.register(files, name=name, owner=owner, upload_bytes=upload_bytes)


def jobs_in(directory: Path) -> list[list[Path]]:
    """The traces a directory holds: each export file is one, and each subdirectory of exports is
    one job (one export per rank). A link to one of them (a capture's ``latest``) is not another."""
    jobs: list[list[Path]] = []
    seen: set[tuple[Path, ...]] = set()
    for entry in sorted(directory.iterdir(), key=lambda e: (e.is_symlink(), e.name)):
        files: list[Path] = []
        if entry.is_file() and entry.suffix.lower() in EXPORT_SUFFIXES:
            files = [entry]
        elif entry.is_dir() and not entry.name.startswith("."):
            files = sorted(p for p in entry.iterdir() if p.is_file() and p.suffix.lower() in EXPORT_SUFFIXES)
        key = tuple(p.resolve() for p in files)
        if files and key not in seen:
            seen.add(key)
            jobs.append(files)
    return jobs


def job_name(files: Sequence[Path], directory: Path) -> str:
    """What the library calls a job: a file's stem, or its directory's name for a directory of
    exports (a capture's run directory holds ``report.sqlite``: its name is the directory's)."""
    return files[0].stem if files[0].parent == directory else files[0].parent.name


def scan_directory(server: Server) -> Registered:
    """Register the traces in ``server.traces_dir`` that the store does not have yet. Those refused
    are kept in ``server.refused`` (replaced on every scan), so the library can say why."""
    result = Registered()
    if server.traces_dir is None:
        return result
    with server.scan_lock:  # two clicks (or two people) at once must not register a trace twice
        known = server.store.registered_paths()
        for files in jobs_in(server.traces_dir):
            if tuple(str(p.resolve()) for p in files) in known:
                continue
            try:
                result.ids.append(register_exports(server.store, files, name=job_name(files, server.traces_dir)))
            except NsysanError as exc:  # shown to reviewers: paths relative to the traces directory
                result.errors.append(_without_server_paths(str(exc), server.traces_dir))
        server.refused = list(result.errors)
    for trace_id in result.ids:
        server.analysis.submit(trace_id)
    return result


def save_upload_streams(server: Server, files: Sequence[tuple[str, IO[bytes]]]) -> int:
    """Store uploaded exports (the ranks of one job), each copied to disk a piece at a time, never
    whole in memory (``POST /upload``, multipart), and register them as one trace. Refused, with
    nothing kept, when the files are too big together, are not named like exports, or are not nsys
    exports. Uploads are taken one at a time (a quota is checked against what is registered)."""
    if not files:
        raise UploadRefused("no file uploaded")

    with server.upload_lock:  # the quota read and the register as one step (two uploads at once)
        written = 0
        owner = auth.current_user()
        used = server.store.uploaded_bytes(owner)
        quota = server.upload_quota_bytes

        def write(index: int, path: Path) -> None:
            nonlocal written
            with path.open("wb") as out:
                while piece := files[index][1].read(2**20):
                    written += len(piece)
                    if written > server.max_upload_bytes:
                        raise UploadRefused(f"upload over the limit of {server.max_upload_bytes / 2**20:.0f} MiB")
                    if quota is not None and written > quota - used:
                        raise UploadRefused(
                            f"{'your' if owner else 'the'} uploads would pass the quota of {quota / 2**20:,.1f} MiB "
                            f"({used / 2**20:,.1f} MiB used): delete some first"
                        )
                    out.write(piece)

        return _keep_upload(server, [name for name, _ in files], write, owner, lambda: written)


def _keep_upload(server: Server, filenames: Sequence[str], write: Callable[[int, Path], None], owner: str | None,
                 size: Callable[[], int]) -> int:  # fmt: skip
    """Write the uploaded files (``write(i, path)`` writes the i-th) into a fresh directory under
    the uploads directory and register them as one trace of ``owner``'s (``size()``: the bytes
    written); keep nothing when refused."""
    names = [_clean_name(n) for n in filenames]
    if len(set(names)) != len(names):
        raise UploadRefused("two uploaded files have the same name")
    target = server.uploads_dir / f"upload-{uuid.uuid4().hex[:12]}"
    target.mkdir(parents=True)
    try:
        paths = []
        for i, name in enumerate(names):
            write(i, target / name)
            paths.append(target / name)
        label = names[0].rsplit(".", 1)[0] if len(names) == 1 else f"{len(names)} files, {names[0]}…"
        trace_id = register_exports(server.store, paths, name=label, owner=owner, upload_bytes=size())
    except NsysanError as exc:
        shutil.rmtree(target, ignore_errors=True)
        raise UploadRefused(_without_server_paths(str(exc), target)) from None
    except BaseException:  # a full disk, say: keep nothing of a refused upload
        shutil.rmtree(target, ignore_errors=True)
        raise
    server.analysis.submit(trace_id)
    return trace_id


def upload_directory(server: Server, trace_id: int) -> Path | None:
    """The directory an uploaded trace's files were written to, or None when the trace was not
    uploaded (registered from the traces directory, say: those files are not the server's to delete)."""
    paths = [Path(p) for p in server.store.trace_paths(trace_id)]
    root = server.uploads_dir.resolve()
    parents = {p.parent for p in paths}
    if len(parents) != 1:
        return None
    (parent,) = parents
    if parent.parent != root or not parent.name.startswith("upload-"):
        return None
    return parent


def delete_upload(server: Server, trace_id: int) -> bool:
    """Delete the files of an uploaded trace from disk (retention); False when it was not uploaded.
    The store still lists the trace (and its findings and reviews) until it is removed there."""
    directory = upload_directory(server, trace_id)
    if directory is None:
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return True


def _clean_name(name: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name.replace("\\", "/")).name)[:120].lstrip(".") or "upload"
    if not base.lower().endswith(EXPORT_SUFFIXES):
        raise UploadRefused(f"{name}: not an nsys SQLite export (expected {', '.join(EXPORT_SUFFIXES)}; "
                            "export a .nsys-rep with `nsys export --type sqlite`)")  # fmt: skip
    return base


def _without_server_paths(message: str, directory: Path) -> str:
    """The validation error as the uploader should see it: about their file, not our disk."""
    return message.replace(str(directory.resolve()) + "/", "").replace(str(directory) + "/", "")
