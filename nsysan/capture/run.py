"""Run a command under ``nsys profile``, export it to SQLite, and write ``manifest.json``.

One output directory per run holds ``report.nsys-rep``, ``report.sqlite`` and ``manifest.json``.
The manifest is written before the workload starts (status ``running``) and rewritten at the
end, so even a crashed capture says what it was. A failing workload keeps its partial report and
its exit code; Ctrl-C lets nsys finish writing the report, then exits 130.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nsysan import __version__
from nsysan.capture import progress
from nsysan.capture.command import check_overrides, nsys_argv
from nsysan.errors import InputError, NsysanError
from nsysan.nsys import find_nsys, nsys_version

HOOK_DIR = Path(__file__).parent / "hook"
REPORT = "report"
_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "NSYSAN_", "OMP_", "PYTORCH_")
_ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NVIDIA_VISIBLE_DEVICES")


class CaptureFailed(NsysanError):
    """nsys itself failed (not the workload): no report to read."""

    exit_code = 1


@dataclass
class Manifest:
    nsysan_version: str
    command: list[str]
    nsys: str
    nsys_version: str
    nsys_argv: list[str]
    hostname: str
    environment: dict[str, str]
    started_utc: str
    status: str = "running"  # running | ok | workload failed | interrupted | export failed | nsys failed
    finished_utc: str | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    outputs: dict[str, str] = field(default_factory=dict)
    workload: dict[str, object] = field(default_factory=dict)

    def write(self, directory: Path) -> Path:
        path = directory / "manifest.json"
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def _relevant_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def run_directory(root: Path, name: str) -> Path:
    """A fresh directory for this run: ROOT/<utc time>-<name>[-N] (mkdir decides, so two captures
    starting in the same second cannot take the same one), and ROOT/latest pointing at it: a glob
    over every run would give several captures of one job together, which the report refuses."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for suffix in range(1, 10_000):
        path = root / (f"{stamp}-{name}" + (f"-{suffix}" if suffix > 1 else ""))
        try:
            path.mkdir()
        except FileExistsError:
            continue
        _point_latest(root, path.name)
        return path
    raise InputError(f"{root}: cannot create a run directory for {name}")


def _point_latest(root: Path, name: str) -> None:
    """ROOT/latest -> NAME (relative, so the runs directory can move), swapped in one rename; a
    filesystem without symlinks just has none."""
    temporary = root / f".latest-{os.getpid()}"
    try:
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(name, target_is_directory=True)
        os.replace(temporary, root / "latest")
    except OSError:
        temporary.unlink(missing_ok=True)


def profile_options(nsys: Path) -> str:
    """The text of ``nsys profile --help``, to tell which newer options this nsys has ("" if it fails)."""
    try:
        return subprocess.run([str(nsys), "profile", "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def check_nsys() -> tuple[Path, str]:
    """The nsys to use and its version; raises with an install hint when there is none usable."""
    nsys = find_nsys()
    return nsys, nsys_version(nsys)


def capture(
    command: Sequence[str],
    output_dir: Path,
    *,
    nsys_options: Sequence[str] = (),
    workload: dict[str, object] | None = None,
    nsys: tuple[Path, str] | None = None,
    say: Callable[[str], None] = lambda line: print(f"nsysan: {line}", file=sys.stderr, flush=True),
) -> tuple[Manifest, Path]:
    """Profile ``command``; return the manifest and the run directory. Never raises for a failing
    workload (the manifest's exit code says so); raises CaptureFailed when nsys produced nothing.

    SIGINT and SIGTERM are passed to nsys as SIGINT, so it stops the workload and finishes the
    report; the manifest is written whatever happens.
    """
    if not command:
        raise InputError("no command to capture: give one after `--`, or --workload NAME")
    try:
        check_overrides(nsys_options)  # before anything is created: a refused capture leaves no directory
    except ValueError as exc:
        raise InputError(f"--nsys: {exc}") from None
    nsys_path, version = nsys or check_nsys()
    output_dir.mkdir(parents=True, exist_ok=True)
    base = output_dir / REPORT
    argv = nsys_argv(str(nsys_path), str(base), command, nsys_options, supported=profile_options(nsys_path))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *filter(None, [env.get("PYTHONPATH")])])
    manifest = Manifest(
        nsysan_version=__version__, command=list(command), nsys=str(nsys_path), nsys_version=version, nsys_argv=argv,
        hostname=platform.node(), environment=_relevant_env(env), started_utc=_now(), workload=workload or {},
    )  # fmt: skip
    manifest.write(output_dir)
    say(f"capturing with nsys {version} into {output_dir}")
    start = time.monotonic()
    signals: list[int] = []
    proc: subprocess.Popen | None = None

    def forward(signum: int, frame: object) -> None:
        signals.append(signum)
        if proc is not None and proc.poll() is None:
            if len(signals) == 1:
                say("interrupted: nsys is finishing the report (signal again to abandon it)")
                proc.send_signal(signal.SIGINT)
            else:
                proc.kill()

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    code: int | None = None
    rep, sqlite = base.with_suffix(".nsys-rep"), base.with_suffix(".sqlite")
    try:
        # nsys gets its own session: a terminal's Ctrl-C reaches only nsysan, which passes exactly one
        # SIGINT on (a second one makes nsys abandon the report)
        proc, readers = progress.start(argv, sys.stdout, sys.stderr, env=env, start_new_session=True)
        code = proc.wait()
        for reader in readers:  # a process the job left behind may hold the pipe: not waited for long
            reader.join(timeout=10)
        if rep.exists() and not sqlite.exists() and len(signals) < 2:
            say("exporting to SQLite")
            export, readers = progress.start([str(nsys_path), "export", "--type=sqlite", f"--output={sqlite}",
                                              "--force-overwrite=true", str(rep)], sys.stdout, sys.stderr)  # fmt: skip
            export.wait()
            for reader in readers:
                reader.join(timeout=10)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        manifest.finished_utc = _now()
        manifest.duration_s = round(time.monotonic() - start, 3)
        manifest.exit_code = 130 if signals else code
        manifest.outputs = {kind: str(p) for kind, p in (("nsys-rep", rep), ("sqlite", sqlite)) if p.exists()}
        if not rep.exists():
            manifest.status = "nsys failed"
        elif not sqlite.exists():
            manifest.status = "export failed"
            manifest.exit_code = manifest.exit_code or 1
        else:
            manifest.status = "interrupted" if signals else "ok" if code == 0 else "workload failed"
        manifest.write(output_dir)
    if manifest.status == "nsys failed":
        raise CaptureFailed(
            f"nsys wrote no report (exit code {code}); see its messages above and {output_dir / 'manifest.json'}"
        )
    say(f"{manifest.status}: {sqlite if sqlite.exists() else rep} (exit code {manifest.exit_code})")
    return manifest, output_dir
