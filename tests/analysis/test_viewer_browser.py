"""The trajectory viewer in a real headless browser: Debian's Chromium driven by Playwright, from ``file://``.

What only a browser can tell: the link from the aggregate page leads to the index, the filter and the page
script work offline, hostile step contents stay text, a long step and a call's prompt appear only once opened.
`make test` installs Chromium (Makefile); where it cannot be installed the test skips, saying so.
Playwright's own browser downloads are never used: the launch names the system binary.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from analysis.viewer_builders import (
    HOSTILE,
    HOSTILE_QID,
    LONG_TAIL,
    PROMPT_MARKER,
    REASONING_MARKER,
    build_viewer_run,
    launched_chromium,
)
from rcarun.cli import main


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = build_viewer_run(tmp_path_factory.mktemp("viewer"))
    root = tmp_path_factory.mktemp("site") / "report"
    assert main(["report", "--db", str(run.db), "--html", str(root), "--resamples", "50"]) == 0
    return root


@pytest.fixture(scope="module")
def browser(site: Path) -> Iterator[Browser]:
    # Asks for the site so that it is written first: Playwright's sync API keeps an event loop running in this
    # thread, where the store writer's asyncio.run cannot start.
    with launched_chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    requests: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console error: {message.text}")

    opened.on("console", console)
    opened.on("request", lambda request: requests.append(request.url))
    try:
        yield opened
        assert problems == []
        assert requests and all(url.startswith("file://") for url in requests), requests
    finally:
        context.close()


def test_from_the_aggregate_page_to_one_call_prompt(page: Page, site: Path) -> None:
    page.goto((site / "index.html").as_uri())
    page.click("#viewer-link")
    assert page.url.endswith("/trajectories.html")

    rows = page.locator("#trajectories tbody tr")
    expect(rows).to_have_count(3)
    page.fill("#filter", "hostile")
    expect(page.locator("#trajectories tbody tr:visible")).to_have_count(1)
    expect(page.locator("section, p").filter(has_text="1 of 3 shown")).to_have_count(1)
    hostile_row = page.locator("#trajectories tbody tr:visible")
    expect(hostile_row.locator("td").nth(6)).to_have_text("1 / 3")
    page.fill("#filter", "")
    # Sorting by steps, descending on the second click: the 12-step trajectory comes first.
    page.click("#trajectories th:has-text('steps')")
    page.click("#trajectories th:has-text('steps')")
    expect(rows.first.locator("td").nth(2)).to_have_text("12")

    page.click(f"#trajectories a:text-is('{HOSTILE_QID}')")
    expect(page.locator("h1#qid")).to_have_text(HOSTILE_QID)

    # The reference root is marked on step 3 and on no other step; its hostile content shows as text.
    expect(page.locator(".step.ref")).to_have_count(1)
    reference = page.locator("#s-3")
    expect(reference.locator(".badge.ref")).to_have_text("reference root")
    expect(reference.locator("pre.content")).to_have_text(HOSTILE)
    assert page.evaluate("window.__pwned") is None
    expect(page.locator("#step-list img")).to_have_count(0)

    # Predictions: role, step and correctness as the report scores them.
    first = page.locator("#p-0")
    expect(first.locator(".pred-role")).to_have_text("Coder")
    expect(first.locator(".verdict-role")).to_have_text("✓ correct")
    expect(first.locator(".pred-step")).to_have_text("3")
    expect(first.locator(".verdict-step")).to_have_text("✓ exact")
    expect(page.locator("#p-1 .verdict-step")).to_have_text("≈ within ±5 (off by 2)")
    expect(page.locator("#p-1 .verdict-role")).to_have_text("✗ wrong")
    expect(page.locator("#p-2 .flag")).to_have_text("abstained")
    expect(page.locator("#p-3")).to_contain_text("no prediction (failed: retries exhausted)")
    # The prediction's chip sits on the step it chose.
    expect(page.locator("#s-3 .chip")).to_contain_text("alpha · aao · r0")
    expect(page.locator("#s-5 .chip")).to_contain_text("alpha · aao · r1")

    # A long step: collapsed, its tail not in the document until opened.
    long_step = page.locator("#s-5 details.content")
    assert LONG_TAIL not in page.content()
    long_step.locator("summary").click()
    expect(long_step.locator("pre")).to_contain_text(LONG_TAIL)

    # A call's prompt: nowhere in the page until its call is opened and its prompt asked for.
    assert PROMPT_MARKER not in page.content()
    page.click("#p-0 button.calls-toggle")
    calls = page.locator("#calls-0 tr.call")
    expect(calls).to_have_count(2)
    expect(calls.nth(0).locator("td").nth(4)).to_have_text("length (length)")
    expect(calls.nth(1).locator("td").nth(4)).to_have_text("ok (stop)")
    expect(calls.nth(1).locator("td").nth(5)).to_have_text("120")
    expect(calls.nth(1).locator("td").nth(8)).to_have_text("$0.00750")
    assert PROMPT_MARKER not in page.content()
    calls.nth(1).locator("button[data-kind=prompt]").click()
    prompt = page.locator("#calls-0 pre.text[data-kind=prompt]")
    expect(prompt).to_contain_text(PROMPT_MARKER)
    expect(prompt).to_contain_text("<i>not markup</i>")
    calls.nth(1).locator("button[data-kind=answer]").click()
    expect(page.locator("#calls-0 pre.text[data-kind=answer]")).to_contain_text('"root_step": 3')
    calls.nth(1).locator("button[data-kind=reasoning]").click()
    expect(page.locator("#calls-0 pre.text[data-kind=reasoning]")).to_have_text(REASONING_MARKER)
    # Clicking the prompt button again hides it; the calls button closes the whole list.
    calls.nth(1).locator("button[data-kind=prompt]").click()
    expect(prompt).to_be_hidden()
    page.click("#p-0 button.calls-toggle")
    expect(page.locator("#detail-0")).to_be_hidden()


def test_a_failed_call_shows_its_error_and_raw_body(page: Page, site: Path) -> None:
    page.goto((site / "trajectories.html").as_uri())
    page.click(f"#trajectories a:text-is('{HOSTILE_QID}')")
    page.click("#p-3 button.calls-toggle")
    expect(page.locator("#calls-3 tr.call td").nth(4)).to_have_text("error")
    expect(page.locator("#calls-3")).to_contain_text("error: HTTP 503: overloaded")
    page.click("#calls-3 button[data-kind='raw body']")
    expect(page.locator("#calls-3 pre.text")).to_contain_text('"message": "overloaded"')
    page.fill("input.filter[data-table=predictions]", "beta")
    expect(page.locator("#predictions tr.pred:visible")).to_have_count(2)
