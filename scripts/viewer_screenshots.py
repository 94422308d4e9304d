"""Screenshots of the trajectory viewer (`rcarun report --html DIR`) for the docs: the trajectory index, one
trajectory (its verdicts with a call's prompt open, and its steps) and the aggregate page, as small PNGs.

Usage: python scripts/viewer_screenshots.py [--db results.db] [--run NAME] [--qid QID] [--out docs/images]

The site is written to a temporary folder from the given results.db (the demo's, by default: `make demo`),
and opened from ``file://`` in Debian's Chromium (``apt-get install -y chromium``) driven by Playwright, with
the same flags as the browser test. Each PNG is reduced to a 128-colour palette so that it stays well under
200 KB: the pages are text on a few flat colours, which a palette keeps legible.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

from PIL import Image
from playwright.sync_api import Page, sync_playwright

from rcarun.analysis.viewer.chromium import CHROMIUM_FLAGS, find_chromium
from rcarun.analysis.viewer.site import page_name
from rcarun.cli import main as rcarun

WIDTH = 1280
AGGREGATE_HEIGHT = 1350


def _save(page: Page, out: Path, height: int) -> Path:
    # full_page: a clip taller than the viewport is cut at the viewport otherwise
    page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": WIDTH, "height": height}, full_page=True)
    with Image.open(out) as shot:
        small = shot.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    small.save(out, optimize=True)
    return out


def screenshots(site: Path, out: Path, qid: str, chromium: str) -> list[Path]:
    """Open the site and write the PNGs into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_FLAGS))
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.goto((site / "index.html").as_uri())
        # The first screen and a half: the summary, then Table 3 with its intervals.
        written.append(_save(page, out / "viewer_aggregate.png", AGGREGATE_HEIGHT))
        page.click("#viewer-link")
        written.append(_save(page, out / "viewer_index.png", 520))
        page.goto((site / "t" / f"{page_name(qid)}.html").as_uri())
        first_with_calls = page.locator("button.calls-toggle").first
        first_with_calls.click()
        page.locator(".calls-box button[data-kind=prompt]").first.click()
        page.locator(".calls-box pre.text").first.wait_for()
        # The header, the step axis, the first predictions and the opened call fit in one screen.
        written.append(_save(page, out / "viewer_trajectory.png", 1100))
        page.goto((site / "t" / f"{page_name(qid)}.html").as_uri() + "#steps")
        written.append(_save(page, out / "viewer_steps.png", 900))
        browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="results.db", help="the results database (default: results.db)")
    parser.add_argument("--run", help="the run (default: the latest)")
    parser.add_argument("--qid", default="algorithm_generated/2", help="the trajectory to show")
    parser.add_argument("--out", type=Path, default=Path("docs/images"), help="where the PNGs go")
    parser.add_argument(
        "--chromium",
        default=None,
        help="the Chromium binary (default: $RCARUN_CHROMIUM, chromium on the PATH)",
    )
    args = parser.parse_args(argv)
    chromium = args.chromium or find_chromium()
    if chromium is None or not Path(chromium).is_file():
        print(f"no Chromium at {chromium or 'chromium'}: apt-get install -y chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as folder:
        site = Path(folder) / "site"
        command = ["report", "--db", args.db, "--html", str(site), "--resamples", "200"]
        if args.run:
            command += ["--run", args.run]
        with contextlib.redirect_stdout(io.StringIO()):  # the text report; the PNGs are what is wanted
            status = rcarun(command)
        if status != 0:
            return status
        for path in screenshots(site, args.out, args.qid, chromium):
            print(f"{path}\t{path.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
