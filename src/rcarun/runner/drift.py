"""What a resume may change: the settings that decide answers stay as the run was started, the rest may move.

A run's answers are comparable only when they came from one model, endpoint, request and method options, output
budgets and trajectories; a resume that changed one would mix two configurations under one name, silently.
Limits, prices, budgets, retries and timeouts decide how fast and how dearly answers come, not what they are;
adding or dropping a backbone or method changes the run's extent; a simulated sweep's loopback ports are drawn
anew. For a managed backbone what decides answers is what its replicas load: ``serve.model``, ``max_model_len``,
``env`` and ``extra_args`` less the flags that only size the server (`_CAPACITY_FLAGS`); GPUs, replica count,
ports and the tensor-parallel size (rounding, as batching) may move.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from rcarun.runner.config import StageConfig, SweepConfig

__all__ = ["answer_changes"]

# Backbone settings that decide what a request is or who answers it.
_BACKBONE_KEYS = (
    "provider",
    "model",
    "endpoints",
    "thinking",
    "reasoning_effort",
    "supports_response_format",
    "extra_body",
    "context_window",
    "max_output_tokens",
    "chars_per_token",
    "local",  # a local model's dtype, device, revision and pass limit decide its numbers
)
_SWEEP_KEYS = ("dataset", "manifest")
# A managed backbone's serve settings that decide what its replicas compute (module docstring).
_SERVE_KEYS = ("model", "max_model_len", "env")
# vllm serve flags that size or instrument the server without changing the model or its decoding; each may be
# written ``--flag value`` or ``--flag=value`` (a bare boolean flag takes no value).
_BOOLEAN_CAPACITY_FLAGS = frozenset(
    (
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--disable-log-requests",
        "--disable-log-stats",
    )
)
_CAPACITY_FLAGS = _BOOLEAN_CAPACITY_FLAGS | {
    "--gpu-memory-utilization",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--swap-space",
    "--cpu-offload-gb",
    "--block-size",
    "--uvicorn-log-level",
}


def _answer_args(extra_args: list[Any]) -> list[str]:
    """``extra_args`` without the capacity flags (and their values), in their order."""
    kept: list[str] = []
    words = [str(word) for word in extra_args]
    index = 0
    while index < len(words):
        word = words[index]
        flag = word.split("=", 1)[0]
        index += 1
        if flag not in _CAPACITY_FLAGS:
            kept.append(word)
            continue
        if "=" not in word and flag not in _BOOLEAN_CAPACITY_FLAGS and index < len(words):
            index += 1  # the flag's value
    return kept


def _answer_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The answer-deciding part of a dumped `SweepConfig`, flattened to dotted paths."""
    sweep = config.get("sweep") or {}
    simulated = bool(sweep.get("simulated"))
    settings: dict[str, Any] = {f"sweep.{key}": sweep.get(key) for key in _SWEEP_KEYS}
    # How passes are kept decides what a local model's method reads (float16 rounds), so it is each local
    # backbone's setting; a config from before the setting had the default.
    forward_cache = sweep.get("forward_cache", "float16")
    for name, backbone in (config.get("backbones") or {}).items():
        if backbone.get("provider") == "local":
            settings[f"backbones.{name}.forward_cache"] = forward_cache
        endpoints = tuple(backbone.get("base_urls") or ()) or (
            (backbone["base_url"],) if backbone.get("base_url") else ()
        )
        values = {**backbone, "endpoints": list(endpoints)}
        for key in _BACKBONE_KEYS:
            if key == "endpoints" and (simulated or backbone.get("provider") == "simulated"):
                continue
            settings[f"backbones.{name}.{key}"] = values.get(key)
        serve = backbone.get("serve")
        if isinstance(serve, dict):
            for key in _SERVE_KEYS:
                # A window left to the backbone is the context_window, compared above.
                settings[f"backbones.{name}.serve.{key}"] = serve.get(key) or ({} if key == "env" else None)
            settings[f"backbones.{name}.serve.extra_args"] = _answer_args(serve.get("extra_args") or [])
    for method in config.get("methods") or ():
        label = method.get("label") or method.get("name")
        settings[f"methods.{label}.name"] = method.get("name")
        settings[f"methods.{label}.options"] = method.get("options") or {}
    for stage, policy in (config.get("stages") or {}).items():
        for key, value in (policy or {}).items():
            settings[f"stages.{stage}.{key}"] = value
    return settings


def _with_stage_defaults(settings: dict[str, Any], stages: set[str]) -> dict[str, Any]:
    """A stage one config names and the other does not runs with the defaults there: compare against them."""
    defaults = StageConfig().model_dump()
    filled = dict(settings)
    for stage in stages:
        for key, value in defaults.items():
            filled.setdefault(f"stages.{stage}.{key}", value)
    return filled


def _groups(path: str) -> str:
    """The backbone or method a path belongs to (``backbones.X`` / ``methods.X``), or the path's head."""
    parts = path.split(".")
    return ".".join(parts[:2]) if parts[0] in ("backbones", "methods") else parts[0]


def _changes(old: dict[str, Any], new: dict[str, Any]) -> Iterator[str]:
    present_old = {_groups(path) for path in old}
    present_new = {_groups(path) for path in new}
    for path in sorted(old.keys() | new.keys()):
        group = _groups(path)
        if group.startswith(("backbones.", "methods.")) and not (
            group in present_old and group in present_new
        ):
            continue  # a backbone or method added or dropped: the run's extent, not its answers
        before, after = old.get(path), new.get(path)
        if before != after:
            yield f"{path}: {_show(before)} -> {_show(after)}"


def _show(value: Any) -> str:
    text = (
        json.dumps(value, sort_keys=True, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    )
    return text if len(text) <= 80 else text[:79] + "…"


def answer_changes(stored_config_json: str, config: SweepConfig) -> list[str]:
    """The answer-deciding settings that differ between the run's stored config and ``config``, one line each
    (``backbones.gpt.model: 'gpt-4o-mini' -> 'gpt-4o'``); empty when a resume cannot mix configurations.

    A stored config that cannot be read (an older rcarun's, or damaged) is compared as far as it goes.
    """
    try:
        stored = json.loads(stored_config_json)
    except json.JSONDecodeError:
        return []
    if not isinstance(stored, dict) or not stored:
        return []
    current = json.loads(config.model_dump_json())
    old, new = _answer_settings(stored), _answer_settings(current)
    stages = {path.split(".")[1] for path in old.keys() | new.keys() if path.startswith("stages.")}
    return list(_changes(_with_stage_defaults(old, stages), _with_stage_defaults(new, stages)))
