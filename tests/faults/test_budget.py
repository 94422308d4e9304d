"""The USD budget binds on what the provider bills, not on rcarun's chars/4 guess nor on the usage it reports.

Prices of 1000 USD per million input tokens make every prompt expensive; ``max_usd`` lets about half of the 60
items run when the prompt bills at chars/4. The server bills its own count (chars/4 × 1, 2 or 4 for the prompt)
and reports it honestly, or reports nothing at all; its total at the same prices must stay within 5% of
``max_usd``. The run stops ('stopped', exit 3) and the items left are 'skipped_budget'.

Up to four tokens a character (or one a UTF-8 byte of emoji and CJK text), or twice the output budget, billed from
the very first wave of 64 calls: the budget reserves the most a bill is believed to be until the backbone's first
report, and what the reports showed after.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, item_statuses, run_cli, run_in_process, sweep_args, write_sweep
from faults.hostile import HostileServer, Prices, Usage, honest, no_usage, ok

ITEMS = 60
PRICES = Prices(input_per_mtok=1000, output_per_mtok=20)
MAX_USD = 12.0  # a prompt bills about 0.41 USD at chars/4: about 29 of the 60 items
TOLERANCE = 1.05
RUN = "budget"


def _config(
    server: HostileServer, data: Path, tmp_path: Path, *, concurrency: int = 16, max_usd: float = MAX_USD
) -> Path:
    return write_sweep(
        tmp_path / "sweep.toml",
        dataset=data,
        backbones={
            "fx": backbone(
                server.base_url,
                limits={"concurrency": concurrency},
                prices={"input_per_mtok": PRICES.input_per_mtok, "output_per_mtok": PRICES.output_per_mtok},
            )
        },
        budget={"max_usd": max_usd},
    )


def _check_spend(server: HostileServer, db: Path, *, items: int = ITEMS, max_usd: float = MAX_USD) -> None:
    spent = server.billed_usd()
    assert spent <= TOLERANCE * max_usd, (
        f"the server billed {spent:.2f} USD for {len(server.served())} answers against max_usd = {max_usd}"
    )
    statuses = item_statuses(db)
    assert set(statuses) <= {"done", "skipped_budget"}, f"items: {dict(statuses)}"
    assert statuses["skipped_budget"] >= 1, f"the budget never bound: {dict(statuses)}"
    assert statuses["done"] >= 1, f"nothing ran: {dict(statuses)}"
    assert sum(statuses.values()) == items, f"items not run must be 'skipped_budget': {dict(statuses)}"


@pytest.mark.parametrize("prompt_mult", [1, 2, 4], ids=["billed-1x", "billed-2x", "billed-4x"])
def test_spend_stays_within_the_budget_when_prompts_bill_above_chars_over_4(
    prompt_mult: int, serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok(latency_s=0.2, usage=honest(prompt_mult)), prices=PRICES)
    config = _config(server, dataset(ITEMS), tmp_path)
    outcome = run_in_process(config, tmp_path / "results.db", RUN)
    assert outcome.status == "stopped"
    _check_spend(server, tmp_path / "results.db")


@pytest.mark.slow
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


WIDE_ITEMS = 24
# Emoji (4 UTF-8 bytes each) and CJK (3 each), as agent logs hold them.
WIDE_TEXT = "🚀✅😀 日本語のログ出力 " * 10


@pytest.mark.parametrize(
    ("usage", "text", "max_usd"),
    [
        (honest(8), "step", 40.0),
        (honest(16), "step", 80.0),
        (honest(4, per_byte=True), WIDE_TEXT, 40.0),
        (honest(completion_of_budget=2.0), "step", 9.0),
    ],
    ids=[
        "2-tokens-a-char",
        "4-tokens-a-char",
        "a-token-a-utf8-byte-of-emoji-and-cjk",
        "output-billed-2x-max-tokens",
    ],
)
def test_rcarun_sweep_spends_within_the_budget_billed_up_to_the_most_it_believes_from_the_first_wave(
    usage: Usage,
    text: str,
    max_usd: float,
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
) -> None:
    # Every item fits in the first wave of 64 calls; at one token a character it would all be admitted, and
    # about half as many items fit the budget as are asked.
    server = serve(ok(latency_s=0.2, usage=usage), prices=PRICES)
    data = dataset(WIDE_ITEMS, text=lambda index: text)
    config = _config(server, data, tmp_path, concurrency=64, max_usd=max_usd)
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert result.returncode == 3, result.describe()
    _check_spend(server, db, items=WIDE_ITEMS, max_usd=max_usd)
