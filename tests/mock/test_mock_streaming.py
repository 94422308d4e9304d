"""The simulator's streamed answers: server-sent events in each provider's chunk shape, timed as a model writes
them, adding up to exactly the unstreamed message, and the two faults that cut an answer off on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from rcarun.mock import MockConfig, MockServer, RequestLogEntry
from rcarun.mock.cli import build_parser, config_from_args

PostChat = Callable[..., Awaitable[Any]]
Body = Callable[..., dict[str, Any]]

FAST = MockConfig(latency_s=0.0, hang_s=0.05)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "minLength": 120},
        "root_step": {"type": "integer", "minimum": 0, "maximum": 9},
        "responsible_role": {"type": "string", "enum": ["Orchestrator", "WebSurfer"]},
    },
    "required": ["reason", "root_step", "responsible_role"],
}
LONG_SCHEMA: dict[str, Any] = {  # an answer of well over 400 tokens
    "type": "object",
    "properties": {"reason": {"type": "string", "minLength": 2400}},
    "required": ["reason"],
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_step",
            "parameters": {
                "type": "object",
                "properties": {"index": {"type": "integer", "minimum": 0}, "why": {"type": "string"}},
                "required": ["index", "why"],
            },
        },
    }
]
STREAM_USAGE = {"stream": True, "stream_options": {"include_usage": True}}
CHUNK_KEYS = ["id", "object", "created", "model", "choices"]
CHOICE_KEYS = ["index", "delta", "logprobs", "finish_reason"]


# ------------------------------------------------------------------------------------- a small SSE reader


@dataclass
class Event:
    at: float  # seconds since the request was sent
    text: bytes  # the event without its closing blank line: b"data: {...}", b"data: [DONE]", b": keep-alive"

    @property
    def chunk(self) -> dict[str, Any] | None:
        if not self.text.startswith(b"data: ") or self.text == b"data: [DONE]":
            return None
        value: dict[str, Any] = json.loads(self.text[len(b"data: ") :])
        return value


@dataclass
class StreamReply:
    status: int
    headers: Mapping[str, str]
    events: list[Event] = field(default_factory=list)
    reads: int = 0  # how many pieces the body arrived in
    error: BaseException | None = None  # what ended the read early, if anything
    ended_at: float = 0.0
    rest: bytes = b""  # bytes after the last complete event

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [chunk for event in self.events if (chunk := event.chunk) is not None]

    @property
    def choice_chunks(self) -> list[dict[str, Any]]:
        return [chunk for chunk in self.chunks if chunk["choices"]]

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1].text == b"data: [DONE]"

    def content_events(self) -> list[Event]:
        """Events carrying thinking, content or tool-call text."""
        found = []
        for event in self.events:
            chunk = event.chunk
            if chunk is None or not chunk["choices"]:
                continue
            delta = chunk["choices"][0]["delta"]
            if "role" not in delta and delta:
                found.append(event)
        return found

    def message(self) -> dict[str, Any]:
        """The deltas added up: content, thinking text per field, tool calls by index."""
        content: list[str] = []
        thinking: dict[str, list[str]] = {}
        calls: dict[int, dict[str, Any]] = {}
        for chunk in self.choice_chunks:
            delta = chunk["choices"][0]["delta"]
            for name, value in delta.items():
                if name == "content":
                    content.append(value)
                elif name in ("reasoning_content", "reasoning"):
                    thinking.setdefault(name, []).append(value)
                elif name == "tool_calls":
                    for call in value:
                        entry = calls.setdefault(call["index"], {"function": {"arguments": ""}})
                        for key in ("id", "type"):
                            if key in call:
                                entry[key] = call[key]
                        if "name" in call["function"]:
                            entry["function"]["name"] = call["function"]["name"]
                        entry["function"]["arguments"] += call["function"]["arguments"]
        message: dict[str, Any] = {"content": "".join(content)}
        message.update({name: "".join(parts) for name, parts in thinking.items()})
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": c["type"], "function": c["function"]}
                for _, c in sorted(calls.items())
            ]
        return message


async def read_stream(
    http: aiohttp.ClientSession,
    server: MockServer,
    body: Mapping[str, Any],
    *,
    timeout_s: float = 5.0,
    leave_after_content_events: int | None = None,
) -> StreamReply:
    """POST ``body`` and read the answer as server-sent events, noting when each event arrived.

    ``leave_after_content_events``: close the connection once that many text-carrying events have arrived.
    """
    started = time.monotonic()
    async with http.post(
        server.base_url + "/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as response:
        reply = StreamReply(response.status, dict(response.headers))
        buffer = b""
        try:
            async for piece in response.content.iter_any():
                now = time.monotonic() - started
                reply.reads += 1
                buffer += piece
                while b"\n\n" in buffer:
                    text, buffer = buffer.split(b"\n\n", 1)
                    reply.events.append(Event(now, text))
                if (
                    leave_after_content_events is not None
                    and len(reply.content_events()) >= leave_after_content_events
                ):
                    response.close()
                    break
        except aiohttp.ClientPayloadError as error:
            reply.error = error
        reply.rest = buffer
        reply.ended_at = time.monotonic() - started
    return reply


@pytest.fixture
def stream(http: aiohttp.ClientSession) -> Callable[..., Awaitable[StreamReply]]:
    async def run(server: MockServer, body: Mapping[str, Any], **options: Any) -> StreamReply:
        return await read_stream(http, server, body, **options)

    return run


Stream = Callable[..., Awaitable[StreamReply]]


def log_entries(server: MockServer) -> list[RequestLogEntry]:
    return [RequestLogEntry.from_dict(entry) for entry in server.request_log()["entries"]]


# ------------------------------------------------------------------------------------------ the shapes


async def test_chunks_are_openais_shape_with_a_usage_chunk_when_asked(
    stream: Stream, post_chat: PostChat, make_body: Body
) -> None:
    body = make_body("which step?", schema=SCHEMA, max_tokens=400, temperature=0)
    config = FAST.replace(rpm=600, request_log_size=10)
    async with MockServer(config) as plain_server:
        whole = await post_chat(plain_server, body)
    async with MockServer(config) as server:
        reply = await stream(server, {**body, **STREAM_USAGE})
        (entry,) = log_entries(server)

    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/event-stream")
    assert reply.headers["x-ratelimit-limit-requests"] == "600"
    assert reply.error is None and reply.rest == b"" and reply.done
    assert all(event.text.startswith(b"data: ") for event in reply.events)
    chunks = reply.chunks
    for event in reply.events[:-1]:  # compact JSON, as OpenAI writes it
        assert event.text[len(b"data: ") :].decode() == json.dumps(
            event.chunk, separators=(",", ":"), ensure_ascii=False
        )
    for chunk in chunks:
        assert list(chunk) == (CHUNK_KEYS if chunk["choices"] else [*CHUNK_KEYS, "usage"])
        assert (chunk["id"], chunk["object"], chunk["model"]) == (
            whole.body["id"],
            "chat.completion.chunk",
            "sim-model",
        )
        assert chunk["created"] == chunks[0]["created"]
    first, *middle, last_choice, usage_chunk = chunks
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    for chunk in middle:
        (choice,) = chunk["choices"]
        assert list(choice) == CHOICE_KEYS and choice["finish_reason"] is None and choice["logprobs"] is None
        assert list(choice["delta"]) == ["content"] and 1 <= len(choice["delta"]["content"]) <= 4
    assert last_choice["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole.body["usage"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle) == whole.content
    assert len(middle) == whole.body["usage"]["completion_tokens"]  # a token a chunk
    assert (entry.outcome, entry.status, entry.completion_id) == ("ok", 200, whole.body["id"])
    assert entry.completion_tokens_sent == whole.body["usage"]["completion_tokens"]


@pytest.mark.parametrize("options", [{}, {"stream_options": {"include_usage": False}}])
async def test_no_usage_chunk_unless_asked(stream: Stream, make_body: Body, options: dict[str, Any]) -> None:
    async with MockServer(FAST) as server:
        reply = await stream(server, make_body("hello", stream=True, **options))
    assert reply.done
    assert all(chunk["choices"] and "usage" not in chunk for chunk in reply.chunks)
    assert reply.chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("options", [{"stream": True}, STREAM_USAGE])
async def test_moonshot_puts_usage_in_the_last_choice_chunk_asked_or_not(
    stream: Stream, post_chat: PostChat, make_body: Body, options: dict[str, Any]
) -> None:
    config = FAST.replace(headers="moonshot", usage_style="deepseek", reasoning_tokens=6)
    body = make_body("which step?", schema=SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(config) as plain_server:
        whole = await post_chat(plain_server, body)
    async with MockServer(config) as server:
        reply = await stream(server, {**body, **options})
    assert reply.done and all(chunk["choices"] for chunk in reply.chunks)  # no usage chunk of its own
    last = reply.chunks[-1]["choices"][0]
    assert list(last) == [*CHOICE_KEYS, "usage"]
    assert last["delta"] == {} and last["finish_reason"] == "stop"
    assert last["usage"] == whole.body["usage"] and "prompt_cache_hit_tokens" in last["usage"]
    assert all("usage" not in chunk["choices"][0] for chunk in reply.chunks[:-1])


async def test_deepseek_usage_style_in_the_usage_chunk(
    stream: Stream, post_chat: PostChat, make_body: Body
) -> None:
    config = FAST.replace(headers="none", usage_style="deepseek")
    body = make_body("hello", temperature=0)
    async with MockServer(config) as plain_server:
        whole = await post_chat(plain_server, body)
    async with MockServer(config) as server:
        reply = await stream(server, {**body, **STREAM_USAGE})
    assert reply.chunks[-1]["usage"] == whole.body["usage"]
    assert reply.chunks[-1]["usage"]["prompt_cache_miss_tokens"] == whole.body["usage"]["prompt_tokens"]


async def test_tool_calls_stream_as_openais_tool_call_deltas(stream: Stream, make_body: Body) -> None:
    body = make_body("look it up", tools=TOOLS, tool_choice="required", seed=4, stream=True)
    async with MockServer(FAST) as server:
        reply = await stream(server, body)
    deltas = [chunk["choices"][0]["delta"] for chunk in reply.choice_chunks[1:-1]]
    assert deltas and all(list(delta) == ["tool_calls"] for delta in deltas)
    calls = [call for delta in deltas for call in delta["tool_calls"]]
    openings = [call for call in calls if "id" in call]
    assert openings and all(
        list(call) == ["index", "id", "type", "function"]
        and call["type"] == "function"
        and call["function"]["arguments"] == ""
        and call["function"]["name"] == "read_step"
        for call in openings
    )
    pieces = [call for call in calls if "id" not in call]
    assert pieces and all(list(call) == ["index", "function"] for call in pieces)
    assert all(list(call["function"]) == ["arguments"] for call in pieces)
    assert reply.chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


# -------------------------------------------------------------------------- the same message, streamed


ANSWER_KINDS: dict[str, tuple[MockConfig, dict[str, Any]]] = {
    "json schema": (FAST, {"schema": SCHEMA, "max_tokens": 400}),
    "plain text": (FAST, {}),
    "json object": (FAST, {"response_format": {"type": "json_object"}}),
    "tool calls": (FAST, {"tools": TOOLS, "tool_choice": "required", "seed": 7}),
    "tool calls with thinking": (
        FAST.replace(reasoning_tokens=9),
        {"tools": TOOLS, "tool_choice": "required", "seed": 8},
    ),
    "thinking (deepseek)": (FAST.replace(reasoning_tokens=25), {"schema": SCHEMA, "max_tokens": 400}),
    "thinking (vllm)": (FAST.replace(reasoning_tokens=25, reasoning_field="reasoning"), {"schema": SCHEMA}),
    "hidden thinking": (FAST.replace(reasoning_tokens=25, reasoning_field=None), {"schema": SCHEMA}),
    "length cut in the answer": (FAST.replace(reasoning_tokens=5), {"schema": SCHEMA, "max_tokens": 20}),
    "length cut in the thinking": (FAST.replace(reasoning_tokens=30), {"schema": SCHEMA, "max_tokens": 20}),
    "tool calls cut by the budget": (FAST, {"tools": TOOLS, "tool_choice": "required", "max_tokens": 3}),
    "length fault": (FAST.replace(length_rate=1.0), {"schema": SCHEMA, "max_tokens": 400}),
    "three tokens a chunk": (FAST.replace(tokens_per_chunk=3, chars_per_token=3.5), {"schema": SCHEMA}),
}


@pytest.mark.parametrize("kind", list(ANSWER_KINDS))
async def test_the_deltas_add_up_to_the_unstreamed_message(
    stream: Stream, post_chat: PostChat, make_body: Body, kind: str
) -> None:
    config, extra = ANSWER_KINDS[kind]
    body = make_body(f"case {kind}", temperature=0, **extra)
    async with MockServer(config.replace(request_log_size=5)) as plain_server:
        whole = await post_chat(plain_server, body)
        (plain_entry,) = log_entries(plain_server)
    async with MockServer(config.replace(request_log_size=5)) as server:
        reply = await stream(server, {**body, **STREAM_USAGE})
        (entry,) = log_entries(server)
    assert whole.status == reply.status == 200 and reply.done

    message, expected = reply.message(), whole.message
    assert message["content"] == (expected["content"] or "")
    for name in ("reasoning_content", "reasoning"):
        assert message.get(name) == (expected.get(name) or None)
    assert message.get("tool_calls") == expected.get("tool_calls")
    assert reply.chunks[-2]["choices"][0]["finish_reason"] == whole.body["choices"][0]["finish_reason"]
    assert reply.chunks[-1]["usage"] == whole.body["usage"]
    assert {chunk["id"] for chunk in reply.chunks} == {whole.body["id"]}
    chars_per_chunk = math.ceil(config.tokens_per_chunk * config.chars_per_token)
    assert all(
        len(text) <= chars_per_chunk
        for chunk in reply.choice_chunks
        for name, text in chunk["choices"][0]["delta"].items()
        if name in ("content", "reasoning_content", "reasoning")
    )
    assert (entry.outcome, entry.completion_tokens_sent) == (
        plain_entry.outcome,
        plain_entry.completion_tokens_sent,
    )
    assert entry.completion_tokens_sent == whole.body["usage"]["completion_tokens"]


# ------------------------------------------------------------------------------------- hostile answers


async def test_a_surrogate_answer_streams_its_lone_ud800_as_an_ascii_escape(
    stream: Stream, post_chat: PostChat, make_body: Body
) -> None:
    config = FAST.replace(surrogate_rate=1.0, request_log_size=5)
    body = make_body("which step?", schema=SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(config) as plain_server:
        whole = await post_chat(plain_server, body)
    async with MockServer(config) as server:
        reply = await stream(server, {**body, "stream": True})
        (entry,) = log_entries(server)
    assert all(event.text.isascii() for event in reply.events)
    assert any(b"\\ud800" in event.text for event in reply.events)
    assert reply.message()["content"] == whole.content and "\ud800" in whole.content
    assert (entry.outcome, entry.detail) == ("surrogate", "reason")


async def test_huge_step_and_bad_usage_reach_the_stream(stream: Stream, make_body: Body) -> None:
    async with MockServer(FAST.replace(huge_step_rate=1.0)) as server:
        huge = await stream(server, make_body("which step?", schema=SCHEMA, max_tokens=400, **STREAM_USAGE))
    assert json.loads(huge.message()["content"])["root_step"] == 10**26

    config = FAST.replace(bad_usage_rate=1.0, request_log_size=50, seed=5)
    async with MockServer(config) as server:
        replies = [await stream(server, make_body(f"case {i}", **STREAM_USAGE)) for i in range(12)]
        entries = log_entries(server)
    assert {entry.detail for entry in entries} == {"missing", "huge", "infinity", "negative"}
    for reply, entry in zip(replies, entries, strict=True):
        assert reply.done and entry.outcome == "bad_usage"
        usage_chunks = [chunk for chunk in reply.chunks if not chunk["choices"]]
        if entry.detail == "missing":
            assert usage_chunks == []
            continue
        (usage_chunk,) = usage_chunks
        usage = usage_chunk["usage"]
        if entry.detail == "huge":
            assert usage["prompt_tokens"] == 10**20
        elif entry.detail == "infinity":
            assert b'"prompt_tokens":Infinity' in reply.events[-2].text
        else:
            assert usage["prompt_tokens"] < 0 and usage["completion_tokens"] < 0
        assert entry.completion_tokens_sent is not None and entry.completion_tokens_sent > 0


# ------------------------------------------------------------------------------------------------ timing


async def test_tokens_arrive_one_by_one_and_the_stream_ends_when_the_body_would_have(
    stream: Stream, post_chat: PostChat, make_body: Body
) -> None:
    config = MockConfig(latency_s=0.05, latency_per_token_s=0.01)
    # Cut at 50 tokens: 0.05 + 50 x 0.01 = 0.55 s, whole or streamed (both at once, to keep the test short).
    body = make_body("explain", schema=LONG_SCHEMA, max_tokens=50, temperature=0)

    async def timed_whole() -> tuple[Any, float]:
        started = time.monotonic()
        whole = await post_chat(server, body)
        return whole, time.monotonic() - started

    async with MockServer(config) as server:
        (whole, whole_s), reply = await asyncio.gather(
            timed_whole(), stream(server, {**body, "stream": True})
        )
        running_after = server.metrics_text()
    assert whole.body["usage"]["completion_tokens"] == 50
    content = reply.content_events()
    assert len(content) == 50
    assert reply.events[0].at < 0.3  # the role chunk goes out at once
    assert content[0].at < 0.3  # the first token long before the end
    assert content[-1].at - content[0].at > 0.25  # ... and the others spread out behind it
    assert 0.45 < reply.events[-1].at < 1.5 and 0.45 < whole_s < 1.5
    assert "vllm:num_requests_running" in running_after and 'model_name="sim-model"} 0.0' in running_after


async def test_fast_tokens_are_written_in_batches_not_one_write_each(stream: Stream, make_body: Body) -> None:
    # 400 tokens at 0.5 ms: one write each would be 400 writes in 0.2 s; the 5-ms floor allows about 40.
    config = MockConfig(latency_s=0.0, latency_per_token_s=0.0005)
    async with MockServer(config) as server:
        reply = await stream(server, make_body("long", schema=LONG_SCHEMA, max_tokens=400, stream=True))
    assert len(reply.content_events()) == 400 and reply.done
    assert reply.reads <= 100
    assert 0.15 < reply.events[-1].at < 1.5


async def test_the_generation_and_its_slot_are_held_until_the_last_chunk(
    http: aiohttp.ClientSession, make_body: Body
) -> None:
    config = MockConfig(latency_s=0.0, latency_per_token_s=0.01, max_concurrency=1)
    async with MockServer(config) as server:
        task = asyncio.ensure_future(
            read_stream(http, server, make_body("long", schema=LONG_SCHEMA, max_tokens=40, stream=True))
        )
        await asyncio.sleep(0.15)  # mid-stream: 0.4 s in all
        during = server.metrics_text()
        async with http.post(server.base_url + "/chat/completions", json=make_body("me too")) as response:
            refused = response.status
        reply = await task
        after = server.metrics_text()
    assert "vllm:num_requests_running" in during and 'sim-model"} 1.0' in during.splitlines()[2]
    assert refused == 429 and reply.done
    assert 'sim-model"} 0.0' in after.splitlines()[2]


async def test_a_queued_stream_is_kept_alive_with_sse_comments(
    http: aiohttp.ClientSession, post_chat: PostChat, make_body: Body
) -> None:
    config = MockConfig(latency_s=0.3, max_concurrency=1, over_concurrency="queue", keepalive_s=0.05)
    async with MockServer(config) as server:
        first = asyncio.ensure_future(post_chat(server, make_body("first")))
        await asyncio.sleep(0.05)
        reply = await read_stream(http, server, make_body("second", **STREAM_USAGE))
        await first
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    comments = [event for event in reply.events if event.text.startswith(b":")]
    assert len(comments) >= 2 and all(event.text == b": keep-alive" for event in comments)
    assert reply.events[: len(comments)] == comments  # all before the first chunk
    assert reply.chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert reply.done and reply.chunks[-1]["usage"]["completion_tokens"] > 0
    assert 0.45 < reply.ended_at < 2.0  # its answer time ran from when the first one's slot came free


# ------------------------------------------------------------------------------------ clients that leave


async def test_a_client_leaving_mid_stream_frees_the_slot_and_is_logged(
    stream: Stream, post_chat: PostChat, make_body: Body
) -> None:
    config = MockConfig(latency_s=0.0, latency_per_token_s=0.02, max_concurrency=1, request_log_size=10)
    async with MockServer(config) as server:
        # 100 tokens: 2 s if read to the end; the client leaves after five.
        left = await stream(
            server,
            make_body("long", schema=LONG_SCHEMA, max_tokens=100, stream=True),
            leave_after_content_events=5,
        )
        for _ in range(100):  # the server notices at its next write, ~20 ms later
            entries = log_entries(server)
            if entries:
                break
            await asyncio.sleep(0.01)
        after = await post_chat(server, make_body("next"))
        (entry, next_entry) = log_entries(server)
    assert len(left.content_events()) >= 5 and not left.done
    assert entry.outcome == "client_left" and entry.status is None
    assert entry.completion_id == left.chunks[0]["id"]
    assert entry.completion_tokens_sent is not None and 5 <= entry.completion_tokens_sent < 100
    assert after.status == 200 and next_entry.outcome == "ok"  # the slot came back


# ------------------------------------------------------------------------------- answers cut on the wire


@pytest.mark.parametrize("kind", ["stream_stall", "stream_drop"])
async def test_a_stream_cut_off_stops_half_way_without_done_and_says_what_was_sent(
    stream: Stream, post_chat: PostChat, make_body: Body, kind: str
) -> None:
    body = make_body("which step?", schema=SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(FAST) as plain_server:
        whole = await post_chat(plain_server, body)
    config = FAST.replace(hang_s=0.3, request_log_size=10, rpm=600, **{f"{kind}_rate": 1.0})
    async with MockServer(config) as server:
        reply = await stream(server, {**body, **STREAM_USAGE})
        stats = server.stats()
        (entry,) = log_entries(server)
    tokens = whole.body["usage"]["completion_tokens"]
    sent = len(reply.content_events())
    assert reply.status == 200 and not reply.done and reply.error is not None
    assert sent == tokens // 2  # about half of its chunks, a token each
    assert whole.content.startswith(reply.message()["content"])
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in reply.chunks)
    if kind == "stream_stall":
        assert reply.ended_at >= 0.25  # held silent for hang_s, then dropped
    else:
        assert reply.ended_at < 0.25
    assert (entry.outcome, entry.status, entry.completion_id) == (kind, 200, reply.chunks[0]["id"])
    assert entry.completion_tokens_sent == sent
    # Charged like an answer: the provider generated it all.
    assert stats.faults[kind] == 1 and stats.accepted == 1 and stats.accepted_completion_tokens == tokens


@pytest.mark.parametrize("kind", ["stream_stall", "stream_drop"])
async def test_an_unstreamed_body_cut_off_sends_its_first_half(
    http: aiohttp.ClientSession, post_chat: PostChat, make_body: Body, kind: str
) -> None:
    body = make_body("which step?", schema=SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(FAST) as plain_server:
        whole = await post_chat(plain_server, body)
    config = FAST.replace(hang_s=0.3, request_log_size=10, **{f"{kind}_rate": 1.0})
    async with MockServer(config) as server:
        started = time.monotonic()
        received = b""
        async with http.post(server.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200
            assert int(response.headers["Content-Length"]) == len(whole.raw)
            with pytest.raises(aiohttp.ClientPayloadError):
                async for piece in response.content.iter_any():
                    received += piece
        ended_s = time.monotonic() - started
        (entry,) = log_entries(server)
    assert len(received) == len(whole.raw) // 2 and received.startswith(b'{"id": "chatcmpl-mock')
    assert (ended_s >= 0.25) if kind == "stream_stall" else (ended_s < 0.25)
    assert (entry.outcome, entry.status, entry.completion_tokens_sent) == (kind, 200, 0)


async def test_the_cut_kinds_never_move_the_earlier_faults_of_a_seed(
    post_chat: PostChat, make_body: Body
) -> None:
    original = FAST.replace(
        error_500_rate=0.15, malformed_rate=0.1, bad_usage_rate=0.1, seed=9, request_log_size=100, hang_s=0.01
    )

    async def outcomes(config: MockConfig) -> list[str]:
        async with MockServer(config) as server:
            for index in range(40):
                with contextlib.suppress(aiohttp.ClientPayloadError):  # a body cut in half
                    await post_chat(server, make_body(f"q{index}", schema=SCHEMA, max_tokens=400))
            return [entry.outcome for entry in log_entries(server)]

    before = await outcomes(original)
    with_cuts = await outcomes(original.replace(stream_stall_rate=0.15, stream_drop_rate=0.15))
    assert {"stream_stall", "stream_drop"} <= set(with_cuts)
    for old, new in zip(before, with_cuts, strict=True):
        assert new == old if old != "ok" else new in {"ok", "stream_stall", "stream_drop"}


# ------------------------------------------------------------------------------- refusals and validation


async def test_refuse_stream_is_a_400_naming_stream_and_unstreamed_requests_are_served(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(refuse_stream=True, request_log_size=10)) as server:
        refused = await post_chat(server, make_body("hello", **STREAM_USAGE))
        served = await post_chat(server, make_body("hello", stream=False))
        entries = log_entries(server)
        stats = server.stats()
    assert refused.status == 400
    assert refused.body == {
        "error": {
            "message": "stream is not supported by this server",
            "type": "invalid_request_error",
            "param": "stream",
            "code": None,
        }
    }
    assert served.status == 200 and served.headers["Content-Type"].startswith("application/json")
    assert served.body["object"] == "chat.completion"
    assert [entry.outcome for entry in entries] == ["stream_refused", "ok"]
    assert stats.errors_4xx == 1 and stats.accepted == 1


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": "true"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream": True, "stream_options": ["include_usage"]}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ],
)
async def test_stream_fields_are_validated(
    post_chat: PostChat, make_body: Body, extra: dict[str, Any], param: str
) -> None:
    async with MockServer(FAST) as server:
        reply = await post_chat(server, make_body("hello", **extra))
    assert reply.status == 400
    assert reply.body["error"]["param"] == param and param.split(".")[0] in reply.body["error"]["message"]


async def test_stream_false_is_the_plain_json_body(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(FAST.replace(request_log_size=5)) as server:
        reply = await post_chat(
            server, make_body("hello", stream=False, stream_options={"include_usage": True})
        )
        (entry,) = log_entries(server)
    assert reply.status == 200 and reply.body["object"] == "chat.completion"
    assert entry.completion_tokens_sent == reply.body["usage"]["completion_tokens"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokens_per_chunk": 0}, "tokens_per_chunk must be a positive integer"),
        ({"tokens_per_chunk": True}, "tokens_per_chunk must be a positive integer"),
        ({"refuse_stream": "yes"}, "refuse_stream must be true or false"),
        ({"stream_stall_rate": 1.5}, "stream_stall_rate must be within"),
        ({"stream_drop_rate": 0.6, "error_500_rate": 0.5}, "fault rates sum to 1.100"),
    ],
)
def test_stream_knobs_are_validated(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MockConfig(**changes)


def test_stream_knobs_have_command_line_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            *("--stream-stall-rate", "0.02", "--stream-drop-rate", "0.03"),
            *("--tokens-per-chunk", "4", "--refuse-stream"),
        ]
    )
    config = config_from_args(args)
    assert (config.stream_stall_rate, config.stream_drop_rate) == (0.02, 0.03)
    assert (config.tokens_per_chunk, config.refuse_stream) == (4, True)
    assert MockConfig.from_json(config.to_json()) == config
    defaults = config_from_args(parser.parse_args([]))
    assert (defaults.tokens_per_chunk, defaults.refuse_stream) == (1, False)
