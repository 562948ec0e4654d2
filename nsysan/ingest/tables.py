"""Which table of an export plays which role, decided by the columns it has.

nsys renamed and reshaped tables between versions. The breaking case: in 2022.4,
``CUDA_GRAPH_EVENTS`` holds graph *nodes*; in newer exports nodes moved to
``CUDA_GRAPH_NODE_EVENTS`` and ``CUDA_GRAPH_EVENTS`` holds whole graphs. A role therefore names
candidate tables *and* the columns that must (and must not) be there.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsysan.ingest.export import NsysExport


@dataclass(frozen=True)
class TableRole:
    name: str
    candidates: tuple[str, ...]
    required: frozenset[str]
    forbidden: frozenset[str] = frozenset()


def _role(name: str, candidates: tuple[str, ...], required: str, forbidden: str = "") -> TableRole:
    return TableRole(name, candidates, frozenset(required.split()), frozenset(forbidden.split()))


ROLES: dict[str, TableRole] = {
    r.name: r
    for r in (
        _role("kernels", ("CUPTI_ACTIVITY_KIND_KERNEL",), "start end deviceId streamId shortName"),
        _role("memcpy", ("CUPTI_ACTIVITY_KIND_MEMCPY",), "start end deviceId streamId bytes copyKind"),
        _role("memset", ("CUPTI_ACTIVITY_KIND_MEMSET",), "start end deviceId streamId bytes"),
        _role("runtime", ("CUPTI_ACTIVITY_KIND_RUNTIME",), "start end globalTid correlationId nameId"),
        _role("driver", ("CUPTI_ACTIVITY_KIND_DRIVER",), "start end globalTid correlationId nameId"),
        _role("nvtx", ("NVTX_EVENTS",), "start end eventType globalTid"),
        # Newer exports: CUPTI overhead records carry overheadType -> ENUM_CUPTI_OVERHEAD_TYPE.
        _role(
            "cupti_overhead",
            ("CUPTI_ACTIVITY_KIND_OVERHEAD",),
            "start end globalTid nameId overheadType",
        ),
        _role("profiler_overhead", ("PROFILER_OVERHEAD",), "start end globalTid nameId"),
        # OS runtime calls (``--trace=osrt``): file reads, waits, sleeps of the host threads
        _role("osrt", ("OSRT_API",), "start end globalTid nameId"),
        _role("sync", ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",), "start end deviceId streamId syncType"),
        _role("cuda_events", ("CUPTI_ACTIVITY_KIND_CUDA_EVENT",), "deviceId streamId correlationId eventId"),
        _role(
            "graph_nodes",
            ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS"),
            "start end globalTid nameId graphNodeId",
            forbidden="graphExecId",
        ),
        _role("graphs", ("CUDA_GRAPH_EVENTS",), "start end globalTid nameId graphId"),
        _role(
            "graph_trace",
            ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE",),
            "start end deviceId streamId graphId correlationId",
        ),
        _role("processes", ("PROCESSES",), "globalPid pid name"),
        _role("threads", ("ThreadNames",), "globalTid nameId"),
        _role("gpus", ("TARGET_INFO_GPU",), "id name"),
    )
}

CUDA_ROLES = ("kernels", "memcpy", "memset", "runtime", "driver", "graph_trace")


def find_table(export: NsysExport, role: str) -> str | None:
    """The table playing ``role`` in this export, or None when the export lacks it."""
    spec = ROLES[role]
    for name in spec.candidates:
        cols = {c.casefold() for c in export.columns(name)}  # SQLite column names ignore case
        required = {c.casefold() for c in spec.required}
        forbidden = {c.casefold() for c in spec.forbidden}
        if cols and required <= cols and not (forbidden & cols):
            return name
    return None


def has_cuda_data(export: NsysExport) -> bool:
    """Whether any CUDA activity table holds rows (``--lazy=false`` exports hold empty ones)."""
    return any(export.has_rows(find_table(export, role)) for role in CUDA_ROLES)
