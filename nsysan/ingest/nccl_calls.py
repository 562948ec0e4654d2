"""NCCL API calls (ncclAllReduce, ncclSend, ncclGroupEnd, ...) from NCCL's own NVTX ranges.

NCCL wraps each API call in a push/pop range of its NVTX domain "NCCL" and attaches the call's
parameters. Two encodings exist in exports:

* **Extended payload** (NCCL >= 2.19-ish, recent nsys): NCCL registers one static payload schema
  per API struct (``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES``: entry name, entry
  type, byte offset; the first entry's offset is stored as NULL) and each range carries the raw
  struct bytes. ``nsys export --include-blobs=true`` writes them to ``NVTX_EVENTS.binaryData``
  (declared TEXT, stored as a BLOB) as a 32-byte header of four little-endian u64 (domain id,
  schema id, payload size, and a fourth that public readers describe either as the payload's
  offset, 32, or the total size, 32 + payload size: not used here) followed by the struct bytes.
  NVIDIA's schema reference only says "see docs for format"; this layout comes from readers of
  nsys 2026.2 exports, so a blob that does not fit it decodes to NA rather than to wrong values.
  Without ``--include-blobs`` (the default, ``EXPORT_PARAM_INCLUDE_BLOBS=false``) binaryData is
  NULL: the schema is there, the values are not.
* **Integer payload** (older NCCL): the message size as the plain NVTX payload
  (``int64Value``/``uint64Value``), no communicator.

Schema ids change between NCCL versions, so fields are found by their entry *names*, which NCCL
has kept. Domain ids are per process and the domain-create row can be missing from a cut-down
export, so a range counts as NCCL when its domain is named "NCCL" or, where the domain has no
name, when the range is named like an NCCL API call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from nsysan.ingest import frames
from nsysan.ingest.export import NsysExport
from nsysan.ingest.frames import Expr
from nsysan.ingest.nccl import NCCL_DOMAIN
from nsysan.ingest.tables import find_table

NCCL_CALL_COLUMNS = ("pid", "tid", "start_ns", "end_ns", "call", "comm_id", "bytes", "peer", "nranks", "comm_rank")

# Payload schema entry name (as NCCL registers it) -> output column.
FIELD_COLUMNS = {
    "NCCL communicator ID": "comm_id",
    "Message size [bytes]": "bytes",
    "Peer rank": "peer",
    "No. of ranks": "nranks",
    "Rank": "comm_rank",
}
_INT_COLUMNS = ("bytes", "peer", "nranks", "comm_rank")

HEADER_BYTES = 32
_API_NAME = re.compile(r"^nccl[A-Z][A-Za-z0-9_]*$")

# NVTX_PAYLOAD_ENTRY_TYPE_* (nvToolsExtPayload.h) -> (bytes, signed), LP64 sizes for C long.
_ENTRY_TYPES: dict[int, tuple[int, bool]] = {
    1: (1, True), 2: (1, False), 3: (2, True), 4: (2, False), 5: (4, True), 6: (4, False),
    7: (8, True), 8: (8, False), 9: (8, True), 10: (8, False), 11: (1, True), 12: (1, False),
    13: (2, True), 14: (2, False), 15: (4, True), 16: (4, False), 17: (8, True), 18: (8, False),
    19: (4, True), 20: (8, True), 22: (8, False), 23: (8, False),
}  # fmt: skip
# Entry types at or above this are registered schema/enum ids; NCCL's reduction op is a C enum.
_SCHEMA_ID_STATIC_START = 1 << 24
_ENUM_BYTES = 4


@dataclass(frozen=True)
class NcclPayloadStatus:
    """Whether an export's NCCL calls carry their parameters, and if not, why (for a report).

    ``state``: "decoded" (extended payloads read), "integer" (older NCCL: sizes only),
    "missing" (calls present, values absent), "absent" (no NCCL calls).
    """

    state: str
    calls: int
    with_values: int
    reason: str

    @property
    def missing(self) -> bool:
        return self.state == "missing"


def read_nccl_calls(x: NsysExport) -> pd.DataFrame:
    """One row per NCCL API range: pid tid start_ns end_ns call comm_id bytes peer nranks comm_rank.

    Fields the export does not give are NA (``comm_id`` is UInt64: NCCL's communicator hash uses
    all 64 bits; the others Int64). :func:`nccl_payload_status` says why they are missing.
    """
    return _read(x)[0]


def nccl_payload_status(x: NsysExport) -> NcclPayloadStatus:
    """How much of the NCCL calls' payload this export holds; see :class:`NcclPayloadStatus`."""
    calls, integer_form = _read(x)
    fields = calls[list(FIELD_COLUMNS.values())].notna().any(axis=1)
    n, with_values = len(calls), int(fields.sum())
    if n == 0:
        return NcclPayloadStatus("absent", 0, 0, "no NCCL API ranges in this export")
    if with_values:
        state = "integer" if integer_form else "decoded"
        return NcclPayloadStatus(state, n, with_values, "")
    return NcclPayloadStatus("missing", n, 0, _missing_reason(x))


