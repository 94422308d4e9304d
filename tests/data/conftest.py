"""Shared locations and record builders for the rcarun.data tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RecordWriter = Callable[..., Path]


@pytest.fixture
def good_record() -> dict[str, Any]:
    """A fresh small valid Who&When-shaped record: 3 steps, label on step 1 (as a string, like Who&When)."""
    return {
        "question": "How many?",
        "question_ID": "task-1",
        "history": [
            {"role": "human", "content": "How many?"},
            {"name": "Planner", "role": "assistant", "content": "plan"},
            {"name": "Coder", "role": "assistant", "content": "code"},
        ],
        "mistake_agent": "Planner",
        "mistake_step": "1",
        "mistake_reason": "bad plan",
    }


@pytest.fixture
def write_record(tmp_path: Path) -> RecordWriter:
    """Write a record (dict, or raw bytes) as <tmp>/ds/<source>/<name>.json and return the file."""

    def write(content: dict[str, Any] | bytes, source: str = "src", name: str = "1") -> Path:
        directory = tmp_path / "ds" / source
        directory.mkdir(parents=True, exist_ok=True)
        file = directory / f"{name}.json"
        file.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        return file

    return write
