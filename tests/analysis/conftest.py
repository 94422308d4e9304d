"""A real results database for the analysis tests: a three-method sweep, run once (the demo's is in tests/conftest.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from helpers.sweeps import make_config
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep


async def _three_methods(db: Path) -> None:
    # Three labels of all-at-once whose prompts differ (step ids shown or not, task shown or not), so the
    # simulator's answers differ and the paired statistics have discordant pairs.
    async with (
        MockServer(MockConfig(latency_s=0.001, seed=11)) as first,
        MockServer(MockConfig(latency_s=0.001, seed=12)) as second,
    ):
        config = make_config(
            {
                "alpha": {
                    "base_url": first.base_url,
                    "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                },
                "beta": {"base_url": second.base_url},
            },
            realizations=2,
            methods=[
                {"name": "all-at-once", "label": "aao", "options": {"temperature": 0.7}},
                {
                    "name": "all-at-once",
                    "label": "aao-plain",
                    "options": {"temperature": 0.7, "step_numbers": False},
                },
                {
                    "name": "all-at-once",
                    "label": "aao-notask",
                    "options": {"temperature": 0.7, "include_task": False},
                },
            ],
        )
        await run_sweep(config, db_path=db, run_name="two", show_progress=False)


@pytest.fixture(scope="session")
def methods_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("two") / "results.db"
    asyncio.run(_three_methods(db))
    return db