def _missing_reason(x: NsysExport) -> str:
    params = _export_params(x)
    if params.get("EXPORT_PARAM_INCLUDE_BLOBS", "").lower() == "false":
        return ("the export was written without payload blobs (EXPORT_PARAM_INCLUDE_BLOBS=false): "
                "re-export the report with `nsys export --type sqlite --include-blobs=true`")  # fmt: skip
    table = find_table(x, "nvtx")
    if table and "binaryData" not in x.columns(table) and not _has_nccl_schema(_schema_entries(x)):
        return "this nsys/NCCL pair recorded no payload on NCCL's ranges"
    return "the NCCL ranges' payload values are absent from this export (cut away or not captured)"


def _export_params(x: NsysExport) -> dict[str, str]:
    if not {"name", "value"} <= set(x.columns("META_DATA_EXPORT")):
        return {}
    df = x.query("SELECT name, value FROM META_DATA_EXPORT WHERE name LIKE 'EXPORT_PARAM_%'")
    return dict(zip(df["name"].astype(str), df["value"].astype(str), strict=True))


def _empty() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype="int64") for c in ("pid", "tid", "start_ns")})
    df["end_ns"] = pd.Series(dtype="Int64")
    df["call"] = pd.Categorical([], categories=pd.Index([], dtype=object))
    df["comm_id"] = pd.Series(dtype="UInt64")
    for c in _INT_COLUMNS:
        df[c] = pd.Series(dtype="Int64")
    return df


def _read(x: NsysExport) -> tuple[pd.DataFrame, bool]:
    """The calls, and whether their values came from the integer (pre-schema) payload."""
    table = find_table(x, "nvtx")
    if table is None:
        return _empty(), False
    ranges = _nccl_ranges(x, table)
    if ranges.empty:
        return _empty(), False
    out = ranges[["pid", "tid", "start_ns", "end_ns"]].reset_index(drop=True)
    out["end_ns"] = out["end_ns"].astype("Int64")
    out["call"] = pd.Categorical(ranges["call"].to_numpy(dtype=object))
    n = len(out)
    values = {c: np.zeros(n, dtype=np.uint64 if c == "comm_id" else np.int64) for c in FIELD_COLUMNS.values()}
    known = {c: np.zeros(n, dtype=bool) for c in FIELD_COLUMNS.values()}

    entries = _schema_entries(x)
    if _has_nccl_schema(entries):
        integer_form = False
        if "binaryData" in x.columns(table):
            blobs = _blobs(x, table, ranges["row"].to_numpy(dtype=np.int64))
            _decode(blobs, entries, values, known)
    else:
        integer_form = True
        size = ranges["int_payload"]
        has = size.notna().to_numpy()
        values["bytes"][has] = size[has].to_numpy(dtype=np.int64)
        known["bytes"] = has

    comm = pd.array(values["comm_id"], dtype="UInt64")
    comm[~known["comm_id"]] = pd.NA
    out["comm_id"] = comm
    for c in _INT_COLUMNS:
        col = pd.array(values[c], dtype="Int64")
        col[~known[c]] = pd.NA
        out[c] = col
    out = out.sort_values(["pid", "tid", "start_ns"], kind="stable").reset_index(drop=True)
    return out, integer_form


