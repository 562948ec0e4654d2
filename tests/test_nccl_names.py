"""Property tests: NCCL kernel-name classification against names built from NCCL's own naming grammar.

The grammars, as NCCL's sources write them:

* NCCL >= 2.19, ``src/device/generate.py``: ``paste("_", "ncclDevKernel", coll, redop, ty, algo, proto)``
  (``None`` parts left out): ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclDevKernel_AllGather_RING_LL``,
  ``ncclDevKernel_SendRecv``, ``ncclDevKernel_Generic``; launched with ``(ncclDevKernelArgsStorage<4096ul>)``.
* NCCL 2.9 to 2.18, ``src/collectives/device/common.h``: ``ncclKernel_##func##_##algo##_##proto##_##devredop##_##type``
  with C type names: ``ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)``; copy
  collectives and send/receive carry the placeholders ``Sum_int8_t``.
* NCCL 2.4 to 2.8, ``src/collectives/collectives.h``: ``coll##Kernel_##op##_##dtype`` where coll is
  ``nccl<Coll><Ring|Tree|CollNet><""|LL|LL128>``: ``ncclAllReduceRingLLKernel_sum_f32(ncclColl)``.

Each test builds a name from parts and checks that :func:`classify_name` and the vectorised
:func:`classify_kernels` give back exactly those parts.
"""

from __future__ import annotations

import itertools

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.ingest.nccl import NCCL_COLUMNS, classify_kernels, classify_name

# -- NCCL >= 2.19 (generate.py's all_* lists) -------------------------------------------------------
NEW_COPY_COLLS = ["AllGather", "Broadcast", "AllGatherV"]
NEW_REDUCING_COLLS = ["AllReduce", "Reduce", "ReduceScatter"]
# generate.py's all_redops also has MinMax; stock NCCL specialises kernels for Sum only (best_kernel),
# so MinMax appears in no released kernel name: see test_new_minmax_kernel_name below.
NEW_REDOPS = ["Sum", "Prod", "PreMulSum", "SumPostDiv"]
NEW_TYS = ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"]
NEW_ALGOS = ["TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"]
PROTOS = ["LL", "LL128", "SIMPLE"]
# the kernels' arguments as demangled names show them (the first as nsys 2026 wrote it in nsys-ai's traces)
NEW_ARGS = ["ncclDevKernelArgsStorage<(unsigned long)4096>", "ncclDevKernelArgsStorage<4096ul>", "ncclDevKernelArgs4K"]

