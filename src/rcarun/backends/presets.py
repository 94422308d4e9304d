"""Provider presets: the small, named differences between OpenAI-compatible APIs, kept as data.

One request builder and one parser (`rcarun.backends.wire`) serve every provider; adding a provider is adding a
`Preset` value here, never a branch on its name. Each difference's source: docs/reliability.md ("Provider
presets and their sources").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rcarun.errors import ConfigError

__all__ = [
    "PRESETS",
    "Preset",
    "get_preset",
    "json_object_format",
    "json_schema_format",
    "register_preset",
]

# Thinking switches: True/False -> fields deep-merged into the request body.
ThinkingFields = Callable[[bool], Mapping[str, Any]]
# Structured output: (schema, schema name) -> the ``response_format`` value.
ResponseFormat = Callable[[Mapping[str, Any], str], Mapping[str, Any]]


def _thinking_type(enabled: bool) -> Mapping[str, Any]:
    return {"thinking": {"type": "enabled" if enabled else "disabled"}}


def _chat_template_enable_thinking(enabled: bool) -> Mapping[str, Any]:
    return {"chat_template_kwargs": {"enable_thinking": enabled}}


def json_schema_format(schema: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """OpenAI-style structured output; ``strict`` is left off: method schemas need not meet its rules."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def json_object_format(schema: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """JSON mode for providers without schema-constrained output; the prompt carries the schema itself."""
    return {"type": "json_object"}


_OPENAI_RATE_LIMIT_HEADERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "limit_requests": ("x-ratelimit-limit-requests",),
        "remaining_requests": ("x-ratelimit-remaining-requests",),
        "reset_requests_s": ("x-ratelimit-reset-requests",),
        "limit_tokens": ("x-ratelimit-limit-tokens",),
        "remaining_tokens": ("x-ratelimit-remaining-tokens",),
        "reset_tokens_s": ("x-ratelimit-reset-tokens",),
    }
)
_MOONSHOT_RATE_LIMIT_HEADERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "limit_requests": ("x-ratelimit-limit", "x-ratelimit-limit-requests"),
        "remaining_requests": ("x-ratelimit-remaining", "x-ratelimit-remaining-requests"),
        "reset_requests_s": ("x-ratelimit-reset", "x-ratelimit-reset-requests"),
        "limit_tokens": ("x-ratelimit-limit-tokens",),
        "remaining_tokens": ("x-ratelimit-remaining-tokens",),
        "reset_tokens_s": ("x-ratelimit-reset-tokens",),
    }
)
# The generic default reads both spellings: the OpenAI suffixed names first, the unsuffixed ones as requests.
_ANY_RATE_LIMIT_HEADERS = _MOONSHOT_RATE_LIMIT_HEADERS

_OPENAI_CACHED: tuple[tuple[str, ...], ...] = (("prompt_tokens_details", "cached_tokens"),)
# The generic default also understands DeepSeek's and Moonshot's spellings, so an unknown provider that copied
# either is still counted.
_ANY_CACHED: tuple[tuple[str, ...], ...] = (*_OPENAI_CACHED, ("prompt_cache_hit_tokens",), ("cached_tokens",))
_OPENAI_REASONING: tuple[tuple[str, ...], ...] = (("completion_tokens_details", "reasoning_tokens"),)
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "n", "presence_penalty", "frequency_penalty")
_QUOTA_MARKERS = (
    "insufficient_quota",
    "exceeded_current_quota",
    "insufficient balance",
    "insufficient_balance",
)
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "exceeded model token limit",
    "too many tokens",
)


@dataclass(frozen=True, slots=True)
class Preset:
    """The ways one provider differs from the plain OpenAI chat-completions shape.

    The ``*_paths`` and ``*_fields`` tuples are tried in order; ``strips_sampling_while_thinking`` drops
    ``sampling_fields`` the API rejects while thinking; ``quota_markers`` (no credit: fatal) and
    ``context_overflow_markers`` are lower-case substrings of an error body; ``meters_output_budget``: the
    tokens/min meter counts the whole budget on arrival (OpenAI); ``streams`` unless a backbone says
    ``stream = false``; ``refusals_count_a_window`` is False where a 429 means too many at once (DeepSeek).
    """

    name: str
    max_tokens_field: str = "max_tokens"
    thinking_fields: ThinkingFields | None = None
    thinking_default_on: bool = False
    sends_reasoning_effort: bool = False
    strips_sampling_while_thinking: bool = False
    sampling_fields: tuple[str, ...] = _SAMPLING_FIELDS
    response_format: ResponseFormat | None = json_schema_format
    cached_tokens_paths: tuple[tuple[str, ...], ...] = _ANY_CACHED
    reasoning_tokens_paths: tuple[tuple[str, ...], ...] = _OPENAI_REASONING
    reasoning_text_fields: tuple[str, ...] = ("reasoning_content", "reasoning")
    rate_limit_headers: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _ANY_RATE_LIMIT_HEADERS)
    rate_limit_statuses: frozenset[int] = frozenset({429})
    quota_markers: tuple[str, ...] = _QUOTA_MARKERS
    context_overflow_markers: tuple[str, ...] = _CONTEXT_MARKERS
    meters_output_budget: bool = False
    refusals_count_a_window: bool = True
    streams: bool = True


_REGISTRY: dict[str, Preset] = {}
PRESETS: Mapping[str, Preset] = MappingProxyType(_REGISTRY)
"""Every registered preset by name (read-only view)."""


def register_preset(preset: Preset) -> Preset:
    """Add a preset to the registry; names are unique."""
    if preset.name in _REGISTRY:
        raise ValueError(f"preset {preset.name!r} is already registered")
    _REGISTRY[preset.name] = preset
    return preset


def get_preset(name: str) -> Preset:
    """The preset registered under `name`; `ConfigError` listing the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ConfigError(f"unknown provider preset {name!r}; known presets: {known}") from None


register_preset(Preset(name="openai-compatible"))

register_preset(
    Preset(
        name="openai",
        max_tokens_field="max_completion_tokens",
        cached_tokens_paths=_OPENAI_CACHED,
        sends_reasoning_effort=True,
        rate_limit_headers=_OPENAI_RATE_LIMIT_HEADERS,
        # "Your rate limit is calculated as the maximum of max_tokens and the estimated number of tokens based
        # on the character count of your request" (OpenAI's rate-limit guide).
        meters_output_budget=True,
    )
)

register_preset(
    Preset(
        name="deepseek",
        thinking_fields=_thinking_type,
        thinking_default_on=True,
        sends_reasoning_effort=True,
        response_format=json_object_format,
        cached_tokens_paths=(("prompt_cache_hit_tokens",), *_OPENAI_CACHED),
        rate_limit_headers=MappingProxyType({}),
        refusals_count_a_window=False,
    )
)

register_preset(
    Preset(
        name="kimi",
        thinking_fields=_thinking_type,
        thinking_default_on=True,
        strips_sampling_while_thinking=True,
        response_format=json_object_format,
        cached_tokens_paths=(("cached_tokens",), *_OPENAI_CACHED),
        rate_limit_headers=_MOONSHOT_RATE_LIMIT_HEADERS,
        rate_limit_statuses=frozenset({429, 503}),
    )
)

register_preset(
    Preset(
        name="vllm",
        thinking_fields=_chat_template_enable_thinking,
        thinking_default_on=True,
        reasoning_text_fields=("reasoning", "reasoning_content"),
    )
)

register_preset(
    Preset(
        name="simulated",
        rate_limit_headers=_ANY_RATE_LIMIT_HEADERS,
    )
)
