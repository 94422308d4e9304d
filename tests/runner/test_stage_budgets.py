"""A method's own stage budgets (RCTA's presets) are never silently overridden by a sweep's stage table."""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers.sweeps import make_config
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
