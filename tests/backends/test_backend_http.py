"""The backend over real loopback HTTP, once per transport: same results, same errors, no leaked key.

Every test here takes the ``transport_name`` fixture, so aiohttp and the openai SDK run the same suite; the
tests that compare transports directly check that they produce identical `ChatResult`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from rcarun.backends import (
    BackendSettings,
    CallProgress,
    ChatMessage,
    ChatRequest,
    ChatResult,
    ChatToolCall,
    OpenAICompatBackend,
    RateLimitInfo,
    Usage,
    build_body,
    create_backend,
    get_preset,
)
from rcarun.errors import (
    AuthError,
    CallDeadline,
    CallError,
    ConfigError,
    ConnectionFailed,
    ContextOverflow,
    MalformedResponse,
    QuotaExhausted,
    RateLimited,
    ResponseTooLarge,
    ServerError,
    SilenceTimeout,
    TransportError,
)
from rcarun.mock import MockConfig, MockServer

from .helpers import KEY_ENV, PLANTED_KEY, CannedServer, Handler, completion, reply, settings_for

Canned = Callable[[Handler], Awaitable[CannedServer]]

SCHEMA = {
    "type": "object",
    "properties": {"role": {"type": "string", "enum": ["Planner", "Coder"]}, "step": {"type": "integer"}},
    "required": ["role", "step"],
}


def chat_request(**overrides: Any) -> ChatRequest:
    values: dict[str, Any] = {
        "messages": (
            ChatMessage("system", "You attribute failures."),
            ChatMessage("user", "Step 0: Planner ..."),
        ),
        "max_tokens": 256,
        "temperature": 0.0,
        "schema": SCHEMA,
    }
    values.update(overrides)
    return ChatRequest(**values)


async def call_once(settings: BackendSettings, request: ChatRequest | None = None) -> ChatResult:
    backend = create_backend(settings)
    try:
        return await backend.chat(request or chat_request())
    finally:
        await backend.aclose()


async def failure(settings: BackendSettings, request: ChatRequest | None = None) -> CallError:
    with pytest.raises(CallError) as caught:
        await call_once(settings, request)
    return caught.value


# ------------------------------------------------------------------------------- canned provider answers

KIMI_HEADERS = {"X-RateLimit-Limit": "200", "X-RateLimit-Remaining": "199", "X-RateLimit-Reset": "30s"}


async def test_canned_completion_parsed_identically(canned: Canned, transport_name: str) -> None:
    usage = {
        "prompt_tokens": 321,
        "completion_tokens": 55,
        "cached_tokens": 256,
        "completion_tokens_details": {"reasoning_tokens": 40},
    }
    payload = completion(content='{"role": "Coder", "step": 3}', reasoning_content="look at 3", usage=usage)
    raw = json.dumps(payload).encode()
    server = await canned(reply(raw, headers=KIMI_HEADERS))
    result = await call_once(settings_for(server.base_url, provider="kimi", transport=transport_name))
    assert result.text == '{"role": "Coder", "step": 3}'
    assert result.reasoning_text == "look at 3"
    assert result.finish_reason == "stop"
    assert result.usage == Usage(
        prompt_tokens=321, cached_prompt_tokens=256, completion_tokens=55, reasoning_tokens=40
    )
    assert result.rate_limit == RateLimitInfo(
        limit_requests=200, remaining_requests=199, reset_requests_s=30.0
    )
    assert result.model == "canned-model"
    assert result.raw_body == raw
    assert result.endpoint == server.base_url
    assert result.latency_s > 0


async def test_both_transports_send_the_same_body_and_get_the_same_result(
    canned: Canned, planted_key: str
) -> None:
    payload = completion(content="", finish_reason="length", reasoning="ran out while thinking")
    server = await canned(reply(payload, headers={"x-ratelimit-remaining-tokens": "10"}))
    request = chat_request(reasoning="off", seed=5)
    results: list[ChatResult] = []
    for transport in ("aiohttp", "openai-sdk"):
        settings = settings_for(
            server.base_url,
            provider="vllm",
            transport=transport,
            api_key_env=KEY_ENV,
            extra_body={"top_k": 20, "chat_template_kwargs": {"preserve_thinking": False}},
            extra_headers={"X-Run": "r1"},
        )
        results.append(await call_once(settings, request))
        expected_body = build_body(request, settings, get_preset("vllm"), stream=True)
        assert server.seen[-1].body == expected_body
        assert server.seen[-1].headers["Authorization"] == f"Bearer {planted_key}"
        assert server.seen[-1].headers.get("X-Run") == "r1", transport
    assert server.seen[0].body["chat_template_kwargs"] == {
        "preserve_thinking": False,
        "enable_thinking": False,
    }
    first, second = (dataclasses.replace(result, latency_s=0.0) for result in results)
    assert first == second
    assert (first.finish_reason, first.text, first.reasoning_text) == ("length", "", "ran out while thinking")


async def test_tool_calls_travel_identically_over_both_transports(canned: Canned) -> None:
    tools = (
        {
            "type": "function",
            "function": {"name": "list_roles", "parameters": {"type": "object", "properties": {}}},
        },
    )
    wire_calls = [{"id": "call_9", "type": "function", "function": {"name": "list_roles", "arguments": "{}"}}]
    server = await canned(reply(completion(content=None, finish_reason="tool_calls", tool_calls=wire_calls)))
    earlier = ChatToolCall("call_1", "list_roles", "{}")
    request = chat_request(
        messages=(
            ChatMessage("user", "who failed?"),
            ChatMessage("assistant", "", tool_calls=(earlier,)),
            ChatMessage("tool", "Planner, Coder", tool_call_id="call_1"),
        ),
        tools=tools,
        tool_choice="auto",
    )
    results: list[ChatResult] = []
    for transport in ("aiohttp", "openai-sdk"):
        settings = settings_for(server.base_url, provider="vllm", transport=transport)
        results.append(await call_once(settings, request))
        assert server.seen[-1].body == build_body(request, settings, get_preset("vllm"), stream=True), (
            transport
        )
    assert server.seen[-1].body["messages"][1]["content"] is None
    assert server.seen[-1].body["tools"] == list(tools)
    first, second = (dataclasses.replace(result, latency_s=0.0) for result in results)
    assert first == second
    assert first.tool_calls == (ChatToolCall("call_9", "list_roles", "{}"),)
    assert (first.text, first.finish_reason) == ("", "tool_calls")


async def test_no_key_configured_sends_no_authorization(
    canned: Canned, transport_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK would otherwise fall back to OPENAI_API_KEY and hand an OpenAI key to a self-hosted server.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-" + "openai-should-not-travel")
    server = await canned(reply(completion()))
    await call_once(settings_for(server.base_url, provider="vllm", transport=transport_name))
    assert "Authorization" not in server.seen[0].headers


async def test_leading_blank_lines_from_a_queued_request(canned: Canned, transport_name: str) -> None:
    body = json.dumps(completion(content="A", usage={"prompt_tokens": 9, "completion_tokens": 1})).encode()

    async def queued(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for _ in range(5):
            await response.write(b"\n")
        await response.write(body)
        await response.write_eof()
        return response

    server = await canned(queued)
    result = await call_once(settings_for(server.base_url, provider="deepseek", transport=transport_name))
    assert (result.text, result.usage.prompt_tokens) == ("A", 9)
    assert result.raw_body == b"\n" * 5 + body


@pytest.mark.parametrize(
    ("provider", "status", "payload", "headers", "error_class"),
    [
        (
            "kimi",
            503,
            {"error": {"message": "overloaded", "type": "engine_overloaded_error"}},
            {},
            RateLimited,
        ),
        ("simulated", 503, {"error": {"message": "overloaded"}}, {}, ServerError),
        ("openai", 429, {"error": {"message": "slow down"}}, {"retry-after-ms": "250"}, RateLimited),
        (
            "vllm",
            400,
            {"object": "error", "message": "maximum context length is 4096 tokens"},
            {},
            ContextOverflow,
        ),
        ("deepseek", 402, {"error": {"message": "Insufficient Balance"}}, {}, QuotaExhausted),
        ("openai", 403, {"error": {"message": "model not allowed"}}, {}, AuthError),
    ],
)
async def test_canned_errors(
    canned: Canned,
    transport_name: str,
    provider: str,
    status: int,
    payload: dict[str, Any],
    headers: dict[str, str],
    error_class: type[CallError],
) -> None:
    server = await canned(reply(payload, status=status, headers=headers))
    error = await failure(settings_for(server.base_url, provider=provider, transport=transport_name))
    assert type(error) is error_class
    assert error.status == status
    assert str(error).startswith(f"test-{provider}: HTTP {status}")
    if isinstance(error, RateLimited) and headers:
        assert error.retry_after_s == 0.25


# ------------------------------------------------------------------------------------------- the simulator


def mock_settings(
    server: MockServer, transport: str, provider: str = "simulated", **overrides: Any
) -> BackendSettings:
    return settings_for(server.base_url, provider=provider, transport=transport, **overrides)


async def test_simulator_answer_usage_and_reasoning(transport_name: str) -> None:
    config = MockConfig(latency_s=0.0, reasoning_tokens=12, usage_style="deepseek")
    async with MockServer(config, host="127.0.0.1", port=0) as server:
        backend = create_backend(mock_settings(server, transport_name, provider="deepseek"))
        try:
            first = await backend.chat(chat_request())
            second = await backend.chat(chat_request())  # same system prompt: a simulated cache hit
        finally:
            await backend.aclose()
    # DeepSeek gets JSON mode (no schema-constrained output there): a JSON object, schema stated in the prompt.
    assert isinstance(json.loads(first.text), dict)
    assert first.finish_reason == "stop"
    assert first.reasoning_text != ""
    assert first.usage.reasoning_tokens == 12
    assert first.usage.completion_tokens > 12
    assert first.usage.prompt_tokens > 0 and first.usage.cached_prompt_tokens == 0
    assert 0 < second.usage.cached_prompt_tokens < second.usage.prompt_tokens
    assert second.text == first.text  # temperature 0: the simulator answers the same request the same way


async def test_simulator_results_identical_across_transports() -> None:
    config = MockConfig(latency_s=0.0, reasoning_tokens=3, headers="openai", rpm=6000)
    results = []
    for transport in ("aiohttp", "openai-sdk"):  # a fresh server each: same ids, same cache state
        async with MockServer(config, host="127.0.0.1", port=0) as server:
            result = await call_once(mock_settings(server, transport))
            assert result.streamed and result.ttft_s is not None and result.ttft_s > 0
            results.append(
                dataclasses.replace(
                    result, latency_s=0.0, raw_body=b"", endpoint="", ttft_s=None, decode_tokens_per_s=None
                )
            )
    assert results[0].rate_limit is not None and results[0].rate_limit.limit_requests == 6000
    assert results[0] == results[1]
    answer = json.loads(results[0].text)  # json_schema response_format: the simulator follows the schema
    assert answer["role"] in ("Planner", "Coder") and isinstance(answer["step"], int)


async def test_simulator_length_stop_with_empty_content(transport_name: str) -> None:
    config = MockConfig(latency_s=0.0, reasoning_tokens=100, reasoning_field="reasoning")
    async with MockServer(config, host="127.0.0.1", port=0) as server:
        result = await call_once(
            mock_settings(server, transport_name, provider="vllm"), chat_request(max_tokens=16)
        )
    assert (result.finish_reason, result.text) == ("length", "")
    assert result.reasoning_text != ""
    assert result.usage.completion_tokens == 16 and result.usage.reasoning_tokens == 16


async def test_simulator_queue_mode_blank_lines(transport_name: str) -> None:
    config = MockConfig(latency_s=0.15, max_concurrency=1, over_concurrency="queue", keepalive_s=0.01)
    async with MockServer(config, host="127.0.0.1", port=0) as server:
        backend = create_backend(mock_settings(server, transport_name, provider="deepseek", stream=False))
        try:
            results = await asyncio.gather(*(backend.chat(chat_request()) for _ in range(3)))
        finally:
            await backend.aclose()
    assert [result.finish_reason for result in results] == ["stop"] * 3
    queued = [result for result in results if result.raw_body.startswith(b"\n")]
    assert queued, "at least one request waited in the queue behind blank lines"
    assert all(isinstance(json.loads(result.text), dict) for result in results)


async def test_simulator_queue_mode_keep_alive_comments_while_streaming(transport_name: str) -> None:
    # DeepSeek writes ": keep-alive" comments while a streamed request is queued: the answer still adds up.
    config = MockConfig(latency_s=0.15, max_concurrency=1, over_concurrency="queue", keepalive_s=0.01)
    async with MockServer(config, host="127.0.0.1", port=0) as server:
        backend = create_backend(mock_settings(server, transport_name, provider="deepseek"))
        try:
            results = await asyncio.gather(*(backend.chat(chat_request()) for _ in range(3)))
        finally:
            await backend.aclose()
    assert [(result.finish_reason, result.streamed) for result in results] == [("stop", True)] * 3
    assert all(isinstance(json.loads(result.text), dict) for result in results)
    # Queued behind one another, the last waited two answers' time for its first token.
    assert max(result.ttft_s or 0.0 for result in results) >= 0.25


@pytest.mark.parametrize(
    ("config", "provider", "error_class", "status"),
    [
        (MockConfig(error_500_rate=1.0), "simulated", ServerError, 500),
        (MockConfig(error_503_rate=1.0), "simulated", ServerError, 503),
        (MockConfig(error_503_rate=1.0), "kimi", RateLimited, 503),
        (MockConfig(malformed_rate=1.0), "simulated", MalformedResponse, 200),
        (MockConfig(quota_exhausted=True), "openai", QuotaExhausted, 429),
        (MockConfig(context_window=64), "vllm", ContextOverflow, 400),
        (MockConfig(api_key="sk-the-right-one"), "simulated", AuthError, 401),
        (MockConfig(reset_rate=1.0), "simulated", TransportError, None),
    ],
)
async def test_simulator_faults(
    transport_name: str, config: MockConfig, provider: str, error_class: type[CallError], status: int | None
) -> None:
    async with MockServer(dataclasses.replace(config, latency_s=0.0), host="127.0.0.1", port=0) as server:
        backend = create_backend(mock_settings(server, transport_name, provider=provider))
        try:
            for _ in range(3):  # the malformed fault has several variants: each must be caught
                with pytest.raises(CallError) as caught:
                    await backend.chat(chat_request())
                assert type(caught.value) is error_class
                assert caught.value.status == status
                assert "test-" + provider in str(caught.value)
        finally:
            await backend.aclose()


async def test_simulator_rate_limit_with_headers(transport_name: str) -> None:
    config = MockConfig(latency_s=0.0, rpm=60, burst_s=1.0, headers="openai")
    async with MockServer(config, host="127.0.0.1", port=0) as server:
        backend = create_backend(mock_settings(server, transport_name, provider="openai"))
        try:
            first = await backend.chat(chat_request())
            with pytest.raises(RateLimited) as caught:
                await backend.chat(chat_request())
        finally:
            await backend.aclose()
    assert first.rate_limit is not None and first.rate_limit.limit_requests == 60
    assert caught.value.status == 429
    assert caught.value.retry_after_s is not None and caught.value.retry_after_s > 0
    assert caught.value.reset_s is not None and caught.value.reset_s > 0


async def test_timeout_is_a_transport_error(transport_name: str) -> None:
    config = MockConfig(latency_s=0.0, timeout_rate=1.0, hang_s=30.0)
    async with MockServer(config, host="127.0.0.1", port=0) as server:
        error = await failure(mock_settings(server, transport_name, timeout_s=0.3))
    assert type(error) is SilenceTimeout and isinstance(error, TransportError)
    assert error.status is None
    assert "nothing arrived for timeout_s = 0.3 s before an answer" in str(error)
    assert "test-simulated" in str(error)


async def test_refused_connection_is_a_connection_failure(transport_name: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = await failure(settings_for(f"http://127.0.0.1:{port}/v1", transport=transport_name))
    # A transport error (retried), and one that says nothing was sent: the runner stops a backbone that keeps
    # meeting it.
    assert type(error) is ConnectionFailed and isinstance(error, TransportError)


# ------------------------------------------------------------------------------------------------- secrets


def exception_texts(error: BaseException) -> list[str]:
    texts: list[str] = []
    seen: BaseException | None = error
    while seen is not None:
        texts += [str(seen), repr(seen), *(str(arg) for arg in seen.args)]
        seen = seen.__cause__ or seen.__context__
    return texts


async def test_planted_key_reaches_the_server_and_nothing_else(
    canned: Canned, transport_name: str, planted_key: str
) -> None:
    async def echo_key(request: web.Request) -> web.StreamResponse:
        # Some providers quote the key they were given; the backend must not pass it on.
        sent = request.headers.get("Authorization", "")
        return web.json_response({"error": {"message": f"Incorrect API key provided: {sent}"}}, status=401)

    server = await canned(echo_key)
    settings = settings_for(server.base_url, transport=transport_name, api_key_env=KEY_ENV)
    backend = create_backend(settings)
    try:
        with pytest.raises(AuthError) as caught:
            await backend.chat(chat_request())
        texts = [*exception_texts(caught.value), repr(backend), str(backend), repr(settings)]
        texts.append(repr(backend._transport))  # type: ignore[attr-defined]
    finally:
        await backend.aclose()
    assert server.seen[0].headers["Authorization"] == f"Bearer {planted_key}"
    assert "***" in str(caught.value)
    assert not [text for text in texts if planted_key in text]

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = await failure(
        settings_for(f"http://127.0.0.1:{port}/v1", transport=transport_name, api_key_env=KEY_ENV)
    )
    assert not [text for text in exception_texts(refused) if planted_key in text]


def test_key_variable_unset_is_a_config_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=KEY_ENV):
        create_backend(settings_for("http://127.0.0.1:9/v1", api_key_env=KEY_ENV))


@pytest.mark.parametrize(
    ("field", "value"), [("provider", "nope"), ("transport", "carrier-pigeon"), ("backend", "quantum")]
)
def test_unknown_names_are_config_errors(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=value):
        create_backend(settings_for("http://127.0.0.1:9/v1", **{field: value}))


def test_create_backend_picks_openai_compat_by_registry() -> None:
    backend = create_backend(settings_for("http://127.0.0.1:9/v1", provider="vllm"))
    assert isinstance(backend, OpenAICompatBackend)
    assert backend.name == "test-vllm" and backend.preset.name == "vllm"
    assert "PLANTED" not in repr(backend) and PLANTED_KEY not in repr(backend)


# ----------------------------------------------------------------------------------- long and endless answers


@pytest.mark.parametrize("code", [200, 500])
async def test_an_endless_body_is_refused_at_the_size_cap(
    canned: Canned, transport_name: str, code: int
) -> None:
    # An error answer too (the openai SDK reads an error's whole body itself: its response hook caps it).
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=code, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(10_000):  # 640 MB, if nobody stopped reading
                await response.write(b"x" * 65_536)
        return response

    server = await canned(endless)
    settings = settings_for(server.base_url, transport=transport_name, max_response_bytes=2**20)
    error = await failure(settings)
    assert type(error) is ResponseTooLarge
    assert "max_response_mb = 1 MiB" in str(error)


async def test_the_call_deadline_cuts_an_answer_that_keeps_arriving(
    canned: Canned, transport_name: str
) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            while True:  # a token every 20 ms, for ever: never silent, never done
                await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
                await asyncio.sleep(0.02)
        return response

    server = await canned(trickle)
    progress = CallProgress()
    backend = create_backend(
        settings_for(server.base_url, transport=transport_name, timeout_s=0.2, max_call_s=0.5)
    )
    try:
        with pytest.raises(CallDeadline) as caught:
            await backend.chat(chat_request(), progress)
    finally:
        await backend.aclose()
    assert "max_call_s = 0.5 s" in str(caught.value)
    # What arrived is kept for the runner to store and charge.
    assert progress.streamed and progress.tokens >= 10
    partial = json.loads(progress.partial_body() or b"{}")
    assert partial["choices"][0]["message"]["content"] == "a" * progress.tokens
