"""The hardened dashboard in a real Chromium: the Content Security Policy breaks no page, and what
the server refuses (a comment too long, an upload too big) is said in the page."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.samples import SAMPLES_DIR
from tests.test_dashboard_security import _free_port, _wait_for


@pytest.fixture
def served(tmp_path) -> Iterator[str]:
    """``nsysan serve`` (loopback, no login) on two samples, uploads limited to 1 MiB."""
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("pipeline-stall", "pipeline-stall-fixed"):
        shutil.copy(SAMPLES_DIR / f"{name}.sqlite", traces)
    port = _free_port()
    with (tmp_path / "serve.log").open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "nsysan", "serve", "--db", str(tmp_path / "r.sqlite"),
                                    "--traces", str(traces), "--port", str(port), "--uploads", str(tmp_path / "up"),
                                    "--max-upload-mb", "1"], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait_for(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def _ready(page, name: str) -> None:
    row = page.locator("table.library tr", has=page.get_by_role("link", name=name, exact=True))
    row.locator("td.status", has_text="ready").wait_for(timeout=60_000)


def test_no_page_breaks_under_the_content_security_policy(browser, served):
    page = browser.new_page()
    blocked: list[str] = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: blocked.append(str(e)))
    page.goto(served)
    _ready(page, "pipeline-stall")
    _ready(page, "pipeline-stall-fixed")
    page.goto(f"{served}/traces/1")
    page.locator("#timeline .js-plotly-plot .main-svg").first.wait_for(state="attached")
    # the bars are WebGL (regl compiles with Function): under a CSP without eval Plotly draws none
    page.locator("#timeline .js-plotly-plot canvas.gl-canvas-context").first.wait_for(state="attached")
    page.wait_for_timeout(500)
    assert "WebGL is not supported" not in page.inner_text("body")
    page.goto(f"{served}/traces/1/findings")
    page.locator("#findings-table").wait_for()
    page.goto(f"{served}/findings/1")
    page.locator("#finding-timeline .js-plotly-plot .main-svg").first.wait_for(state="attached")
    page.goto(f"{served}/compare?before=1&after=2")
    page.locator("#compare-result").get_by_text("fixed", exact=False).first.wait_for()
    assert blocked == []


def test_a_comment_too_long_is_refused_in_the_page(browser, served):
    page = browser.new_page()
    page.goto(served)
    _ready(page, "pipeline-stall")
    page.goto(f"{served}/findings/1")
    page.fill("#comment-text", "x" * 10_001)
    page.click("#comment-add")
    page.get_by_text("The comment is too long (10,001 characters; at most 10,000)").wait_for()
    assert page.input_value("#comment-text") == "x" * 10_001  # kept, to be shortened
    page.fill("#comment-text", "short enough")
    page.click("#comment-add")
    page.locator("#comments").get_by_text("short enough").wait_for()


def test_an_upload_over_the_limit_is_refused_in_the_page(browser, served, tmp_path: Path):
    page = browser.new_page()
    page.goto(served)
    _ready(page, "pipeline-stall")
    big = tmp_path / "big.sqlite"
    big.write_bytes(b"\0" * 3 * 2**20)
    page.set_input_files("#upload input[type=file]", str(big))
    page.get_by_text("an upload may be 1 MiB in all").wait_for()
    assert page.locator("table.library tbody tr").count() == 2
