"""Which settings a resume may not change: the forward cache's precision binds only runs with a local model."""

from __future__ import annotations

import json
from typing import Any

from rcarun.runner import SweepConfig
from rcarun.runner.drift import answer_changes


def _config(forward_cache: str, *, local: bool) -> SweepConfig:
    backbones: dict[str, Any] = {
        "gpt": {"provider": "openai", "model": "gpt-x", "base_url": "http://127.0.0.1:9/v1"}
    }
    methods: list[dict[str, Any]] = [{"name": "all-at-once"}]
    if local:
        backbones["tiny"] = {"provider": "local", "model": "tiny"}
        methods.append({"name": "soap"})
    return SweepConfig.model_validate(
        {
            "sweep": {"dataset": "data", "forward_cache": forward_cache},
            "methods": methods,
            "backbones": backbones,
        }
    )


def _changes(before: SweepConfig, after: SweepConfig) -> list[str]:
    return answer_changes(json.dumps(before.model_dump(mode="json")), after)


def test_a_run_without_a_local_model_may_change_how_forward_passes_are_kept() -> None:
    assert _changes(_config("float16", local=False), _config("off", local=False)) == []


def test_a_run_with_a_local_model_may_not() -> None:
    [change] = _changes(_config("float16", local=True), _config("float32", local=True))
    assert change == "backbones.tiny.forward_cache: 'float16' -> 'float32'"


def test_adding_a_local_backbone_is_the_runs_extent_not_a_change() -> None:
    assert _changes(_config("float16", local=False), _config("float16", local=True)) == []
