"""What nsysan knows about NCCL: its kernels, what counts as communication, message sizes, and
which operations on different ranks are one collective.

Kernel names
------------

NCCL names its device kernels after what they do:

==========================================================  ==========================================
``ncclDevKernel_AllReduce_Sum_f32_RING_LL``                 NCCL >= 2.19: op, reduction, type, algo, proto
``ncclDevKernel_SendRecv`` / ``ncclDevKernel_Generic``      point-to-point / fused group
``ncclKernel_AllReduce_RING_LL_Sum_float``                  NCCL 2.9-2.18: op, algo, proto, reduction, type
``ncclAllReduceRingLLKernel_sum_f32``                       NCCL 2.4-2.8: op, algo, proto (none: SIMPLE),
                                                            reduction (``copy``: none), type
==========================================================  ==========================================

Classification runs once per distinct name (the categories of the name column) and is mapped
back through the codes, so it costs nothing per kernel. A kernel is *communication* when it is
NCCL's (:func:`is_communication`); copies are judged by their copy kind where they are used.

Message sizes come from NCCL's NVTX ranges around the launch call (:func:`attach_nccl_bytes`);
cross-rank matching from NCCL's payloads (communicator, sequence, peer) is
:func:`participants_by_communicator`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import pandas as pd

from nsysan.ingest.frames import NVTX_RANGE_TYPES

NCCL_DOMAIN = "NCCL"
NCCL_COLUMNS = ("nccl_kind", "nccl_op", "nccl_reduction", "nccl_dtype", "nccl_algo", "nccl_proto")

_REDUCTIONS = "Sum|Prod|MinMax|Min|Max|PreMulSum|SumPostDiv|Avg"
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
_VERY_OLD = re.compile(
    r"^nccl(?P<op>AllReduce|AllGather|Broadcast|ReduceScatter|Reduce|SendRecv)"
    r"(?P<algo>Ring|Tree|CollNet)?(?P<proto>LL128|LL)?Kernel_(?P<red>sum|prod|min|max|copy)_(?P<dtype>[a-z][a-z0-9]*)$"
)
_VERY_OLD_ALGOS = {"Ring": "RING", "Tree": "TREE", "CollNet": "COLLNET"}

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
    very_old = _VERY_OLD.match(base)
    if very_old:
        return _classify_very_old(very_old)
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


def _classify_very_old(match: re.Match[str]) -> tuple[str | None, ...]:
    """NCCL 2.4-2.8: one kernel per op, algo and protocol; no protocol in the name means SIMPLE."""
    op = match["op"]
    if op == "SendRecv":
        return ("p2p", op, None, None, None, None)
    red = None if match["red"] == "copy" else match["red"].capitalize()
    algo = _VERY_OLD_ALGOS[match["algo"]] if match["algo"] else None
    proto = match["proto"] or ("SIMPLE" if algo else None)
    return ("collective", op, red, match["dtype"], algo, proto)


def classify_kernels(names: pd.Series) -> pd.DataFrame:
    """NCCL columns for a categorical column of kernel names, aligned to its index."""
    cat = names.astype("category")
    table = [classify_name(str(c)) for c in cat.cat.categories]
    codes = cat.cat.codes.to_numpy()
    out = {}
    for i, column in enumerate(NCCL_COLUMNS):
        values = [row[i] for row in table]
        categories = sorted({v for v in values if v is not None})
        position: dict[str | None, int] = {v: j for j, v in enumerate(categories)}
        # old category code -> new code; the trailing -1 serves missing names (code -1)
        remap = np.array([position.get(v, -1) for v in values] + [-1], dtype=np.int64)
        out[column] = pd.Categorical.from_codes(remap[codes], categories=pd.Index(categories))
    return pd.DataFrame(out, index=names.index)


def is_communication(kernels: pd.DataFrame) -> pd.Series:
    """Per kernel, whether it is communication: an NCCL kernel, classified from its name."""
    return kernels["nccl_kind"].notna()


def is_point_to_point(kernels: pd.DataFrame) -> pd.Series:
    """Per kernel, whether it is NCCL send/receive (one partner) rather than a collective."""
    return kernels["nccl_kind"].astype(object).eq("p2p")


def is_allreduce(kernels: pd.DataFrame) -> pd.Series:
    """Per kernel, whether it is an NCCL all-reduce."""
    return kernels["nccl_op"].astype(object).eq("AllReduce")


class LaunchSource(Protocol):
    """What :func:`attach_nccl_bytes` reads from a Trace (a protocol: the Trace imports this module)."""

    @property
    def nvtx(self) -> pd.DataFrame: ...

    def launch_calls(self, kernels: pd.DataFrame) -> pd.DataFrame: ...


def attach_nccl_bytes(nccl_kernels: pd.DataFrame, trace: LaunchSource) -> pd.DataFrame:
    """Add ``nccl_api`` and ``nccl_bytes``: the NCCL-domain NVTX range around each kernel's launch.

    The kernel's correlation id leads to its launch call; the NCCL API range (``ncclAllReduce``...)
    open on that thread at that moment names the call, and its integer payload is the message
    size. Kernels without such a range keep NA.
    """
    out = nccl_kernels.copy()
    out["nccl_api"], out["nccl_bytes"] = pd.NA, pd.NA
    nvtx = trace.nvtx
    ranges = nvtx[(nvtx["domain"] == NCCL_DOMAIN) & nvtx["event_type"].isin(NVTX_RANGE_TYPES)] if len(nvtx) else nvtx
    if ranges.empty:
        return out
    api = trace.launch_calls(out)
    calls = (
        out[["export", "pid", "correlation_id"]]
        .reset_index()
        .merge(
            api[["export", "pid", "tid", "correlation_id", "start_ns"]].rename(columns={"start_ns": "call_ns"}),
            on=["export", "pid", "correlation_id"],
        )
    )
    if calls.empty:
        return out
    calls = calls.astype({"tid": "int64", "call_ns": "int64"}).sort_values("call_ns")
    r = ranges[["export", "pid", "tid", "start_ns", "end_ns", "text", "payload_int"]].dropna(subset=["end_ns"])
    r = r.astype({"tid": "int64", "start_ns": "int64", "end_ns": "int64"}).sort_values("start_ns")
    hit = pd.merge_asof(
        calls, r, left_on="call_ns", right_on="start_ns", by=["export", "pid", "tid"], direction="backward"
    )
    hit = hit[hit["end_ns"].notna() & (hit["end_ns"] >= hit["call_ns"])].set_index("index")
    out.loc[hit.index, "nccl_api"] = hit["text"].astype(object)
    out.loc[hit.index, "nccl_bytes"] = hit["payload_int"]
    return out


EDGE_COLUMNS = ["i", "j"]


COMMUNICATOR_COLUMNS = ("comm_id", "comm_rank", "peer", "rank", "a_start")


def participants_by_communicator(ops: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """Participants from NCCL's payloads: the n-th collective of a communicator on one rank is the
    n-th on every member; the n-th send from a to b pairs with the n-th receive of b from a.
    ``ops``: comm_id, comm_rank, peer (the peer's rank in the communicator, point-to-point only),
    rank and a_start, indexed by op id. Ops without a communicator are left out.

    Returns (``group``, ``edges``): per collective op the number of its (communicator, sequence)
    group, whose other members are its participants (a group, not edges: a collective over 1,024
    ranks would be a million edges per operation); and point-to-point edges (i, j). Works on plain
    arrays of the narrowest types, in start order: 10M ops at 1,024 ranks.
    """
    group = np.full(len(ops), -1, dtype=np.int64)
    rows = np.flatnonzero(ops["comm_id"].notna().to_numpy())
    rows = rows[np.argsort(ops["a_start"].to_numpy()[rows], kind="stable")]  # known ops in start order
    comm = pd.factorize(ops["comm_id"].take(rows))[0].astype(np.int32)
    rank = ops["rank"].to_numpy()[rows]
    p2p = ops["peer"].notna().to_numpy()[rows]
    if not p2p.all():
        coll = ~p2p
        seq = _occurrence(comm[coll], rank[coll])
        key = comm[coll].astype(np.int64) * (int(seq.max()) + 1) + seq
        del seq
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        del key
        number = np.empty(len(first), dtype=np.int64)
        number[np.argsort(first, kind="stable")] = np.arange(len(first))  # groups numbered as they first start
        group[rows[coll]] = number[inverse]
    edges = pd.DataFrame(columns=EDGE_COLUMNS, dtype="int64")
    if p2p.any():
        at = rows[p2p]
        comm, rank = comm[p2p], rank[p2p]
        del rows, p2p
        peer = ops["peer"].take(at).to_numpy(dtype="int32")
        me = ops["comm_rank"].take(at).to_numpy(dtype="int32", na_value=-1)
        keys = [comm, me, peer, _occurrence(comm, rank, peer)]
        del comm, me, peer, rank
        index = at if ops.index.equals(pd.RangeIndex(len(ops))) else ops.index.take(at).to_numpy(dtype="int64")
        del at
        edges = _pairs(index, keys)
    return pd.Series(group, index=ops.index), edges


def same_as_previous(keys: Sequence[np.ndarray], order: np.ndarray) -> np.ndarray:
    """For each row of ``order`` (a sort by ``keys``) after the first: whether it has the keys of the
    row before it. Runs of True are the groups of a lexsort."""
    same = np.ones(max(len(order) - 1, 0), dtype=bool)
    for k in keys:
        k = k[order]
        same &= k[1:] == k[:-1]
    return same


def _occurrence(*keys: np.ndarray) -> np.ndarray:
    """Per row, how many rows before it have the same keys (pandas' groupby().cumcount())."""
    order = np.lexsort(keys[::-1])  # stable: equal keys keep their order
    if not len(order):
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.append(True, ~same_as_previous(keys, order)))  # first of its keys, sorted
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    return out


def _pairs(index: np.ndarray, keys: list[np.ndarray]) -> pd.DataFrame:
    """Edges (i, j) between the n-th point-to-point op of ``me`` with ``peer`` and the n-th of
    ``peer`` with ``me`` in one communicator; ``index``: the ops' ids. ``keys`` (comm, me, peer,
    seq = n; -1: unknown) are consumed, so that their memory is free before the sort's. Packs the four into one integer and
    matches by sorting: millions of ops at 1,024 ranks, where a four-column merge needs GiBs; keys
    that do not fit in 63 bits, repeat or are unknown go through the merge."""
    comm, me, peer, seq = keys
    if len(index) and min(int(comm.min()), int(me.min()), int(peer.min()), int(seq.min())) >= 0:
        ranks = max(int(me.max()), int(peer.max())) + 1
        seqs = int(seq.max()) + 1
        if (int(comm.max()) + 1) * ranks * ranks * seqs < 2**63:
            mine, theirs = _packed(comm, me, peer, seq, ranks, seqs), _packed(comm, peer, me, seq, ranks, seqs)
            keys.clear()
            del comm, me, peer, seq
            order = np.argsort(mine, kind="stable")
            sorted_keys = mine[order]
            del mine
            if not (sorted_keys[1:] == sorted_keys[:-1]).any():
                wanted = np.argsort(theirs, kind="stable")  # sorted needles: the search walks memory in order
                needles = theirs[wanted]
                del theirs
                at = np.searchsorted(sorted_keys, needles)
                np.minimum(at, len(order) - 1, out=at)
                hit = sorted_keys[at] == needles
                del sorted_keys, needles
                return pd.DataFrame({"i": index[wanted[hit]], "j": index[order[at[hit]]]})
            comm, me, peer, seq = _unpacked(mine_sorted=sorted_keys, order=order, ranks=ranks, seqs=seqs)
    pts = pd.DataFrame({"index": index, "comm_id": comm, "me": me, "peer": peer, "seq": seq})
    pe = pts.merge(pts, left_on=["comm_id", "me", "peer", "seq"], right_on=["comm_id", "peer", "me", "seq"],
                   suffixes=("_i", "_j"))  # fmt: skip
    return pe.rename(columns={"index_i": "i", "index_j": "j"})[EDGE_COLUMNS].astype("int64")


def _unpacked(mine_sorted: np.ndarray, order: np.ndarray, ranks: int, seqs: int) -> tuple[np.ndarray, ...]:
    """The four keys back from their packed form (sorted by it, ``order`` the sort), in row order."""
    packed = np.empty_like(mine_sorted)
    packed[order] = mine_sorted
    packed, seq = np.divmod(packed, seqs)
    packed, peer = np.divmod(packed, ranks)
    comm, me = np.divmod(packed, ranks)
    return comm, me, peer, seq


def _packed(comm: np.ndarray, a: np.ndarray, b: np.ndarray, seq: np.ndarray, ranks: int, seqs: int) -> np.ndarray:
    """((comm x ranks + a) x ranks + b) x seqs + seq, in one int64 array (no temporaries)."""
    out = comm.astype(np.int64)
    for value, scale in ((a, ranks), (b, ranks), (seq, seqs)):
        out *= scale
        out += value
    return out
