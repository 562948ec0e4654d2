"""Screenshots of the main pages for docs/: ``python -m tools.screenshots [OUT] [--big EXPORT]``.

Serves the bundled samples from a throw-away store, reviews one finding the way a team would
(status, assignee, a comment, a note), and photographs each page with Debian's Chromium.
``--big`` adds the overview of a large export (e.g. the 1M-kernel one benchmarks/ingest.py builds),
to show rows drawn as their busy share.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from fixtures.samples import SAMPLES_DIR
from tools.browser import ServeProcess, launch_chromium


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=Path("docs/img"))
    parser.add_argument("--big", type=Path, help="also photograph the overview of this (large) export")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        traces = tmp / "traces"
        traces.mkdir()
        for name in ("pipeline-stall", "pipeline-stall-fixed", "overlap-slowdown", "graph-gap", "allreduce-2rank"):
            os.symlink(SAMPLES_DIR / f"{name}.sqlite", traces / f"{name}.sqlite")
        if args.big:
            os.symlink(args.big.resolve(), traces / args.big.name)
        with ServeProcess(traces, str(tmp / "review.sqlite"), tmp) as server, sync_playwright() as p:
            url = server.url
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            timeout = 600_000 if args.big else 60_000
            page.locator("td.status", has_text="ready").nth(4 + bool(args.big)).wait_for(timeout=timeout)

            def shot(name: str) -> None:
                page.wait_for_timeout(1500)
                page.screenshot(path=str(args.out / f"{name}.png"), full_page=True)
                print(args.out / f"{name}.png")

            shot("library")
            ids = {name: page.locator("tr", has=page.get_by_role("link", name=name, exact=True)).get_attribute("data-trace")
                   for name in ("pipeline-stall", "pipeline-stall-fixed")}  # fmt: skip
            page.goto(f"{url}/traces/{ids['pipeline-stall']}")
            page.fill("#note-text", "Captured on 4 GPUs with the 1F1B schedule; rank 3 loads its data late.")
            page.click("#note-add")
            page.locator("li.note").wait_for()
            shot("overview")
            page.goto(f"{url}/traces/{ids['pipeline-stall']}/findings")
            page.locator("#findings-table a").first.click()
            page.locator("#finding-timeline .main-svg").first.wait_for()
            page.fill("#author", "sam")
            page.click("#finding-status")
            page.get_by_role("option", name="confirmed").click()
            page.fill("#finding-assignee", "dana")
            page.click("#finding-save")
            page.locator(".saved").wait_for()
            page.fill("#comment-text", "Rank 3 starts its sends late; moving its sends to their own group.")
            page.click("#comment-add")
            page.locator("li.comment").wait_for()
            shot("finding")
            page.goto(f"{url}/traces/{ids['pipeline-stall']}/findings")
            page.locator("#findings-table").get_by_text("confirmed").wait_for()
            shot("findings")
            page.goto(f"{url}/compare?before={ids['pipeline-stall']}&after={ids['pipeline-stall-fixed']}")
            page.locator("#step-change").wait_for()
            shot("compare")
            if args.big:
                page.goto(url)
                big = page.locator("tr", has=page.get_by_role("link", name=args.big.stem, exact=True)).get_attribute(
                    "data-trace"
                )
                page.goto(f"{url}/traces/{big}")
                page.locator("#timeline .main-svg").first.wait_for(timeout=120_000)
                shot("overview-1m")
            browser.close()


if __name__ == "__main__":
    main()
