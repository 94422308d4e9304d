"""Fixtures every test package may use: the shared Who&When data beside the project checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

# The shared data tree sits beside the project checkout (../shared relative to the project root).
WHO_AND_WHEN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "who_and_when"


@pytest.fixture
def who_and_when() -> Path:
    if not (WHO_AND_WHEN / "algorithm_generated").is_dir():
        pytest.skip(f"Who&When data not found at {WHO_AND_WHEN} (expected ../shared/data beside the project)")
    return WHO_AND_WHEN
