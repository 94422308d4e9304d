"""The simulator over real HTTP on loopback: answers, limits, concurrency, faults, length, usage, errors."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from rcarun.mock import MockConfig, MockServer
from rcarun.mock.limits import FifoSlots

# conftest.py fixtures: post_chat(server, body, headers=None, timeout_s=10) -> ChatReply; make_body(...).
PostChat = Callable[..., Awaitable[Any]]
Body = Callable[..., dict[str, Any]]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "agent": {"type": "string", "enum": ["Orchestrator", "WebSurfer"]},
        "step": {"type": "integer", "minimum": 0, "maximum": 5},
        "reason": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 5}, "maxItems": 2},
    },
    "required": ["agent", "step", "reason", "steps"],
}

FAST = MockConfig(latency_s=0.0)


def assert_schema_answer(answer: Any) -> None:
    assert answer["agent"] in ("Orchestrator", "WebSurfer")
    assert isinstance(answer["step"], int) and 0 <= answer["step"] <= 5
    assert isinstance(answer["reason"], str) and answer["reason"]
    assert len(answer["steps"]) <= 2 and all(0 <= s <= 5 for s in answer["steps"])


# --------------------------------------------------------------------------------------------------- answers


async def test_answers_follow_the_response_format_schema_in_the_openai_shape(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(reasoning_tokens=3)) as server:
        for index in range(20):
            reply = await post_chat(server, make_body(f"case {index}", schema=SCHEMA, max_tokens=500))
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("application/json")
            body = reply.body
            assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
            assert isinstance(body["created"], int) and body["model"] == "sim-model"
            choice = body["choices"][0]
            assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
            assert_schema_answer(json.loads(choice["message"]["content"]))
            assert len(choice["message"]["reasoning_content"]) == 12  # 3 tokens of 4 characters
            usage = body["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            assert usage["completion_tokens"] == 3 + math.ceil(len(choice["message"]["content"]) / 4)


async def test_answers_follow_the_schema_stated_in_the_prompt(post_chat: PostChat, make_body: Body) -> None:
    prompt = (
        "Find the decisive error.\nAnswer as JSON with this schema:\n```json\n" + json.dumps(SCHEMA) + "\n```"
    )
    async with MockServer(FAST) as server:
        for index in range(10):
            reply = await post_chat(server, make_body(prompt, temperature=0.7, seed=index))
            assert_schema_answer(json.loads(reply.content))
        plain = await post_chat(server, make_body("Say something."))
        assert plain.status == 200 and plain.content.endswith(".") and not plain.content.startswith("{")


async def test_temperature_zero_repeats_and_sampling_varies_reproducibly(
    post_chat: PostChat, make_body: Body
) -> None:
    async def answers(config: MockConfig, temperature: float | None) -> list[str]:
        async with MockServer(config) as server:
            replies = [
                await post_chat(server, make_body(schema=SCHEMA, temperature=temperature)) for _ in range(6)
            ]
        return [reply.content for reply in replies]

    greedy = await answers(FAST, 0)
    assert len(set(greedy)) == 1
    sampled = await answers(FAST, None)
    assert len(set(sampled)) > 1
    assert await answers(FAST, None) == sampled  # same server seed, same realizations
    assert await answers(FAST.replace(seed=1), None) != sampled


# ---------------------------------------------------------------------------------------------------- limits


async def test_a_burst_beyond_the_rpm_bucket_gets_429_with_retry_after_and_headers(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(rpm=120)) as server:  # bucket of 2 requests, refilled at 2/s
        replies = await asyncio.gather(*(post_chat(server, make_body()) for _ in range(6)))
        assert sorted(r.status for r in replies) == [200, 200, 429, 429, 429, 429]
        for reply in replies:
            assert reply.headers["x-ratelimit-limit-requests"] == "120"
            assert reply.headers["x-ratelimit-remaining-requests"] in ("0", "1")
            assert reply.headers["x-ratelimit-reset-requests"].endswith("s")
        rejected = next(r for r in replies if r.status == 429)
        assert int(rejected.headers["Retry-After"]) >= 1 and int(rejected.headers["retry-after-ms"]) > 0
        assert rejected.body["error"]["type"] == "requests"
        assert rejected.body["error"]["code"] == "rate_limit_exceeded"
        stats = server.stats()
        assert stats.requests_total == 6 and stats.accepted == 2
        assert stats.rejected_429 == 4 and stats.rejected_by["rpm"] == 4
        assert stats.max_requests_1s == 2 and stats.accepted_per_second == (2,)
        assert stats.overshoot_requests == pytest.approx(4.0, abs=0.1)


async def test_overshoot_is_zero_for_a_paced_client_and_positive_for_a_flood(
    post_chat: PostChat, make_body: Body
) -> None:
    # 50 requests/s with a burst of 10; the paced client sends at most 25/s.
    async with MockServer(FAST.replace(rps=50, burst_s=0.2)) as server:
        for _ in range(15):
            assert (await post_chat(server, make_body())).status == 200
            await asyncio.sleep(0.04)
        paced = server.stats()
        assert paced.overshoot_requests == 0.0 and paced.rejected_429 == 0 and paced.accepted == 15

        server.reset()
        flood = await asyncio.gather(*(post_chat(server, make_body()) for _ in range(40)))
        stats = server.stats()
        assert stats.rejected_429 == sum(r.status == 429 for r in flood) > 0
        assert stats.overshoot_requests > 0
        assert stats.overshoot_by_limit.keys() == {"rps"}


async def test_tokens_per_minute_limit_with_moonshot_headers(post_chat: PostChat, make_body: Body) -> None:
    config = FAST.replace(tpm=6_000, headers="moonshot")  # 100 tokens per second, bucket of 100
    async with MockServer(config) as server:
        first = await post_chat(server, make_body("x" * 240))  # ~80 prompt tokens
        assert first.status == 200
        assert first.headers["X-RateLimit-Limit-Tokens"] == "6000"
        assert int(first.headers["X-RateLimit-Remaining-Tokens"]) < 100
        assert "x-ratelimit-limit-tokens" not in {k.lower() for k in first.headers if k.islower()}
        second = await post_chat(server, make_body("x" * 240))
        assert second.status == 429 and second.body["error"]["type"] == "rate_limit_reached_error"
        assert int(second.headers["Retry-After"]) >= 1
        too_large = await post_chat(server, make_body("x" * 30_000))
        assert too_large.status == 429 and "Request too large" in too_large.body["error"]["message"]
        stats = server.stats()
        assert stats.rejected_by["tpm"] == 2 and stats.overshoot_tokens > 0


async def test_deepseek_style_sends_no_rate_limit_headers(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(FAST.replace(rpm=60, headers="none")) as server:
        ok, rejected = await post_chat(server, make_body()), await post_chat(server, make_body())
        assert (ok.status, rejected.status) == (200, 429)
        for reply in (ok, rejected):
            assert not [name for name in reply.headers if "ratelimit" in name.lower()]
        assert rejected.headers["Retry-After"] == "1"


# ----------------------------------------------------------------------------------------------- concurrency


async def test_concurrency_cap_rejects_extra_requests_in_429_mode(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(MockConfig(latency_s=0.3, max_concurrency=2)) as server:
        replies = await asyncio.gather(*(post_chat(server, make_body()) for _ in range(5)))
        assert sorted(r.status for r in replies) == [200, 200, 429, 429, 429]
        stats = server.stats()
        assert stats.rejected_by["concurrency"] == 3 and stats.max_generating == 2 and stats.accepted == 2


async def test_queue_mode_keeps_waiters_alive_with_blank_lines_then_sends_the_body(
    post_chat: PostChat, make_body: Body
) -> None:
    config = MockConfig(latency_s=0.2, max_concurrency=1, over_concurrency="queue", keepalive_s=0.05)
    async with MockServer(config) as server:
        replies = await asyncio.gather(*(post_chat(server, make_body(schema=SCHEMA)) for _ in range(3)))
        assert [r.status for r in replies] == [200, 200, 200]
        queued = [r for r in replies if r.raw.startswith(b"\n")]
        assert len(queued) == 2  # the first one got the slot at once
        for reply in replies:
            assert reply.headers["Content-Type"].startswith("application/json")
            blank_lines = len(reply.raw) - len(reply.raw.lstrip(b"\n"))
            assert reply.raw[blank_lines:].startswith(b"{")
            completion = json.loads(reply.raw)  # JSON parsers skip the leading whitespace
            assert_schema_answer(json.loads(completion["choices"][0]["message"]["content"]))
        assert max(len(r.raw) - len(r.raw.lstrip(b"\n")) for r in replies) >= 4  # waited two latencies
        stats = server.stats()
        assert stats.max_generating == 1 and stats.max_in_flight == 3 and stats.accepted == 3


async def test_a_queued_request_starts_its_answer_time_when_the_slot_came_free_not_when_its_task_ran(
    post_chat: PostChat, make_body: Body, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's own loop stalling at a hand-off must not stretch the slot (the ceiling is slots / latency)."""
    latency_s, stall_s = 0.15, 0.1
    config = MockConfig(latency_s=latency_s, max_concurrency=1, over_concurrency="queue", keepalive_s=5.0)
    release = FifoSlots.release

    def stalling_release(slots: FifoSlots, freed_at: float) -> None:
        release(slots, freed_at)
        asyncio.get_running_loop().call_soon(time.sleep, stall_s)  # before the woken waiter gets the loop

    monkeypatch.setattr(FifoSlots, "release", stalling_release)
    async with MockServer(config) as server:
        done_at: list[float] = []

        async def timed() -> None:
            await post_chat(server, make_body())
            done_at.append(time.monotonic())

        await asyncio.gather(timed(), timed())
        gap = done_at[1] - done_at[0]
        # The second answer leaves one latency after the first, the stall inside it (before: latency + stall).
        assert latency_s - 0.03 < gap < latency_s + stall_s / 2, gap


