"""The bench's strict sliding-window server: what it admits, what it says when it refuses, what it charges.

The server runs on a free loopback port with a fake clock, so that "within a second" and "after the oldest has
left the window" are exact; answers come at once (latency 0).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest

from rcarun_bench.metrics import Arrival, window_figures
from rcarun_bench.window_server import (
    SlidingWindow,
    WindowConfig,
    WindowServer,
    WindowServerProcess,
    answer_content,
    format_go_duration,
    prompt_tokens,
)

_LIMIT_HEADERS = {
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 5_000.0

    def __call__(self) -> float:
        return self.now


def _body(content: str = "x" * 400, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1_000, **fields}


class Client:
    """A started server, its fake clock and an HTTP session."""

    def __init__(self, server: WindowServer, clock: FakeClock, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.clock = clock
        self.http = http

    async def post(
        self, body: Mapping[str, Any] | None = None, after_s: float = 0.0
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        """Advance the clock by ``after_s``, send one request; (status, lower-case headers, JSON body)."""
        self.clock.now += after_s
        url = f"{self.server.base_url}/chat/completions"
        async with self.http.post(url, json=dict(body or _body())) as response:
            payload = await response.json()
            headers = {name.lower(): value for name, value in response.headers.items()}
            return response.status, headers, payload


@pytest.fixture
async def make_client() -> AsyncIterator[Any]:
    servers: list[WindowServer] = []
    async with aiohttp.ClientSession() as http:

        async def make(**config: Any) -> Client:
            clock = FakeClock()
            server = WindowServer(WindowConfig(latency_s=0.0, **config), clock=clock)
            await server.start()
            servers.append(server)
            return Client(server, clock, http)

        yield make
        for server in servers:
            await server.stop()


# ---------------------------------------------------------------------------------------- the window itself


def test_the_window_counts_the_last_window_s_and_forgets_what_left_it() -> None:
    window = SlidingWindow(limit=3, window_s=60.0)
    for at in (0.0, 0.2, 0.4):
        assert window.admits(at, 1)
        window.add(at, 1)

    assert not window.admits(0.6, 1)
    assert window.remaining(0.6) == 0
    # One more fits once the oldest has left: at exactly 60 s after it (an arrival then is not "in the last
    # 60 s"), not a moment before.
    assert not window.admits(59.999, 1)
    assert window.wait_s(30.0, 1) == pytest.approx(30.0)
    assert window.admits(60.0, 1)
    # The reset is until everything counted has left: the newest (0.4) leaves at 60.4.
    assert window.reset_s(30.0) == pytest.approx(30.4)
    assert window.reset_s(61.0) == 0.0


def test_tokens_wait_until_enough_of_them_have_left() -> None:
    window = SlidingWindow(limit=1_000, window_s=60.0)
    window.add(0.0, 400)
    window.add(10.0, 400)

    assert window.admits(20.0, 200) and not window.admits(20.0, 201)
    # 500 more need the first 400 gone (at 60 s); 700 more need both (at 70 s); 1,001 never fit.
    assert window.wait_s(20.0, 500) == pytest.approx(40.0)
    assert window.wait_s(20.0, 700) == pytest.approx(50.0)
    assert window.wait_s(20.0, 1_001) == 60.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0s"), (0.2, "200ms"), (1.0, "1s"), (59.87, "59.87s"), (62.0, "1m2s"), (60.5, "1m0.5s")],
)
def test_resets_are_written_as_openai_writes_durations(seconds: float, text: str) -> None:
    assert format_go_duration(seconds) == text


def test_prompt_tokens_are_characters_over_the_ratio_plus_four_per_message() -> None:
    messages = [{"role": "system", "content": "a" * 10}, {"role": "user", "content": "b" * 399}]

    assert prompt_tokens(messages, 4.0) == math.ceil(10 / 4) + 4 + math.ceil(399 / 4) + 4
    assert prompt_tokens(messages, 3.0) == math.ceil(10 / 3) + 4 + 133 + 4


def test_the_answer_fills_the_requests_schema_or_the_prompts() -> None:
    schema = {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "responsible_role": {"type": "string", "enum": ["Coder", "WebSurfer"]},
            "root_step": {"type": "integer", "minimum": 0, "maximum": 4},
        },
    }
    structured = _body(
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    )
    in_prompt = _body(
        content=f"Answer as:\n```json\n{json.dumps(schema)}\n```", response_format={"type": "json_object"}
    )

    for body in (structured, in_prompt):
        answer = json.loads(answer_content(body))
        assert answer["responsible_role"] == "Coder"
        assert answer["root_step"] == 0
        assert isinstance(answer["reason"], str)


# ------------------------------------------------------------------------------------------- over HTTP


async def test_n_plus_one_requests_within_a_second_one_is_refused_until_the_oldest_leaves(
    make_client: Any,
) -> None:
    client = await make_client(rpm=5)

    statuses = [(await client.post(after_s=0.1))[0] for _ in range(6)]

    assert statuses == [200] * 5 + [429]
    # The first arrived at t = 0.1 s from the clock's start; it leaves the window 60 s later.
    assert (await client.post(after_s=59.0))[0] == 429
    assert (await client.post(after_s=0.5))[0] == 200
    assert (await client.post())[0] == 429
    stats = client.server.stats()
    assert (stats.requests_total, stats.accepted, stats.rejected_429) == (9, 6, 3)
    assert stats.rejected_by == {"rpm": 3}
    assert stats.max_requests_60s == 5
    # Offered load: the 5 accepted and the refused ones within one 60-s window ask for 3 more than allowed.
    assert stats.overshoot_requests == pytest.approx(3.0)
    arrivals = client.server.arrivals()
    assert arrivals[0] == Arrival(at=0.0, status=200, tokens=arrivals[0].tokens)
    assert [a.status for a in arrivals] == [200] * 5 + [429, 429, 200, 429]
    assert arrivals[-2].at == pytest.approx(60.0)


async def test_openai_headers_on_every_response_reset_until_the_window_is_empty_and_no_retry_after(
    make_client: Any,
) -> None:
    client = await make_client(rpm=3, tpm=100_000, signal="openai-headers")
    for _ in range(3):
        status, headers, _ = await client.post(after_s=10.0)
        assert status == 200
        assert set(headers) >= _LIMIT_HEADERS
        assert "retry-after" not in headers

    status, headers, body = await client.post(after_s=5.0)

    assert status == 429
    assert "retry-after" not in headers and "retry-after-ms" not in headers
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # Arrivals at 0, 10 and 20 s from the first; now 25 s: everything has left at 20 + 60 = 80 s, 55 s away
    # (not 35 s, when one more request would fit).
    assert headers["x-ratelimit-reset-requests"] == "55s"
    assert headers["x-ratelimit-reset-tokens"] == "55s"
    assert body["error"]["code"] == "rate_limit_exceeded"


async def test_retry_after_only_says_when_one_more_request_fits(make_client: Any) -> None:
    client = await make_client(rpm=3, signal="retry-after")
    for _ in range(3):
        status, headers, _ = await client.post(after_s=10.0)
        assert status == 200 and not set(headers) & (_LIMIT_HEADERS | {"retry-after"})

    status, headers, _ = await client.post(after_s=5.2)

    # The oldest (at 0 s) leaves at 60 s; now 25.2 s: 34.8 s, rounded up to whole seconds.
    assert status == 429
    assert headers["retry-after"] == "35"
    assert not set(headers) & _LIMIT_HEADERS


async def test_both_sends_the_headers_and_retry_after(make_client: Any) -> None:
    client = await make_client(rpm=1, signal="both")
    status, headers, _ = await client.post()
    assert status == 200 and "x-ratelimit-reset-requests" in headers and "retry-after" not in headers

    status, headers, _ = await client.post(after_s=0.5)

    assert status == 429
    assert headers["retry-after"] == "60"
    assert headers["x-ratelimit-reset-requests"] == "59.5s"


async def test_a_bare_429_carries_no_header_at_all(make_client: Any) -> None:
    client = await make_client(rpm=1, tpm=100_000, signal="bare")
    await client.post()

    status, headers, body = await client.post()

    assert status == 429
    assert not {h for h in headers if h.startswith("x-ratelimit") or h.startswith("retry-after")}
    assert body["error"]["type"] == "requests"


async def test_an_overload_is_a_503_with_kimis_error_type_and_no_header(make_client: Any) -> None:
    client = await make_client(rpm=1, signal="overload-503")
    await client.post()

    status, headers, body = await client.post()

    assert status == 503
    assert body["error"]["type"] == "engine_overloaded_error"
    assert not {h for h in headers if h.startswith("x-ratelimit") or h.startswith("retry-after")}
    stats = client.server.stats()
    assert (stats.rejected_429, stats.errors_5xx) == (0, 1)
    assert [a.status for a in client.server.arrivals()] == [200, 503]


async def test_tokens_metered_by_usage_are_prompt_plus_the_answer(make_client: Any) -> None:
    client = await make_client(tpm=10_000, metering="usage")

    status, headers, body = await client.post(_body(max_tokens=1_000))

    usage = body["usage"]
    prompt = math.ceil(400 / 4) + 4
    assert status == 200
    assert usage["prompt_tokens"] == prompt
    assert usage["completion_tokens"] == math.ceil(len(body["choices"][0]["message"]["content"]) / 4)
    assert usage["total_tokens"] == prompt + usage["completion_tokens"]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert headers["x-ratelimit-remaining-tokens"] == str(10_000 - usage["total_tokens"])
    assert client.server.arrivals()[0].tokens == usage["total_tokens"]


async def test_tokens_metered_by_max_tokens_charge_the_whole_budget_at_arrival(make_client: Any) -> None:
    client = await make_client(tpm=3_000, metering="max_tokens")
    prompt = math.ceil(400 / 4) + 4

    first = await client.post(_body(max_tokens=1_000))
    second = await client.post({**_body(), "max_completion_tokens": 1_500})
    third = await client.post(_body(max_tokens=1_000))

    assert first[0] == 200 and first[1]["x-ratelimit-remaining-tokens"] == str(3_000 - prompt - 1_000)
    # max_completion_tokens (OpenAI's newer name) wins over max_tokens.
    assert second[0] == 200 and second[1]["x-ratelimit-remaining-tokens"] == str(3_000 - 2 * prompt - 2_500)
    # 396 tokens left; the next asks for 1,104 at arrival though its answer would use about 60.
    assert third[0] == 429
    assert [a.tokens for a in client.server.arrivals()] == [prompt + 1_000, prompt + 1_500, prompt + 1_000]
    assert client.server.stats().rejected_by == {"tpm": 1}


async def test_another_ratio_counts_more_prompt_tokens_than_the_clients_estimate(make_client: Any) -> None:
    client = await make_client(tpm=10_000, chars_per_token=3.0)

    _, _, body = await client.post()

    assert body["usage"]["prompt_tokens"] == math.ceil(400 / 3) + 4


async def test_a_shorter_window_keeps_the_rate_and_states_the_per_minute_limit(make_client: Any) -> None:
    client = await make_client(rpm=300, window_s=10.0)

    statuses = [(await client.post())[0] for _ in range(51)]
    _, headers, _ = await client.post(after_s=10.0)

    assert statuses == [200] * 50 + [429]
    assert headers["x-ratelimit-limit-requests"] == "300"
    assert headers["x-ratelimit-remaining-requests"] == "49"
    assert headers["x-ratelimit-reset-requests"] == "10s"


async def test_reset_empties_the_windows_and_the_counters(make_client: Any) -> None:
    client = await make_client(rpm=1)
    await client.post()
    await client.post()

    client.server.reset()

    assert client.server.stats().requests_total == 0
    assert client.server.arrivals() == []
    status, _, _ = await client.post()
    assert status == 200
    assert client.server.arrivals()[0].at == 0.0


async def test_a_streaming_or_malformed_request_is_a_400(make_client: Any) -> None:
    client = await make_client(rpm=10)

    assert (await client.post(_body(stream=True)))[0] == 400
    assert (await client.post({"model": "m"}))[0] == 400
    stats = client.server.stats()
    assert (stats.errors_4xx, stats.requests_total) == (2, 0)


# --------------------------------------------------------------------------------------------- figures


def _paced(start: float, end: float, rate: float, status: int = 200) -> list[Arrival]:
    count = round((end - start) * rate)
    return [Arrival(at=start + i / rate, status=status, tokens=10) for i in range(count)]


def test_a_client_at_the_limit_throughout_has_full_goodput_and_no_refusal() -> None:
    arrivals = _paced(0.0, 100.0, rate=5.0)

    figures = window_figures(arrivals, limit_per_window=300, window_s=60.0, by_tokens=False)

    assert figures.goodput == pytest.approx(1.0)
    assert (figures.refused, figures.first_refusal_s, figures.recovery_s) == (0, None, None)
    assert figures.last_arrival_s == pytest.approx(99.8)
    assert figures.mean_tokens == 10


def test_a_client_that_stops_for_a_minute_after_its_first_429() -> None:
    # At the limit until 58 s, one 429 at 58 s, silent until 118 s, then at the limit again.
    arrivals = [*_paced(0.0, 58.0, 5.0), Arrival(58.0, 429, 10), *_paced(118.0, 160.0, 5.0)]

    figures = window_figures(arrivals, limit_per_window=300, window_s=60.0, by_tokens=False)

    # [20, 80) s holds 38 s at the limit of 60.
    assert figures.goodput == pytest.approx(38 / 60)
    assert (figures.refused, figures.refused_early, figures.refused_late) == (1, 1, 0)
    assert figures.first_refusal_s == 58.0
    assert figures.late_refused_share == 0.0
    # The first 15-s span at 0.95 of the limit ends about 15 s after sending resumed at 118 s.
    assert figures.recovery_s is not None and 74.0 <= figures.recovery_s <= 76.0


def test_refusals_after_the_grace_count_against_the_requests_sent_then() -> None:
    arrivals = sorted(
        [
            *_paced(0.0, 100.0, 5.0),
            *_paced(10.0, 20.0, 1.0, status=429),
            *_paced(50.0, 60.0, 1.0, status=429),
        ],
        key=lambda a: a.at,
    )

    figures = window_figures(arrivals, limit_per_window=3_000, window_s=60.0, by_tokens=True)

    # Tokens bind: 10 tokens a request against 3,000 per window (= 300 requests' worth); refusals count none.
    assert figures.goodput == pytest.approx(1.0)
    assert figures.first_refusal_s == 10.0
    # 10 refusals within 30 s of the first (10 to 19 s), 10 after 40 s (50 to 59 s) among 310 arrivals.
    assert (figures.refused_early, figures.refused_late) == (10, 10)
    late_arrivals = sum(1 for a in arrivals if a.at > 40.0)
    assert figures.late_refused_share == pytest.approx(10 / late_arrivals)
    assert figures.recovery_s == pytest.approx(15.0)


async def test_the_window_server_in_its_own_process_counts_refuses_resets_and_stops() -> None:
    # The process handling is the simulator's (`rcarun.mock.process.ServerProcess`); what the bench reads is its.
    server = WindowServerProcess(WindowConfig(rpm=1, latency_s=0.0))  # one request a minute
    with server:
        pid = server.pid
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        async with aiohttp.ClientSession() as http:
            for expected in (200, 429):
                async with http.post(server.base_url + "/chat/completions", json=_body()) as response:
                    assert response.status == expected
        assert [a.status for a in server.arrivals()] == [200, 429]
        stats = server.stats()
        assert (stats.requests_total, stats.accepted, stats.rejected_429) == (2, 1, 1)
        server.reset()
        assert server.stats().requests_total == 0
    assert not server.running
    with pytest.raises(ProcessLookupError):  # exited and reaped
        os.kill(pid, 0)
