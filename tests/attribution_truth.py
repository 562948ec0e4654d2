"""Step-time attribution against simulated truth: ``python -m tests.attribution_truth [--seeds N] [FAMILY ...]``.

Each scenario of :mod:`fixtures.attribution_scenarios` is a simulated job whose truth for "what would
fixing X save" is the same simulation, same draws, re-run without X. This analyses each one as a user
would (``nsysan.analysis.analyse`` on its exports) and scores, per kind, the sum of the findings'
``recoverable_ns`` against the simulated saving, the breakdown of each step against the simulated
one, whether the top group is the planted cause, and what clean twins claim. tests/test_attribution_truth.py
asserts on the same figures.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fixtures.attribution_scenarios import FAMILIES, scenario
from fixtures.jobsim import KINDS
from nsysan.analysis import analyse
from nsysan.ingest import load_trace

# kinds whose fix the simulation removes under another kind's name: head-of-line blocking on a
# shared NCCL stream (shared_nccl_stream) and behind a late rank (nccl_ordering_stall) are both
# removed by one NCCL stream per communicator or peer, which the scenarios call nccl_ordering_stall
TRUTH_KIND = {"shared_nccl_stream": "nccl_ordering_stall"}
CATEGORIES = ("compute", "communication_exposed", "waiting_for_peer", "copy_exposed", "idle")


@dataclass
class Result:
    family: str
    seed: int
    planted: bool
    wall_ns: int
    truth: dict[str, int]
    claimed: dict[str, int]
    top_kind: str | None
    top_severity: str | None
    breakdown_error: float  # worst |category - truth| / step length over matched steps (nan: none compared)
    steps_compared: int
    doc: dict[str, Any] = field(repr=False, default_factory=dict)


def run(family: str, seed: int, planted: bool, root: Path) -> Result:
    out = root / f"{family}-{seed}-{int(planted)}"
    paths, truth = scenario(family, seed, planted, out)
    with load_trace(paths, cache=None) as trace:
        doc = analyse(trace)
    claimed: dict[str, int] = {}
    for f in doc["findings"]:
        kind = TRUTH_KIND.get(f["kind"], f["kind"])
        claimed[kind] = claimed.get(kind, 0) + int(f["recoverable_ns"])
    groups = doc["groups"]
    top = groups[0] if groups else None
    return Result(family, seed, planted, truth.wall_ns, dict(truth.saving_ns), claimed,
                  TRUTH_KIND.get(top["kind"], top["kind"]) if top else None, top["severity"] if top else None,
                  *_breakdown_error(doc, truth), doc=doc)  # fmt: skip


def _breakdown_error(doc: dict[str, Any], truth: Any) -> tuple[float, int]:
    """The worst disagreement, as a share of the step, between a step's categories and the
    simulated ones, over steps whose windows agree within 1% (same step found)."""
    worst, compared = float("nan"), 0
    ranks = doc.get("steps", {}).get("ranks", {})
    for rank, steps in truth.steps.items():
        got = ranks.get(str(rank))
        if not got:
            continue
        starts = {s: i for i, s in enumerate(got["start_ns"])}
        for st in steps:
            i = starts.get(st.start_ns)
            if i is None:
                continue
            length = st.end_ns - st.start_ns
            if got["end_ns"][i] != st.end_ns or length <= 0:
                continue
            err = max(abs(got["breakdown_ns"][c][i] - getattr(st, c)) for c in CATEGORIES) / length
            worst = err if compared == 0 else max(worst, err)
            compared += 1
    return worst, compared


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("families", nargs="*", default=list(FAMILIES))
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            for seed in range(args.seeds):
                for planted in (True, False):
                    r = run(family, seed, planted, Path(tmp))
                    kinds = [k for k in KINDS if r.truth.get(k) or r.claimed.get(k)]
                    cells = " ".join(
                        f"{k}={r.claimed.get(k, 0) / 1e3:.0f}/{r.truth.get(k, 0) / 1e3:.0f}" for k in kinds
                    )
                    print(f"{family:22s} {seed} {'P' if planted else 'C'} wall={r.wall_ns / 1e6:7.2f}ms "
                          f"top={r.top_kind}/{r.top_severity} bd={r.breakdown_error:.3f}({r.steps_compared}) "
                          f"claimed/truth us: {cells}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
