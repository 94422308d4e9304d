"""Where the sample dataset shipped inside the package lives, so the demo runs with no data download.

The sample is ten unchanged Who&When trajectories (MIT, licence beside them) under ``samples/who_and_when/``,
laid out as a dataset directory that `rcarun.data.iter_dataset` reads directly.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["bundled_sample_path"]


def bundled_sample_path() -> Path:
    """The bundled sample dataset directory (``<source>/N.json`` files), for editable and wheel installs."""
    # Path(__file__) rather than importlib.resources: the package is always installed unzipped, and callers
    # want a real directory they can list and hand to iter_dataset.
    return Path(__file__).resolve().parent / "samples" / "who_and_when"
