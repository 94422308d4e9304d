"""rcarun's backends: one request in, one `ChatResult` (or a typed `rcarun.errors.CallError`) out.

The runner builds a `BackendSettings` per backbone from TOML and calls `create_backend`; everything provider
specific lives in `presets`, everything HTTP specific in `transports`, and the single request builder and
response parser both transports share in `wire`.
"""

from __future__ import annotations

from rcarun.backends.openai_compat import OpenAICompatBackend
from rcarun.backends.presets import PRESETS, Preset, get_preset, register_preset
from rcarun.backends.ratelimits import (
    longest_reset_s,
    parse_duration_s,
    parse_rate_limit_headers,
    parse_retry_after_s,
)
from rcarun.backends.registry import backend, backend_names, create_backend
from rcarun.backends.replicas import ReplicaBalancer
from rcarun.backends.settings import BackendSettings, Secret
from rcarun.backends.streaming import CallProgress
from rcarun.backends.transports import ResponseStream, Transport, create_transport, transport, transport_names
from rcarun.backends.types import (
    Backend,
    ChatMessage,
    ChatRequest,
    ChatResult,
    ChatToolCall,
    PromptSize,
    RateLimitInfo,
    ReasoningSetting,
    ToolChoice,
    Usage,
    prompt_chars,
    prompt_size,
    utf8_length,
)
from rcarun.backends.wire import build_body, parse_completion, replay_body, replay_completion

__all__ = [
    "PRESETS",
    "Backend",
    "BackendSettings",
    "CallProgress",
    "ChatMessage",
    "ChatRequest",
    "ChatResult",
    "ChatToolCall",
    "OpenAICompatBackend",
    "Preset",
    "PromptSize",
    "RateLimitInfo",
    "ReasoningSetting",
    "ReplicaBalancer",
    "ResponseStream",
    "Secret",
    "ToolChoice",
    "Transport",
    "Usage",
    "backend",
    "backend_names",
    "build_body",
    "create_backend",
    "create_transport",
    "get_preset",
    "longest_reset_s",
    "parse_completion",
    "parse_duration_s",
    "parse_rate_limit_headers",
    "parse_retry_after_s",
    "prompt_chars",
    "prompt_size",
    "register_preset",
    "replay_body",
    "replay_completion",
    "transport",
    "transport_names",
    "utf8_length",
]
