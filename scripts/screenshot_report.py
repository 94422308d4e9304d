"""Screenshot an HTML report with headless Chromium, to check the layout of `rcarun report --html` by eye.

Usage: python scripts/screenshot_report.py REPORT.html OUT.png [--chromium PATH] [--size WIDTH,HEIGHT]

Not part of the test suite: it needs a Chromium binary (Debian: ``apt-get install -y chromium``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def screenshot(
    page: Path, out: Path, *, chromium: str = "/usr/bin/chromium", size: str = "1400,4000"
) -> Path:
    """Render ``page`` with headless Chromium into ``out`` and return the PNG's absolute path.

    Raises:
        FileNotFoundError: the page or the Chromium binary does not exist.
        RuntimeError: Chromium failed or wrote no PNG.
    """
    page = page.resolve(strict=True)
    out = out.resolve()
    out.unlink(missing_ok=True)  # so that a stale file cannot pass for a fresh screenshot
    command = [
        chromium,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--hide-scrollbars",
        f"--screenshot={out}",
        f"--window-size={size}",
        page.as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"chromium exited with {result.returncode}: {result.stderr.strip()[-2000:]}")
    if not out.is_file() or not out.read_bytes()[:8] == PNG_SIGNATURE:
        raise RuntimeError(f"chromium wrote no PNG at {out}: {result.stderr.strip()[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="the HTML report")
    parser.add_argument("out", type=Path, help="where to write the PNG")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium binary")
    parser.add_argument("--size", default="1400,4000", help="window size WIDTH,HEIGHT in CSS pixels")
    args = parser.parse_args(argv)
    try:
        path = screenshot(args.page, args.out, chromium=args.chromium, size=args.size)
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"screenshot failed: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
