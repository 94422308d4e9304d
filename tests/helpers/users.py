"""Running a command as an unprivileged user, where file modes bite (root reads and writes through them).

As root, commands run as ``nobody`` through ``setpriv``. That user must be able to read the checkout and its
.venv: a clone in a private directory (``mktemp -d`` gives 0700) cannot be, and then the tests that need real
permissions skip, saying why, rather than fail for a reason that is not rcarun's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["as_unprivileged", "reachable_directory"]

_NOBODY = ("--reuid=65534", "--regid=65534", "--clear-groups", "--")


@functools.cache
def _why_nobody_cannot_run() -> str | None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "root without setpriv: no way to run as an unprivileged user"
    probe = subprocess.run(
        [setpriv, *_NOBODY, sys.executable, "-c", "import rcarun"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"the unprivileged user cannot import rcarun from this checkout ({last}); clone it somewhere world-readable"
    return None


def as_unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run as ``nobody`` when we are root (skipping the test when that user cannot run rcarun here)."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return argv
    why = _why_nobody_cannot_run()
    if why is not None:
        pytest.skip(why)
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    return [setpriv, *_NOBODY, *argv]


@contextlib.contextmanager
def reachable_directory(prefix: str) -> Iterator[Path]:
    """A fresh directory any user can reach (pytest's tmp_path is private to its owner), removed afterwards
    whatever modes a test left on it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(folder)
