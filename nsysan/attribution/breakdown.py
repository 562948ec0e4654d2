"""Where a step's GPU time went, per rank: the part of the map that needs one export.

At each instant of a step on a rank's GPU(s), one category holds, by precedence:
``compute`` (any kernel that is not NCCL's runs) > communication (an NCCL kernel runs) >
``copy_exposed`` (a memcpy or memset runs) > ``idle``. Communication is split in the reduce, which
knows when each operation's last participant arrived (``waiting_for_peer`` before, and
``communication_exposed`` after; an instant where one NCCL kernel transfers while another waits
is communication). So the categories of a step sum to its length.

The map sends, per (rank, step): compute, communication (all of it), copy and idle ns, idle split
by its host-side cause (:func:`nsysan.attribution.host.idle_causes`); and the *exposed pieces* of
each NCCL operation (its time not covered by compute), which the reduce splits at the
operation's last arrival.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nsysan.attribution.host import IDLE_CAUSES, idle_causes
from nsysan.intervals import complement_arrays, covered_arrays, intersect_arrays, union_arrays

CATEGORIES = ("compute", "communication_exposed", "waiting_for_peer", "copy_exposed", "idle")
# per copy kind (the memcpy kind labels nsys writes), bytes moved and busy time in each step
COPY_KINDS = {"h2d": "Host-to-Device", "d2h": "Device-to-Host", "d2d": "Device-to-Device", "p2p": "Peer-to-Peer"}
COPY_COLUMNS = ["copy_bytes", "copy_busy_ns", "copy_pageable_bytes", "copy_main_stream_ns",
                *(f"copy_{k}_{u}" for k in COPY_KINDS for u in ("bytes", "ns"))]  # fmt: skip
MAP_COLUMNS = ["export", "rank", "step", "start_ns", "end_ns", "compute_ns", "comm_ns", "copy_ns", "idle_ns",
               *COPY_COLUMNS, *(f"idle_{c}_ns" for c in IDLE_CAUSES)]  # fmt: skip
PIECE_COLUMNS = ["export", "rank", "step", "row", "start_ns", "end_ns"]
GAP_COLUMNS = ["export", "rank", "step", "start_ns", "end_ns", "cause", "next_row"]


def _split(s: np.ndarray, e: np.ndarray, w_start: np.ndarray, w_end: np.ndarray) -> tuple[np.ndarray, ...]:
    """Intervals cut at window boundaries: (start, end, index of the interval, window)."""
    order = np.argsort(w_start, kind="stable")
    ws, we = w_start[order], w_end[order]
    ps, pe, which = intersect_arrays(s, e, ws, we)
    window = order[np.searchsorted(ws, ps, side="right") - 1]
    return ps, pe, which, window


def _lead_in(ops: pd.DataFrame, windows: pd.DataFrame, launch: pd.DataFrame, host: dict[str, pd.DataFrame]
             ) -> pd.DataFrame | None:  # fmt: skip
    """The host's data loading before the rank's first step, as an idle gap ending where the step
    starts (outside every step: it moves the rank's start, which the breakdown does not count but
    the what-if does): the loading on the thread that launched the first op, since its last
    blocking call. None without one."""
    if not len(ops) or not len(windows):
        return None
    s0 = int(windows["start_ns"].min())
    first = int(np.argmin(ops["start_ns"].to_numpy()))
    tid, at = int(launch["tid"].to_numpy()[first]), int(launch["launch_ns"].to_numpy()[first])
    loading = host["loading"]
    if tid < 0 or at < 0 or loading.empty:
        return None
    pid = int(ops["pid"].to_numpy()[first])
    mine = loading[(loading["pid"] == pid) & (loading["tid"] == tid) & (loading["start_ns"] < at)]
    if mine.empty:
        return None
    blocking = host["blocking"]
    before = blocking[(blocking["pid"] == pid) & (blocking["tid"] == tid) & (blocking["end_ns"] <= at)] \
        if len(blocking) else blocking  # fmt: skip
    since = int(before["end_ns"].max()) if len(before) else 0
    lo, hi = union_arrays(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy())
    stall = int(covered_arrays(np.array([since]), np.array([at]), lo, hi)[0])
    if stall <= 0:
        return None
    return pd.DataFrame({"step": [int(windows["step"].min())], "start_ns": [s0 - stall], "end_ns": [s0],
                         "cause": [IDLE_CAUSES.index("data_loading")], "next_row": [int(ops["row"].to_numpy()[first])]})  # fmt: skip


def rank_breakdown(
    ops: pd.DataFrame, windows: pd.DataFrame, launch: pd.DataFrame, host: dict[str, pd.DataFrame]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The breakdown of one rank's steps (see the module docstring).

    ``ops``: the rank's GPU operations (start_ns, end_ns, what: 0 compute, 1 NCCL, 2 copy) with a
    ``row`` each (their place in the export's table); ``windows``: its steps; ``launch``: per op,
    tid and launch_ns; ``host``: the export's blocking calls, data-loading intervals and
    full-queue rows (for the idle's causes). Returns (per-step table, exposed NCCL pieces, idle gaps).
    """
    w_start = windows["start_ns"].to_numpy(dtype=np.int64)
    w_end = windows["end_ns"].to_numpy(dtype=np.int64)
    s = ops["start_ns"].to_numpy(dtype=np.int64)
    e = ops["end_ns"].to_numpy(dtype=np.int64)
    what = ops["what"].to_numpy()
    compute = union_arrays(s[what == 0], e[what == 0])
    busy_cm = union_arrays(s[what <= 1], e[what <= 1])
    busy = union_arrays(s, e)
    length = w_end - w_start
    compute_ns = covered_arrays(w_start, w_end, *compute)
    cm_ns = covered_arrays(w_start, w_end, *busy_cm)
    busy_ns = covered_arrays(w_start, w_end, *busy)
    table = pd.DataFrame({"step": windows["step"].to_numpy(), "start_ns": w_start, "end_ns": w_end,
                          "compute_ns": compute_ns, "comm_ns": cm_ns - compute_ns, "copy_ns": busy_ns - cm_ns,
                          "idle_ns": length - busy_ns})  # fmt: skip

    # idle gaps inside the steps and the host-side cause of each
    lo, hi = (int(w_start.min()), int(w_end.max())) if len(w_start) else (0, 0)
    gs, ge = complement_arrays(*busy, lo, hi)
    gs, ge, _, gw = _split(gs, ge, w_start, w_end)
    order = np.argsort(s, kind="stable")
    nxt = np.searchsorted(s[order], ge, side="left")
    has_next = nxt < len(order)
    next_op = np.where(has_next, order[np.minimum(nxt, len(order) - 1)], -1)
    gaps = pd.DataFrame({"export": ops["export"].iloc[0] if len(ops) else 0, "pid": np.where(
        has_next, ops["pid"].to_numpy()[np.maximum(next_op, 0)], -1), "start_ns": gs, "end_ns": ge,
        "tid": np.where(has_next, launch["tid"].to_numpy()[np.maximum(next_op, 0)], -1),
        "launch_ns": np.where(has_next, launch["launch_ns"].to_numpy()[np.maximum(next_op, 0)], -1),
        "launched_ns": np.where(has_next, launch["launched_ns"].to_numpy()[np.maximum(next_op, 0)], -1)})  # fmt: skip
    # what the copies moved, per step: bytes, busy time, pageable bytes, time on the main stream
    copy = np.flatnonzero(what == 2)
    cw = np.searchsorted(w_start, s[copy], side="right") - 1
    inside = (cw >= 0) & (s[copy] < w_end[np.maximum(cw, 0)])
    copy, cw = copy[inside], cw[inside]
    # the main stream: the one with the most GPU time
    stream_key = (ops["device"].to_numpy(dtype=np.int64) << 32) | (ops["stream"].to_numpy(dtype=np.int64) & 0xFFFFFFFF)
    which_stream, keys = pd.factorize(stream_key)
    main = keys[np.argmax(np.bincount(which_stream, weights=e - s))] if len(keys) else -1
    on_main = stream_key[copy] == main
    nbytes = ops["bytes"].to_numpy(dtype=np.int64)[copy]
    dur = (e - s)[copy]
    table["copy_bytes"] = np.bincount(cw, weights=nbytes, minlength=len(table)).astype(np.int64)
    table["copy_busy_ns"] = np.bincount(cw, weights=dur, minlength=len(table)).astype(np.int64)
    table["copy_pageable_bytes"] = np.bincount(cw, weights=nbytes * ops["pageable"].to_numpy()[copy],
                                               minlength=len(table)).astype(np.int64)  # fmt: skip
    table["copy_main_stream_ns"] = np.bincount(cw, weights=dur * on_main, minlength=len(table)).astype(np.int64)
    kind = ops["copy_kind"].astype("category")
    codes, labels = kind.cat.codes.to_numpy()[copy], list(kind.cat.categories)
    for short, label in COPY_KINDS.items():
        is_kind = codes == (labels.index(label) if label in labels else -2)
        table[f"copy_{short}_bytes"] = np.bincount(cw, weights=nbytes * is_kind, minlength=len(table)).astype(np.int64)
        table[f"copy_{short}_ns"] = np.bincount(cw, weights=dur * is_kind, minlength=len(table)).astype(np.int64)
    cause = idle_causes(gaps, host["blocking"], host["loading"], host["queue_full"])
    per_cause = np.bincount(gw * len(IDLE_CAUSES) + cause, weights=ge - gs, minlength=len(table) * len(IDLE_CAUSES))
    per_cause = per_cause.reshape(len(table), len(IDLE_CAUSES)).astype(np.int64)
    for i, name in enumerate(IDLE_CAUSES):
        table[f"idle_{name}_ns"] = per_cause[:, i]
    gap_table = pd.DataFrame({"step": windows["step"].to_numpy()[gw] if len(gw) else np.empty(0, np.int64),
                              "start_ns": gs, "end_ns": ge, "cause": cause,
                              "next_row": np.where(has_next, ops["row"].to_numpy()[np.maximum(next_op, 0)], -1)})  # fmt: skip
    lead = _lead_in(ops, windows, launch, host)
    if lead is not None:
        gap_table = pd.concat([lead, gap_table], ignore_index=True)

    # NCCL operations' time not covered by compute, cut at step boundaries
    comm = np.flatnonzero(what == 1)
    not_compute = complement_arrays(*compute, min(lo, int(s.min(initial=lo))), max(hi, int(e.max(initial=hi))))
    ps, pe, which = intersect_arrays(s[comm], e[comm], *not_compute)
    ps, pe, part, pw = _split(ps, pe, w_start, w_end)
    pieces = pd.DataFrame({"step": windows["step"].to_numpy()[pw] if len(pw) else np.empty(0, np.int64),
                           "row": ops["row"].to_numpy()[comm[which[part]]] if len(part) else np.empty(0, np.int64),
                           "start_ns": ps, "end_ns": pe})  # fmt: skip
    return table, pieces, gap_table
