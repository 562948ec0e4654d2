"""What one export's map sends to the coordinator, and how the coordinator joins it: small
(the coordinator holds every NCCL op of the job: 10M at 1,024 ranks) and joined once."""

from __future__ import annotations

import pandas as pd

from fixtures.samples import sample_paths
from nsysan.detect import DetectorParts, map_detectors, reduce_detectors, run_detectors
from nsysan.detect.nccl_ordering_stall import KIND
from nsysan.detect.runner import _take_tables
from nsysan.ingest import load_trace


def _parts(sample: str = "allreduce-4rank-2022.4") -> list[DetectorParts]:
    """The maps' parts of a job of one export per rank."""
    parts = []
    with load_trace(sample_paths(sample)) as trace:
        for index in range(len(trace.exports)):
            with trace.export_alone(index) as one:
                parts.append(map_detectors(one).with_export(index))
    return parts


def test_the_compact_table_uses_narrow_types():
    ops = _parts("pipeline-stall")[0].tables[KIND]["ops"]
    assert len(ops) > 0
    assert "launch_ns" not in ops  # read by the map, not needed by the reduce
    for column in ("export", "pid", "device", "stream", "rank", "iteration", "comm_rank", "peer"):
        assert ops[column].dtype.itemsize <= 4, (column, ops[column].dtype)
    assert ops.memory_usage(index=False).sum() / len(ops) < 80


def test_joining_keeps_names_categorical_and_takes_the_parts_tables():
    parts = _parts()
    assert len(parts) == 4
    ops = parts[1].tables[KIND]["ops"]
    ops["short_name"] = ops["short_name"].cat.add_categories("ncclDevKernel_Broadcast")  # exports differ
    names = [set(p.tables[KIND]["ops"]["short_name"].cat.categories) for p in parts]
    frames = _take_tables(parts, KIND)
    joined = frames["ops"]["short_name"]
    assert isinstance(joined.dtype, pd.CategoricalDtype)  # not object: 1 byte an op, not 8
    assert set(joined.cat.categories) == set().union(*names)
    assert all(KIND not in p.tables for p in parts)  # held once, by the join


def test_reduce_after_the_join_gives_the_serial_findings():
    with load_trace(sample_paths("allreduce-4rank-2022.4")) as trace:
        serial = [f.title for f in run_detectors(trace)]
        clock = [int(c) for c in trace.job_clock()]
    assert [f.title for f in reduce_detectors(_parts(), clock)] == serial
