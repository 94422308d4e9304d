"""A method's own stage budgets (RCTA's presets) are never silently overridden by a sweep's stage table."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.sweeps import make_config, rows
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.runner.config import StageConfig
from rcarun.runner.scheduler import stage_budget_notes


@dataclass
class _Preset:
    """Stands for a method whose options fix its stages' budgets (what the runner reads of it)."""

    label: str
    stage_budgets: dict[str, int] = field(default_factory=dict)


def test_the_stage_table_applies_only_where_the_method_does_not_fix_the_budget() -> None:
    table = StageConfig(max_tokens=8_000)
    assert table.first_budget(32_000, method_sets_it=True) == 32_000
    assert table.first_budget(1_024, method_sets_it=False) == 8_000
    assert StageConfig().first_budget(1_024, method_sets_it=False) == 1_024


def test_a_conflict_is_said_once_per_method_and_stage() -> None:
    config = make_config(
        {"sim": {"base_url": "http://127.0.0.1:9/v1"}},
        stages={"attribution": {"max_tokens": 8_000}, "outline": {"max_tokens": 12_000}},
    )
    methods = [
        _Preset("rcta/no-a1", {"summary": 4_000, "outline": 12_000, "attribution": 32_000}),
        _Preset("rcta", {"summary": 4_000, "outline": 6_000, "attribution": 8_000}),
        _Preset("all-at-once"),
    ]
    notes = stage_budget_notes(methods, config)  # type: ignore[arg-type]
    assert notes == [
        "[stages.attribution] max_tokens = 8000 does not apply to method 'rcta/no-a1', whose own settings give "
        "attribution 32,000 tokens (they win; change the method's options to change it)",
        "[stages.outline] max_tokens = 12000 does not apply to method 'rcta', whose own settings give outline "
        "6,000 tokens (they win; change the method's options to change it)",
    ]


async def test_rcta_s_ablation_preset_keeps_its_32k_attribution_budget_under_a_stage_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.0)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url}},
            methods=[
                {"name": "rcta/no-a1", "options": {"preset": "ablation"}},
                {"name": "all-at-once", "options": {"max_tokens": 2_000}},
            ],
            stages={"attribution": {"max_tokens": 8_000}},
        )
        await run_sweep(config, db_path=db, run_name="presets", show_progress=False)
    first = dict(
        rows(
            db,
            "SELECT method, max(max_tokens) FROM calls WHERE stage = 'attribution' AND attempt = 1 GROUP BY method",
        )
    )
    assert first == {
        "rcta/no-a1": 32_000,
        "all-at-once": 8_000,
    }  # the preset wins; the table applies elsewhere
    assert "does not apply to method 'rcta/no-a1'" in capsys.readouterr().err
