"""What the simulated model generates for an admitted request, and the completion body that carries it."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Mapping
from typing import Any

from .answers import (
    answer_seed,
    count_text_tokens,
    filler_sentence,
    filler_text,
    generate_value,
    schema_from_request,
    simulate_tool_calls,
    tool_calls_text,
)
from .config import MockConfig
from .faults import spoiled_usage

__all__ = [
    "Completion",
    "answer_outcome",
    "completion_body",
    "compose_answer",
    "cut_short",
    "fit_to_budget",
    "usage",
]


class Completion:
    """What the simulated model generated within its budget."""

    __slots__ = ("completion_tokens", "content", "finish_reason", "reasoning_tokens", "tool_calls")

    def __init__(
        self,
        content: str,
        reasoning_tokens: int,
        completion_tokens: int,
        finish_reason: str,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        self.content = content
        self.reasoning_tokens = reasoning_tokens
        self.completion_tokens = completion_tokens
        self.finish_reason = finish_reason
        self.tool_calls = tool_calls


def compose_answer(
    body: Mapping[str, Any],
    messages: list[dict[str, Any]],
    model: str,
    sample_rng: random.Random,
    tool_rounds_max: int,
) -> str | list[dict[str, Any]]:
    """The answer text, or the tool calls (wire shape) when the simulated model calls tools this round."""
    seed = answer_seed(messages, model, body.get("seed"))
    temperature = body["temperature"]
    if temperature is None or temperature > 0:
        # A sampled model answers differently each time; the server's own stream keeps runs reproducible.
        seed ^= sample_rng.getrandbits(64)
    rng = random.Random(seed)
    if body.get("tools"):
        calls = simulate_tool_calls(body, model=model, rounds_max=tool_rounds_max, rng=rng)
        if calls is not None:
            return calls
    schema = schema_from_request(body)
    if schema is not None:
        return json.dumps(generate_value(schema, rng), ensure_ascii=False)
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_object":
        return json.dumps({"answer": filler_sentence(rng)})
    return filler_sentence(rng)


def fit_to_budget(
    answer: str | list[dict[str, Any]], reasoning_tokens: int, max_tokens: int | None, chars_per_token: float
) -> Completion:
    """Cut reasoning and answer to ``max_tokens`` as a model does: thinking first, then the answer.

    Tool calls are all or nothing (calls cut short are no calls): a budget too small for them is a length stop
    with no content.
    """
    if isinstance(answer, list):
        calls_tokens = count_text_tokens(tool_calls_text(answer), chars_per_token)
        if max_tokens is None or max_tokens >= reasoning_tokens + calls_tokens:
            return Completion("", reasoning_tokens, reasoning_tokens + calls_tokens, "tool_calls", answer)
        return Completion("", min(max_tokens, reasoning_tokens), max_tokens, "length")
    answer_tokens = count_text_tokens(answer, chars_per_token)
    if max_tokens is None or max_tokens >= reasoning_tokens + answer_tokens:
        return Completion(answer, reasoning_tokens, reasoning_tokens + answer_tokens, "stop")
    if max_tokens < reasoning_tokens:
        # The budget ran out while thinking: no content at all (the "empty content" length stop).
        return Completion("", max_tokens, max_tokens, "length")
    content_tokens = max_tokens - reasoning_tokens
    content = answer[: math.floor(content_tokens * chars_per_token)]
    return Completion(content, reasoning_tokens, max_tokens, "length")


def cut_short(
    answer: str, reasoning_tokens: int, max_tokens: int | None, chars_per_token: float
) -> Completion | None:
    """The ``length_rate`` fault: the answer stopped at a tenth of ``max_tokens`` (of its own length when that
    is shorter or no budget was given); None if it cannot be cut."""
    whole = reasoning_tokens + count_text_tokens(answer, chars_per_token)
    cut_at = max(1, max_tokens // 10) if max_tokens is not None else 0
    if cut_at >= whole or cut_at == 0:
        cut_at = max(1, whole // 10)
    if cut_at >= whole:
        return None
    return fit_to_budget(answer, reasoning_tokens, cut_at, chars_per_token)


def answer_outcome(completion: Completion, answer_fault: str | None) -> str:
    """The request log's outcome of an answer sent whole."""
    if answer_fault is not None:
        return answer_fault
    return "length" if completion.finish_reason == "length" else "ok"


def usage(
    config: MockConfig,
    completion: Completion,
    prompt_tokens: int,
    cached_tokens: int,
    answer_fault: str | None,
    detail: str | None,
) -> dict[str, Any] | None:
    """The answer's ``usage`` in the configured style; for a "bad_usage" answer its ``detail`` variant (None:
    missing)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": prompt_tokens + completion.completion_tokens,
    }
    if config.usage_style == "deepseek":
        usage["prompt_cache_hit_tokens"] = cached_tokens
        usage["prompt_cache_miss_tokens"] = prompt_tokens - cached_tokens
    else:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    usage["completion_tokens_details"] = {"reasoning_tokens": completion.reasoning_tokens}
    if answer_fault == "bad_usage":
        return spoiled_usage(usage, detail)
    return usage


def completion_body(
    config: MockConfig,
    completion_id: str,
    model: str,
    completion: Completion,
    usage: dict[str, Any] | None,
    ascii_only: bool,
) -> bytes:
    """The completion's JSON body (with ASCII escapes for a "surrogate" answer: a lone surrogate cannot be
    UTF-8)."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.tool_calls is not None:
        message["content"] = None
        message["tool_calls"] = completion.tool_calls
    if config.reasoning_field is not None:
        message[config.reasoning_field] = (
            filler_text(completion.reasoning_tokens, config.chars_per_token)
            if completion.reasoning_tokens > 0
            else None
        )
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": completion.finish_reason}
        ],
    }
    if usage is not None:
        body["usage"] = usage
    # json.dumps writes float("inf") as the bare word Infinity, as the "infinity" usage means to.
    return json.dumps(body, ensure_ascii=ascii_only).encode()
