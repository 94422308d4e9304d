"""The USD budget binds on what the provider bills, not on rcarun's chars/4 guess nor on the usage it reports.

Prices of 1000 USD per million input tokens make every prompt expensive; ``max_usd`` lets about half of the 60
items run when the prompt bills at chars/4. The server bills its own count (chars/4 × 1, 2 or 4 for the prompt)
and reports it honestly, or reports nothing at all; its total at the same prices must stay within 5% of
``max_usd``. The run stops ('stopped', exit 3) and the items left are 'skipped_budget'.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, item_statuses, run_cli, run_in_process, sweep_args, write_sweep
from faults.hostile import HostileServer, Prices, honest, no_usage, ok

ITEMS = 60
PRICES = Prices(input_per_mtok=1000, output_per_mtok=20)
MAX_USD = 12.0  # a prompt bills about 0.41 USD at chars/4: about 29 of the 60 items
TOLERANCE = 1.05
RUN = "budget"


def _config(server: HostileServer, data: Path, tmp_path: Path) -> Path:
    return write_sweep(
        tmp_path / "sweep.toml",
        dataset=data,
        backbones={
            "fx": backbone(
                server.base_url,
                limits={"concurrency": 16},
                prices={"input_per_mtok": PRICES.input_per_mtok, "output_per_mtok": PRICES.output_per_mtok},
            )
        },
        budget={"max_usd": MAX_USD},
    )


def _check_spend(server: HostileServer, db: Path) -> None:
    spent = server.billed_usd()
    assert spent <= TOLERANCE * MAX_USD, (
        f"the server billed {spent:.2f} USD for {len(server.served())} answers against max_usd = {MAX_USD}"
    )
    statuses = item_statuses(db)
    assert set(statuses) <= {"done", "skipped_budget"}, f"items: {dict(statuses)}"
    assert statuses["skipped_budget"] >= 1, f"the budget never bound: {dict(statuses)}"
    assert sum(statuses.values()) == ITEMS, f"items not run must be 'skipped_budget': {dict(statuses)}"


@pytest.mark.parametrize("prompt_mult", [1, 2, 4], ids=["billed-1x", "billed-2x", "billed-4x"])
def test_spend_stays_within_the_budget_when_prompts_bill_above_chars_over_4(
    prompt_mult: int, serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok(latency_s=0.2, usage=honest(prompt_mult)), prices=PRICES)
    config = _config(server, dataset(ITEMS), tmp_path)
    outcome = run_in_process(config, tmp_path / "results.db", RUN)
    assert outcome.status == "stopped"
    _check_spend(server, tmp_path / "results.db")


def test_spend_stays_within_the_budget_when_the_provider_reports_no_usage(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok(latency_s=0.2, usage=no_usage()), prices=PRICES)
    config = _config(server, dataset(ITEMS), tmp_path)
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert result.returncode == 3, result.describe()
    _check_spend(server, db)

    cost = run_cli(["cost", "--db", str(db), "--run", RUN], cwd=tmp_path)
    assert cost.returncode == 0, cost.describe()
    assert "estimated" in cost.stdout.lower(), (
        f"`rcarun cost` does not say the usage was estimated:\n{cost.stdout}"
    )
