"""Classify NCCL kernels from their names.

NCCL names its device kernels after what they do:

==========================================================  ==========================================
``ncclDevKernel_AllReduce_Sum_f32_RING_LL``                 NCCL >= 2.19: op, reduction, type, algo, proto
``ncclDevKernel_SendRecv`` / ``ncclDevKernel_Generic``      point-to-point / fused group
``ncclKernel_AllReduce_RING_LL_Sum_float``                  older NCCL: op, algo, proto, reduction, type
==========================================================  ==========================================

Classification runs once per distinct name (the categories of the name column) and is mapped
back through the codes, so it costs nothing per kernel.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

NCCL_COLUMNS = ("nccl_kind", "nccl_op", "nccl_reduction", "nccl_dtype", "nccl_algo", "nccl_proto")

_REDUCTIONS = "Sum|Prod|Min|Max|PreMulSum|SumPostDiv|Avg"
_ALGOS = "RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT"
_PROTOS = "LL128|LL|SIMPLE"

_NEW = re.compile(
    rf"^ncclDevKernel_(?P<op>[A-Za-z]+?)"
    rf"(?:_(?P<red>{_REDUCTIONS}))?"
    rf"(?:_(?P<dtype>(?!(?:{_ALGOS})(?:_|$))[a-z][a-z0-9]*))?"
    rf"(?:_(?P<algo>{_ALGOS}))?"
    rf"(?:_(?P<proto>{_PROTOS}))?$"
)
_OLD = re.compile(
    rf"^ncclKernel_(?P<op>[A-Za-z]+?)"
    rf"(?:_(?P<algo>{_ALGOS}))?"
    rf"(?:_(?P<proto>{_PROTOS}))?"
    rf"(?:_(?P<red>{_REDUCTIONS}))?"
    rf"(?:_(?P<dtype>[A-Za-z_0-9]+))?$"
)

_DTYPES = {
    "int8_t": "i8", "uint8_t": "u8", "int32_t": "i32", "uint32_t": "u32", "int64_t": "i64",
    "uint64_t": "u64", "half": "f16", "float": "f32", "double": "f64", "__nv_bfloat16": "bf16",
    "__nv_fp8_e4m3": "f8e4m3", "__nv_fp8_e5m2": "f8e5m2",
}  # fmt: skip
_P2P_OPS = {"SendRecv", "Send", "Recv"}


def classify_name(name: str) -> tuple[str | None, ...]:
    """(kind, op, reduction, dtype, algo, proto) for one kernel name; all None if not NCCL."""
    base = name.split("(", 1)[0].split("<", 1)[0].strip()
    if base.startswith("void "):
        base = base[5:]
    match = _NEW.match(base) or _OLD.match(base)
    if not match:
        if base.startswith("nccl"):
            return ("other", base, None, None, None, None)
        return (None,) * 6
    op = match["op"]
    kind = "p2p" if op in _P2P_OPS else "generic" if op == "Generic" else "collective"
    dtype = match["dtype"]
    dtype = _DTYPES.get(dtype, dtype) if dtype else None
    red = match["red"] if kind == "collective" else None
    if kind == "p2p":
        dtype = None
    return (kind, op, red, dtype, match["algo"], match["proto"])


def classify_kernels(names: pd.Series) -> pd.DataFrame:
    """NCCL columns for a categorical column of kernel names, aligned to its index."""
    cat = names.astype("category")
    table = [classify_name(str(c)) for c in cat.cat.categories]
    codes = cat.cat.codes.to_numpy()
    out = {}
    for i, column in enumerate(NCCL_COLUMNS):
        values = [row[i] for row in table]
        categories = sorted({v for v in values if v is not None})
        position = {v: j for j, v in enumerate(categories)}
        # old category code -> new code; the trailing -1 serves missing names (code -1)
        remap = np.array([position.get(v, -1) for v in values] + [-1], dtype=np.int64)
        out[column] = pd.Categorical.from_codes(remap[codes], categories=categories)
    return pd.DataFrame(out, index=names.index)
