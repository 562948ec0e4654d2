"""Page speed benchmark: how long a user waits for the dashboard's pages of a trace with hundreds of
findings, in a real Chromium (issue 31 item 3).

    python benchmarks/pages.py [EXPORT ...] [--repeat 5]

Default export: NERSC's ``4gpu_baseline`` DDP capture (446 findings in 36 groups; not bundled, as
its licence is not ours to give: pass its path, or any export of your own). ``nsysan serve`` runs
on it in its own process (tools/browser.py, as the browser tests); once the trace is analysed this
times, as a user waits for them:

* trace page, built: from opening ``/traces/1`` until the timeline is drawn (its figure is in the
  page), the timeline already in the server's memory;
* zoom: from a zoom of the timeline to a narrow window until the server's redrawn figure is in the
  page;
* findings page: from opening ``/traces/1/findings`` until the table shows its rows;
* finding page: from opening the largest finding until its zoomed timeline is drawn;
* trace page, rebuilt: the server restarted (timelines are kept in memory only), then from opening
  the trace page until the timeline is drawn again.

Targets (issue 31): drawn <= 1 s when built, <= 3 s when rebuilt after a restart, zoom <= 0.5 s.
Each figure is printed with its ratio to its target; these 2-core machines are shared and noisy, so
the medians of ``--repeat`` runs are what to compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT = Path("/work/nersc/4gpu_baseline.sqlite")
GRAPH = "#timeline .js-plotly-plot"
TARGETS = {"trace page, built": 1.0, "zoom": 0.5, "trace page, rebuilt": 3.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="*", type=Path, default=[DEFAULT], help="the export(s) of one trace")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    missing = [p for p in args.exports if not p.is_file()]
    if missing:
        sys.exit(f"benchmarks/pages.py: no export {missing[0]} (give the path of a trace with many findings)")

    from playwright.sync_api import sync_playwright

    from nsysan.store import ReviewStore
    from tools.browser import ServeProcess, launch_chromium

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        traces = work / "traces"
        traces.mkdir()
        for path in args.exports:
            os.symlink(path.resolve(), traces / path.name)
        db = str(work / "review.sqlite")
        timings: dict[str, list[float]] = {}
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            with ServeProcess(traces, db, work) as server:
                t = time.perf_counter()
                page.goto(server.url)
                page.locator("td.status", has_text="ready").wait_for(timeout=1_200_000)
                print(f"registered, analysed and timeline prepared in {time.perf_counter() - t:.1f} s")
                findings = ReviewStore(db).findings(1)
                print(f"trace: {', '.join(p.name for p in args.exports)}; {len(findings)} findings")
                url = server.url
                for i in range(args.repeat):
                    _time(timings, "trace page, built", _open_trace, page, url)
                    page.wait_for_timeout(300)
                    _time(timings, "zoom", _zoom, page, i)
                    _time(timings, "findings page", _open_findings, page, url)
                    _time(timings, "finding page", _open_finding, page, url, findings[0]["id"])
            for _ in range(args.repeat):
                with ServeProcess(traces, db, work) as server:  # a restart: no timeline in memory
                    _time(timings, "trace page, rebuilt", _open_trace, page, server.url)
            browser.close()
    for label, times in timings.items():
        median = statistics.median(times)
        target = TARGETS.get(label)
        versus = f"; {median / target:.2f}x of the {target:g} s target" if target else ""
        print(
            f"{label:>20}: median {median:.2f} s (min {min(times):.2f}, max {max(times):.2f}) over {len(times)}{versus}"
        )


def _time(timings: dict[str, list[float]], label: str, step: Callable[..., Any], *args: Any) -> None:
    t = time.perf_counter()
    step(*args)
    timings.setdefault(label, []).append(time.perf_counter() - t)


def _until(page: Any, predicate: str, timeout_s: float) -> bool:
    """Poll ``predicate`` (JavaScript) every 20 ms until it holds: whether it did within ``timeout_s``.
    Polled with evaluate (DevTools), not wait_for_function: the page's CSP forbids eval, which
    wait_for_function needs."""
    end = time.perf_counter() + timeout_s
    while time.perf_counter() < end:
        if page.evaluate(predicate):
            return True
        page.wait_for_timeout(20)
    return False


def _wait(page: Any, predicate: str, timeout_s: float) -> None:
    if not _until(page, predicate, timeout_s):
        raise TimeoutError(f"not within {timeout_s:g} s: {predicate}")


def _open_trace(page: Any, url: str) -> None:
    page.goto(f"{url}/traces/1")
    _wait(page, f"(document.querySelector('{GRAPH}') || {{}}).data !== undefined", 300)


def _zoom(page: Any, i: int) -> None:
    """A narrow window somewhere in the middle (another each time): the server draws it anew. The
    graph may not be listening yet when the page has just drawn it: the zoom is asked again, up to
    five times, and the time counts from the first ask."""
    for _ in range(5):
        page.evaluate(f"""() => {{
            const gd = document.querySelector('{GRAPH}');
            window.__before = window.__before || gd.data;
            const [lo, hi] = gd.layout.xaxis.range.map(Number);
            const at = lo + (hi - lo) * (0.3 + 0.1 * {i % 5});
            Plotly.relayout(gd, {{'xaxis.range': [at, at + (hi - lo) / 200]}});
        }}""")
        if _until(page, f"document.querySelector('{GRAPH}').data !== window.__before", 10):
            page.evaluate("() => { window.__before = undefined; }")
            return
    raise TimeoutError("the zoomed figure never came")


def _open_findings(page: Any, url: str) -> None:
    page.goto(f"{url}/traces/1/findings")
    page.locator("#findings-table .ag-cell").first.wait_for(timeout=60_000)


def _open_finding(page: Any, url: str, finding_id: int) -> None:
    page.goto(f"{url}/findings/{finding_id}")
    _wait(page, "(document.querySelector('#finding-timeline .js-plotly-plot') || {}).data !== undefined", 60)


if __name__ == "__main__":
    main()
