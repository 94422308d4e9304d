"""The values that cross the backend boundary: one request in, one result out.

These are provider-neutral. A backend turns a `ChatRequest` into its provider's wire format and the provider's
answer into a `ChatResult` (or raises one of `rcarun.errors.CallError`'s subclasses). Everything above the
backends — budgets, the runner, the store — sees only these types.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from rcarun.jsonfast import dumps_canonical

if TYPE_CHECKING:
    from rcarun.backends.streaming import CallProgress

__all__ = [
    "Backend",
    "ChatMessage",
    "ChatRequest",
    "ChatResult",
    "ChatToolCall",
    "PromptSize",
    "RateLimitInfo",
    "ReasoningSetting",
    "ToolChoice",
    "Usage",
    "prompt_chars",
    "prompt_size",
    "utf8_length",
]

# "off" disables thinking where the provider can; "low"/"medium"/"high" set the effort; None leaves the
# backbone's configured default.
ReasoningSetting = Literal["off", "low", "medium", "high"]

# OpenAI's string forms of ``tool_choice``; None leaves it out of the request (the provider's "auto").
ToolChoice = Literal["auto", "none", "required"]


@dataclass(frozen=True, slots=True)
class ChatToolCall:
    """One function call an assistant turn asked for; ``arguments`` is the JSON text as the model wrote it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message; an assistant turn may carry ``tool_calls``, a ``tool`` turn names the call it answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ChatToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat-completion request, before any provider-specific translation.

    ``max_tokens`` is the attempt's output budget, reasoning included; ``schema`` goes out as ``response_format``
    where supported; ``tools`` are OpenAI function specs; None leaves a setting at the provider's default.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int
    temperature: float | None = None
    schema: Mapping[str, Any] | None = None
    schema_name: str = "answer"
    reasoning: ReasoningSetting | None = None
    seed: int | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: ToolChoice | None = None

    def prompt_chars(self) -> int:
        """Characters the prompt is made of (see `prompt_chars`)."""
        return prompt_chars(self.messages, self.tools)

    def prompt_size(self) -> PromptSize:
        """Characters and UTF-8 bytes of the prompt, the basis of token estimates before a call (`prompt_size`)."""
        return prompt_size(self.messages, self.tools)

    def canonical_json(self) -> str:
        """A stable JSON rendering (sorted keys, no whitespace) for hashing, caching and storage; tool fields only
        when set, so requests without tools hash as they always did."""
        return self.canonical_bytes().decode()

    def canonical_bytes(self) -> bytes:
        """`canonical_json` as UTF-8 (`UnicodeEncodeError` for a lone surrogate)."""
        payload: dict[str, Any] = {
            "messages": [_canonical_message(m) for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "schema": self.schema,
            "schema_name": self.schema_name,
            "reasoning": self.reasoning,
            "seed": self.seed,
        }
        if self.tools:
            payload["tools"] = list(self.tools)
        if self.tool_choice is not None:
            payload["tool_choice"] = self.tool_choice
        return dumps_canonical(payload)

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()


def prompt_chars(messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """Characters a prompt is made of: message contents, the names and arguments of earlier tool calls, and the
    compact JSON of the tool specs (providers render all three into the prompt and bill them as prompt tokens).
    """
    chars = 0
    for message in messages:
        chars += len(message.content)
        for call in message.tool_calls:
            chars += len(call.name) + len(call.arguments)
    if tools:
        chars += len(json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False))
    return chars


@dataclass(frozen=True, slots=True)
class PromptSize:
    """How large a prompt is: code points (`prompt_chars`) and UTF-8 bytes (at most one token each)."""

    chars: int
    utf8_bytes: int


def utf8_length(text: str) -> int:
    """UTF-8 bytes of ``text`` (an unpaired surrogate counts its three bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def prompt_size(messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] = ()) -> PromptSize:
    """`prompt_chars`'s text measured in characters and in UTF-8 bytes."""
    chars = 0
    utf8_bytes = 0
    for message in messages:
        for text in (
            message.content,
            *(part for call in message.tool_calls for part in (call.name, call.arguments)),
        ):
            chars += len(text)
            utf8_bytes += utf8_length(text)
    if tools:
        specs = json.dumps(list(tools), separators=(",", ":"), ensure_ascii=False)
        chars += len(specs)
        utf8_bytes += utf8_length(specs)
    return PromptSize(chars=chars, utf8_bytes=utf8_bytes)


def _canonical_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {"id": call.id, "name": call.name, "arguments": call.arguments} for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the provider reported them, normalised across providers.

    ``cached_prompt_tokens`` is part of ``prompt_tokens``; ``reasoning_tokens`` is part of
    ``completion_tokens`` (the OpenAI convention, which every preset maps onto).
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """Rate-limit headers of interest, already parsed into numbers (seconds for durations)."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One successful HTTP exchange (a length stop is a success at this layer).

    ``latency_s`` runs from sending to the whole body; ``raw_body`` is kept for the store (streamed: the completion
    the events add up to); ``usage_problem`` says why ``usage`` is not what the provider charged (none, or a bad
    count, read as 0), and the runner then charges an estimate; ``ttft_s`` and ``decode_tokens_per_s`` only when
    streamed.
    """

    text: str
    reasoning_text: str
    finish_reason: str
    usage: Usage
    latency_s: float
    model: str = ""
    rate_limit: RateLimitInfo | None = None
    raw_body: bytes = b""
    endpoint: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    tool_calls: tuple[ChatToolCall, ...] = ()
    usage_problem: str | None = None
    streamed: bool = False
    ttft_s: float | None = None
    decode_tokens_per_s: float | None = None


@runtime_checkable
class Backend(Protocol):
    """Sends one request and translates the answer; never sleeps, loops or retries.

    Raises:
        rcarun.errors.CallError: a subclass saying whether the failure is retryable, a rate limit or fatal.
    """

    name: str

    async def chat(self, request: ChatRequest, progress: CallProgress | None = None) -> ChatResult:
        """``progress``, when given, is kept up to date with what has arrived (read when the call ends early)."""
        ...

    async def aclose(self) -> None: ...
