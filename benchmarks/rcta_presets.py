"""What RCTA costs per trajectory under its two presets, on the bundled sample, against the simulator.

Runs the real runner (RCTA with ``preset = "full"`` and then ``"ablation"``, one simulated backbone with
DeepSeek-like illustrative prices and 300 reasoning tokens per answer) into a fresh results.db each, and prints
calls, tokens and simulated USD per trajectory, overall and per stage. Usage:

    .venv/bin/python benchmarks/rcta_presets.py [--realizations 1]

The simulator answers with random schema-valid JSON whose length does not depend on the budget, so the two
presets differ here only in the output budgets they reserve; with a real model the larger ablation budgets
also leave room for longer answers. Random answers often fail RCTA's validation, so validation retries appear.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
from pathlib import Path

from rcarun.data import bundled_sample_path
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, run_sweep

_PRICES = {"input_per_mtok": 0.28, "cached_input_per_mtok": 0.028, "output_per_mtok": 0.42}


async def _run(preset: str, realizations: int, workdir: Path) -> None:
    db = workdir / f"{preset}.db"
    async with MockServer(MockConfig(latency_s=0.001, reasoning_tokens=300)) as server:
        config = SweepConfig.model_validate(
            {
                "sweep": {"dataset": str(bundled_sample_path()), "realizations": realizations},
                "methods": [{"name": "rcta", "label": f"rcta-{preset}", "options": {"preset": preset}}],
                "backbones": {
                    "sim": {
                        "provider": "simulated",
                        "model": "sim",
                        "base_url": server.base_url,
                        "prices": _PRICES,
                    }
                },
            }
        )
        await run_sweep(config, db_path=db, run_name=preset, show_progress=False)
    with sqlite3.connect(db) as connection:
        items = connection.execute("SELECT count(DISTINCT item_id) FROM calls").fetchone()[0]
        calls, prompt, completion, usd = connection.execute(
            "SELECT sum(attempt = 1), sum(prompt_tokens), sum(completion_tokens), sum(cost_usd) "
            "FROM calls WHERE status != 'cached'"
        ).fetchone()
        print(
            f"{preset:<9} {items} trajectories x realizations: {calls / items:.2f} calls, "
            f"{prompt / items:,.0f} prompt and {completion / items:,.0f} completion tokens, "
            f"${usd / items:.5f} per trajectory"
        )
        for stage, stage_calls, budget, stage_prompt, stage_completion in connection.execute(
            "SELECT stage, sum(attempt = 1), max(max_tokens), sum(prompt_tokens), sum(completion_tokens) "
            "FROM calls GROUP BY stage ORDER BY stage"
        ):
            print(
                f"          {stage:<12} {stage_calls:>4} calls, budget {budget:>6,}, "
                f"{stage_prompt:>9,} prompt, {stage_completion:>8,} completion tokens"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--realizations", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        for preset in ("full", "ablation"):
            asyncio.run(_run(preset, args.realizations, Path(workdir)))


if __name__ == "__main__":
    main()
