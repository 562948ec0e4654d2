"""Which finding of a new analysis is which finding of the last one (docs/store.md, "Re-analysis").

A stored finding and a new one are the same finding when they have the same ``kind``, ``rank`` and
``device``, the same ``group`` key (or the stored one has none: stored before group keys, it matches
on the rest), and their windows overlap (``[start_ns, end_ns]``, ends included, so equal instants
match). The group key is the detector's own statement of "the same problem" (it names the stream
and late peer, the kernel and its launch shape, the graph, the blocked thread); the window tells the
episodes of one problem apart. Pairs are one to one, made greedily: the longest overlap first, then
the closest start, then the oldest stored finding.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

_IDENTITY = ("kind", "rank", "device")


def same_problem(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a stored finding and a new one could be one finding (before their windows are compared)."""
    return all(old.get(k) == new.get(k) for k in _IDENTITY) and (old.get("group") or "") in ("", new.get("group") or "")


def overlap_ns(old: Mapping[str, Any], new: Mapping[str, Any]) -> int | None:
    """How long the two windows overlap (0: they touch), or None when they are apart."""
    overlap = min(int(old["end_ns"]), int(new["end_ns"])) - max(int(old["start_ns"]), int(new["start_ns"]))
    return overlap if overlap >= 0 else None


def match(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """The stored findings ``old`` (each with its ``id``) matched to the new ones: index into ``new``
    -> index into ``old``. Those of either side left out have no match."""
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for i, o in enumerate(old):
        buckets.setdefault(tuple(o.get(k) for k in _IDENTITY), []).append(i)
    # per bucket: stored findings by start, with the latest end so far, to visit only those that can overlap
    sweeps = {}
    for key, members in buckets.items():
        members.sort(key=lambda i: int(old[i]["start_ns"]))
        starts = [int(old[i]["start_ns"]) for i in members]
        reach = list(itertools.accumulate((int(old[i]["end_ns"]) for i in members), max))
        sweeps[key] = (members, starts, reach)
    candidates = []
    for j, n in enumerate(new):
        members, starts, reach = sweeps.get(tuple(n.get(k) for k in _IDENTITY), ([], [], []))
        start, end = int(n["start_ns"]), int(n["end_ns"])
        for at in range(bisect.bisect_right(starts, end) - 1, -1, -1):
            if reach[at] < start:  # nothing at or before this one reaches the new window
                break
            o = old[members[at]]
            overlap = overlap_ns(o, n)
            if overlap is not None and same_problem(o, n):
                candidates.append((-overlap, abs(int(o["start_ns"]) - start), o["id"], j, members[at]))
    matched: dict[int, int] = {}
    taken: set[int] = set()
    for *_, j, i in sorted(candidates):
        if j not in matched and i not in taken:
            matched[j] = i
            taken.add(i)
    return matched
