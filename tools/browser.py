"""``nsysan serve`` in a child process, and the Chromium that looks at it: one way to start both,
shared by the browser tests, ``tools.screenshots`` and ``benchmarks/overview.py``.

Test and documentation tooling, so it lives outside the ``dashboards`` package the wheel installs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# without the networking flags Chromium keeps trying to reach Google, which a closed network refuses
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]  # fmt: skip


def chromium_executable() -> Path:
    """Debian's Chromium (tests/install-chromium.sh), or ``NSYSAN_CHROMIUM``."""
    return Path(os.environ.get("NSYSAN_CHROMIUM", "/usr/bin/chromium"))


def launch_chromium(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=str(chromium_executable()), args=CHROMIUM_ARGS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``nsysan serve --traces TRACES --db DB`` on a free port, its output in ``workdir/serve.log``;
    returns once it answers (a login page counts)."""

    def __init__(self, traces: Path, db: str, workdir: Path, *, host: str = "127.0.0.1",
                 env: dict[str, str] | None = None, args: tuple[str, ...] = (), timeout: float = 60.0) -> None:  # fmt: skip
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "serve.log"
        command = [sys.executable, "-m", "nsysan", "serve", "--db", db, "--traces", str(traces), "--host", host,
                   "--port", str(port), "--uploads", str(workdir / "uploads"), *args]  # fmt: skip
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=2)
                return
            except (urllib.error.URLError, ConnectionError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"nsysan serve did not start:\n{self.log.read_text()}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
