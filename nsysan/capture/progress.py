"""nsys's output passed on to a log without its progress bars.

nsys redraws a progress bar with carriage returns ("\\r[1/2] [=====50%   ] report.nsys-rep"), which
on a terminal is one line and in a log file (CI, Slurm) a single line of several KB per bar. When
nsysan's output is not a terminal, nsys (and the job under it, whose output goes through nsys) is
given a pipe and each line is passed on as a terminal would have shown it at its end: the text
after its last carriage return. On a terminal nothing is piped, so the job sees the terminal.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import threading
from collections.abc import Sequence
from typing import IO, Any

_CHUNK = 1 << 16


def start(
    argv: Sequence[str], stdout: IO[Any], stderr: IO[Any], **popen: Any
) -> tuple[subprocess.Popen, list[threading.Thread]]:
    """``Popen(argv)`` with each of its output streams that goes to a non-terminal filtered (see
    the module's doc); join the returned threads after the process ended."""
    pipes = {name: not _is_terminal(stream) for name, stream in (("stdout", stdout), ("stderr", stderr))}
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE if pipes["stdout"] else None,
        stderr=subprocess.PIPE if pipes["stderr"] else None,
        **popen,
    )
    threads = []
    for name, stream in (("stdout", stdout), ("stderr", stderr)):
        source = getattr(proc, name)
        if source is not None:
            t = threading.Thread(target=forward, args=(source, stream), name=f"nsys {name}", daemon=True)
            t.start()
            threads.append(t)
    return proc, threads


def _is_terminal(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def forward(source: IO[bytes], sink: IO[Any]) -> None:
    """Copy ``source`` to ``sink`` line by line, each line as it ends on a terminal. A sink that
    fails (a closed pipe: ``| head``) stops the copying, never the reading: an undrained pipe would
    block nsys and the job on their next write."""
    out = sink if isinstance(sink, (io.RawIOBase, io.BufferedIOBase)) else getattr(sink, "buffer", None)
    write = out.write if out is not None else (lambda b: sink.write(b.decode(errors="replace")))  # text only
    broken = False
    pending = b""
    while chunk := source.read1(_CHUNK) if hasattr(source, "read1") else source.read(_CHUNK):
        if broken:
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        text = b"".join(shown(line) + b"\n" for line in lines)
        if b"\r" in pending:  # a bar still redrawing: its latest complete state and the one being drawn
            *done, current = pending.split(b"\r")
            latest = [d for d in done if d.strip()]
            pending = (b"\r" + latest[-1] if latest else b"") + b"\r" + current
        try:
            if text:
                write(text)
            (out or sink).flush()
        except (OSError, ValueError, TypeError):
            broken = True
    if pending and not broken:
        with contextlib.suppress(OSError, ValueError, TypeError):
            write(shown(pending))
            (out or sink).flush()


def shown(line: bytes) -> bytes:
    """What a terminal shows of ``line``: its text after the last carriage return that has any."""
    parts = [p for p in line.split(b"\r") if p.strip()]
    return parts[-1] if parts else line.replace(b"\r", b"")