def _nccl_ranges(x: NsysExport, table: str) -> pd.DataFrame:
    """NVTX ranges in a non-default domain that belong to NCCL, with their names and rowids."""
    type_ids = frames.nvtx_type_ids(x, *frames.NVTX_RANGE_TYPES)
    create_ids = frames.nvtx_type_ids(x, "domain_create")
    if not type_ids:
        return pd.DataFrame()
    created = frames._select(
        x, table, {"pid": "globalTid", "domain_id": "domainId", "domain": "text"}, required=("domain_id",),
        ints=("pid", "domain_id"), where=f"WHERE eventType IN ({', '.join(map(str, create_ids or [-1]))})",
    )  # fmt: skip
    created["pid"] = frames.decode_pid(created["pid"])
    created = created.dropna(subset=["domain_id"]).drop_duplicates(["pid", "domain_id"], keep="last")

    cols: dict[str, frames.Source] = {
        "row": Expr("rowid", frozenset()), "pid": "globalTid", "tid": "globalTid", "start_ns": "start",
        "end_ns": "end", "domain_id": "domainId", "text": "text", "text_id": "textId",
        "int64": "int64Value", "uint64": "uint64Value", "int32": "int32Value", "uint32": "uint32Value",
    }  # fmt: skip
    df = frames._select(
        x, table, cols, required=("start_ns", "domain_id"),
        ints=("row", "pid", "tid", "start_ns", "end_ns", "domain_id", "text_id", "int64", "uint64", "int32", "uint32"),
        where=f"WHERE eventType IN ({', '.join(map(str, type_ids))}) AND domainId IS NOT NULL AND domainId != 0",
    )  # fmt: skip
    if df.empty:
        return df
    df["pid"], df["tid"] = frames.decode_pid(df["pid"]), frames.decode_tid(df["tid"])
    registered = pd.Series(x.resolve(df["text_id"]), index=df.index, dtype=object)
    df["call"] = df["text"].astype(object).where(df["text"].notna(), registered)
    df = df.merge(created[["pid", "domain_id", "domain"]], on=["pid", "domain_id"], how="left")
    named = df["call"].astype(str).str.match(_API_NAME).to_numpy(dtype=bool) & df["call"].notna().to_numpy()
    unnamed_domain = df["domain"].isna().to_numpy()
    nccl = (df["domain"] == NCCL_DOMAIN).fillna(False).to_numpy(dtype=bool) | (unnamed_domain & named)
    df = df[nccl].reset_index(drop=True)
    df["int_payload"] = frames._first_int(df, ("int64", "uint64", "int32", "uint32"))
    return df


