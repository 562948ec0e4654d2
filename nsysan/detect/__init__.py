"""Detectors: pure functions from a Trace to Findings, one module per finding kind.

Importing this package registers the built-in detectors, through the same
:func:`~nsysan.detect.registry.register` an outside detector would use.
"""

from nsysan.detect.registry import DetectorSpec, parse_settings, register, registered

BUILTIN = (
    "nccl_ordering_stall",
    "shared_nccl_stream",
    "graph_allreduce_gap",
    "comm_compute_slowdown",
    "command_buffer_full",
    "late_rank",
    "gpu_idle",
    "copy_bound",
    "exposed_communication",
)

for _kind in BUILTIN:
    __import__(f"nsysan.detect.{_kind}")

from nsysan.detect.runner import DetectorParts, map_detectors, reduce_detectors, run_detectors  # noqa: E402

__all__ = [
    "BUILTIN",
    "DetectorParts",
    "DetectorSpec",
    "map_detectors",
    "parse_settings",
    "reduce_detectors",
    "register",
    "registered",
    "run_detectors",
]
