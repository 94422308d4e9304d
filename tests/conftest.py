"""Fixtures every test package may use: the shared Who&When data beside the project checkout, the demo's results.db."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rcarun.demo import demo_sweep_config, simulated_backbones
from rcarun.runner import run_sweep

# The shared data tree sits beside the project checkout (../shared relative to the project root).
WHO_AND_WHEN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "who_and_when"


@pytest.fixture
def who_and_when() -> Path:
    """The full Who&When set from ../shared. Absent, its tests skip, and `make test` lists them (-rs); with
    RCARUN_REQUIRE_SHARED=1 (set by .ci/run wherever ../shared exists) a missing set fails them instead."""
    if not (WHO_AND_WHEN / "algorithm_generated").is_dir():
        message = f"Who&When data not found at {WHO_AND_WHEN} (expected ../shared/data beside the project)"
        if os.environ.get("RCARUN_REQUIRE_SHARED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return WHO_AND_WHEN


async def _demo(db: Path) -> None:
    async with simulated_backbones() as backbones:
        await run_sweep(demo_sweep_config(backbones), db_path=db, run_name="demo", show_progress=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test on the demo's results.db is slow (the demo sweep takes about two minutes the first time)."""
    for item in items:
        if "demo_db" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded demo (`make demo`) run once per test session: every method on four simulated backbones."""
    db = tmp_path_factory.mktemp("demo") / "results.db"
    asyncio.run(_demo(db))
    return db
