"""``nsysan capture``: run a job under nsys with the flags distributed users need."""

from nsysan.capture.command import DEFAULT_OPTIONS, check_overrides, nsys_argv
from nsysan.capture.run import CaptureFailed, Manifest, capture, check_nsys, run_directory

__all__ = [
    "DEFAULT_OPTIONS",
    "CaptureFailed",
    "Manifest",
    "capture",
    "check_nsys",
    "check_overrides",
    "nsys_argv",
    "run_directory",
]
