"""Finding the Nsight Systems command line (``nsys``) on this machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from nsysan.errors import NsysanError

INSTALL_HINT = (
    "install Nsight Systems (https://developer.nvidia.com/nsight-systems) or, on Debian, "
    "run `bash .ci/install-nsys.sh` from the nsysan repository; or point NSYS at the binary"
)

# Where installers put nsys, newest layout first; the last is .ci/install-nsys.sh's prefix.
_USUAL = (
    "/usr/local/cuda/bin/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/usr/local/cuda/nsight-systems-*/bin/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "~/.cache/nsysan/nsys/usr/bin/nsys",
)


class NsysNotFound(NsysanError):
    exit_code = 2


def find_nsys() -> Path:
    """The nsys binary: $NSYS, then PATH, then the usual install directories."""
    env = os.environ.get("NSYS")
    if env:
        path = Path(env).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise NsysNotFound(f"NSYS={env} is not an executable file; {INSTALL_HINT}")
    on_path = shutil.which("nsys")
    if on_path:
        return Path(on_path)
    for pattern in _USUAL:
        expanded = os.path.expanduser(pattern)
        for candidate in sorted(Path("/").glob(expanded.lstrip("/")), reverse=True):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    raise NsysNotFound(f"nsys not found (looked at $NSYS, PATH and the usual install directories); {INSTALL_HINT}")


# --cuda-graph-trace (kernels inside graph replays) and --export=sqlite at profile time
MINIMUM_VERSION = (2022, 4)


def nsys_version(nsys: Path) -> str:
    """'2022.4.2.1' from ``nsys --version``; refuses versions older than MINIMUM_VERSION."""
    try:
        out = subprocess.run([str(nsys), "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError as exc:
        raise NsysNotFound(f"{nsys}: cannot run it ({exc.strerror}); {INSTALL_HINT}") from None
    match = re.search(r"(\d{4})\.(\d+)((?:\.\d+)*)", out)
    if not match:
        raise NsysNotFound(f"{nsys}: cannot read a version from `nsys --version` ({out.strip()!r})")
    if (int(match.group(1)), int(match.group(2))) < MINIMUM_VERSION:
        raise NsysNotFound(
            f"{nsys}: Nsight Systems {match.group(0)} is older than {MINIMUM_VERSION[0]}.{MINIMUM_VERSION[1]}, "
            f"which nsysan capture needs (--cuda-graph-trace); {INSTALL_HINT}"
        )
    return match.group(0)