# ---------------------------------------------------------------------------------------------------- faults


@pytest.mark.parametrize(("fault", "status"), [("error_500_rate", 500), ("error_503_rate", 503)])
async def test_server_errors_show_as_5xx_and_are_not_charged(
    post_chat: PostChat, make_body: Body, fault: str, status: int
) -> None:
    async with MockServer(FAST.replace(rpm=60, **{fault: 1.0})) as server:
        replies = [await post_chat(server, make_body()) for _ in range(3)]
        assert [r.status for r in replies] == [status] * 3
        assert replies[0].body["error"]["type"] == "server_error"
        stats = server.stats()
        assert stats.errors_5xx == 3 and stats.faults[f"error_{status}"] == 3
        assert stats.accepted == 0 and stats.rejected_429 == 0 and stats.overshoot_requests == 0.0


async def test_timeout_fault_hangs_and_the_server_still_stops(post_chat: PostChat, make_body: Body) -> None:
    server = MockServer(FAST.replace(timeout_rate=1.0, hang_s=30.0))
    async with server:
        with pytest.raises(asyncio.TimeoutError):
            await post_chat(server, make_body(), timeout_s=0.3)
        assert server.stats().faults["timeout"] == 1
    # Leaving the block woke the hanging handler; the port no longer answers.
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(server.root_url + "/mock/stats")


