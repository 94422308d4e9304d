"""The embedded demo (`make demo`): four simulated backbones with different limit styles, end to end."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rcarun.demo import DEMO_REALIZATIONS, demo_sweep_config, simulated_backbones
from rcarun.runner import run_sweep


async def test_demo_sweep_runs_every_backbone_and_exercises_each_limit_style(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with simulated_backbones() as backbones:
        outcome = await run_sweep(
            demo_sweep_config(backbones), db_path=db, run_name="demo", show_progress=False
        )

    assert outcome.status == "finished"
    assert set(outcome.counters) == {"sim-deepseek", "sim-gpt", "sim-kimi", "sim-qwen"}
    with sqlite3.connect(db) as connection:
        per_backbone = dict(
            connection.execute("SELECT backbone, count(*) FROM predictions GROUP BY backbone")
        )
        length = dict(
            connection.execute(
                "SELECT backbone, count(*) FROM calls WHERE status = 'length' GROUP BY backbone"
            )
        )
        endpoints = connection.execute(
            "SELECT count(DISTINCT endpoint) FROM calls WHERE backbone = 'sim-qwen'"
        )
        distinct_endpoints = endpoints.fetchone()[0]
        priced = dict(connection.execute("SELECT backbone, sum(cost_usd) > 0 FROM calls GROUP BY backbone"))
    assert per_backbone == {name: 10 * DEMO_REALIZATIONS for name in outcome.counters}
    # sim-qwen thinks for 1,500 tokens: every first attempt at 1,024 stops on length and is retried at 2,048.
    assert length == {"sim-qwen": 10 * DEMO_REALIZATIONS}
    assert distinct_endpoints == 2  # both vLLM-style replicas served calls
    assert priced == {"sim-deepseek": 1, "sim-gpt": 1, "sim-kimi": 1, "sim-qwen": 0}
