"""Two captures of one job compared: step time, where it went (the report's per-step breakdown),
GPU time, NCCL, copies, kernels and findings, each before, after, delta and percentage; whether the
two are comparable at all; the CI gate.

Works on two report documents that carry a ``profile`` (see :mod:`nsysan.diff.profile`), so a
saved ``nsysan report --format json`` and a fresh trace compare the same way. The breakdown comes
from the documents' ``steps`` sections; a document written before they existed has none, and the
breakdown is then marked unavailable (everything else still compares).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from nsysan import __version__
from nsysan.errors import InputError
from nsysan.findings import Severity
from nsysan.report.document import fold_groups

DIFF_VERSION = 3  # 2: "breakdown"; finding groups' "recoverable_ns". 3: matched groups' "change"
MIN_KERNEL_OVERLAP = 0.5  # share of each side's kernel time in signatures the other side also ran
CONFIDENCE = 0.95  # the gate fails only on a change at least this likely to be real
TOP_KERNELS = 10
CATEGORIES = ("compute", "communication_exposed", "waiting_for_peer", "copy_exposed", "idle")
"""Where a rank's step time went (the report's ``steps.ranks[r].breakdown_ns``), in the order every
format (and the dashboard) shows them; per step they sum to the step's duration."""
METRICS = ("step", "busy", "nccl", *CATEGORIES)
RANK_DIFFERS = 0.01  # a rank's breakdown row is shown when its change differs from the job's by this share of a step
# parts of a group key that name run-specific ids (a new process, a renumbered stream or graph)
_VOLATILE = re.compile(r"^(pid|stream|graph|correlation) ")


class NotComparable(InputError):
    """The two captures are not of the same job setup; ``--force`` compares them anyway."""


def _pct(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return round(100.0 * (after - before) / before, 3)


def _delta(before: float | None, after: float | None) -> dict[str, Any]:
    return {"before": before, "after": after,
            "delta": None if before is None or after is None else after - before, "pct": _pct(before, after)}  # fmt: skip


def confidence_greater(before: list[float], after: list[float]) -> float | None:
    """How sure one can be that ``after`` values are larger than ``before`` values: one-sided
    Mann-Whitney U (normal approximation, tie-corrected, continuity-corrected), as 1 - p.

    Rank-based, so one odd step (a checkpoint, a data-loader hiccup) does not decide it. None
    with fewer than two samples a side: the spread is unknown.
    """
    nx, ny = len(before), len(after)
    if nx < 2 or ny < 2:
        return None
    values = pd.Series(np.concatenate([before, after]))
    ranks = values.rank().to_numpy()
    u = ranks[nx:].sum() - ny * (ny + 1) / 2
    n = nx + ny
    ties = values.value_counts().to_numpy()
    var = nx * ny / 12 * ((n + 1) - (ties**3 - ties).sum() / (n * (n - 1)))
    if var <= 0:
        return 0.5
    z = (u - nx * ny / 2 - 0.5) / math.sqrt(var)
    return round(0.5 * (1 + math.erf(z / math.sqrt(2))), 4)


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"steps": 0, "median_ns": None, "p90_ns": None}
    a = np.asarray(values, dtype=float)
    return {"steps": len(a), "median_ns": float(np.median(a)), "p90_ns": float(np.percentile(a, 90))}


