"""Re-analysis with settings in a real Chromium (``nsysan serve`` in its own process; issue 31 item 6):
the trace page's form queues it, the page follows the analysis and redraws, and a finding it changed
says so in its thread; a bad setting is one line on the page and changes nothing."""

from __future__ import annotations

import time

from playwright.sync_api import expect

from nsysan.store import ReviewStore
from nsysan.store.store import ANALYSIS_AUTHOR
from tests.test_dashboard_browser import _ready, serve
from tests.test_review_history_browser import _trace_id


def test_reanalyse_with_settings_and_read_what_changed_in_the_thread(browser, tmp_path):
    db = str(tmp_path / "review.sqlite")
    with serve(tmp_path, db, samples=("overlap-slowdown",)) as s:
        page = browser.new_page()
        page.goto(s.url)
        _ready(page, "overlap-slowdown")
        trace_id = _trace_id(page, "overlap-slowdown")
        page.goto(f"{s.url}/traces/{trace_id}")
        page.locator("#timeline").wait_for(timeout=60_000)
        page.get_by_text("Re-analyse with other settings").click()

        page.fill("#reanalyse-settings", "no_such.min_ratio=2")
        page.click("#reanalyse")
        expect(page.locator("#reanalyse-message .error")).to_have_text(
            "Not re-analysed: 'no_such.min_ratio=2': no detector 'no_such'; known: " + _known()
        )
        store = ReviewStore(db)
        assert store.trace(int(trace_id))["settings"] == {}  # nothing queued

        # the slowdown's finding pages, open while it is re-analysed
        open_pages = {}
        for f in store.findings(int(trace_id), kind="comm_compute_slowdown"):
            open_pages[f["id"]] = browser.new_page()
            open_pages[f["id"]].goto(f"{s.url}/findings/{f['id']}")
            open_pages[f["id"]].locator("#finding-status").wait_for()
        page.fill("#reanalyse-settings", "comm_compute_slowdown.min_ratio=1.44")
        page.click("#reanalyse")
        expect(page.locator("#reanalyse-message .ok")).to_contain_text(
            "Re-analysing with comm_compute_slowdown.min_ratio=1.44"
        )
        deadline = time.monotonic() + 60
        while store.trace(int(trace_id))["status"] != "ready":
            assert time.monotonic() < deadline, "the re-analysis did not finish in 60 s"
            time.sleep(0.2)
        # the page followed the analysis and drew the timeline again when it was done
        expect(page.locator("#overview-loading")).to_have_count(0, timeout=30_000)
        page.locator("#timeline").wait_for()
        assert store.trace(int(trace_id))["settings"] == {"comm_compute_slowdown": {"min_ratio": 1.44}}
        changed = [f["id"] for f in store.findings(int(trace_id), include_missing=True)
                   if any(c["author"] == ANALYSIS_AUTHOR for c in store.finding(f["id"])["comments"])]  # fmt: skip
        assert changed and set(changed) <= set(open_pages)
        for finding_id, other in open_pages.items():  # each open page says so, never reloaded
            said = other.locator("#review-message .live", has_text="A re-analysis changed this finding")
            expect(said).to_have_count(1 if finding_id in changed else 0, timeout=15_000)
        page.goto(f"{s.url}/findings/{changed[0]}")
        entry = page.locator("#comments li", has_text="settings comm_compute_slowdown.min_ratio=1.44")
        expect(entry).to_have_count(1, timeout=30_000)
        assert entry.inner_text().startswith(ANALYSIS_AUTHOR)
        # the form shows the settings the trace was last analysed with
        page.goto(f"{s.url}/traces/{trace_id}")
        page.get_by_text("Re-analyse with other settings").click()
        expect(page.locator("#reanalyse-settings")).to_have_value("comm_compute_slowdown.min_ratio=1.44")


def _known() -> str:
    from nsysan.detect import registered

    return ", ".join(sorted(registered()))