async def test_reset_fault_drops_the_connection(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(FAST.replace(reset_rate=1.0)) as server:
        with pytest.raises(aiohttp.ClientConnectionError):
            await post_chat(server, make_body())
        assert server.stats().faults["reset"] == 1


async def test_malformed_fault_is_a_200_that_is_not_a_chat_completion(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(malformed_rate=1.0)) as server:
        for _ in range(6):
            reply = await post_chat(server, make_body())
            assert reply.status == 200
            try:
                body = json.loads(reply.raw)
            except ValueError:
                continue
            assert not body.get("choices")
        assert server.stats().faults["malformed"] == 6


async def test_fault_sequence_is_reproducible_from_the_seed(post_chat: PostChat, make_body: Body) -> None:
    config = FAST.replace(error_500_rate=0.3, error_503_rate=0.3, seed=11)

    async def statuses(cfg: MockConfig) -> list[int]:
        async with MockServer(cfg) as server:
            return [(await post_chat(server, make_body())).status for _ in range(20)]

    first = await statuses(config)
    assert set(first) == {200, 500, 503}
    assert await statuses(config) == first
    assert await statuses(config.replace(seed=12)) != first


# ------------------------------------------------------------------------------------------- length and usage


async def test_length_stops_cut_reasoning_then_answer_and_never_exceed_max_tokens(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(reasoning_tokens=50)) as server:
        body = make_body(schema=SCHEMA, temperature=0)
        full = await post_chat(server, {**body, "max_tokens": 4000})
        answer_tokens = full.body["usage"]["completion_tokens"] - 50
        assert full.body["choices"][0]["finish_reason"] == "stop" and answer_tokens > 5

        empty = await post_chat(server, {**body, "max_completion_tokens": 20, "max_tokens": 4000})
        assert empty.body["choices"][0]["finish_reason"] == "length"
        assert empty.content == "" and len(empty.message["reasoning_content"]) == 80
        assert empty.body["usage"]["completion_tokens"] == 20
        assert empty.body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 20

        cut = await post_chat(server, {**body, "max_tokens": 50 + answer_tokens - 3})
        assert cut.body["choices"][0]["finish_reason"] == "length"
        assert full.content.startswith(cut.content) and 0 < len(cut.content) < len(full.content)
        assert cut.body["usage"]["completion_tokens"] == 50 + answer_tokens - 3
        assert server.stats().length_stops == 2


@pytest.mark.parametrize("style", ["openai", "deepseek"])
async def test_usage_shapes_and_prefix_cache(post_chat: PostChat, make_body: Body, style: str) -> None:
    system = "s" * 400  # 100 tokens + 4 for the message
    config = FAST.replace(usage_style=style, reasoning_tokens=7, reasoning_field="reasoning")
    async with MockServer(config) as server:
        first = await post_chat(server, make_body("one", system=system))
        second = await post_chat(server, make_body("two", system=system))
    assert "reasoning" in second.message and "reasoning_content" not in second.message
    for reply, cached in ((first, 0), (second, 104)):
        usage = reply.body["usage"]
        assert usage["prompt_tokens"] == 104 + 1 + 4
        assert usage["completion_tokens_details"]["reasoning_tokens"] == 7
        if style == "openai":
            assert usage["prompt_tokens_details"] == {"cached_tokens": cached}
            assert "prompt_cache_hit_tokens" not in usage
        else:
            assert usage["prompt_cache_hit_tokens"] == cached
            assert usage["prompt_cache_miss_tokens"] == usage["prompt_tokens"] - cached
            assert "prompt_tokens_details" not in usage


# ---------------------------------------------------------------------------------------------------- errors


async def test_context_window_overflow_is_vllms_400(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(FAST.replace(context_window=100)) as server:
        reply = await post_chat(server, make_body("u" * 200, system="s", max_tokens=60))
        assert reply.status == 400
        # prompt: 50 + 4 (user) + 1 + 4 (system) = 59 tokens
        assert reply.body["error"]["message"].startswith(
            "This model's maximum context length is 100 tokens. However, you requested 119 tokens "
            "(59 in the messages, 60 in the completion)."
        )
        assert (await post_chat(server, make_body("u" * 200, system="s", max_tokens=41))).status == 200
        assert server.stats().errors_4xx == 1


async def test_api_key_is_required_when_configured(
    post_chat: PostChat, make_body: Body, http: aiohttp.ClientSession
) -> None:
    config = FAST.replace(api_key="sk-mock-secret")
    assert "sk-mock-secret" not in repr(config)
    async with MockServer(config) as server:
        missing = await post_chat(server, make_body())
        wrong = await post_chat(server, make_body(), headers={"Authorization": "Bearer sk-other"})
        right = await post_chat(server, make_body(), headers={"Authorization": "Bearer sk-mock-secret"})
        assert (missing.status, wrong.status, right.status) == (401, 401, 200)
        assert wrong.body["error"]["code"] == "invalid_api_key" and b"sk-" not in wrong.raw
        async with http.get(server.base_url + "/models") as models:
            assert models.status == 401
        headers = {"Authorization": "Bearer sk-mock-secret"}
        async with http.get(server.base_url + "/models", headers=headers) as models:
            assert (await models.json())["data"][0]["id"] == "sim-model"


async def test_exhausted_quota_is_openais_insufficient_quota_429(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(quota_exhausted=True)) as server:
        reply = await post_chat(server, make_body())
        assert reply.status == 429
        assert reply.body["error"]["type"] == reply.body["error"]["code"] == "insufficient_quota"
        assert "Retry-After" not in reply.headers
        assert server.stats().rejected_by["quota"] == 1


async def test_bad_requests_get_400_in_the_openai_error_shape(
    post_chat: PostChat, http: aiohttp.ClientSession
) -> None:
    async with MockServer(FAST) as server:
        async with http.post(server.base_url + "/chat/completions", data=b"{not json") as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert set(error) == {"message", "type", "param", "code"}
        empty = await post_chat(server, {"model": "m", "messages": []})
        assert empty.status == 400 and empty.body["error"]["param"] == "messages"


async def test_stats_and_reset_over_http(
    post_chat: PostChat, make_body: Body, http: aiohttp.ClientSession
) -> None:
    async with MockServer(FAST.replace(rpm=60)) as server:
        await post_chat(server, make_body())
        await post_chat(server, make_body())
        async with http.get(server.root_url + "/mock/stats") as response:
            stats = await response.json()
        assert stats["requests_total"] == 2 and stats["accepted"] == 1 and stats["rejected_429"] == 1
        assert stats["accepted_per_second"] == [1] and stats["faults"]["reset"] == 0
        async with http.post(server.root_url + "/mock/reset") as response:
            assert response.status == 200
        assert server.stats().requests_total == 0
        assert (await post_chat(server, make_body())).status == 200  # the bucket is full again