def _steps(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """Per rank: steps, median and p90 step time before and after; the slowest rank's median
    (the job waits for it) with the confidence that the change is more than step-to-step noise."""
    pb, pa = b["steps"]["per_rank"], a["steps"]["per_rank"]
    rows: list[dict[str, Any]] = []
    for r in sorted(set(pb) | set(pa), key=int):
        sb, sa = _stats(pb.get(r, {}).get("step_ns", [])), _stats(pa.get(r, {}).get("step_ns", []))
        rows.append({"rank": int(r), "before": sb, "after": sa, "median": _delta(sb["median_ns"], sa["median_ns"]),
                     "p90": _delta(sb["p90_ns"], sa["p90_ns"])})  # fmt: skip

    def slowest(side: str) -> tuple[int | None, float | None]:
        known = [(row[side]["median_ns"], row["rank"]) for row in rows if row[side]["median_ns"] is not None]
        return (max(known)[1], max(known)[0]) if known else (None, None)

    (rb, vb), (ra, va) = slowest("before"), slowest("after")

    def pool(p: dict[str, Any]) -> list[float]:
        return [x for v in p.values() for x in v["step_ns"]]

    def repeated(p: dict[str, Any]) -> bool:
        return any(len(v["step_ns"]) > 1 for v in p.values())

    worse = confidence_greater(pool(pb), pool(pa)) if repeated(pb) and repeated(pa) else None
    change = _delta(vb, va)
    return {
        "source": {"before": b["steps"]["source"], "after": a["steps"]["source"]},
        "detail": {"before": b["steps"]["detail"], "after": a["steps"]["detail"]},
        "per_rank": rows,
        "slowest": {
            "rank_before": rb,
            "rank_after": ra,
            **change,
            "confidence": _direction(worse, change["delta"]),
            "confidence_worse": worse,
        },
    }


def _direction(worse: float | None, delta: float | None) -> float | None:
    """Confidence of the change in the direction it went."""
    if worse is None or delta is None:
        return None
    return worse if delta > 0 else round(1 - worse, 4)


def _breakdown_series(doc: dict[str, Any]) -> tuple[dict[int, dict[str, list[float]]], str | None]:
    """Per rank, per category, the per-step series (ns) of a report document's ``steps`` section;
    or no ranks and why there are none."""
    steps = doc.get("steps")
    if not isinstance(steps, dict):
        return {}, ("no steps section, so no step breakdown: the report was written by an nsysan without one "
                    "(write it again with `nsysan report --format json`)")  # fmt: skip
    out: dict[int, dict[str, list[float]]] = {}
    for rank, r in (steps.get("ranks") or {}).items():
        parts = r.get("breakdown_ns") or {}
        missing = [c for c in CATEGORIES if not isinstance(parts.get(c), list)]
        if missing:
            return {}, f"rank {rank}'s step breakdown has no {', '.join(missing)}"
        if len({len(parts[c]) for c in CATEGORIES}) > 1:
            return {}, f"rank {rank}'s step breakdown has series of different lengths"
        if len(parts[CATEGORIES[0]]):
            out[int(rank)] = {c: [float(x) for x in parts[c]] for c in CATEGORIES}
    if not out:
        return {}, "no steps found" + (f": {steps['detail']}" if steps.get("detail") else "")
    return out, None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _judged(before: list[float], after: list[float], change: dict[str, Any]) -> dict[str, Any]:
    """A change with the confidence that it is more than step-to-step noise, judged as step time is
    (:func:`confidence_greater` on the per-step samples; None with fewer than two a side)."""
    worse = confidence_greater(before, after)
    return {**change, "confidence": _direction(worse, change["delta"]), "confidence_worse": worse}


def _breakdown(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """Where step time went, before and after: per category the mean time per step over ranks
    (each rank's mean per step, averaged over ranks) and per rank, with the confidence that each
    change is more than step-to-step noise, judged as step time is: over all ranks' per-step
    samples for the job's figure, over the rank's own for a rank's. ``differs`` marks a rank whose
    change is not the job's (by more than RANK_DIFFERS of a step), the rows worth showing."""
    (sb, why_b), (sa, why_a) = _breakdown_series(b), _breakdown_series(a)
    source = {"before": (b.get("steps") or {}).get("source"), "after": (a.get("steps") or {}).get("source")}
    out: dict[str, Any] = {"available": not (why_b or why_a), "why": {"before": why_b, "after": why_a},
                           "source": source, "categories": list(CATEGORIES), "step_ns": _delta(None, None),
                           "job": {}, "per_rank": []}  # fmt: skip
    if not out["available"]:
        return out

    def job_mean(series: dict[int, dict[str, list[float]]], c: str | None) -> float:
        """Each rank's mean per step, averaged over ranks (every rank weighs the same); c=None: the
        step itself, the categories' sum."""
        return float(np.mean([_step_mean(v) if c is None else np.mean(v[c]) for v in series.values()]))

    def pool(series: dict[int, dict[str, list[float]]], c: str) -> list[float]:
        return [x for v in series.values() for x in v[c]]

    def repeated(series: dict[int, dict[str, list[float]]]) -> bool:
        return any(len(v[CATEGORIES[0]]) > 1 for v in series.values())

    judge = repeated(sb) and repeated(sa)
    step = _delta(job_mean(sb, None), job_mean(sa, None))
    out["step_ns"] = step
    for c in CATEGORIES:
        change = _delta(job_mean(sb, c), job_mean(sa, c))
        row = _judged(pool(sb, c), pool(sa, c), change) if judge else {**change, "confidence": None,
                                                                         "confidence_worse": None}  # fmt: skip
        row["share_before"] = _share(change["before"], step["before"])
        row["share_after"] = _share(change["after"], step["after"])
        out["job"][c] = row
    tolerance = RANK_DIFFERS * max(step["before"] or 0, step["after"] or 0)
    for rank in sorted(set(sb) | set(sa)):
        vb, va = sb.get(rank), sa.get(rank)
        counts = {"before": len(vb[CATEGORIES[0]]) if vb else 0, "after": len(va[CATEGORIES[0]]) if va else 0}
        cats: dict[str, dict[str, Any]] = {}
        for c in CATEGORIES:
            change = _delta(_mean(vb[c]) if vb else None, _mean(va[c]) if va else None)
            cats[c] = _judged(vb[c] if vb else [], va[c] if va else [], change)
        total = _delta(_step_mean(vb) if vb else None, _step_mean(va) if va else None)
        for c, row in cats.items():
            row["share_before"] = _share(row["before"], total["before"])
            row["share_after"] = _share(row["after"], total["after"])
            row["differs"] = row["delta"] is None or abs(row["delta"] - out["job"][c]["delta"]) > tolerance
        out["per_rank"].append({"rank": rank, "steps": counts, "step_ns": total, "categories": cats})
    return out


def _step_mean(series: dict[str, list[float]]) -> float:
    """A rank's mean step time: the mean over its steps of the categories' sum."""
    return float(np.mean(np.sum([series[c] for c in CATEGORIES], axis=0)))


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else round(100.0 * part / whole, 3)


def _table(before: list[dict[str, Any]], after: list[dict[str, Any]], keys: list[str],
           values: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """Rows of both sides joined on ``keys``; each value as before/after/delta/pct; biggest change first."""
    fb = pd.DataFrame(before, columns=[*keys, *values])
    fa = pd.DataFrame(after, columns=[*keys, *values])
    j = fb.merge(fa, on=keys, how="outer", suffixes=("_b", "_a"))
    out = []
    for row in j.to_dict("records"):
        item = {k: row[k] for k in keys}
        for v in values:
            x, y = row[f"{v}_b"], row[f"{v}_a"]
            x = None if pd.isna(x) else (float(x) if isinstance(x, float) and not float(x).is_integer() else int(x))
            y = None if pd.isna(y) else (float(y) if isinstance(y, float) and not float(y).is_integer() else int(y))
            item[v] = _delta(x, y)
        out.append(item)
    main = values[-1]
    return sorted(out, key=lambda r: -abs((r[main]["after"] or 0) - (r[main]["before"] or 0)))


def _ranks(b: dict[str, Any], a: dict[str, Any]) -> list[dict[str, Any]]:
    rows = _table(b["ranks_table"], a["ranks_table"], ["rank"],
                  ["span_ns", "kernel_ns", "nccl_ns", "copy_ns", "idle_pct", "busy_ns"])  # fmt: skip
    return sorted(rows, key=lambda r: r["rank"])


def _kernels(b: dict[str, Any], a: dict[str, Any], top: int) -> dict[str, Any]:
    """Kernel signatures: the largest total-time regressions and improvements among those in both,
    and those that appeared or vanished."""
    rows = _table(b["kernels"], a["kernels"], ["signature"], ["count", "total_ns"])
    names = {k["signature"]: (k["short_name"], k["shape"], k["nccl"]) for k in [*b["kernels"], *a["kernels"]]}
    for r in rows:
        r["short_name"], r["shape"], r["nccl"] = names[r["signature"]]
        # per call: in captures of equal length a slower job runs fewer calls, so totals alone mislead
        r["mean_ns"] = _delta(
            *(r["total_ns"][s] / r["count"][s] if r["count"][s] else None for s in ("before", "after"))
        )
    both = [r for r in rows if r["count"]["before"] and r["count"]["after"]]
    return {
        "regressions": sorted([r for r in both if r["total_ns"]["delta"] > 0], key=lambda r: -r["total_ns"]["delta"])[
            :top
        ],
        "improvements": sorted([r for r in both if r["total_ns"]["delta"] < 0], key=lambda r: r["total_ns"]["delta"])[
            :top
        ],
        "appeared": [r for r in rows if not r["count"]["before"]][:top],
        "vanished": [r for r in rows if not r["count"]["after"]][:top],
        "appeared_total": sum(1 for r in rows if not r["count"]["before"]),
        "vanished_total": sum(1 for r in rows if not r["count"]["after"]),
        "signatures": {"before": len(b["kernels"]), "after": len(a["kernels"]), "both": len(both)},
    }


def _identity(f: dict[str, Any]) -> str | None:
    """A finding's problem without run-specific ids: its group key less pids, streams and graph
    ids, or for an ungrouped finding its kind, rank and evidence (kernel, operation, peer)."""
    if f.get("group"):
        return "|".join(p for p in f["group"].split("|") if not _VOLATILE.match(p))
    ev = f.get("evidence") or {}
    blocked = ev["blocked_op"] if isinstance(ev.get("blocked_op"), dict) else {}
    parts = [ev.get("short_name") or ev.get("kernel") or blocked.get("kernel"),
             ev.get("operation") or ev.get("op") or ev.get("communication_class"), ev.get("late_rank", ev.get("peer"))]  # fmt: skip
    if all(p is None for p in parts):
        return None  # kind and rank alone do not say it is the same problem
    return "|".join(map(str, [f["kind"], f.get("rank"), *parts]))


def _finding_groups(doc: dict[str, Any]) -> list[dict[str, Any]]:
    findings = doc.get("findings", [])
    groups = doc.get("groups") or fold_groups(findings)
    out = []
    for g in groups:
        worst = findings[g["worst"]]
        out.append({"group": g["group"], "kind": g["kind"], "severity": g["severity"], "count": g["count"],
                    "impact_ns": int(g["impact_ns"]), "recoverable_ns": _recoverable(findings, g),
                    "title": worst["title"], "rank": worst.get("rank"), "device": worst.get("device"),
                    "identity": _identity(worst), "worst": worst})  # fmt: skip
    return out


def _recoverable(findings: list[dict[str, Any]], group: dict[str, Any]) -> int | None:
    """The wall time fixing a group would save: its findings' ``recoverable_ns`` summed; None when
    one of them has none (a report, or a store, from before findings carried it)."""
    values = [findings[i].get("recoverable_ns") for i in group.get("findings") or [group["worst"]]]
    return None if any(v is None for v in values) else int(sum(values))


def _total(groups: list[dict[str, Any]], key: str) -> int | None:
    values = [g[key] for g in groups]
    return None if any(v is None for v in values) else int(sum(values))


def _findings(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """Finding groups matched by group key, then by identity (group key without run-specific ids,
    or evidence); each match once, the larger impact first."""
    gb, ga = _finding_groups(b), _finding_groups(a)
    unmatched_a = list(range(len(ga)))
    pairs: list[tuple[int, int, str]] = []
    for how, key in (("group", lambda g: g["group"] or None), ("evidence", lambda g: g["identity"])):
        taken = {i for i, _, _ in pairs}
        index: dict[str, list[int]] = {}
        for j in unmatched_a:
            k = key(ga[j])
            if k is not None:
                index.setdefault(k, []).append(j)
        for i, g in enumerate(gb):
            k = key(g)
            if i in taken or k is None or not index.get(k):
                continue
            j = index[k].pop(0)
            pairs.append((i, j, how))
            unmatched_a.remove(j)
    matched_b = {i for i, _, _ in pairs}

    def brief(g: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in g.items() if k != "identity"}

    unchanged = [{**brief(ga[j]), "matched_by": how, "before": brief(gb[i]), "impact": _delta(gb[i]["impact_ns"], ga[j]["impact_ns"]),
                  "recoverable": _delta(gb[i]["recoverable_ns"], ga[j]["recoverable_ns"]),
                  "change": impact_change(gb[i]["impact_ns"], ga[j]["impact_ns"]),
                  "severity_before": gb[i]["severity"]} for i, j, how in pairs]  # fmt: skip
    return {
        "fixed": [brief(g) for i, g in enumerate(gb) if i not in matched_b],
        "new": [brief(ga[j]) for j in unmatched_a],
        "unchanged": sorted(unchanged, key=lambda u: -abs(u["impact"]["delta"] or 0)),
        "impact_total": _delta(sum(g["impact_ns"] for g in gb), sum(g["impact_ns"] for g in ga)),
        # what fixing every group would save, where each side's findings say (None: a side from before)
        "recoverable_total": _delta(_total(gb, "recoverable_ns"), _total(ga, "recoverable_ns")),
    }


# A problem found in both captures changed when its impact moved by this factor or more (and by
# at least CHANGE_MIN_NS): the same problem's impact varies between two runs by tens of percent
# (which steps were captured, jitter), a 1.5x move is past that; and a 14x drop is not "unchanged".
CHANGE_FACTOR = 1.5
CHANGE_MIN_NS = 10_000  # the detectors' smallest impact worth a finding (10 us)


def impact_change(before: float, after: float) -> str:
    """``better``, ``worse`` or ``same``: how a matched finding group's impact moved."""
    if after <= before / CHANGE_FACTOR and before - after >= CHANGE_MIN_NS:
        return "better"
    if after >= before * CHANGE_FACTOR and after - before >= CHANGE_MIN_NS:
        return "worse"
    return "same"


def change_counts(matched: list[dict[str, Any]]) -> str:
    """ "2 better, 1 worse, 3 about the same": the matched groups by their impact's move."""
    counts = {c: sum(g.get("change", "same") == c for g in matched) for c in ("better", "worse", "same")}
    return f"{counts['better']} better, {counts['worse']} worse, {counts['same']} about the same"


def _changed(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, Any]]:
    before, after = before or {}, after or {}
    return [{"name": k, "before": before.get(k), "after": after.get(k)}
            for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]  # fmt: skip


def _capture(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """Differences in how the two were run: command, NCCL_/CUDA_/TORCH_ environment, nsys options;
    from ``manifest.json`` when given, else from what the exports recorded."""
    cb, ca = b["profile"]["capture"], a["profile"]["capture"]
    mb, ma = b.get("capture") or {}, a.get("capture") or {}

    def env(m: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
        environment = m.get("environment") or c["environment"]
        return {k: v for k, v in environment.items() if k.startswith(("NCCL_", "CUDA_", "TORCH_"))}

    def cmd(m: dict[str, Any], c: dict[str, Any]) -> Any:
        return m.get("command") or c["command"]

    def opts(m: dict[str, Any], c: dict[str, Any]) -> Any:
        if not m.get("nsys_argv"):
            return c["options"]
        return {"argv": " ".join(m["nsys_argv"][2 : len(m["nsys_argv"]) - len(m.get("command") or [])])}

    command = (
        []
        if cmd(mb, cb) == cmd(ma, ca)
        else [{"name": "command", "before": _join(cmd(mb, cb)), "after": _join(cmd(ma, ca))}]
    )
    return {"command": command, "environment": _changed(env(mb, cb), env(ma, ca)), "nsys_options": _changed(opts(mb, cb), opts(ma, ca)),
            "status": {"before": mb.get("status"), "after": ma.get("status")}}  # fmt: skip


def _join(cmd: list[str] | None) -> str | None:
    return None if cmd is None else " ".join(cmd)


def comparability(b: dict[str, Any], a: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(reasons the two cannot be compared, notes worth knowing that do not block)."""
    pb, pa = b["profile"], a["profile"]
    reasons, notes = [], []
    if len(pb["ranks"]) != len(pa["ranks"]):
        reasons.append(f"world size differs: {len(pb['ranks'])} ranks before, {len(pa['ranks'])} after")
    elif pb["ranks"] != pa["ranks"]:
        reasons.append(f"ranks differ: {pb['ranks']} before, {pa['ranks']} after")
    if pb["devices"] != pa["devices"]:
        reasons.append(f"devices differ: {pb['devices']} before, {pa['devices']} after")
    tb = {k["signature"]: k["total_ns"] for k in pb["kernels"]}
    ta = {k["signature"]: k["total_ns"] for k in pa["kernels"]}
    if tb and ta:
        shared_b = sum(v for k, v in tb.items() if k in ta) / max(sum(tb.values()), 1)
        shared_a = sum(v for k, v in ta.items() if k in tb) / max(sum(ta.values()), 1)
        if min(shared_b, shared_a) < MIN_KERNEL_OVERLAP:
            reasons.append(f"different work: only {100 * shared_b:.0f}% of the kernel time before and {100 * shared_a:.0f}% "
                           "after is in kernels (name, grid, block) both captures ran")  # fmt: skip
    elif bool(tb) != bool(ta):
        reasons.append(f"kernels recorded {'before only' if tb else 'after only'}")
    gb, ga = pb["capture"]["graph_trace"], pa["capture"]["graph_trace"]
    if gb != ga and gb and ga:
        reasons.append(f"CUDA graph trace mode differs: {gb} before, {ga} after (--cuda-graph-trace)")
    vb, va = pb["capture"]["nsys_versions"], pa["capture"]["nsys_versions"]
    if vb and va and vb != va:
        reasons.append(f"nsys versions differ: {', '.join(vb)} before, {', '.join(va)} after")
    if "process order" in pb.get("rank_sources", []) + pa.get("rank_sources", []) and len(pb["ranks"]) > 1:
        notes.append(
            "ranks were guessed from process order: per-rank rows pair processes by their order, not by a recorded rank"
        )
    sb, sa = pb["steps"]["source"], pa["steps"]["source"]
    if sb != sa:
        notes.append(
            f"steps found differently: {sb or 'none'} before, {sa or 'none'} after; step times may not compare"
        )
    elif sb == "kernel sequence" and pb["steps"]["detail"] != pa["steps"]["detail"]:
        notes.append("the repeating kernel sequence differs between the two; step times may not compare")
    for label, d in (("before", b), ("after", a)):
        status = (d.get("capture") or {}).get("status")
        if status and status != "ok":
            notes.append(f"the {label} capture's status is {status!r} (manifest.json): its figures cover a partial run")
    return reasons, notes


def diff_documents(before: dict[str, Any], after: dict[str, Any], *, labels: tuple[str, str] = ("before", "after"),
                   top: int = TOP_KERNELS) -> dict[str, Any]:  # fmt: skip
    """The diff document (docs/diff.md): every figure of two profiled report documents side by side."""
    for label, doc in zip(labels, (before, after), strict=True):
        if not isinstance(doc.get("profile"), dict):
            raise InputError(f"{label}: a report without a diff profile; write it with `nsysan report --format json` "
                             f"from nsysan {__version__} or later")  # fmt: skip
    pb, pa = before["profile"], after["profile"]
    reasons, notes = comparability(before, after)
    return {
        "nsysan_diff_version": DIFF_VERSION,
        "nsysan_version": __version__,
        "before": {"label": labels[0], "ranks": pb["ranks"], "devices": pb["devices"], "capture": pb["capture"]},
        "after": {"label": labels[1], "ranks": pa["ranks"], "devices": pa["devices"], "capture": pa["capture"]},
        "comparable": {"ok": not reasons, "reasons": reasons, "notes": notes},
        "steps": _steps(pb, pa),
        "breakdown": _breakdown(before, after),
        "ranks": _ranks(pb, pa),
        "nccl": _table(pb["nccl"], pa["nccl"], ["kind", "op", "bytes"], ["count", "total_ns"]),
        "copies": _table(pb["copies"], pa["copies"], ["copy_kind"], ["count", "bytes", "total_ns"]),
        "kernels": _kernels(pb, pa, top),
        "findings": _findings(before, after),
        "capture": _capture(before, after),
    }


def _samples(profile: dict[str, Any], key: str) -> list[float]:
    return [x for v in profile["steps"]["per_rank"].values() for x in v[key]]


def parse_threshold(text: str) -> float:
    """'5%' or '5' -> 5.0 (percent)."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise InputError(f"--fail-on-regression {text!r}: give a percentage such as 5%") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"--fail-on-regression {text!r}: give a non-negative percentage")
    return value


def metric_change(diff: dict[str, Any], before: dict[str, Any], after: dict[str, Any], metric: str) -> dict[str, Any]:
    """The gated metric: its value before and after, how much worse after is (percent; negative =
    better) and the confidence that it is worse, from the per-step samples where there are steps."""
    pb, pa = before["profile"], after["profile"]
    if metric == "step":
        s = diff["steps"]["slowest"]
        if s["before"] is None or s["after"] is None:
            raise InputError(
                "--metric step: no step time in "
                + " and ".join(side for side, p in (("before", pb), ("after", pa)) if not p["steps"]["per_rank"])
                + " (name NVTX ranges `step N` or give --step-pattern; or gate on --metric busy|nccl)"
            )
        return {"metric": "step", "unit": "ns", "before": s["before"], "after": s["after"], "worse_pct": s["pct"],
                "confidence_worse": s["confidence_worse"]}  # fmt: skip
    if metric == "busy":
        # busy share: lower is worse
        vb = _busy_share(pb)
        va = _busy_share(pa)
        sampled = pb["steps"]["per_rank"] and pa["steps"]["per_rank"]
        worse = confidence_greater(_samples(pa, "busy_pct"), _samples(pb, "busy_pct")) if sampled else None
        pct = _pct(vb, va)
        return {"metric": "busy", "unit": "%", "before": vb, "after": va, "worse_pct": None if pct is None else -pct,
                "confidence_worse": worse}  # fmt: skip
    if metric == "nccl":
        per_step = bool(pb["steps"]["per_rank"] and pa["steps"]["per_rank"])
        if per_step:
            vb, va = (float(np.median(_samples(p, "nccl_ns"))) for p in (pb, pa))
        else:
            vb, va = (float(sum(r["total_ns"] for r in p["nccl"])) for p in (pb, pa))
        worse = confidence_greater(_samples(pb, "nccl_ns"), _samples(pa, "nccl_ns")) if per_step else None
        return {"metric": "nccl" + (" per step" if per_step else " total"), "unit": "ns", "before": vb, "after": va,
                "worse_pct": _pct(vb, va), "confidence_worse": worse}  # fmt: skip
    if metric in CATEGORIES:
        bd = diff["breakdown"]
        if not bd["available"]:
            why = "; ".join(f"{side}: {w}" for side, w in bd["why"].items() if w)
            raise InputError(
                f"--metric {metric}: no step breakdown to compare ({why}); gate on --metric step|busy|nccl"
            )
        j = bd["job"][metric]
        return {"metric": f"{metric} per step", "unit": "ns", "before": j["before"], "after": j["after"],
                "worse_pct": j["pct"], "confidence_worse": j["confidence_worse"],
                # none before: no percentage to take, so what it adds is weighed against the step before
                "from_zero_pct": _share(j["after"], bd["step_ns"]["before"]) if not j["before"] and j["after"] else None}  # fmt: skip
    if metric.startswith("kernel:") and metric[7:]:
        name = metric[7:]

        def pick(p: dict[str, Any]) -> list[dict[str, Any]]:
            return [k for k in p["kernels"] if name in (k["short_name"], k["signature"]) or name in k["signature"]]

        kb, ka = pick(pb), pick(pa)
        if not kb and not ka:
            raise InputError(f"--metric {metric}: no kernel named {name!r} in either capture")

        def steps(p: dict[str, Any]) -> int:
            return sum(len(v["step_ns"]) for v in p["steps"]["per_rank"].values())

        nb, na = steps(pb), steps(pa)
        vb, va = float(sum(k["total_ns"] for k in kb)), float(sum(k["total_ns"] for k in ka))
        if nb and na:  # per step, so captures of different lengths compare
            vb, va = vb / nb, va / na
        return {"metric": metric + (" per step" if nb and na else " total"), "unit": "ns", "before": vb, "after": va,
                "worse_pct": _pct(vb, va), "confidence_worse": None}  # fmt: skip
    raise InputError(f"--metric {metric!r}: one of {', '.join(METRICS)}, kernel:NAME")


def _percent(c: float) -> str:
    return ">99.9%" if c >= 0.9995 else f"{100 * c:.1f}%"


def _busy_share(p: dict[str, Any]) -> float | None:
    rows = p["ranks_table"]
    span = sum(r["span_ns"] for r in rows)
    return round(100.0 * sum(r["busy_ns"] for r in rows) / span, 3) if span else None


def gate(diff: dict[str, Any], before: dict[str, Any], after: dict[str, Any], *, threshold: float | None,
         metric: str = "step", fail_on: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The CI verdict: fails when ``metric`` got worse by more than ``threshold`` percent and the
    per-step samples make that at least CONFIDENCE likely (with no samples, the threshold alone
    decides, and the verdict says so); or when ``fail_on`` finds new (or worse) findings."""
    out: dict[str, Any] = {"failed": False, "reasons": []}
    if threshold is not None:
        m = metric_change(diff, before, after, metric)
        m["threshold_pct"] = threshold
        beyond_noise = m["confidence_worse"] is None or m["confidence_worse"] >= CONFIDENCE
        m["noise_judged"] = m["confidence_worse"] is not None
        out["regression"] = m
        conf = (
            f", confidence {_percent(m['confidence_worse'])}"
            if m["noise_judged"]
            else ", no per-step samples to judge noise"
        )
        if m["worse_pct"] is not None and m["worse_pct"] > threshold and beyond_noise:
            out["reasons"].append(f"{m['metric']} worse by {m['worse_pct']:.1f}% (threshold {threshold:g}%{conf})")
        elif m.get("from_zero_pct") is not None and m["from_zero_pct"] > threshold and beyond_noise:
            out["reasons"].append(f"{m['metric']} appeared (none before), adding {m['from_zero_pct']:.1f}% to the step "
                                  f"(threshold {threshold:g}%{conf})")  # fmt: skip
    if fail_on is not None:
        f = diff["findings"]
        if fail_on == "new-findings":
            hits = f["new"]
        else:
            level = Severity(fail_on).rank
            hits = [g for g in f["new"] if Severity(g["severity"]).rank >= level]
            hits += [
                g for g in f["unchanged"] if Severity(g["severity"]).rank >= level > Severity(g["severity_before"]).rank
            ]
        out["fail_on"] = fail_on
        if hits:
            out["reasons"].append(f"{len(hits)} new or worsened finding group(s) at --fail-on {fail_on}")
    out["failed"] = bool(out["reasons"])
    return out
