"""The simulator's chaos knobs: random 429s, answers cut short (length_rate), the hostile answers and pauses of
the outside fault campaign (huge steps, lone surrogates, nonsense usage, day-long Retry-After) and the request
log that reconciles them."""

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
# The all-at-once answer and a nested one in rcta's shape: step fields named as the methods name them.
ROOT_STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string"},
        "responsible_role": {"type": "string", "enum": ["Orchestrator", "WebSurfer"]},
        "root_step": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["reason", "responsible_role", "root_step"],
}
NESTED_STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "root_cause": {
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": ["Orchestrator"]},
                "step": {"type": "integer", "minimum": 0, "maximum": 9},
            },
        },
        "step_ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}},
        "reason": {"type": "string", "minLength": 80},
    },
}
HALF_SCHEMA: dict[str, Any] = {  # binary search's answer: no step in it
    "type": "object",
    "properties": {"reason": {"type": "string"}, "half": {"type": "string", "enum": ["upper", "lower"]}},
}


def log_entries(server: MockServer) -> list[RequestLogEntry]:
    return [RequestLogEntry.from_dict(entry) for entry in server.request_log()["entries"]]


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


async def test_bare_rate_limit_fault_is_a_429_that_states_nothing(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(bare_rate_limit_rate=1.0, headers="openai")) as server:
        reply = await post_chat(server, make_body("overloaded?"))
        stats = server.stats()
    assert reply.status == 429
    stated = {name.lower() for name in reply.headers} & {"retry-after", "retry-after-ms"}
    assert not stated and not any(name.lower().startswith("x-ratelimit") for name in reply.headers)
    assert stats.faults["bare_rate_limit"] == 1 and stats.accepted == 0 and stats.rejected_429 == 0


