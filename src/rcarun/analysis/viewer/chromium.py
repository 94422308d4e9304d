"""How rcarun opens its viewer in a headless Chromium: the flags and where the browser is.

Shared by the viewer's browser tests and `scripts/viewer_screenshots.py` (the images in docs/images), so both
drive the same browser the same way. Debian's ``chromium`` package is the browser (the Makefile installs it);
Playwright only drives it. Nothing in rcarun's runtime imports this module.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["CHROMIUM_FLAGS", "find_chromium"]

# Without the background-networking flags Chromium tries Google's hosts at every start, which a closed
# network (CI, these machines) refuses, slowly.
CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def find_chromium() -> str | None:
    """The Chromium binary: ``$RCARUN_CHROMIUM`` when set (None if it is not a file), else ``chromium`` on the
    PATH, else Debian's ``/usr/bin/chromium``; None when there is none."""
    wanted = os.environ.get("RCARUN_CHROMIUM")
    if wanted:
        return wanted if Path(wanted).is_file() else None
    return shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