def _schema_entries(x: NsysExport) -> pd.DataFrame:
    """Payload schema entries with each entry's byte offset, width and signedness.

    The tables have no process column, so each process's registration repeats the rows:
    duplicates are dropped. An entry with a NULL offset follows the previous one at its natural
    alignment (NVTX's rule for unset offsets; for the first entry that is 0).
    """
    cols = x.columns("NVTX_PAYLOAD_SCHEMA_ENTRIES")
    if not {"domainId", "schemaId", "idx", "type", "name"} <= set(cols):
        return pd.DataFrame(columns=["domain_id", "schema_id", "name", "offset", "width", "signed"])
    offset = '"offset"' if "offset" in cols else "NULL"
    df = x.query(
        f'SELECT DISTINCT domainId, schemaId, idx, "type", name, {offset} AS off '
        "FROM NVTX_PAYLOAD_SCHEMA_ENTRIES ORDER BY domainId, schemaId, idx"
    )
    df = df.drop_duplicates(["domainId", "schemaId", "idx"])
    enum_size = _enum_sizes(x)
    rows = []
    for key, group in df.groupby(["domainId", "schemaId"], sort=False):
        domain, schema = (int(k) for k in cast(tuple[int, int], key))
        end = 0
        for entry_type, name, entry_off in group[["type", "name", "off"]].itertuples(index=False, name=None):
            etype = int(entry_type) if pd.notna(entry_type) else 0
            if etype >= _SCHEMA_ID_STATIC_START:
                width, signed = enum_size.get((domain, etype), _ENUM_BYTES), True
            else:
                width, signed = _ENTRY_TYPES.get(etype, (0, False))
            off = int(entry_off) if pd.notna(entry_off) else (-(-end // width) * width if width else end)
            end = off + width
            rows.append((domain, schema, str(name), off, width, signed))
    return pd.DataFrame(rows, columns=["domain_id", "schema_id", "name", "offset", "width", "signed"])


def _enum_sizes(x: NsysExport) -> dict[tuple[int, int], int]:
    if not {"domainId", "schemaId", "size"} <= set(x.columns("NVTX_PAYLOAD_ENUMS")):
        return {}
    df = x.query("SELECT DISTINCT domainId, schemaId, size FROM NVTX_PAYLOAD_ENUMS WHERE size IS NOT NULL")
    return {(int(d), int(s)): int(n) for d, s, n in zip(df["domainId"], df["schemaId"], df["size"], strict=True)}


def _has_nccl_schema(entries: pd.DataFrame) -> bool:
    return bool(entries["name"].isin(["NCCL communicator ID", "Message size [bytes]"]).any())


def _blobs(x: NsysExport, table: str, rows: np.ndarray) -> list[bytes]:
    """binaryData of the given rowids, in that order; NULL, and text that is not hex, become b''."""
    df = x.query(
        f"SELECT rowid AS row, binaryData FROM {table} WHERE rowid IN (SELECT value FROM json_each(?))",
        (json.dumps([int(r) for r in rows]),),
    )
    by_row = dict(zip(df["row"].astype("int64"), df["binaryData"], strict=True))
    return [_as_bytes(by_row.get(int(r))) for r in rows]


def _as_bytes(value: object) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            return b""
    return b""


def _decode(
    blobs: list[bytes], entries: pd.DataFrame, values: dict[str, np.ndarray], known: dict[str, np.ndarray]
) -> None:
    """Fill ``values``/``known`` from the blobs, one vectorised pass per distinct schema."""
    lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    buf = np.frombuffer(b"".join(blobs) + bytes(8), dtype=np.uint8)
    has_header = lengths >= HEADER_BYTES
    pos = np.where(has_header, starts, 0)
    domain = _read_uint(buf, pos, 8)
    schema = _read_uint(buf, pos + 8, 8)
    size = _read_uint(buf, pos + 16, 8)
    room = np.maximum(lengths - HEADER_BYTES, 0).astype(np.uint64)
    valid = has_header & (size <= room)
    wanted = entries[entries["name"].isin(list(FIELD_COLUMNS))]
    for key, fields in wanted.groupby(["domain_id", "schema_id"], sort=False):
        d, s = cast(tuple[int, int], key)
        hit = valid & (domain == np.uint64(d)) & (schema == np.uint64(s))
        if not hit.any():
            continue
        idx = np.flatnonzero(hit)
        entries_of_schema = zip(fields["name"].tolist(), fields["width"].tolist(), fields["offset"].tolist(),
                                fields["signed"].tolist(), strict=True)  # fmt: skip
        for name, entry_width, offset, signed in entries_of_schema:
            column, width = FIELD_COLUMNS[name], int(entry_width)
            if width not in (1, 2, 4, 8):
                continue
            fits = int(offset) + width <= size[idx].astype(np.int64)
            at = idx[fits]
            raw = _read_uint(buf, starts[at] + HEADER_BYTES + int(offset), width)
            if column == "comm_id":
                values[column][at] = raw
            else:
                values[column][at] = _to_signed(raw, width) if signed else raw.astype(np.int64)
            known[column][at] = True


def _read_uint(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Little-endian unsigned integers of ``width`` bytes at byte positions ``pos``."""
    if len(pos) == 0:
        return np.zeros(0, dtype=np.uint64)
    take = np.clip(pos[:, None] + np.arange(width), 0, len(buf) - 1)
    shifts = (np.arange(width, dtype=np.uint64) * np.uint64(8))[None, :]
    values: np.ndarray = np.bitwise_or.reduce(buf[take].astype(np.uint64) << shifts, axis=1)
    return values


def _to_signed(raw: np.ndarray, width: int) -> np.ndarray:
    if width == 8:
        return raw.view(np.int64)
    bits = 8 * width
    out = raw.astype(np.int64)
    return np.where(out >= 1 << (bits - 1), out - (1 << bits), out)