async def test_control_answer_starts_with_terminal_sequences_and_keeps_its_json(
    post_chat: PostChat, make_body: Body
) -> None:
    body = make_body("which step?", schema=ROOT_STEP_SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(FAST) as plain_server:
        plain = await post_chat(plain_server, body)
    async with MockServer(FAST.replace(control_rate=1.0, request_log_size=10)) as server:
        reply = await post_chat(server, body)
        stats = server.stats()
        entries = log_entries(server)
    assert reply.status == 200
    first, _, rest = reply.content.partition("\n")
    assert "\x1b]52;" in first and "\x1b[2J" in first and "\x9b" in first
    assert json.loads(rest) == json.loads(plain.content)
    assert [(e.outcome, e.detail) for e in entries] == [("control", "(prefix)")]
    assert stats.faults["control"] == 1 and stats.accepted == 1


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


# ------------------------------------------------------------------------------------- the hostile answers


async def test_huge_step_states_ten_to_the_26_as_a_json_integer_and_changes_nothing_else(
    post_chat: PostChat, make_body: Body
) -> None:
    body = make_body("which step?", schema=ROOT_STEP_SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(FAST) as plain_server:
        plain = await post_chat(plain_server, body)
    async with MockServer(FAST.replace(huge_step_rate=1.0, request_log_size=10)) as server:
        reply = await post_chat(server, body)
        stats = server.stats()
        (entry,) = log_entries(server)
    assert reply.status == 200
    assert b'\\"root_step\\": 100000000000000000000000000}' in reply.raw  # an integer, not 1e+26
    answer, plain_answer = json.loads(reply.content), json.loads(plain.content)
    assert answer["root_step"] == 10**26 and isinstance(answer["root_step"], int)
    assert {**answer, "root_step": plain_answer["root_step"]} == plain_answer
    assert reply.body["choices"][0]["finish_reason"] == "stop"
    assert stats.faults["huge_step"] == 1 and stats.accepted == 1
    assert (entry.outcome, entry.status, entry.detail) == ("huge_step", 200, "root_step")
    assert entry.completion_id == reply.body["id"]


async def test_huge_step_reaches_nested_step_fields_but_not_step_arrays(
    post_chat: PostChat, make_body: Body
) -> None:
    config = FAST.replace(huge_step_rate=1.0, request_log_size=10)
    async with MockServer(config) as server:
        reply = await post_chat(server, make_body("where?", schema=NESTED_STEP_SCHEMA, max_tokens=400))
        (entry,) = log_entries(server)
    answer = json.loads(reply.content)
    assert answer["root_cause"]["step"] == 10**26
    assert all(0 <= step <= 9 for step in answer["step_ids"])
    assert entry.outcome == "huge_step" and entry.detail == "root_cause.step"


async def test_huge_step_without_a_step_field_or_cut_off_by_the_budget_is_a_plain_answer(
    post_chat: PostChat, make_body: Body
) -> None:
    config = FAST.replace(huge_step_rate=1.0, request_log_size=10)
    async with MockServer(config) as server:
        half = await post_chat(server, make_body("which half?", schema=HALF_SCHEMA, max_tokens=400))
        # root_step comes last: 10 tokens stop the answer inside its reason.
        cut = await post_chat(server, make_body("which step?", schema=ROOT_STEP_SCHEMA, max_tokens=10))
        stats = server.stats()
        entries = log_entries(server)
    assert set(json.loads(half.content)) == {"reason", "half"}
    assert cut.body["choices"][0]["finish_reason"] == "length" and b"10000000000" not in cut.raw
    assert [(e.outcome, e.detail) for e in entries] == [("ok", None), ("length", None)]
    assert stats.faults["huge_step"] == 0 and stats.accepted == 2


async def test_surrogate_answer_carries_a_lone_ud800_escape_at_the_end_of_its_free_text(
    post_chat: PostChat, make_body: Body
) -> None:
    body = make_body("which step?", schema=ROOT_STEP_SCHEMA, max_tokens=400, temperature=0)
    async with MockServer(FAST) as plain_server:
        plain = await post_chat(plain_server, body)
    async with MockServer(FAST.replace(surrogate_rate=1.0, request_log_size=10)) as server:
        reply = await post_chat(server, body)
        text = await post_chat(server, make_body("say something", max_tokens=400))
        stats = server.stats()
        entries = log_entries(server)
    assert reply.status == 200
    # Written as the escape itself (not an escaped backslash), so the decoded content holds U+D800.
    assert b"\\ud800" in reply.raw and b"\\\\ud800" not in reply.raw
    assert reply.raw.isascii()
    answer = json.loads(reply.content)
    assert answer["reason"] == json.loads(plain.content)["reason"] + "\ud800"
    assert answer["root_step"] == json.loads(plain.content)["root_step"]
    assert text.content.endswith(".\ud800")  # not JSON: the text itself ends cut mid-emoji
    assert [(e.outcome, e.status, e.detail) for e in entries] == [
        ("surrogate", 200, "reason"),
        ("surrogate", 200, "(text)"),
    ]
    assert stats.faults["surrogate"] == 2 and stats.accepted == 2


async def test_bad_usage_cycles_through_missing_huge_infinity_and_negative_and_stats_bill_the_truth(
    post_chat: PostChat, make_body: Body
) -> None:
    bodies = [
        make_body(f"case {i}", schema=ROOT_STEP_SCHEMA, max_tokens=400, temperature=0) for i in range(16)
    ]
    async with MockServer(FAST) as plain_server:
        for body in bodies:
            await post_chat(plain_server, body)
        billed = plain_server.stats()
    async with MockServer(FAST.replace(bad_usage_rate=1.0, request_log_size=100, seed=5)) as server:
        replies = [await post_chat(server, body) for body in bodies]
        stats = server.stats()
        entries = log_entries(server)
    assert {entry.detail for entry in entries} == {"missing", "huge", "infinity", "negative"}
    for reply, entry in zip(replies, entries, strict=True):
        assert reply.status == 200 and entry.outcome == "bad_usage"
        assert entry.completion_id == reply.body["id"]
        json.loads(reply.content)  # the answer itself is sound
        usage = reply.body.get("usage")
        if entry.detail == "missing":
            assert usage is None
        elif entry.detail == "huge":
            assert (
                b'"prompt_tokens": 100000000000000000000,' in reply.raw and usage["prompt_tokens"] == 10**20
            )
        elif entry.detail == "infinity":
            assert b'"prompt_tokens": Infinity,' in reply.raw and usage["prompt_tokens"] == float("inf")
        else:
            assert min(usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) < 0
            assert usage["prompt_tokens"] < 0 and usage["completion_tokens"] < 0
    assert stats.faults["bad_usage"] == 16 and stats.accepted == 16
    assert (stats.accepted_prompt_tokens, stats.accepted_completion_tokens) == (
        billed.accepted_prompt_tokens,
        billed.accepted_completion_tokens,
    )


async def test_long_pause_is_a_429_asking_for_a_day_a_date_in_2099_or_infinity_and_is_not_charged(
    post_chat: PostChat, make_body: Body
) -> None:
    async with MockServer(FAST.replace(long_pause_rate=1.0, request_log_size=100, rpm=600)) as server:
        replies = [await post_chat(server, make_body(f"q{i}")) for i in range(12)]
        stats = server.stats()
        entries = log_entries(server)
    pauses = [reply.headers["Retry-After"] for reply in replies]
    assert set(pauses) == {"86400", "Wed, 21 Oct 2099 07:28:00 GMT", "1e400"}
    for reply, entry in zip(replies, entries, strict=True):
        assert reply.status == 429 and reply.body["error"]["code"] == "rate_limit_exceeded"
        assert (entry.outcome, entry.status, entry.detail) == (
            "long_pause",
            429,
            reply.headers["Retry-After"],
        )
        assert entry.completion_id is None
        if reply.headers["Retry-After"] == "86400":
            assert reply.headers["retry-after-ms"] == "86400000"
        else:
            assert "retry-after-ms" not in reply.headers
    assert stats.faults["long_pause"] == 12 and stats.accepted == 0 and stats.rejected_429 == 0
    assert reply.headers["x-ratelimit-remaining-requests"] == "10"  # the rpm bucket untouched


async def test_the_new_kinds_never_move_the_original_faults_of_a_seed(
    post_chat: PostChat, make_body: Body
) -> None:
    original = FAST.replace(
        error_500_rate=0.15, error_503_rate=0.1, malformed_rate=0.1, rate_limit_rate=0.1, seed=9
    )
    original = original.replace(request_log_size=200)

    async def outcomes(config: MockConfig) -> list[str]:
        async with MockServer(config) as server:
            for index in range(80):
                await post_chat(server, make_body(f"q{index}", schema=ROOT_STEP_SCHEMA, max_tokens=400))
            return [entry.outcome for entry in log_entries(server)]

    before = await outcomes(original)
    zero_rates = original.replace(
        huge_step_rate=0.0, surrogate_rate=0.0, bad_usage_rate=0.0, long_pause_rate=0.0
    )
    assert await outcomes(zero_rates) == before
    with_new = await outcomes(
        original.replace(huge_step_rate=0.1, surrogate_rate=0.1, bad_usage_rate=0.1, long_pause_rate=0.1)
    )
    new_kinds = {"huge_step", "surrogate", "bad_usage", "long_pause"}
    assert new_kinds <= set(with_new)
    for old, new in zip(before, with_new, strict=True):
        assert new == old if old != "ok" else new in new_kinds | {"ok"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"huge_step_rate": 1.5}, "huge_step_rate must be within"),
        ({"surrogate_rate": -0.1}, "surrogate_rate must be within"),
        ({"bad_usage_rate": float("nan")}, "bad_usage_rate must be within"),
        ({"long_pause_rate": 0.6, "bad_usage_rate": 0.5}, "fault rates sum to 1.100"),
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
        [
            *("--rate-limit-rate", "0.05", "--length-rate", "0.1", "--request-log-size", "500"),
            *("--huge-step-rate", "0.01", "--surrogate-rate", "0.02", "--bad-usage-rate", "0.03"),
            *("--long-pause-rate", "0.004"),
        ]
    )
    config = config_from_args(args)
    assert (config.rate_limit_rate, config.length_rate, config.request_log_size) == (0.05, 0.1, 500)
    assert (config.huge_step_rate, config.surrogate_rate, config.bad_usage_rate, config.long_pause_rate) == (
        0.01,
        0.02,
        0.03,
        0.004,
    )
    assert MockConfig.from_json(config.to_json()) == config
