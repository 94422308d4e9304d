"""The one request builder and the one response parser every transport shares.

Every transport sends the body `build_body` makes and hands the raw status, headers and bytes to
`parse_completion`, so a backbone gives identical `ChatResult`s and errors whichever transport carries it;
provider differences come from the `Preset`, never from branches on names. Parsing is by hand on the decoded
JSON (it runs once per call on the hot path, and must tolerate shapes a strict model would refuse). Everything
returned can be stored: lone surrogates become U+FFFD, unsound token counts become 0 with
``ChatResult.usage_problem`` saying why, and provider text quoted in an error is scrubbed of secrets whole,
before it is shortened.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from rcarun import jsonfast
from rcarun.backends.presets import Preset
from rcarun.backends.ratelimits import longest_reset_s, parse_rate_limit_headers
from rcarun.backends.settings import BackendSettings, redact_secrets
from rcarun.backends.types import (
    ChatMessage,
    ChatRequest,
    ChatResult,
    ChatToolCall,
    RateLimitInfo,
    Usage,
)
from rcarun.errors import (
    AuthError,
    BadRequest,
    CallError,
    ContextOverflow,
    MalformedResponse,
    ModelNotFound,
    QuotaExhausted,
    RateLimited,
    ServerError,
)
from rcarun.text import repair_surrogates

__all__ = [
    "MAX_QUOTED_CHARS",
    "build_body",
    "completion_result",
    "error_for_status",
    "parse_completion",
    "provider_message",
    "refuses_streaming",
    "replay_body",
    "replay_completion",
]

MAX_QUOTED_CHARS = 300
"""How much of a provider's error message an rcarun error quotes."""

Redactor = Callable[[str], str]
"""Scrubs secrets from provider text; the backend passes one that knows its key (default: generic shapes only)."""

_MAX_COUNT: Final = 2**53  # beyond this a token count is no count (and no longer exact as a float)
_MISSING: Final = object()

_EFFORT_LEVELS = frozenset({"low", "medium", "high"})

# Statuses whose meaning does not depend on the provider (other 4xx: BadRequest, 5xx: ServerError). Rate-limit
# statuses come from the preset first.
_STATUS_ERRORS: Mapping[int, type[CallError]] = {
    401: AuthError,
    402: QuotaExhausted,
    403: AuthError,
    404: ModelNotFound,
    408: ServerError,
    429: RateLimited,
}
# Statuses on which an error body may say "out of credit" and must become fatal.
_QUOTA_STATUSES = frozenset({402, 403, 429})


