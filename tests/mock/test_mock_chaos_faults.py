"""The simulator's chaos knobs: random 429s, answers cut short (length_rate) and the request log."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from rcarun.mock import MockConfig, MockServer, RequestLogEntry, request_digest
from rcarun.mock.cli import build_parser, config_from_args

PostChat = Callable[..., Awaitable[Any]]
Body = Callable[..., dict[str, Any]]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"reason": {"type": "string", "minLength": 200}, "step": {"type": "integer"}},
    "required": ["reason", "step"],
}
FAST = MockConfig(latency_s=0.0, hang_s=0.05)


async def test_rate_limit_fault_is_a_429_with_the_configured_retry_after(
    post_chat: PostChat, make_body: Body
) -> None:
    config = FAST.replace(rate_limit_rate=1.0, rate_limit_retry_after_s=0.25)
    async with MockServer(config) as server:
        reply = await post_chat(server, make_body("overloaded?"))
        stats = server.stats()
    assert reply.status == 429
    assert reply.headers["Retry-After"] == "1"  # whole seconds, rounded up, as providers send it
    assert float(reply.headers["retry-after-ms"]) == 250
    assert reply.body["error"]["code"] == "rate_limit_exceeded"
    assert stats.faults["rate_limit"] == 1 and stats.accepted == 0
    assert stats.rejected_429 == 0  # no limit asked for it: the limits' own counter stays clean


async def test_length_fault_cuts_the_answer_at_a_tenth_of_max_tokens(
    post_chat: PostChat, make_body: Body
) -> None:
    body = make_body("explain at length", schema=SCHEMA, max_tokens=100, temperature=0)
    async with MockServer(FAST) as whole_server:
        whole = await post_chat(whole_server, body)
    async with MockServer(FAST.replace(length_rate=1.0)) as server:
        cut = await post_chat(server, body)
        stats = server.stats()
    assert whole.body["choices"][0]["finish_reason"] == "stop"
    assert whole.body["usage"]["completion_tokens"] > 10
    assert cut.body["choices"][0]["finish_reason"] == "length"
    assert cut.body["usage"]["completion_tokens"] == 10
    assert len(cut.content) == 40 and whole.content.startswith(cut.content)
    assert stats.length_faults == 1 and stats.length_stops == 1 and stats.accepted == 1


async def test_length_fault_cuts_an_answer_shorter_than_a_tenth_of_its_budget_at_a_tenth_of_itself(
    post_chat: PostChat, make_body: Body
) -> None:
    body = make_body("short", schema=SCHEMA, max_tokens=60_000, temperature=0)
    async with MockServer(FAST.replace(length_rate=1.0)) as server:
        cut = await post_chat(server, body)
    async with MockServer(FAST) as whole_server:
        whole = await post_chat(whole_server, body)
    assert cut.body["choices"][0]["finish_reason"] == "length"
    assert cut.body["usage"]["completion_tokens"] == whole.body["usage"]["completion_tokens"] // 10


async def test_length_fault_hits_about_its_rate_and_is_reproducible_by_seed(
    post_chat: PostChat, make_body: Body
) -> None:
    async def cut_pattern(seed: int) -> list[bool]:
        async with MockServer(FAST.replace(length_rate=0.3, seed=seed)) as server:
            replies = [
                await post_chat(server, make_body(f"q{i}", schema=SCHEMA, max_tokens=400)) for i in range(200)
            ]
            assert server.stats().length_faults == sum(
                r.body["choices"][0]["finish_reason"] == "length" for r in replies
            )
        return [r.body["choices"][0]["finish_reason"] == "length" for r in replies]

    first, again, other = await cut_pattern(1), await cut_pattern(1), await cut_pattern(2)
    assert first == again and first != other
    assert 35 <= sum(first) <= 85  # 200 draws at 0.3: mean 60, sd 6.5


async def test_request_log_records_each_request_with_its_outcome_and_identity(
    post_chat: PostChat, make_body: Body
) -> None:
    config = FAST.replace(
        error_500_rate=0.15,
        error_503_rate=0.1,
        reset_rate=0.1,
        timeout_rate=0.1,
        malformed_rate=0.1,
        rate_limit_rate=0.1,
        length_rate=0.2,
        request_log_size=1000,
        seed=3,
    )
    sent: list[tuple[str, int, str | None]] = []  # (digest, status or -1 for no answer, completion id)
    async with MockServer(config) as server:
        for index in range(120):
            body = make_body(f"question {index}", schema=SCHEMA, max_tokens=300 + index)
            digest = request_digest(body["messages"], body["max_tokens"])
            try:
                reply = await post_chat(server, body, timeout_s=5)
            except aiohttp.ClientError:
                sent.append((digest, -1, None))
                continue
            completion_id = None
            if reply.status == 200:
                try:
                    completion_id = json.loads(reply.raw).get("id")
                except ValueError:
                    completion_id = None
            sent.append((digest, reply.status, completion_id))
        log = server.request_log()
        stats = server.stats()

    assert log["total"] == 120 and log["dropped"] == 0 and log["size"] == 1000
    entries = [RequestLogEntry.from_dict(entry) for entry in log["entries"]]
    assert [entry.seq for entry in entries] == list(range(1, 121))
    by_digest = {entry.request_digest: entry for entry in entries}
    assert len(by_digest) == 120  # every request found by the digest its client computed
    outcomes: dict[str, int] = {}
    for digest, status, completion_id in sent:
        entry = by_digest[digest]
        outcomes[entry.outcome] = outcomes.get(entry.outcome, 0) + 1
        assert entry.max_tokens is not None and entry.max_tokens >= 300
        if entry.outcome in ("ok", "length"):
            assert entry.status == status == 200 and entry.completion_id == completion_id
        elif entry.outcome in ("timeout", "reset"):
            assert entry.status is None and status == -1 and entry.completion_id is None
        elif entry.outcome == "malformed":
            assert entry.status == status == 200 and entry.completion_id is None
        else:
            assert entry.status == status and entry.completion_id is None
            assert status == {"error_500": 500, "error_503": 503, "rate_limit": 429}[entry.outcome]
    for kind in ("error_500", "error_503", "timeout", "reset", "malformed", "rate_limit"):
        assert outcomes.get(kind, 0) == stats.faults[kind] > 0
    assert outcomes.get("length", 0) == stats.length_faults > 0
    assert outcomes["ok"] + outcomes.get("length", 0) == stats.accepted


async def test_request_log_is_bounded_and_says_how_many_fell_off(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(request_log_size=3)) as server:
        for index in range(5):
            await post_chat(server, make_body(f"q{index}"))
        log = server.request_log()
        server.reset()
        after_reset = server.request_log()
    assert log["total"] == 5 and log["dropped"] == 2
    assert [entry["seq"] for entry in log["entries"]] == [3, 4, 5]
    assert after_reset["total"] == 0 and after_reset["entries"] == []


async def test_request_log_off_by_default(http: aiohttp.ClientSession) -> None:
    async with MockServer(FAST) as server:
        async with http.get(server.root_url + "/mock/log") as response:
            assert response.status == 404
        with pytest.raises(RuntimeError, match="request_log_size"):
            server.request_log()


async def test_a_bad_request_is_logged_without_a_digest(http: aiohttp.ClientSession) -> None:
    async with MockServer(FAST.replace(request_log_size=10)) as server:
        async with http.post(server.base_url + "/chat/completions", data=b"{not json") as response:
            assert response.status == 400
        (entry,) = server.request_log()["entries"]
    assert entry["outcome"] == "bad_request" and entry["status"] == 400 and entry["request_digest"] is None


def test_request_digest_depends_on_messages_and_max_tokens_only() -> None:
    messages = [{"role": "user", "content": "é"}]
    same = request_digest([{"content": "é", "role": "user", "name": "x"}], 10)
    assert request_digest(messages, 10) == same
    assert request_digest(messages, 11) != same
    assert request_digest([{"role": "system", "content": "é"}], 10) != same


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"length_rate": 1.5}, "length_rate must be within"),
        ({"request_log_size": -1}, "request_log_size must be an integer"),
        ({"rate_limit_rate": 0.6, "error_500_rate": 0.5}, "fault rates sum to 1.100"),
        ({"rate_limit_retry_after_s": -1.0}, "rate_limit_retry_after_s must be"),
    ],
)
def test_chaos_knobs_are_validated(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MockConfig(**changes)


def test_chaos_knobs_have_command_line_flags() -> None:
    args = build_parser().parse_args(
        ["--rate-limit-rate", "0.05", "--length-rate", "0.1", "--request-log-size", "500"]
    )
    config = config_from_args(args)
    assert (config.rate_limit_rate, config.length_rate, config.request_log_size) == (0.05, 0.1, 500)
    assert MockConfig.from_json(config.to_json()) == config