# -- NCCL 2.9 .. 2.18 (common.h, collectives.h, devcomm.h) ---------------------------------------
OLD_COLLS = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"]
OLD_ALGOS = ["TREE", "RING", "COLLNET", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE"]
OLD_REDOPS = ["Sum", "Prod", "Min", "Max", "PreMulSum", "SumPostDiv"]
C_TYPES = {
    "int8_t": "i8", "uint8_t": "u8", "int32_t": "i32", "uint32_t": "u32", "int64_t": "i64", "uint64_t": "u64",
    "half": "f16", "float": "f32", "double": "f64", "__nv_bfloat16": "bf16",
}  # fmt: skip

# -- NCCL 2.4 .. 2.8 -------------------------------------------------------------------------------
VERY_OLD_ALGOS = {"Ring": "RING", "Tree": "TREE", "CollNet": "COLLNET"}
VERY_OLD_PROTOS = {"": "SIMPLE", "LL": "LL", "LL128": "LL128"}
VERY_OLD_TYS = ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64"]

Parts = tuple[str | None, str | None, str | None, str | None, str | None, str | None]


def _decorate(draw: st.DrawFn, name: str, args: str) -> str:
    """As nsys records it: the short name, or the demangled one with its arguments (and ``void ``)."""
    form = draw(st.sampled_from(["short", "demangled", "void"]))
    return name if form == "short" else f"{'void ' if form == 'void' else ''}{name}({args})"


@st.composite
def new_names(draw: st.DrawFn) -> tuple[str, Parts]:
    coll = draw(st.sampled_from(["SendRecv", "Generic", *NEW_COPY_COLLS, *NEW_REDUCING_COLLS]))
    if coll == "SendRecv":
        parts: Parts = ("p2p", coll, None, None, None, None)
    elif coll == "Generic":
        parts = ("generic", coll, None, None, None, None)
    elif coll in NEW_COPY_COLLS:
        parts = ("collective", coll, None, None, draw(st.sampled_from(NEW_ALGOS)), draw(st.sampled_from(PROTOS)))
    else:
        parts = ("collective", coll, draw(st.sampled_from(NEW_REDOPS)), draw(st.sampled_from(NEW_TYS)),
                 draw(st.sampled_from(NEW_ALGOS)), draw(st.sampled_from(PROTOS)))  # fmt: skip
    name = "_".join(p for p in ("ncclDevKernel", *parts[1:]) if p is not None)
    return _decorate(draw, name, draw(st.sampled_from(NEW_ARGS))), parts


@st.composite
def old_names(draw: st.DrawFn) -> tuple[str, Parts]:
    algo, proto = draw(st.sampled_from(OLD_ALGOS)), draw(st.sampled_from(PROTOS))
    if draw(st.booleans()) and draw(st.booleans()):  # NCCL's single point-to-point kernel
        name = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
        parts: Parts = ("p2p", "SendRecv", None, None, "RING", "SIMPLE")
    else:
        coll, red, ctype = (
            draw(st.sampled_from(OLD_COLLS)),
            draw(st.sampled_from(OLD_REDOPS)),
            draw(st.sampled_from(list(C_TYPES))),
        )
        name = f"ncclKernel_{coll}_{algo}_{proto}_{red}_{ctype}"
        parts = ("collective", coll, red, C_TYPES[ctype], algo, proto)
    return _decorate(draw, name, "ncclDevComm*, unsigned long, ncclWork*"), parts


def very_old_names() -> list[tuple[str, Parts]]:
    """Every kernel name NCCL 2.4-2.8 could launch (a finite grammar), short and demangled."""
    cases: list[tuple[str, Parts]] = [("ncclSendRecvKernel_copy_i8", ("p2p", "SendRecv", None, None, None, None))]
    for coll in ("Broadcast", "AllGather", "Reduce", "ReduceScatter", "AllReduce"):
        ops = ["copy"] if coll in ("Broadcast", "AllGather") else ["sum", "prod", "min", "max"]
        for algo, proto, op, ty in itertools.product(VERY_OLD_ALGOS, VERY_OLD_PROTOS, ops, VERY_OLD_TYS):
            parts: Parts = ("collective", coll, None if op == "copy" else op.capitalize(), ty, VERY_OLD_ALGOS[algo],
                            VERY_OLD_PROTOS[proto])  # fmt: skip
            cases.append((f"nccl{coll}{algo}{proto}Kernel_{op}_{ty}", parts))
    return cases + [(f"{name}(ncclColl)", parts) for name, parts in cases]


IDENTIFIER = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True)
# Kernels a PyTorch job really runs beside NCCL's (CUTLASS, cuBLAS, cuDNN, PyTorch, Triton, flash-attn).
LIBRARY_KERNELS = [
    "ampere_sgemm_128x64_tn",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4::Params)",
    "cutlass::Kernel<cutlass::gemm::kernel::GemmUniversal<ncclKernel_AllReduce_RING_LL_Sum_float>>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1>>(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
    "cudnn::engines_precompiled::nchwToNhwcKernel",
    "triton_poi_fused_add_mul_0",
    "flash_fwd_kernel",
    "NCCL_AllReduce_custom",
    "c10d::intra_node_comm::oneShotAllReduceKernel",
    "cross_device_reduce_1stage",
]