def build_body(
    request: ChatRequest, settings: BackendSettings, preset: Preset, *, stream: bool = False
) -> dict[str, Any]:
    """The JSON body for ``POST {base_url}/chat/completions``.

    Precedence, lowest first: the request's fields, the backbone's ``extra_body``, the thinking switch (the
    request's ``reasoning`` beats the backbone default); sampling fields go last when the preset says the
    provider rejects them while thinking. ``stream`` is not part of the request's identity (hash, cache key).
    """
    body: dict[str, Any] = {
        "model": settings.model,
        "messages": [_wire_message(message) for message in request.messages],
        preset.max_tokens_field: request.max_tokens,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = list(request.tools)
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.seed is not None:
        body["seed"] = request.seed
    if (
        request.schema is not None
        and settings.supports_response_format
        and preset.response_format is not None
    ):
        body["response_format"] = preset.response_format(request.schema, request.schema_name)
    if settings.extra_body:
        _deep_merge(body, settings.extra_body)

    thinking, effort = _reasoning_choice(request, settings)
    if thinking is not None and preset.thinking_fields is not None:
        _deep_merge(body, preset.thinking_fields(thinking))
    if effort is not None and preset.sends_reasoning_effort:
        body["reasoning_effort"] = effort
    thinking_on = preset.thinking_default_on if thinking is None else thinking
    if preset.strips_sampling_while_thinking and thinking_on:
        for name in preset.sampling_fields:
            body.pop(name, None)
    return body


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    if not message.tool_calls and message.tool_call_id is None:
        return {"role": message.role, "content": message.content}
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        # OpenAI's own shape for an assistant turn that only called tools is null content.
        if not message.content:
            wire["content"] = None
        wire["tool_calls"] = [_wire_tool_call(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _wire_tool_call(call: ChatToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _reasoning_choice(request: ChatRequest, settings: BackendSettings) -> tuple[bool | None, str | None]:
    """(thinking on/off or None for provider default, effort or None) from the request, else the backbone."""
    if request.reasoning == "off":
        return False, None
    if request.reasoning in _EFFORT_LEVELS:
        return True, request.reasoning
    effort = settings.reasoning_effort if settings.thinking is not False else None
    return settings.thinking, effort


def _deep_merge(target: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        current = target.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict):
            _deep_merge(current, value)
        elif isinstance(value, Mapping):
            fresh: dict[str, Any] = {}
            _deep_merge(fresh, value)
            target[key] = fresh
        else:
            target[key] = value


def parse_completion(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    preset: Preset,
    latency_s: float,
    endpoint: str,
    *,
    backbone: str = "",
    redact: Redactor = redact_secrets,
) -> ChatResult:
    """Translate one HTTP exchange into a `ChatResult`, or raise the matching `rcarun.errors.CallError`
    (RateLimited, QuotaExhausted, ServerError, BadRequest, ContextOverflow, AuthError, MalformedResponse).

    ``body`` is the response as received (leading blank lines allowed: DeepSeek writes them while a request is
    queued) or a streamed answer's assembled completion; ``backbone`` is named in error messages; ``redact``
    scrubs secrets from any provider text an error quotes.
    """
    label = backbone or endpoint
    if not 200 <= status < 300:
        rate_limit = parse_rate_limit_headers(_lowered(headers), preset.rate_limit_headers)
        raise error_for_status(status, body, preset, label, rate_limit, redact=redact)
    payload = _load_json(body)
    if not isinstance(payload, dict):
        raise MalformedResponse(
            f"{label}: HTTP {status} body is not a JSON object: {_quote(_decode(body), redact)}",
            status=status,
        )
    return completion_result(
        payload, body, status, headers, preset, latency_s, endpoint, backbone=backbone, redact=redact
    )


def completion_result(
    payload: Mapping[str, Any],
    body: bytes,
    status: int,
    headers: Mapping[str, str],
    preset: Preset,
    latency_s: float,
    endpoint: str,
    *,
    backbone: str = "",
    redact: Redactor = redact_secrets,
) -> ChatResult:
    """`parse_completion` for a completion already decoded (a streamed answer's assembled chunks, whose rendering
    ``body`` is what the store keeps): the same reading, without parsing ``body`` again."""
    rate_limit = parse_rate_limit_headers(_lowered(headers), preset.rate_limit_headers)
    label = backbone or endpoint
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _in_band_error(status, payload, body, preset, label, rate_limit, redact)
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedResponse(f"{label}: HTTP {status} choice has no message object", status=status)
    finish_reason = choice.get("finish_reason")
    model = payload.get("model")
    usage, usage_problem = _usage(payload.get("usage", _MISSING), preset)
    return ChatResult(
        text=repair_surrogates(_content_text(message.get("content"), label, status)),
        reasoning_text=repair_surrogates(_reasoning_text(message, preset)),
        finish_reason=repair_surrogates(finish_reason) if isinstance(finish_reason, str) else "",
        usage=usage,
        latency_s=latency_s,
        model=repair_surrogates(model) if isinstance(model, str) else "",
        rate_limit=rate_limit,
        raw_body=body,
        endpoint=endpoint,
        tool_calls=_tool_calls(message.get("tool_calls"), label, status),
        usage_problem=usage_problem,
    )


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _tool_calls(raw: Any, label: str, status: int) -> tuple[ChatToolCall, ...]:
    """The tool calls of a message, arguments as the model's JSON text; a call without an id gets
    ``call_<position>`` so it can still be answered."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedResponse(f"{label}: HTTP {status} tool_calls is a {type(raw).__name__}", status=status)
    calls: list[ChatToolCall] = []
    for position, entry in enumerate(raw):
        function = entry.get("function") if isinstance(entry, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str):
            raise MalformedResponse(
                f"{label}: HTTP {status} tool_calls[{position}] has no function name", status=status
            )
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = entry.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{position}"
        calls.append(
            ChatToolCall(
                id=repair_surrogates(call_id),
                name=repair_surrogates(name),
                arguments=repair_surrogates(arguments),
            )
        )
    return tuple(calls)


def replay_completion(body: bytes, preset: Preset, backbone: str) -> ChatResult:
    """The answer in a stored completion body, read as the backend read it (CallError if it no longer is one)."""
    return parse_completion(200, {}, body, preset, 0.0, "", backbone=backbone)


def replay_body(result: ChatResult, preset: Preset) -> bytes:
    """A completion body that `parse_completion` reads back into ``result``'s answer (for an in-process
    engine's answer with tool calls, which no other stored column can hold)."""
    message: dict[str, Any] = {"role": "assistant", "content": result.text or None}
    if result.reasoning_text and preset.reasoning_text_fields:
        message[preset.reasoning_text_fields[0]] = result.reasoning_text
    if result.tool_calls:
        message["tool_calls"] = [_wire_tool_call(call) for call in result.tool_calls]
    payload = {
        "object": "chat.completion",
        "model": result.model,
        "choices": [{"index": 0, "message": message, "finish_reason": result.finish_reason}],
        "usage": {
            "prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.completion_tokens,
        },
    }
    # An in-process engine's text may hold lone surrogates, which no UTF-8 body can carry.
    return repair_surrogates(json.dumps(payload, ensure_ascii=False, separators=(",", ":"))).encode()


def _load_json(body: bytes) -> Any:
    try:
        # json.loads skips leading whitespace itself; the strip also covers bodies that are only blank lines.
        stripped = body.strip()
        return jsonfast.loads(stripped) if stripped else None
    except (ValueError, UnicodeDecodeError):
        return None


def _content_text(content: Any, label: str, status: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Content parts (some gateways return them even for text-only answers).
        return "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise MalformedResponse(
        f"{label}: HTTP {status} message content is a {type(content).__name__}", status=status
    )


def _reasoning_text(message: Mapping[str, Any], preset: Preset) -> str:
    for name in preset.reasoning_text_fields:
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _usage(raw: Any, preset: Preset) -> tuple[Usage, str | None]:
    """The usage counts, and what was wrong with them (None when nothing was). Never raises: an answer with
    unusable counts was still paid for, and must reach the store."""
    if not isinstance(raw, dict):
        return Usage(), "no usage in the answer"
    problems: list[str] = []
    usage = Usage(
        prompt_tokens=_count(raw.get("prompt_tokens", _MISSING), "prompt_tokens", problems),
        cached_prompt_tokens=_first_count(raw, preset.cached_tokens_paths, problems),
        completion_tokens=_count(raw.get("completion_tokens", _MISSING), "completion_tokens", problems),
        reasoning_tokens=_first_count(raw, preset.reasoning_tokens_paths, problems),
    )
    return usage, "; ".join(problems) or None


def _first_count(usage: Mapping[str, Any], paths: tuple[tuple[str, ...], ...], problems: list[str]) -> int:
    """The count at the first of ``paths`` present (optional fields: absent from every path is 0, no problem)."""
    for path in paths:
        node: Any = usage
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return _count(node, ".".join(path), problems)
    return 0


def _count(value: Any, name: str, problems: list[str]) -> int:
    """``value`` as a token count; 0 with a line in ``problems`` unless it is an integer in [0, 2**53)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < _MAX_COUNT:
            return value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer() and 0 <= value < _MAX_COUNT:
        return int(value)  # 1200.0: some servers write every number as a float
    problems.append(f"usage.{name} is {_brief(value)}")
    return 0


def _brief(value: Any) -> str:
    """A usage value as the JSON that carried it (Infinity, NaN, "12", true, 1e+20), at most 40 characters."""
    if value is _MISSING:
        return "missing"
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):  # not JSON-born (a hand-built payload); its type is enough
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:39] + "…"


def error_for_status(
    status: int,
    body: bytes,
    preset: Preset,
    label: str,
    rate_limit: RateLimitInfo | None = None,
    *,
    redact: Redactor = redact_secrets,
) -> CallError:
    """The rcarun error for a non-2xx answer (returned, not raised), quoting the provider's text scrubbed."""
    payload = _load_json(body)
    full_text = _provider_text(payload, body)
    quoted = _quote(full_text, redact)
    classifier = full_text.lower()
    message = f"{label}: HTTP {status}: {quoted}" if quoted else f"{label}: HTTP {status}"

    if status in _QUOTA_STATUSES and any(marker in classifier for marker in preset.quota_markers):
        return QuotaExhausted(message, status=status)
    if status in preset.rate_limit_statuses:
        return RateLimited(
            message,
            status=status,
            retry_after_s=rate_limit.retry_after_s if rate_limit is not None else None,
            reset_s=longest_reset_s(rate_limit),
            rate_limit=rate_limit,
        )
    error_class = _STATUS_ERRORS.get(status)
    if error_class is None:
        error_class = (
            ServerError if status >= 500 else BadRequest if 400 <= status < 500 else MalformedResponse
        )
    if error_class is BadRequest and any(marker in classifier for marker in preset.context_overflow_markers):
        error_class = ContextOverflow
    if error_class is RateLimited:
        # 429 on a preset that lists other rate-limit statuses only: still a rate limit.
        return RateLimited(message, status=status, reset_s=longest_reset_s(rate_limit), rate_limit=rate_limit)
    return error_class(message, status=status)


def _in_band_error(
    status: int,
    payload: Mapping[str, Any],
    body: bytes,
    preset: Preset,
    label: str,
    rate_limit: RateLimitInfo | None,
    redact: Redactor,
) -> CallError:
    """A 2xx whose body is not a completion: an error object carrying its own status, or malformed."""
    error = payload.get("error")
    if isinstance(error, dict):
        for key in ("status", "code"):
            code = error.get(key)
            if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
                return error_for_status(code, body, preset, label, rate_limit, redact=redact)
    quoted = provider_message(payload, body, redact=redact)
    detail = f": {quoted}" if quoted else ""
    return MalformedResponse(f"{label}: HTTP {status} body is not a chat completion{detail}", status=status)


_STREAM_WORD = re.compile(r"\bstream(?:_options)?\b")


def refuses_streaming(status: int, body: bytes) -> bool:
    """Whether a 400 or 422 refuses the request for streaming (its message or ``param`` names ``stream``)."""
    if status not in (400, 422):
        return False
    payload = _load_json(body)
    text = _provider_text(payload, body)
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        param = payload["error"].get("param")
        if isinstance(param, str):
            text = f"{text} {param}"
    return _STREAM_WORD.search(text.lower()) is not None


def provider_message(payload: Any, body: bytes, *, redact: Redactor = redact_secrets) -> str:
    """The provider's own error message, scrubbed, whitespace collapsed and cut to `MAX_QUOTED_CHARS`."""
    return _quote(_provider_text(payload, body), redact)


def _provider_text(payload: Any, body: bytes) -> str:
    """The provider's error message with its type and code, or the body's first characters when not JSON."""
    text = ""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            parts = [error.get("message"), error.get("type"), error.get("code")]
            text = " | ".join(str(part) for part in parts if part not in (None, ""))
        elif isinstance(error, str):
            text = error
        if not text:
            for key in ("message", "detail"):
                value = payload.get(key)
                if value:
                    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                    break
    if not text:
        return _decode(body)
    return text


def _decode(body: bytes) -> str:
    # The whole body, not a prefix: cutting before the secrets are scrubbed could cut a key in two, and a cut
    # key matches nothing (whitespace collapsing can then bring its first half inside the quoted part).
    return body.decode("utf-8", errors="replace")


def _quote(text: str, redact: Redactor) -> str:
    """Provider text as an error quotes it: scrubbed whole first, then storable, collapsed and shortened."""
    collapsed = " ".join(repair_surrogates(redact(text)).split())
    if len(collapsed) <= MAX_QUOTED_CHARS:
        return collapsed
    return collapsed[: MAX_QUOTED_CHARS - 1] + "…"
