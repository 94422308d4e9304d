"""The shared request builder and response parser, fed recorded-shape bodies and headers directly.

Provider quirks the simulator cannot produce are pinned here: DeepSeek's cache fields and blank lines, Moonshot's
headers and 503, vLLM's ``reasoning`` field and context-length 400, OpenAI's quota 429.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rcarun.backends import (
    ChatMessage,
    ChatRequest,
    ChatResult,
    ChatToolCall,
    RateLimitInfo,
    Usage,
    build_body,
    get_preset,
    parse_completion,
    replay_body,
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

from .helpers import completion, settings_for

SCHEMA = {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]}


def request(**overrides: Any) -> ChatRequest:
    values: dict[str, Any] = {
        "messages": (ChatMessage("system", "be brief"), ChatMessage("user", "which step failed?")),
        "max_tokens": 512,
    }
    values.update(overrides)
    return ChatRequest(**values)


def body_for(provider: str, chat: ChatRequest, **settings: Any) -> dict[str, Any]:
    return build_body(chat, settings_for("http://x/v1", provider=provider, **settings), get_preset(provider))


# ------------------------------------------------------------------------------------------- request body


def test_openai_budget_field_and_effort() -> None:
    body = body_for("openai", request(temperature=0.0, seed=7, reasoning="high"))
    assert body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "which step failed?"},
        ],
        "max_completion_tokens": 512,
        "temperature": 0.0,
        "seed": 7,
        "reasoning_effort": "high",
    }


def test_generic_presets_send_max_tokens() -> None:
    for provider in ("deepseek", "kimi", "vllm", "simulated", "openai-compatible"):
        body = body_for(provider, request())
        assert body["max_tokens"] == 512 and "max_completion_tokens" not in body, provider


def test_openai_reasoning_off_sends_no_effort() -> None:
    assert "reasoning_effort" not in body_for("openai", request(reasoning="off"), reasoning_effort="low")


@pytest.mark.parametrize(
    ("reasoning", "setting_thinking", "setting_effort", "thinking", "effort"),
    [
        ("off", True, "high", {"type": "disabled"}, None),
        ("high", None, None, {"type": "enabled"}, "high"),
        ("low", False, None, {"type": "enabled"}, "low"),
        (None, True, "medium", {"type": "enabled"}, "medium"),
        (None, False, "medium", {"type": "disabled"}, None),
        (None, None, None, None, None),  # provider default: nothing sent
    ],
)
def test_deepseek_thinking_switch_and_effort(
    reasoning: Any, setting_thinking: Any, setting_effort: Any, thinking: Any, effort: Any
) -> None:
    body = body_for(
        "deepseek", request(reasoning=reasoning), thinking=setting_thinking, reasoning_effort=setting_effort
    )
    assert body.get("thinking") == thinking
    assert body.get("reasoning_effort") == effort


def test_vllm_thinking_via_chat_template_kwargs_merged_with_extra_body() -> None:
    extra = {"chat_template_kwargs": {"preserve_thinking": False}, "top_k": 20}
    body = body_for("vllm", request(reasoning="off"), extra_body=extra)
    assert body["chat_template_kwargs"] == {"preserve_thinking": False, "enable_thinking": False}
    assert body["top_k"] == 20
    assert "reasoning_effort" not in body and "thinking" not in body
    on = body_for("vllm", request(reasoning="medium"))
    assert on["chat_template_kwargs"] == {"enable_thinking": True}
    assert "reasoning_effort" not in on
    assert extra == {"chat_template_kwargs": {"preserve_thinking": False}, "top_k": 20}  # not mutated


def test_kimi_strips_sampling_while_thinking() -> None:
    chat = request(temperature=0.3, seed=11)
    thinking_on = body_for("kimi", chat, thinking=True, extra_body={"top_p": 0.9, "n": 1, "user": "rcarun"})
    assert thinking_on["thinking"] == {"type": "enabled"}
    for name in ("temperature", "seed", "top_p", "n"):
        assert name not in thinking_on
    assert thinking_on["user"] == "rcarun"
    # Thinking is on by default for kimi-k2.5+: nothing said means stripped too.
    assert "temperature" not in body_for("kimi", chat)
    thinking_off = body_for("kimi", request(temperature=0.3, seed=11, reasoning="off"))
    assert thinking_off["thinking"] == {"type": "disabled"}
    assert (thinking_off["temperature"], thinking_off["seed"]) == (0.3, 11)


def test_deepseek_keeps_sampling_while_thinking() -> None:
    assert body_for("deepseek", request(temperature=0.2), thinking=True)["temperature"] == 0.2


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        ("openai", {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}),
        ("vllm", {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}),
        ("simulated", {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}),
        ("deepseek", {"type": "json_object"}),
        ("kimi", {"type": "json_object"}),
    ],
)
def test_response_format_per_preset(provider: str, expected: dict[str, Any]) -> None:
    body = body_for(provider, request(schema=SCHEMA, schema_name="verdict"))
    assert body["response_format"] == expected
    assert json.loads(json.dumps(body)) == body  # the body is plain JSON


def test_response_format_off_when_backbone_does_not_support_it() -> None:
    body = body_for("vllm", request(schema=SCHEMA), supports_response_format=False)
    assert "response_format" not in body
    assert "response_format" not in body_for("vllm", request())


# ------------------------------------------------------------------------------------------ parse results


def parse(provider: str, payload: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return parse_completion(200, headers or {}, raw, get_preset(provider), 0.25, "http://x/v1", backbone="bb")


def test_openai_usage_and_headers() -> None:
    usage = {
        "prompt_tokens": 1200,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "completion_tokens_details": {"reasoning_tokens": 256},
    }
    headers = {"X-RateLimit-Remaining-Requests": "99", "X-RateLimit-Reset-Tokens": "1.5s"}
    result = parse("openai", completion(usage=usage, model="gpt-x"), headers)
    assert result.usage == Usage(1200, 1024, 300, 256)
    assert result.rate_limit == RateLimitInfo(remaining_requests=99, reset_tokens_s=1.5)
    assert (result.text, result.finish_reason, result.model, result.latency_s) == (
        '{"ok": true}',
        "stop",
        "gpt-x",
        0.25,
    )
    assert result.endpoint == "http://x/v1"


def test_deepseek_cache_hits_reasoning_content_and_blank_lines() -> None:
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 120,
        "prompt_cache_hit_tokens": 640,
        "prompt_cache_miss_tokens": 260,
        "completion_tokens_details": {"reasoning_tokens": 80},
    }
    payload = completion(content="B", reasoning_content="first I looked at step 3", usage=usage)
    raw = b"\n\n\n\n" + json.dumps(payload).encode()  # keep-alive blank lines written while queued
    result = parse("deepseek", raw)
    assert result.usage == Usage(900, 640, 120, 80)
    assert (result.text, result.reasoning_text) == ("B", "first I looked at step 3")
    assert result.raw_body == raw
    assert result.rate_limit is None


def test_kimi_cached_tokens_and_moonshot_headers() -> None:
    usage = {"prompt_tokens": 500, "completion_tokens": 40, "cached_tokens": 384}
    headers = {"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "49", "X-RateLimit-Reset": "12s"}
    result = parse("kimi", completion(usage=usage, reasoning_content="hm"), headers)
    assert result.usage == Usage(500, 384, 40, 0)
    assert result.reasoning_text == "hm"
    assert result.rate_limit == RateLimitInfo(limit_requests=50, remaining_requests=49, reset_requests_s=12.0)


@pytest.mark.parametrize(
    "message_fields",
    [
        {"reasoning": "thinking in the new field"},
        {"reasoning_content": "thinking in the new field"},
        {"reasoning": "thinking in the new field", "reasoning_content": None},
        {"reasoning": "", "reasoning_content": "thinking in the new field"},
    ],
)
@pytest.mark.parametrize("provider", ["vllm", "openai-compatible", "simulated", "deepseek", "kimi"])
def test_reasoning_read_from_either_field(provider: str, message_fields: dict[str, Any]) -> None:
    assert parse(provider, completion(**message_fields)).reasoning_text == "thinking in the new field"


@pytest.mark.parametrize("content", [None, ""])
def test_length_stop_with_empty_content_is_still_a_length_stop(content: str | None) -> None:
    payload = completion(
        content=content,
        finish_reason="length",
        reasoning="step 1 looks fine, step 2",
        usage={
            "prompt_tokens": 30,
            "completion_tokens": 64,
            "completion_tokens_details": {"reasoning_tokens": 64},
        },
    )
    result = parse("vllm", payload)
    assert (result.finish_reason, result.text) == ("length", "")
    assert result.reasoning_text == "step 1 looks fine, step 2"
    assert result.usage == Usage(30, 0, 64, 64)


def test_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": '{"a": '}, {"type": "text", "text": "1}"}]
    assert parse("openai-compatible", completion(content=parts)).text == '{"a": 1}'  # type: ignore[arg-type]


def test_missing_usage_is_zero_not_an_error() -> None:
    payload = completion()
    del payload["usage"]
    result = parse("vllm", payload)
    assert result.usage == Usage()
    assert result.usage_problem == "no usage in the answer"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\n\n\n",
        b"<html><body>502 Bad Gateway</body></html>",
        b'{"id": "x", "choices": [{"index": 0, "mess',
        b'{"object": "chat.completion", "choices": []}',
        b'{"choices": [{"index": 0}]}',
        b'{"choices": [{"message": {"content": 5}}]}',
        b"[1, 2]",
        b'{"error": {"message": "upstream went away"}}',
    ],
)
def test_ok_status_without_a_completion_is_malformed(raw: bytes) -> None:
    with pytest.raises(MalformedResponse) as caught:
        parse("deepseek", raw)
    assert caught.value.status == 200
    assert str(caught.value).startswith("bb: HTTP 200")


def test_ok_status_carrying_an_error_with_its_own_status_uses_it() -> None:
    raw = b'\n\n{"error": {"message": "Too many requests in queue", "code": 429}}'
    with pytest.raises(RateLimited) as caught:
        parse("deepseek", raw)
    assert caught.value.status == 429


# ------------------------------------------------------------------------------------------------ errors

OPENAI_QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "code": "insufficient_quota",
    }
}
OPENAI_RATE = {
    "error": {"message": "Rate limit reached for requests", "type": "requests", "code": "rate_limit_exceeded"}
}
VLLM_CONTEXT = {
    "object": "error",
    "message": "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens "
    "(39000 in the messages, 1000 in the completion).",
    "type": "BadRequestError",
    "code": 400,
}
OPENAI_CONTEXT = {
    "error": {"message": "Too long.", "type": "invalid_request_error", "code": "context_length_exceeded"}
}
MOONSHOT_OVERLOADED = {
    "error": {"message": "The engine is currently overloaded", "type": "engine_overloaded_error"}
}


@pytest.mark.parametrize(
    ("provider", "status", "payload", "error_class"),
    [
        ("openai", 429, OPENAI_QUOTA, QuotaExhausted),
        ("simulated", 429, OPENAI_QUOTA, QuotaExhausted),
        ("openai", 429, OPENAI_RATE, RateLimited),
        ("deepseek", 429, {"error": {"message": "concurrency"}}, RateLimited),
        ("deepseek", 402, {"error": {"message": "Insufficient Balance"}}, QuotaExhausted),
        ("kimi", 503, MOONSHOT_OVERLOADED, RateLimited),
        ("kimi", 429, MOONSHOT_OVERLOADED, RateLimited),
        ("openai", 503, MOONSHOT_OVERLOADED, ServerError),
        ("vllm", 500, {"object": "error", "message": "boom"}, ServerError),
        ("vllm", 502, b"<html>bad gateway</html>", ServerError),
        ("deepseek", 504, b"", ServerError),
        ("vllm", 400, VLLM_CONTEXT, ContextOverflow),
        ("openai", 400, OPENAI_CONTEXT, ContextOverflow),
        ("openai", 400, {"error": {"message": "Unsupported parameter: 'max_tokens'"}}, BadRequest),
        ("vllm", 404, {"object": "error", "message": "The model `x` does not exist."}, ModelNotFound),
        ("vllm", 422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}, BadRequest),
        ("openai", 401, {"error": {"message": "Incorrect API key provided"}}, AuthError),
        ("kimi", 403, {"error": {"message": "permission denied"}}, AuthError),
    ],
)
def test_error_translation(
    provider: str, status: int, payload: bytes | dict[str, Any], error_class: type[CallError]
) -> None:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    with pytest.raises(CallError) as caught:
        parse_completion(status, {}, raw, get_preset(provider), 0.1, "http://x/v1", backbone="my-backbone")
    assert type(caught.value) is error_class
    assert caught.value.status == status
    assert str(caught.value).startswith(f"my-backbone: HTTP {status}")


def test_context_overflow_is_a_bad_request() -> None:
    assert issubclass(ContextOverflow, BadRequest)


def test_rate_limited_carries_retry_after_and_longest_reset() -> None:
    headers = {
        "Retry-After": "7",
        "x-ratelimit-reset-requests": "20ms",
        "x-ratelimit-reset-tokens": "1m30s",
        "x-ratelimit-remaining-tokens": "0",
    }
    with pytest.raises(RateLimited) as caught:
        parse_completion(429, headers, json.dumps(OPENAI_RATE).encode(), get_preset("openai"), 0.1, "e")
    assert (caught.value.retry_after_s, caught.value.reset_s) == (7.0, 90.0)


def test_kimi_503_rate_limit_has_no_times_when_no_headers() -> None:
    with pytest.raises(RateLimited) as caught:
        parse_completion(503, {}, json.dumps(MOONSHOT_OVERLOADED).encode(), get_preset("kimi"), 0.1, "e")
    assert (caught.value.status, caught.value.retry_after_s, caught.value.reset_s) == (503, None, None)


def test_error_message_quotes_at_most_300_chars_and_never_a_header() -> None:
    long_message = "x" * 5000
    headers = {"Set-Cookie": "session=COOKIE-VALUE-123", "x-request-id": "REQ-ID-456"}
    raw = json.dumps({"error": {"message": long_message}}).encode()
    with pytest.raises(BadRequest) as caught:
        parse_completion(400, headers, raw, get_preset("openai"), 0.1, "http://x/v1", backbone="gpt")
    text = str(caught.value)
    assert text.startswith("gpt: HTTP 400: ")
    assert len(text) <= len("gpt: HTTP 400: ") + 300
    assert "COOKIE-VALUE-123" not in text and "REQ-ID-456" not in text


def test_context_marker_found_beyond_the_quoted_part() -> None:
    raw = json.dumps({"error": {"message": "y" * 400 + " maximum context length exceeded"}}).encode()
    with pytest.raises(ContextOverflow):
        parse_completion(400, {}, raw, get_preset("vllm"), 0.1, "e")


def test_only_openai_meters_the_whole_output_budget_against_tokens_per_minute() -> None:
    from rcarun.backends import PRESETS

    assert {name for name, preset in PRESETS.items() if preset.meters_output_budget} == {"openai"}


# ------------------------------------------------------------------------------------------------ tool calls

READ_STEPS = {
    "type": "function",
    "function": {
        "name": "read_steps",
        "description": "Read a range of steps.",
        "parameters": {
            "type": "object",
            "properties": {"start": {"type": "integer", "minimum": 0}, "end": {"type": "integer"}},
            "required": ["start", "end"],
        },
    },
}


def tool_conversation() -> tuple[ChatMessage, ...]:
    call = ChatToolCall("call_a", "read_steps", '{"start": 0, "end": 2}')
    return (
        ChatMessage("user", "which step failed?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "[step 0] Planner: go", tool_call_id="call_a"),
    )


def test_tool_less_request_hash_is_pinned() -> None:
    # The rendering from before rcarun sent tools: every stored request hash and call-cache key depends on it.
    chat = request(temperature=0.0, schema=SCHEMA)
    assert chat.canonical_json() == (
        '{"max_tokens":512,"messages":[{"content":"be brief","role":"system"},'
        '{"content":"which step failed?","role":"user"}],"reasoning":null,"schema":{"properties":'
        '{"step":{"type":"integer"}},"required":["step"],"type":"object"},"schema_name":"answer","seed":null,'
        '"temperature":0.0}'
    )
    assert chat.sha256() == "ad30665e9be330249502249f12dafe232d2ac79bbb169f3021c1fe2fcca370d1"


def test_tool_fields_change_the_hash_only_when_set() -> None:
    plain = request()
    assert request(tools=(), tool_choice=None).sha256() == plain.sha256()
    with_tools = request(tools=(READ_STEPS,))
    assert with_tools.sha256() != plain.sha256()
    assert request(tools=(READ_STEPS,), tool_choice="none").sha256() != with_tools.sha256()
    rendered = json.loads(request(messages=tool_conversation(), tools=(READ_STEPS,)).canonical_json())
    assert rendered["messages"][1]["tool_calls"] == [
        {"id": "call_a", "name": "read_steps", "arguments": '{"start": 0, "end": 2}'}
    ]
    assert rendered["messages"][2]["tool_call_id"] == "call_a"
    assert "tool_call_id" not in rendered["messages"][0]


def test_prompt_chars_count_tool_specs_and_call_arguments() -> None:
    messages = tool_conversation()
    contents = sum(len(m.content) for m in messages)
    spec_chars = len(json.dumps([READ_STEPS], separators=(",", ":")))
    call_chars = len("read_steps") + len('{"start": 0, "end": 2}')
    assert request(messages=messages).prompt_chars() == contents + call_chars
    assert (
        request(messages=messages, tools=(READ_STEPS,)).prompt_chars() == contents + call_chars + spec_chars
    )


def test_body_carries_tools_tool_choice_and_tool_messages_in_openai_shape() -> None:
    body = body_for("openai", request(messages=tool_conversation(), tools=(READ_STEPS,), tool_choice="auto"))
    assert body["tools"] == [READ_STEPS]
    assert body["tool_choice"] == "auto"
    assert body["messages"] == [
        {"role": "user", "content": "which step failed?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read_steps", "arguments": '{"start": 0, "end": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "[step 0] Planner: go"},
    ]


def test_body_without_tools_has_no_tool_fields() -> None:
    body = body_for("vllm", request())
    assert "tools" not in body and "tool_choice" not in body
    assert all(set(message) == {"role", "content"} for message in body["messages"])


def test_assistant_text_beside_tool_calls_is_kept() -> None:
    call = ChatToolCall("c1", "list_roles", "{}")
    body = body_for("vllm", request(messages=(ChatMessage("assistant", "let me look", tool_calls=(call,)),)))
    assert body["messages"][0]["content"] == "let me look"


def openai_tool_calls(*calls: tuple[str, str, str]) -> list[dict[str, Any]]:
    return [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in calls
    ]


@pytest.mark.parametrize("content", [None, ""])
def test_tool_calls_parsed_with_null_or_empty_content(content: str | None) -> None:
    calls = openai_tool_calls(
        ("call_1", "read_steps", '{"start": 3, "end": 5}'), ("call_2", "list_roles", "{}")
    )
    result = parse("openai", completion(content=content, finish_reason="tool_calls", tool_calls=calls))
    assert (result.text, result.finish_reason) == ("", "tool_calls")
    assert result.tool_calls == (
        ChatToolCall("call_1", "read_steps", '{"start": 3, "end": 5}'),
        ChatToolCall("call_2", "list_roles", "{}"),
    )


def test_tool_call_arguments_sent_as_an_object_are_serialised_and_missing_ids_numbered() -> None:
    raw_calls = [{"type": "function", "function": {"name": "search", "arguments": {"pattern": "é"}}}]
    result = parse("vllm", completion(content=None, finish_reason="tool_calls", tool_calls=raw_calls))
    assert result.tool_calls == (ChatToolCall("call_0", "search", '{"pattern": "é"}'),)


def test_answers_without_tool_calls_have_none() -> None:
    assert parse("vllm", completion(tool_calls=None)).tool_calls == ()
    assert parse("vllm", completion()).tool_calls == ()


@pytest.mark.parametrize(
    "tool_calls",
    [
        {"id": "x"},
        [{"id": "x", "type": "function"}],
        [{"id": "x", "function": {"arguments": "{}"}}],
        ["call"],
    ],
)
def test_malformed_tool_calls_are_malformed_responses(tool_calls: Any) -> None:
    with pytest.raises(MalformedResponse, match="tool_calls"):
        parse("openai", completion(content=None, finish_reason="tool_calls", tool_calls=tool_calls))


# ----------------------------------------------------------------------------------- values a store can keep

LONE = "\\ud800"  # a JSON escape of an unpaired high surrogate, as an answer cut mid-emoji carries
PAIRED = "\\ud83d\\ude00"  # the same escape properly paired: one emoji


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_lone_surrogates_become_replacement_characters_in_every_text() -> None:
    lone = "\ud800"
    payload = completion(
        content=f"cut {lone}\U0001f600 here",
        reasoning_content=lone,
        finish_reason=f"stop{lone}",
        model=f"m{lone}",
        tool_calls=openai_tool_calls((f"c{lone}", f"f{lone}", f'{{"a": "{lone}"}}')),
    )
    raw = json.dumps(payload).encode()  # ASCII JSON: the surrogate travels as its escape, the emoji as a pair
    assert LONE.encode() in raw and PAIRED.encode() in raw
    result = parse("deepseek", raw)
    assert result.text == "cut \ufffd\U0001f600 here"  # the paired escape stays one emoji
    assert (result.reasoning_text, result.model, result.finish_reason) == ("\ufffd", "m\ufffd", "stop\ufffd")
    assert result.tool_calls == (ChatToolCall("c\ufffd", "f\ufffd", '{"a": "\ufffd"}'),)
    assert result.raw_body == raw  # the bytes are stored as received; a replay parses them the same way
    assert parse("deepseek", result.raw_body) == result


def test_content_parts_and_object_arguments_are_cleaned_too() -> None:
    raw = (
        f'{{"choices": [{{"message": {{"content": [{{"type": "text", "text": "a{LONE}"}}], "tool_calls": '
        f'[{{"function": {{"name": "g", "arguments": {{"k": "{LONE}"}}}}}}]}}}}], '
        '"usage": {"prompt_tokens": 1, "completion_tokens": 1}}'
    ).encode()
    result = parse("vllm", raw)
    assert result.text == "a\ufffd"
    assert result.tool_calls == (ChatToolCall("call_0", "g", '{"k": "\ufffd"}'),)


@pytest.mark.parametrize("status", [200, 400, 500])
def test_lone_surrogates_never_reach_an_error_message(status: int) -> None:
    raw = f'{{"error": {{"message": "bad {LONE} input", "code": "x{LONE}"}}}}'.encode()
    with pytest.raises(CallError) as caught:
        parse_completion(status, {}, raw, get_preset("openai"), 0.1, "e", backbone="bb")
    assert _storable(str(caught.value))
    assert "bad \ufffd input" in str(caught.value)


@pytest.mark.parametrize(
    ("usage_json", "problem"),
    [
        ('{"prompt_tokens": Infinity, "completion_tokens": 7}', "usage.prompt_tokens is Infinity"),
        ('{"prompt_tokens": NaN, "completion_tokens": 7}', "usage.prompt_tokens is NaN"),
        ('{"prompt_tokens": -5, "completion_tokens": 7}', "usage.prompt_tokens is -5"),
        ('{"prompt_tokens": 1e20, "completion_tokens": 7}', "usage.prompt_tokens is 1e+20"),
        (
            '{"prompt_tokens": 100000000000000000000, "completion_tokens": 7}',
            "usage.prompt_tokens is 100000000000000000000",
        ),
        (
            '{"prompt_tokens": 9007199254740992, "completion_tokens": 7}',
            "usage.prompt_tokens is 9007199254740992",
        ),
        ('{"prompt_tokens": "12", "completion_tokens": 7}', 'usage.prompt_tokens is "12"'),
        ('{"prompt_tokens": 12.5, "completion_tokens": 7}', "usage.prompt_tokens is 12.5"),
        ('{"prompt_tokens": true, "completion_tokens": 7}', "usage.prompt_tokens is true"),
        ('{"prompt_tokens": null, "completion_tokens": 7}', "usage.prompt_tokens is null"),
        ('{"completion_tokens": 7}', "usage.prompt_tokens is missing"),
        ('{"prompt_tokens": [1], "completion_tokens": 7}', "usage.prompt_tokens is [1]"),
        (
            '{"prompt_tokens": "' + "9" * 60 + '", "completion_tokens": 7}',
            'usage.prompt_tokens is "' + "9" * 38 + "…",
        ),
    ],
)
def test_unsound_counts_are_zero_with_a_problem_never_an_exception(usage_json: str, problem: str) -> None:
    raw = f'{{"choices": [{{"message": {{"content": "ok"}}}}], "usage": {usage_json}}}'.encode()
    result = parse("openai", raw)
    assert result.text == "ok"  # the paid answer is still an answer
    assert result.usage == Usage(prompt_tokens=0, completion_tokens=7)
    assert result.usage_problem == problem


def test_every_count_read_is_checked_and_every_problem_named() -> None:
    usage = (
        '{"prompt_tokens": 100, "completion_tokens": -Infinity, "prompt_tokens_details": {"cached_tokens": -1}, '
        '"completion_tokens_details": {"reasoning_tokens": 2.5}}'
    )
    raw = f'{{"choices": [{{"message": {{"content": "ok"}}}}], "usage": {usage}}}'.encode()
    result = parse("openai", raw)
    assert result.usage == Usage(prompt_tokens=100)
    assert result.usage_problem == (
        "usage.prompt_tokens_details.cached_tokens is -1; usage.completion_tokens is -Infinity; "
        "usage.completion_tokens_details.reasoning_tokens is 2.5"
    )


@pytest.mark.parametrize("usage", [None, [], "12 tokens", 5])
def test_usage_that_is_not_an_object_is_no_usage(usage: Any) -> None:
    result = parse("vllm", completion(usage={}) | {"usage": usage})
    assert (result.usage, result.usage_problem) == (Usage(), "no usage in the answer")


def test_integral_floats_in_range_are_counts() -> None:
    usage = {
        "prompt_tokens": 1200.0,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1024.0},
        "completion_tokens_details": {"reasoning_tokens": 0.0},
    }
    result = parse("openai", completion(usage=usage))
    assert result.usage == Usage(1200, 1024, 300, 0)
    assert result.usage_problem is None
    assert type(result.usage.prompt_tokens) is int


def test_sound_usage_has_no_problem_and_absent_optional_counts_are_fine() -> None:
    result = parse("kimi", completion(usage={"prompt_tokens": 0, "completion_tokens": 9007199254740991}))
    assert result.usage == Usage(prompt_tokens=0, completion_tokens=2**53 - 1)
    assert result.usage_problem is None


def test_replay_body_parses_back_to_the_same_answer_with_sound_usage() -> None:
    call = ChatToolCall("c1", "read_steps", '{"start": 1}')
    original = parse(
        "deepseek",
        completion(
            content="answer \U0001f600",
            reasoning_content="thought",
            finish_reason="tool_calls",
            tool_calls=openai_tool_calls(("c1", "read_steps", '{"start": 1}')),
            usage={"prompt_tokens": 40, "completion_tokens": 5},
        ),
    )
    replayed = parse("deepseek", replay_body(original, get_preset("deepseek")))
    assert (replayed.text, replayed.reasoning_text, replayed.tool_calls) == (
        "answer \U0001f600",
        "thought",
        (call,),
    )
    assert replayed.usage == Usage(prompt_tokens=40, completion_tokens=5)
    assert replayed.usage_problem is None


def test_replay_body_of_an_engine_answer_with_a_lone_surrogate_is_utf8() -> None:
    engine = ChatResult(
        text="cut \ud800",
        reasoning_text="",
        finish_reason="tool_calls",
        usage=Usage(3, 0, 4, 0),
        latency_s=0.0,
        tool_calls=(ChatToolCall("c\ud800", "f", "{}"),),
    )
    replayed = parse("vllm", replay_body(engine, get_preset("vllm")))
    assert replayed.text == "cut \ufffd"
    assert replayed.tool_calls == (ChatToolCall("c\ufffd", "f", "{}"),)
    assert replayed.usage_problem is None
