"""Overview benchmark: how long the dashboard's timeline takes for a 1M-kernel trace.

    python benchmarks/overview.py [--kernels 1000000] [--repeat 5]

Uses the export benchmarks/ingest.py builds (8 ranks, cached under .nsysan-work/). Times, in one
process:

* prepare: read the timeline's columns and index them (TimelineData.from_trace). The server does
  this once per trace, in the background right after analysis, and keeps the result;
* render: what every page view and zoom costs after that: build the plotly figure and serialise it
  to the JSON the browser receives, for the whole trace (occupancy), a 20 ms window and a 0.5 ms
  window (every kernel drawn).

* in the browser (with ``--browser``, needs Playwright and Debian's Chromium): ``nsysan serve`` on
  the export, then, once analysed, the time from opening the trace's page to the timeline being
  drawn, and from a zoom to the redrawn window, as a user waits for them.

Target: render <= 2 s after analysis.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.ingest import WORK, build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--browser", action="store_true", help="also time the page in Chromium through nsysan serve")
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    path = build(WORK / f"bench-{args.kernels}.sqlite", args.kernels)

    import resource

    from dashboards.timeline import TimelineData
    from nsysan.ingest import load_trace

    t = time.perf_counter()
    with load_trace([path]) as trace:
        data = TimelineData.from_trace(trace)
    prepare = time.perf_counter() - t
    print(f"trace: {path.name}, {data.intervals:,} intervals in {len(data.rows)} rows")
    print(f"prepare (once per trace, after analysis): {prepare:.2f} s")

    start, end = data.extent_ns
    mid = (start + end) // 2
    findings = [{"id": i, "rank": i % 8, "device": i % 8, "severity": "warning", "title": f"finding {i}",
                 "start_ns": start + i * (end - start) // 20, "end_ns": start + i * (end - start) // 20 + 10**6}
                for i in range(20)]  # fmt: skip
    views = {"whole trace": None, "20 ms window": (mid, mid + 20_000_000), "0.5 ms window": (mid, mid + 500_000)}
    worst = 0.0
    for label, window in views.items():
        times, size, traces = [], 0, ""
        for _ in range(args.repeat):
            t = time.perf_counter()
            fig = data.figure(window, findings)
            payload = fig.to_json()
            times.append(time.perf_counter() - t)
            size = len(payload)
            traces = ", ".join(sorted({tr.type for tr in fig.data}))
        median = statistics.median(times)
        worst = max(worst, median)
        print(f"render {label:>13}: median {median * 1000:7.1f} ms (min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}) "
              f"over {args.repeat}; {size / 1e6:.2f} MB of JSON; {traces}")  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"slowest view {worst:.2f} s vs target 2 s: {worst / 2:.2f}x of the budget; peak memory {peak:.0f} MiB")
    if args.browser:
        in_browser(path, args.repeat)


def in_browser(path: Path, repeat: int) -> None:
    import os
    import tempfile

    from playwright.sync_api import sync_playwright

    from tools.browser import ServeProcess, launch_chromium

    with tempfile.TemporaryDirectory() as scratch:
        traces = Path(scratch) / "traces"
        traces.mkdir()
        os.symlink(path.resolve(), traces / path.name)
        with ServeProcess(traces, f"{scratch}/review.sqlite", Path(scratch)) as server, sync_playwright() as p:
            url = server.url
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            t = time.perf_counter()
            page.goto(url)
            page.locator("td.status", has_text="ready").wait_for(timeout=600_000)
            print(f"browser: registered, analysed and its timeline prepared in {time.perf_counter() - t:.1f} s")
            graph = "#timeline .js-plotly-plot"
            opens, zooms = [], []
            for i in range(repeat):
                t = time.perf_counter()
                page.goto(f"{url}/traces/1")
                page.locator(f"{graph} g.hm").wait_for(state="attached", timeout=60_000)
                opens.append(time.perf_counter() - t)
                page.wait_for_timeout(300)
                t = time.perf_counter()
                lo = 100 + 200 * i
                page.evaluate(
                    f"Plotly.relayout(document.querySelector('{graph}'), {{'xaxis.range': [{lo}, {lo + 0.5}]}})"
                )
                page.wait_for_function(f"!document.querySelector('{graph}').data.some(t => t.type === 'heatmap')",
                                       timeout=60_000)  # fmt: skip
                zooms.append(time.perf_counter() - t)
            browser.close()
    print(
        f"browser: open the overview until drawn: median {statistics.median(opens):.2f} s (first {opens[0]:.2f} s, "
        f"max {max(opens):.2f} s) over {repeat}; {statistics.median(opens) / 2:.2f}x of the 2 s target"
    )
    print(
        f"browser: zoom to 0.5 ms until redrawn with every kernel: median {statistics.median(zooms):.2f} s "
        f"(max {max(zooms):.2f} s)"
    )


if __name__ == "__main__":
    main()
