"""The reader against fixtures whose ground truth we know, in both schema flavours."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest

from fixtures.exporter import ExportWriter
from fixtures.scenarios import JobSpec, write_job
from nsysan.ingest import NsysExport, load_trace
from nsysan.ingest.frames import decode_pid, decode_tid
from nsysan.ingest.nccl import classify_name
from nsysan.ingest.tables import find_table

SHAPES = [
    pytest.param(
        JobSpec(flavour=f, file_per_rank=per_rank, ranks=n, seed=n),
        id=f"{f}-{'per-rank' if per_rank else 'one-file'}-{n}",
    )
    for f in ("2022.4", "current")
    for per_rank, n in ((False, 2), (True, 3))
]


@pytest.mark.parametrize("spec", SHAPES)
def test_reader_matches_ground_truth(tmp_path, spec):
    paths, truth = write_job(spec, tmp_path)
    with load_trace(paths) as t:
        ranks = {(r.export, r.pid): r.rank for r in t.ranks.itertuples()}
        assert ranks == truth.ranks
        assert set(t.ranks["rank_source"]) == {"nvtx"}
        assert t.ranks["world_size"].tolist() == [spec.ranks] * spec.ranks
        assert t.kernels.groupby("export").size().to_dict() == dict(truth.kernels)
        assert t.kernels.groupby("export")["nccl_kind"].count().to_dict() == dict(truth.nccl_kernels)
        assert (t.memcpy["copy_kind"] == "Peer-to-Peer").groupby(t.memcpy["export"]).sum().to_dict() == dict(
            truth.peer_copies
        )
        ranges = t.nvtx[t.nvtx["event_type"] == "push_pop"]
        assert ranges.groupby("export").size().to_dict() == dict(truth.nvtx_ranges)
        assert set(ranges["domain"]) == {"train", "NCCL"}
        # every kernel row carries the rank of its process, and names are resolved
        assert t.kernels["rank"].notna().all() and t.kernels["short_name"].notna().all()
        assert set(t.kernels["nccl_op"].dropna()) == {"AllReduce"}
        # every kernel finds its launch call through the correlation id
        launched = t.kernels[t.kernels["graph_node_id"].isna()].merge(
            t.cuda_api, on=["export", "pid", "correlation_id"]
        )
        assert len(launched) == len(t.kernels)
        assert t.devices["device"].tolist() == sorted(d for ds in truth.devices.values() for d in ds)
        if spec.file_per_rank:
            assert len(set(t.job_clock())) == spec.ranks  # separate sessions, separate offsets


@pytest.mark.parametrize("flavour", ["2022.4", "current"])
def test_graph_node_table_found_by_columns(tmp_path, flavour):
    paths, _truth = write_job(JobSpec(flavour=flavour, graph="node"), tmp_path)
    with NsysExport(paths[0]) as x:
        expected = "CUDA_GRAPH_EVENTS" if flavour == "2022.4" else "CUDA_GRAPH_NODE_EVENTS"
        assert find_table(x, "graph_nodes") == expected
    with load_trace(paths) as t:
        node_kernels = t.kernels[t.kernels["graph_node_id"].notna()]
        assert len(node_kernels) > 0
        assert set(node_kernels["graph_node_id"]) <= set(t.graph_nodes["graph_node_id"])


def test_new_layout_graph_table_is_not_mistaken_for_nodes(tmp_path):
    w = ExportWriter(tmp_path / "g.sqlite", "current")
    w.row("CUDA_GRAPH_EVENTS", start=1, end=2, eventClass=0, globalTid=0, nameId=w.string("cudaGraphInstantiate"),
          graphId=5, graphExecId=9)  # fmt: skip
    w.nvtx_mark(1, 1, 10, "hello")
    w.close()
    with NsysExport(tmp_path / "g.sqlite") as x:
        assert find_table(x, "graphs") == "CUDA_GRAPH_EVENTS"
        assert find_table(x, "graph_nodes") is None


def test_graph_mode_capture_is_reported(tmp_path):
    paths, truth = write_job(JobSpec(graph="graph"), tmp_path)
    with load_trace(paths) as t:
        assert len(t.graph_launches) == sum(truth.graph_launches.values()) > 0
        from nsysan.overview import build_overview

        assert any("--cuda-graph-trace=node" in n for n in build_overview(t).limitations)


def test_overhead_type_resolved_through_enum_at_run_time(tmp_path):
    w = ExportWriter(tmp_path / "o.sqlite", "current")
    w.cupti_overhead(7, 7, 100, 900, "Command Buffer Full")
    w.cupti_overhead(7, 7, 1000, 1200, "CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH")
    w.profiler_overhead(7, 7, 50, 60, "CUDA profiling data flush")
    w.nvtx_mark(7, 7, 10, "nsysan rank=0")
    w.close()
    # ids in this file are our own; the reader must go through the enum, so shuffle them
    con = sqlite3.connect(tmp_path / "o.sqlite")
    con.execute("UPDATE ENUM_CUPTI_OVERHEAD_TYPE SET id = id + 100")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_OVERHEAD SET overheadType = overheadType + 100")
    con.commit()
    con.close()
    with load_trace([tmp_path / "o.sqlite"]) as t:
        o = t.overhead.sort_values("start_ns")
    assert o["overhead_type"].astype(object).where(o["overhead_type"].notna(), None).tolist() == [
        None,
        "Command Buffer Full",
        "CUPTI buffer flush",
    ]
    assert o["source"].tolist() == ["PROFILER_OVERHEAD", "CUPTI_ACTIVITY_KIND_OVERHEAD", "CUPTI_ACTIVITY_KIND_OVERHEAD"]
    assert o["pid"].tolist() == [7, 7, 7]


def test_global_ids_decode():
    g = pd.Series([(1 << 56) | (1 << 48) | (123456 << 24) | 654321])
    assert decode_pid(g).tolist() == [123456] and decode_tid(g).tolist() == [654321]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ("collective", "AllReduce", "Sum", "f32", "RING", "LL")),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)",
            ("collective", "ReduceScatter", "Sum", "bf16", "RING", "SIMPLE"),
        ),
        ("ncclDevKernel_AllGather_RING_LL", ("collective", "AllGather", None, None, "RING", "LL")),
        ("ncclDevKernel_Broadcast_RING_LL128", ("collective", "Broadcast", None, None, "RING", "LL128")),
        ("ncclDevKernel_AllReduce_Sum_f16_NVLS_SIMPLE", ("collective", "AllReduce", "Sum", "f16", "NVLS", "SIMPLE")),
        ("ncclDevKernel_SendRecv", ("p2p", "SendRecv", None, None, None, None)),
        ("ncclDevKernel_Generic", ("generic", "Generic", None, None, None, None)),
        ("ncclKernel_AllReduce_RING_LL_Sum_float", ("collective", "AllReduce", "Sum", "f32", "RING", "LL")),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", ("p2p", "SendRecv", None, None, "RING", "SIMPLE")),
        (
            "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16",
            ("collective", "ReduceScatter", "Sum", "bf16", "RING", "LL"),
        ),
        ("ampere_sgemm_128x64_tn", (None,) * 6),
        ("void at::native::vectorized_elementwise_kernel<4>(int)", (None,) * 6),
    ],
)
def test_nccl_kernel_names(name, expected):
    assert classify_name(name) == expected


def test_domains_created_before_the_session_keep_their_names(tmp_path):
    """nsys 2022.4 writes the domain-create rows of domains made before the session with a negative
    start (NERSC's exports: the NCCL domain among them). The rows are no time the reader uses; the
    ranges in the domain must still be NCCL's."""
    import shutil

    from fixtures.samples import SAMPLES_DIR

    path = tmp_path / "early-domains.sqlite"
    shutil.copy(SAMPLES_DIR / "allreduce-2rank.sqlite", path)
    with sqlite3.connect(path) as con:
        moved = con.execute("UPDATE NVTX_EVENTS SET start = -351429369363, end = NULL WHERE eventType = 75").rowcount
    assert moved == 6
    with load_trace([path]) as trace:
        ranges = trace.nvtx[trace.nvtx["event_type"] == "push_pop"]
        nccl = ranges[ranges["domain"] == "NCCL"]
        assert len(nccl) > 0 and set(nccl["text"].astype(str)) >= {"ncclAllReduce"}
