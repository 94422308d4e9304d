"""Fixtures for end-to-end runner tests."""

from __future__ import annotations

import pytest

from rcarun.data import bundled_sample_path, iter_dataset


@pytest.fixture
def sample_qids() -> list[str]:
    return [record.trajectory.qid for record in iter_dataset(bundled_sample_path())]
