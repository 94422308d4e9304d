"""A method's own stage budgets (RCTA's presets) are never silently overridden by a sweep's stage table."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.sweeps import make_config, rows
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.runner.config import StageConfig
from rcarun.runner.wiring import stage_budget_notes


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


async def test_component_conditions_default_to_the_ablation_settings_and_full_rcta_to_full(
    tmp_path: Path,
) -> None:
    # App. H: "All component conditions share these settings" (4,000 / 12,000 / 32,000); Full: 4,000/6,000/8,000.
    db = tmp_path / "results.db"
    conditions = ["rcta/no-a1", "rcta/no-a2", "rcta/no-a3", "rcta/no-a4"]
    async with MockServer(MockConfig(latency_s=0.0)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url}},
            methods=[{"name": "rcta"}, *({"name": name} for name in conditions)],
        )
        await run_sweep(config, db_path=db, run_name="components", show_progress=False, limit=1)
    sent = rows(
        db,
        "SELECT method, stage, max(max_tokens) FROM calls WHERE attempt = 1 AND status != 'cached' "
        "GROUP BY method, stage",
    )
    budgets: dict[str, dict[str, int]] = {}
    for method, stage, max_tokens in sent:
        budgets.setdefault(method, {})[stage] = max_tokens
    assert budgets["rcta"] == {"summary": 4_000, "outline": 6_000, "attribution": 8_000}
    # Stage I is shared: the summaries (the same request under both presets) were sent once, by whichever item
    # came first; the conditions' outline (12,000) once for all of them; each condition sent its attribution.
    conditions_sent = {stage: tokens for method in conditions for stage, tokens in budgets[method].items()}
    assert conditions_sent.get("summary", 4_000) == 4_000 and conditions_sent["outline"] == 12_000
    assert all(budgets[method]["attribution"] == 32_000 for method in conditions)