@st.composite
def not_nccl_names(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["identifier", "nccl inside", "library", "templated"]))
    if kind == "library":
        return draw(st.sampled_from(LIBRARY_KERNELS))
    head = draw(IDENTIFIER.filter(lambda s: not s.startswith("nccl")))
    if kind == "identifier":
        return head
    if kind == "nccl inside":  # 'nccl' after something: a user's kernel named after NCCL, not NCCL's own
        tail = draw(st.sampled_from(["nccl", "ncclKernel_AllReduce_RING_LL_Sum_float", "_ncclDevKernel_SendRecv"]))
        return head + tail + draw(IDENTIFIER | st.just(""))
    inner = draw(new_names())[0].removeprefix("void ")
    return f"void {head}<{inner}>(int)"  # NCCL's name only as a template argument


def _row(frame: pd.DataFrame, i: int) -> Parts:
    return tuple(None if pd.isna(v) else v for v in frame.iloc[i][list(NCCL_COLUMNS)])  # type: ignore[return-value]


@settings(max_examples=400, deadline=None)
@given(new_names())
def test_new_kernel_names_decode_to_their_parts(case):
    name, parts = case
    assert classify_name(name) == parts


@settings(max_examples=400, deadline=None)
@given(old_names())
def test_nccl_2_9_to_2_18_kernel_names_decode_to_their_parts(case):
    name, parts = case
    assert classify_name(name) == parts


def test_nccl_2_4_to_2_8_kernel_names_are_at_least_nccl():
    """NCCL 2.4-2.8 names (``ncclAllReduceRingLLKernel_sum_f32``) count as NCCL communication."""
    cases = very_old_names()
    assert len(cases) == 2 * (1 + 2 * 9 * 9 + 3 * 9 * 4 * 9)
    assert [name for name, _ in cases if classify_name(name)[0] is None] == []


def test_nccl_2_4_to_2_8_kernel_names_decode_to_their_parts():
    wrong = [(name, classify_name(name), parts) for name, parts in very_old_names() if classify_name(name) != parts]
    assert wrong == []


def test_new_minmax_kernel_name():
    assert classify_name("ncclDevKernel_AllReduce_MinMax_f32_RING_LL") == (
        "collective", "AllReduce", "MinMax", "f32", "RING", "LL",
    )  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(not_nccl_names())
def test_other_kernels_are_not_nccl(name):
    assert classify_name(name) == (None,) * 6


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(new_names(), old_names(), not_nccl_names().map(lambda n: (n, (None,) * 6)),
                          st.just((None, (None,) * 6))), max_size=30),
       st.randoms(use_true_random=False))  # fmt: skip
def test_the_vectorised_classification_matches_each_name(cases, rnd):
    """classify_kernels maps each distinct name once and back through the categorical codes: every
    row (repeated names, missing names, any order, any index) gets its own name's parts."""
    cases = cases + [rnd.choice(cases) for _ in range(len(cases))] if cases else cases
    index = pd.Index([rnd.randrange(10**6) for _ in cases])
    names = pd.Series([n for n, _ in cases], index=index, dtype=object)
    frame = classify_kernels(names.astype("category") if rnd.random() < 0.5 else names)
    assert list(frame.columns) == list(NCCL_COLUMNS) and frame.index.equals(index)
    for i, (_, parts) in enumerate(cases):
        assert _row(frame, i) == parts


def test_every_kernel_name_in_the_real_traces(realtraces, nsysai_traces):
    """Every distinct kernel name nsys wrote in the 21 real exports, short and demangled: only NCCL's
    own (``ncclDevKernel_SendRecv``, nsys-ai's 2x H100 job) are NCCL, and they are send/receive."""
    import sqlite3

    names: set[str] = set()
    for path in [*realtraces.values(), *nsysai_traces.values()]:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone():
            for column in ("shortName", "demangledName"):
                names |= {v for (v,) in con.execute(
                    f"SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.{column}")}  # fmt: skip
        con.close()
    nccl = {n for n in names if n.removeprefix("void ").startswith("nccl")}
    assert len(names) > 250 and nccl == {
        "ncclDevKernel_SendRecv",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)",
    }
    for name in names - nccl:
        assert classify_name(name) == (None,) * 6, name
    for name in nccl:
        assert classify_name(name) == ("p2p", "SendRecv", None, None, None, None)
