"""Fixtures for the store tests: a fresh results.db with one run, and row builders with sensible defaults."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rcarun.store import CallRow, ItemRow, PredictionRow, Store, open_store

RowMaker = Callable[..., Any]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "results.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    opened = open_store(db_path)
    yield opened
    opened.close()


@pytest.fixture
def run_id(store: Store) -> int:
    return store.get_or_create_run("test-run", '{"seed": 1}')


def _work(run_id: int, backbone: str, method: str, qid: str, realization: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "item_id": f"{backbone}|{method}|{qid}|r{realization}",
        "backbone": backbone,
        "method": method,
        "qid": qid,
        "realization": realization,
    }


def make_call(
    run_id: int,
    *,
    backbone: str = "bb-a",
    method: str = "all-at-once",
    qid: str = "q1",
    realization: int = 0,
    **overrides: Any,
) -> CallRow:
    row = CallRow(
        **_work(run_id, backbone, method, qid, realization),
        model="model-x",
        stage="attribution",
        attempt=1,
        max_tokens=512,
        status="ok",
        started_at="2025-01-01T00:00:00.000Z",
        ended_at="2025-01-01T00:00:01.000Z",
        finish_reason="stop",
    )
    return replace(row, **overrides)


def make_prediction(
    run_id: int,
    *,
    backbone: str = "bb-a",
    method: str = "all-at-once",
    qid: str = "q1",
    realization: int = 0,
    **overrides: Any,
) -> PredictionRow:
    row = PredictionRow(
        **_work(run_id, backbone, method, qid, realization),
        pred_role="planner",
        pred_step=3,
        role_valid=True,
        step_valid=True,
        abstained=False,
        output_json='{"role": "planner", "step": 3}',
    )
    return replace(row, **overrides)


def make_item(
    run_id: int,
    *,
    backbone: str = "bb-a",
    method: str = "all-at-once",
    qid: str = "q1",
    realization: int = 0,
    **overrides: Any,
) -> ItemRow:
    row = ItemRow(**_work(run_id, backbone, method, qid, realization), status="done", attempts=1)
    return replace(row, **overrides)


@pytest.fixture(name="make_call")
def make_call_fixture() -> RowMaker:
    return make_call


@pytest.fixture(name="make_prediction")
def make_prediction_fixture() -> RowMaker:
    return make_prediction


@pytest.fixture(name="make_item")
def make_item_fixture() -> RowMaker:
    return make_item
