"""Which settings a resume may not change (the forward cache binds only runs with a local model), and how a
sweep is sliced across backbone kinds."""

from __future__ import annotations

import json
from typing import Any

from rcarun.runner import SweepConfig, narrow_sweep
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


def _managed(**serve: Any) -> SweepConfig:
    return SweepConfig.model_validate(
        {
            "sweep": {"dataset": "data"},
            "methods": [{"name": "all-at-once"}],
            "backbones": {
                "qwen": {
                    "provider": "vllm",
                    "model": "qwen3",
                    "context_window": 32768,
                    "serve": {"model": "Qwen/Qwen3-32B", "gpus": [0, 1], **serve},
                }
            },
        }
    )


def test_new_weights_under_the_same_served_name_are_a_change() -> None:
    [change] = _changes(_managed(), _managed(model="Qwen/Qwen3-32B-AWQ"))
    assert change == "backbones.qwen.serve.model: 'Qwen/Qwen3-32B' -> 'Qwen/Qwen3-32B-AWQ'"


def test_a_flag_that_changes_what_vllm_computes_is_a_change_one_that_sizes_it_is_not() -> None:
    sized = _managed(
        extra_args=["--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--dtype", "bf16"]
    )
    resized = _managed(
        extra_args=["--dtype", "bf16", "--max-num-seqs=64", "--gpu-memory-utilization", "0.8"],
        gpus=[2, 3, 4, 5],
        tensor_parallel=2,
        command="/opt/vllm/bin/vllm",
    )
    assert _changes(sized, resized) == []
    [change] = _changes(sized, _managed(extra_args=["--dtype", "fp16"]))
    assert change == 'backbones.qwen.serve.extra_args: ["--dtype", "bf16"] -> ["--dtype", "fp16"]'
    [change] = _changes(_managed(), _managed(env={"VLLM_ATTENTION_BACKEND": "FLASHINFER"}))
    assert change.startswith("backbones.qwen.serve.env: {} -> ")


def test_a_slice_by_chat_methods_drops_the_local_backbones_and_one_by_chat_backbones_drops_soap() -> None:
    config = _config("float16", local=True)
    by_method = narrow_sweep(config, methods=["all-at-once"])
    assert set(by_method.backbones) == {"gpt"}
    by_backbone = narrow_sweep(config, backbones=["gpt"])
    assert [m.name for m in by_backbone.methods] == ["all-at-once"]
    only_soap = narrow_sweep(config, methods=["soap"])
    assert set(only_soap.backbones) == {"tiny"}
    both = narrow_sweep(config, backbones=["gpt"], methods=["all-at-once", "soap"])
    assert set(both.backbones) == {"gpt"} and [m.name for m in both.methods] == ["all-at-once", "soap"]
