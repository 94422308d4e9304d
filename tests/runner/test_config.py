"""Sweep and backbone configs: the shipped files parse, unknown keys and misplaced secrets are refused."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from rcarun.errors import ConfigError
from rcarun.methods import create_method
from rcarun.runner import build_prices, load_backbones_file, load_sweep_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_shipped_backbones_have_dated_prices_and_key_variables() -> None:
    backbones = load_backbones_file(CONFIGS / "backbones.toml")
    assert {"deepseek-flash", "deepseek-v4-pro", "gpt-5.4-mini", "kimi-k3", "qwen3.5-35b-a3b"} <= set(
        backbones
    )
    for name, backbone in backbones.items():
        assert backbone.prices.taken, f"{name} has no price date"
        if backbone.provider != "vllm":
            assert backbone.api_key_env and backbone.api_key_env.endswith("_API_KEY")
    flash = backbones["deepseek-flash"]
    assert flash.prices.input_per_mtok == 0.15 and len(flash.prices.windows) == 2
    assert all(window.weekdays == ("mon", "tue", "wed", "thu", "fri") for window in flash.prices.windows)
    table = build_prices(flash)
    assert table.price_at(datetime(2026, 11, 27, 2, tzinfo=UTC)).input_per_mtok == 0.30  # Friday, peak
    assert table.price_at(datetime(2026, 11, 28, 2, tzinfo=UTC)).input_per_mtok == 0.15  # Saturday, off-peak
    assert backbones["qwen3.5-35b-a3b"].endpoints == ("http://127.0.0.1:8000/v1",)
    # The paper's DS-V4-Flash: its open weights, self-hosted (DeepSeek's API serves V4.1-Flash under its ids).
    paper_flash = backbones["ds-v4-flash"]
    assert (paper_flash.provider, paper_flash.model) == ("vllm", "deepseek-ai/DeepSeek-V4-Flash")


def test_shipped_sweep_resolves_backbones_and_paths() -> None:
    config = load_sweep_config(CONFIGS / "sweeps" / "mini-cross-backbone.toml")
    assert list(config.backbones) == [
        "deepseek-flash",
        "deepseek-v4-pro",
        "gpt-5.4-mini",
        "kimi-k3",
        "qwen3.5-35b-a3b",
    ]
    assert Path(config.sweep.dataset).is_absolute()
    assert config.sweep.manifest == "longrca-mini"
    assert [m.name for m in config.methods] == [
        "all-at-once",
        "step-by-step",
        "binary-search",
        "echo",
        "falat",
    ]
    for entry in config.methods:  # every method accepts its options
        create_method(entry.name, label=entry.resolved_label, options=entry.options)
    assert config.stage("attribution").max_tokens == 8000
    assert config.stage("attribution").length_cap == 65_536
    assert config.stage("summary").length_retries == 1  # unlisted stages get the paper's default policy


def test_shipped_component_study_runs_every_condition_at_the_ablation_settings() -> None:
    config = load_sweep_config(CONFIGS / "sweeps" / "mini-components.toml")
    assert list(config.backbones) == ["deepseek-flash"] and config.sweep.manifest == "longrca-mini"
    methods = [create_method(e.name, label=e.resolved_label, options=e.options) for e in config.methods]
    assert [m.label for m in methods] == ["rcta", "rcta/no-a1", "rcta/no-a2", "rcta/no-a3", "rcta/no-a4"]
    ablation = {"summary": 4_000, "outline": 12_000, "attribution": 32_000}
    assert all(dict(m.stage_budgets) == ablation for m in methods)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def test_unknown_keys_are_refused_with_their_location(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[sweep]
dataset = "data"
realisations = 2

[[methods]]
name = "all-at-once"

[backbones.sim]
provider = "simulated"
model = "m"
base_url = "http://127.0.0.1:1/v1"
""",
    )
    with pytest.raises(ConfigError, match=r"sweep\.realisations: Extra inputs are not permitted"):
        load_sweep_config(path)


def test_a_key_pasted_where_its_variable_name_belongs_is_refused(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[sweep]
dataset = "data"

[[methods]]
name = "all-at-once"

[backbones.sim]
provider = "openai"
model = "m"
base_url = "https://example.invalid/v1"
api_key_env = "sk-proj-abc-def-ghi"
""",
    )
    with pytest.raises(ConfigError, match="api_key_env must be the NAME") as caught:
        load_sweep_config(path)
    assert "sk-proj-abc-def-ghi" not in str(caught.value)


def test_a_removed_transport_is_refused_naming_the_ones_there_are(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[sweep]
dataset = "data"

[[methods]]
name = "all-at-once"

[backbones.sim]
provider = "simulated"
model = "m"
base_url = "http://127.0.0.1:1/v1"
transport = "httptools"
""",
    )
    with pytest.raises(ConfigError) as caught:
        load_sweep_config(path)
    assert str(caught.value) == (
        f"{path}: backbones.sim.transport: unknown transport 'httptools' (known: aiohttp, openai-sdk)"
    )
