"""Layouts that hold with the names real jobs have (issue 31 item 4): a 300-character demangled
kernel name, in a real Chromium, on the trace, finding and compare pages. Nothing may run past the
window or over a neighbouring column; compared by bounding boxes, as a reader would see it."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from fixtures.samples import SAMPLES_DIR
from tests.test_dashboard_browser import _ready, serve

# a CUTLASS kernel as PyTorch's demangled names run: 300 characters, no space to break at for 150
LONG_NAME = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_bf16_256x128_32x3_nn_align8::Params<"
             "cutlass::gemm::GemmShape<256,128,32>,cutlass::epilogue::thread::LinearCombination<float,4,float,float>,"
             "cutlass::arch::OpMultiplyAddFastF32,cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>>>"
             "(Params p)")  # fmt: skip

# the page's geometry: columns side by side that overlap, and boxes that run past their column or
# the window (inside a box that scrolls or clips its content, and inside plotly's drawing, excepted)
_GEOMETRY = """() => {
  document.querySelectorAll("details").forEach((d) => { d.open = true; });  // folded tables count too
  const width = document.documentElement.clientWidth;
  const name = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
      (el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\\s+/).join(".") : "");
  const clipped = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const s = getComputedStyle(p);
      if (s.overflowX !== "visible" || p.classList.contains("js-plotly-plot")) return true;
    }
    return false;
  };
  const problems = [];
  for (const el of document.querySelectorAll("main *")) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > width + 1 && !clipped(el)) problems.push(`${name(el)} runs past the window (${Math.round(r.right)} > ${width})`);
  }
  for (const row of document.querySelectorAll(".columns")) {
    const columns = [...row.children].map((c) => [c, c.getBoundingClientRect()]);
    for (let i = 0; i < columns.length; i++) {
      const [col, box] = columns[i];
      for (let j = i + 1; j < columns.length; j++) {
        const other = columns[j][1];
        if (box.left < other.right - 1 && other.left < box.right - 1) problems.push(`${name(col)} overlaps ${name(columns[j][0])}`);
      }
      for (const el of col.querySelectorAll("*")) {
        const r = el.getBoundingClientRect();
        if (r.width > 0 && (r.right > box.right + 1 || r.left < box.left - 1) && !clipped(el) ) problems.push(`${name(el)} runs out of ${name(col)}`);
      }
    }
  }
  return [...new Set(problems)];
}"""


def _long_named(tmp: Path) -> None:
    """overlap-slowdown with its slowed GEMM renamed to LONG_NAME (demangled and short name)."""
    traces = tmp / "traces"
    traces.mkdir(exist_ok=True)
    target = traces / "long-names.sqlite"
    shutil.copy(SAMPLES_DIR / "overlap-slowdown.sqlite", target)
    with sqlite3.connect(target) as db:
        changed = db.execute(
            "UPDATE StringIds SET value = ? WHERE value = 'ampere_sgemm_128x64_tn'", (LONG_NAME,)
        ).rowcount
    assert changed == 1 and len(LONG_NAME) == 300


@pytest.mark.parametrize("width", [1280, 900])
def test_a_300_character_kernel_name_runs_over_nothing(browser, tmp_path, width):
    _long_named(tmp_path)
    with serve(tmp_path, str(tmp_path / "review.sqlite"), samples=("overlap-slowdown",)) as s:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.goto(s.url)
        _ready(page, "long-names")
        _ready(page, "overlap-slowdown")
        ids = {name: page.locator("tr", has=page.get_by_role("link", name=name, exact=True)).get_attribute("data-trace")
               for name in ("long-names", "overlap-slowdown")}  # fmt: skip
        seen = {}
        page.goto(f"{s.url}/traces/{ids['long-names']}")
        page.get_by_text(LONG_NAME[:60]).first.wait_for()
        page.locator("#timeline .js-plotly-plot").wait_for(timeout=60_000)  # measured with its timeline drawn
        seen["trace"] = page.evaluate(_GEOMETRY)
        page.goto(f"{s.url}/traces/{ids['long-names']}/findings")
        page.get_by_text(LONG_NAME[:60]).first.wait_for()
        seen["findings"] = page.evaluate(_GEOMETRY)
        link = page.locator("a[href^='/findings/']", has_text=LONG_NAME[:60]).first.get_attribute("href")
        page.goto(f"{s.url}{link}")
        page.locator("#finding-status").wait_for()
        seen["finding"] = page.evaluate(_GEOMETRY)
        page.goto(f"{s.url}/compare?before={ids['long-names']}&after={ids['overlap-slowdown']}")
        page.locator("#step-change").wait_for()
        assert LONG_NAME[:60] in page.inner_text("main")
        seen["compare"] = page.evaluate(_GEOMETRY)
        page.close()
        assert seen == {"trace": [], "findings": [], "finding": [], "compare": []}
