"""The aggregate page in a real headless browser (Debian's Chromium through Playwright, from ``file://``).

What only a browser can tell: the summary is the first thing on the page, the folded long tail keeps the page
short (its height is measured, not guessed from the markup), a folded section opens from its summary line, and
the page asks for nothing but itself. Skips, saying so, where Chromium is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from analysis.viewer_builders import launched_chromium
from rcarun.cli import main

# The page's height at 1280 px on `methods_db` (three methods × two backbones × two realizations) before the
# page was condensed: every table open, the summary scattered over the header. Measured in this Chromium.
OLD_HEIGHT_PX = 7810


@pytest.fixture(scope="module")
def report_page(methods_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Written before the browser starts: Playwright's sync API keeps an event loop running in this thread.
    page = tmp_path_factory.mktemp("aggregate") / "report.html"
    assert main(["report", "--db", str(methods_db), "--html", str(page), "--resamples", "50"]) == 0
    return page


@pytest.fixture
def page(report_page: Path) -> Iterator[Page]:
    with launched_chromium() as browser:
        opened = browser.new_page(viewport={"width": 1280, "height": 900})
        requests: list[str] = []
        problems: list[str] = []
        opened.on("request", lambda request: requests.append(request.url))
        opened.on("pageerror", lambda error: problems.append(str(error)))
        opened.goto(report_page.as_uri())
        yield opened
        assert problems == []
        assert all(url.startswith(("file://", "data:")) for url in requests), requests


def test_the_summary_comes_first_and_the_page_is_half_as_tall(page: Page) -> None:
    sections = page.locator("section")
    expect(sections.first).to_have_attribute("id", "summary")
    summary = page.locator("#summary").bounding_box()
    accuracy = page.locator("#accuracy").bounding_box()
    assert summary is not None and accuracy is not None
    assert summary["y"] < 900 - 200  # within the first screen, below the header and the contents
    assert summary["y"] < accuracy["y"]
    expect(page.locator("#summary th").first).to_have_text("Run")
    expect(page.locator("#summary")).to_contain_text("expected answers readable")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height <= OLD_HEIGHT_PX / 2, height
    # Table 3's numbers carry their intervals; the accuracy plot is drawn (a decoded image, not a broken one).
    expect(page.locator("#accuracy td .ci").first).to_be_visible()
    assert page.evaluate("document.querySelector('#accuracy img').naturalWidth") > 600


def test_the_long_tail_is_folded_and_opens(page: Page) -> None:
    outcomes = page.locator("#outcomes details.tail")
    expect(outcomes).not_to_have_attribute("open", "")
    table = page.locator("#full-metrics table")
    expect(table).to_be_hidden()
    page.locator("#full-metrics summary").click()
    expect(table).to_be_visible()
    expect(table.locator("tbody tr")).to_have_count(6)  # 3 methods × 2 backbones, first realization
    # Every entry of the contents leads to a section of the page.
    targets = page.locator("#toc a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert targets[0] == "#summary" and len(targets) >= 10
    for target in targets:
        expect(page.locator(target)).to_have_count(1)
