"""What one export's map sends to the coordinator, and how the coordinator joins it: small
(the coordinator holds every NCCL op of the job: 10M at 1,024 ranks) and joined once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fixtures.samples import sample_paths
from nsysan.analysis import map_export
from nsysan.attribution.job import reduce_attribution
from nsysan.attribution.part import AttributionPart
from nsysan.detect import DetectorParts, map_detectors, reduce_detectors, run_detectors
from nsysan.detect.nccl_ordering_stall import KIND, matching
from nsysan.ingest import load_trace
from nsysan.ingest.frames import concat_frames


def _parts(sample: str = "allreduce-4rank-2022.4") -> list[DetectorParts]:
    """The maps' parts of a job of one export per rank."""
    parts = []
    with load_trace(sample_paths(sample)) as trace:
        for index in range(len(trace.exports)):
            with trace.export_alone(index) as one:
                parts.append(map_detectors(one).with_export(index))
    return parts


def _attribution_parts(sample: str = "allreduce-4rank-2022.4") -> list[AttributionPart]:
    """The maps' attribution parts of a job: since the step attribution, the NCCL operations the
    ordering stall reads are its compact table (``comm``), not the detector's own."""
    with load_trace(sample_paths(sample)) as trace:
        parts = []
        for index in range(len(trace.exports)):
            with trace.export_alone(index) as one:
                parts.append(map_export(one, index).attribution)
    return parts


def test_the_compact_table_uses_narrow_types():
    assert _parts("pipeline-stall")[0].tables[KIND] == {}  # the detector sends nothing of its own
    ops = _attribution_parts("pipeline-stall")[0].comm
    assert len(ops) > 0
    assert not {"launch_ns", "launched_ns", "tid"} & set(ops)  # read by the map, not needed by the reduce
    for column in ("export", "pid", "device", "stream", "rank", "iteration", "comm_rank", "peer", "row"):
        assert ops[column].dtype.itemsize <= 4, (column, ops[column].dtype)
    assert ops.memory_usage(index=False).sum() / len(ops) < 80


def test_joining_keeps_names_categorical_and_takes_the_parts_tables():
    parts = _attribution_parts()
    assert len(parts) == 4
    ops = parts[1].comm
    ops["short_name"] = ops["short_name"].cat.add_categories("ncclDevKernel_Broadcast")  # exports differ
    names = [set(p.comm["short_name"].cat.categories) for p in parts]
    job = reduce_attribution(parts, [0] * len(parts), matching(None))
    joined = job.comm["short_name"]
    assert isinstance(joined.dtype, pd.CategoricalDtype)  # not object: 1 byte an op, not 8
    assert set(joined.cat.categories) == set().union(*names)
    assert len(job.comm) == 16 and all(p.comm.empty for p in parts)  # held once, by the join


def test_reduce_after_the_join_gives_the_serial_findings():
    with load_trace(sample_paths("allreduce-4rank-2022.4")) as trace:
        serial = [f.title for f in run_detectors(trace)]
        clock = [int(c) for c in trace.job_clock()]
        mapped = []
        for index in range(len(trace.exports)):
            with trace.export_alone(index) as one:
                mapped.append(map_export(one, index))
    job = reduce_attribution([m.attribution for m in mapped], clock, matching(None))
    joined = reduce_detectors([m.detectors for m in mapped], job.clock.offsets, attribution=job)
    assert [f.title for f in joined] == serial
    assert any(f.recoverable_ns > 0 for f in joined)  # the attribution's figures reach the findings


def _concat_by_union_categoricals(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The oracle: pandas' own concat, and union_categoricals over the non-empty parts' columns."""
    rows = [p for p in parts if len(p)]
    cats = [c for c in rows[0].columns if any(isinstance(p[c].dtype, pd.CategoricalDtype) for p in rows)]
    out = pd.concat([p.drop(columns=cats) for p in rows], ignore_index=True)
    for c in cats:
        arrays = []
        for p in rows:
            a = p[c].array if isinstance(p[c].dtype, pd.CategoricalDtype) else pd.Categorical(p[c].astype(object))
            arrays.append(pd.Categorical.from_codes(a.codes, categories=pd.Index(a.categories.astype(str))))
        out[c] = pd.api.types.union_categoricals(arrays, ignore_order=True)
    return out[list(rows[0].columns)]


@pytest.mark.parametrize("seed", range(30))
def test_join_of_parts_is_pandas_concat_with_unioned_categories(seed):
    """The coordinator's join (concat_frames) takes a column at a time; it must give what pandas'
    concat and union_categoricals give: promoted integer widths, nullable columns, names whose
    categories differ in content and order between exports, parts with no rows."""
    rng = np.random.default_rng(seed)
    names = ["ncclDevKernel_SendRecv", "ncclDevKernel_AllReduce", "ncclDevKernel_AllGather", "7"]
    parts = []
    for export in range(int(rng.integers(2, 7))):
        n = int(rng.integers(0, 6))
        cats = list(rng.choice(names, size=int(rng.integers(1, 4)), replace=False))
        values = [cats[i] if rng.random() > 0.15 else None for i in rng.integers(0, len(cats), n)]
        name = pd.Series(pd.Categorical(values, categories=cats))
        if rng.random() < 0.15:
            name = name.astype(object)
        width = [np.int8, np.int16, np.int32, np.int64][int(rng.integers(0, 4))]
        parts.append(pd.DataFrame({
            "export": np.int16(export), "short_name": name, "seq": np.arange(n).astype(width),
            "comm": pd.array(rng.integers(0, 9, n), dtype="Int32").copy(), "start": rng.integers(0, 10**12, n),
        }))  # fmt: skip
    if sum(len(p) > 0 for p in parts) < 2:
        return  # one part with rows is returned as it is
    if not any(isinstance(p["short_name"].dtype, pd.CategoricalDtype) for p in parts if len(p)):
        parts[0]["short_name"] = parts[0]["short_name"].astype("category")
    pd.testing.assert_frame_equal(concat_frames(parts), _concat_by_union_categoricals(parts))
