"""Fixtures of the bad-input tests: the corpus of `helpers.badinput` written into ``tmp_path``, and a simulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.badinput import BadDataset, write_bad_dataset, write_big_dataset, write_small_dataset
from rcarun.mock import MockConfig, MockProcess


@pytest.fixture
def bad_dataset(tmp_path: Path) -> BadDataset:
    return write_bad_dataset(tmp_path / "bad")


@pytest.fixture
def big_dataset(tmp_path: Path) -> Path:
    return write_big_dataset(tmp_path / "big")


@pytest.fixture
def small_dataset(tmp_path: Path) -> Path:
    return write_small_dataset(tmp_path / "small")


@pytest.fixture(scope="module")
def mock_url() -> Iterator[str]:
    """One simulated backbone in its own process, shared by a module's sweeps."""
    with MockProcess(MockConfig()) as server:
        yield server.base_url
