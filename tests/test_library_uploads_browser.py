"""Deleting an uploaded trace from the library page, in a real Chromium (``nsysan serve`` in its own
process; skips without Playwright and Chromium, like tests/test_dashboard_browser.py)."""

from __future__ import annotations

import pytest

from fixtures.samples import SAMPLES_DIR
from nsysan.store import NotFound, ReviewStore
from tests.test_dashboard_browser import _ready, serve


def test_an_uploaded_trace_is_deleted_after_a_confirmation(browser, tmp_path):
    db = str(tmp_path / "review.sqlite")
    with serve(tmp_path, db, samples=("pipeline-stall",)) as s:
        page = browser.new_page()
        page.goto(s.url)
        _ready(page, "pipeline-stall")
        page.set_input_files("#upload input[type=file]", str(SAMPLES_DIR / "launch-queue-full.sqlite"))
        _ready(page, "launch-queue-full")
        rows = page.locator("table.library tbody tr")
        uploaded = page.locator("table.library tr", has=page.get_by_role("link", name="launch-queue-full", exact=True))
        scanned = page.locator("table.library tr", has=page.get_by_role("link", name="pipeline-stall", exact=True))
        assert scanned.locator("button.delete").count() == 0  # the traces directory's files are not the server's
        trace_id = int(uploaded.get_attribute("data-trace"))
        store = ReviewStore(db)
        finding = store.findings(trace_id)[0]
        store.comment(finding["id"], "ada", "to be deleted with its trace")
        (upload_dir,) = (tmp_path / "uploads").iterdir()

        asked: list[str] = []

        def dismiss(dialog) -> None:
            asked.append(dialog.message)
            dialog.dismiss()

        page.once("dialog", dismiss)
        uploaded.locator("button.delete").click()
        page.wait_for_timeout(1500)  # a refresh or two: nothing happened
        assert asked and "launch-queue-full" in asked[0] and rows.count() == 2 and upload_dir.exists()

        page.once("dialog", lambda dialog: dialog.accept())
        uploaded.locator("button.delete").click()
        page.get_by_text(f"Deleted trace {trace_id}").wait_for()
        uploaded.wait_for(state="detached")
        assert rows.count() == 1 and not upload_dir.exists()
        assert [t["name"] for t in store.traces()] == ["pipeline-stall"]
        with pytest.raises(NotFound):
            store.finding(finding["id"])
