"""Buckets, admission, the offered-load yardstick and the counters, driven by plain clock numbers."""

from __future__ import annotations

import asyncio

import pytest

from rcarun.mock import format_openai_duration
from rcarun.mock.headers import rate_limit_headers, retry_after_headers
from rcarun.mock.limits import FifoSlots, OfferedLoad, RateLimiter, bucket_specs
from rcarun.mock.stats import SlidingWindowMax, StatsRecorder


def test_bucket_capacities_are_burst_seconds_of_quota() -> None:
    by_name = {spec.name: spec for spec in bucket_specs(rpm=600, rps=10, tpm=60_000, burst_s=1.0)}
    assert by_name["rpm"].capacity == 10 and by_name["rpm"].rate == 10
    assert by_name["rps"].capacity == 10 and by_name["rps"].rate == 10
    assert by_name["tpm"].capacity == 1000 and by_name["tpm"].rate == 1000
    small = {spec.name: spec for spec in bucket_specs(rpm=10, rps=2, tpm=None, burst_s=0.1)}
    assert small["rpm"].capacity == 1  # never below one request
    assert small["rps"].capacity == 1  # max(1, rps * burst_s)


def test_a_burst_beyond_the_bucket_is_rejected_with_the_time_to_wait() -> None:
    limiter = RateLimiter(bucket_specs(rpm=600, rps=None, tpm=None, burst_s=1.0), now=0.0)
    assert all(limiter.admit(10, now=0.0).accepted for _ in range(10))
    rejected = limiter.admit(10, now=0.0)
    assert not rejected.accepted and rejected.limit_name == "rpm"
    assert rejected.retry_after_s == pytest.approx(0.1)
    assert not limiter.admit(10, now=0.05).accepted
    assert limiter.admit(10, now=0.1).accepted
    state = limiter.request_state(now=0.1)
    assert state is not None and state.remaining == 0 and state.reset_s == pytest.approx(1.0)


def test_a_request_is_never_partially_charged() -> None:
    limiter = RateLimiter(bucket_specs(rpm=600, rps=None, tpm=6_000, burst_s=1.0), now=0.0)
    assert limiter.admit(80, now=0.0).accepted
    rejected = limiter.admit(80, now=0.0)  # tokens: 20 left of 100
    assert not rejected.accepted and rejected.limit_name == "tpm"
    assert rejected.retry_after_s == pytest.approx(0.6)
    requests, tokens = limiter.request_state(0.0), limiter.token_state(0.0)
    assert requests is not None and requests.remaining == 9  # the tpm rejection did not take a request
    assert tokens is not None and tokens.remaining == 20


def test_large_requests_go_into_debt_and_requests_over_the_minute_limit_never_pass() -> None:
    limiter = RateLimiter(bucket_specs(rpm=None, rps=None, tpm=6_000, burst_s=1.0), now=0.0)  # capacity 100
    assert limiter.admit(250, now=0.0).accepted  # bigger than the bucket, admitted when full
    waiting = limiter.admit(1, now=0.0)
    assert not waiting.accepted and waiting.retry_after_s == pytest.approx(
        1.51
    )  # repay 150 debt + 1 at 100/s
    too_large = limiter.admit(6_001, now=100.0)
    assert not too_large.accepted and too_large.too_large and too_large.limit_name == "tpm"


def test_rps_tier_binds_inside_a_generous_rpm() -> None:
    limiter = RateLimiter(bucket_specs(rpm=6_000, rps=5, tpm=None, burst_s=1.0), now=0.0)
    verdicts = [limiter.admit(1, now=0.0) for _ in range(7)]
    assert [v.accepted for v in verdicts] == [True] * 5 + [False] * 2
    assert verdicts[-1].limit_name == "rps"


def test_offered_load_is_zero_for_a_paced_client_and_measures_a_flood() -> None:
    specs = bucket_specs(rpm=600, rps=None, tpm=60_000, burst_s=1.0)  # 10 req/s, burst 10; 1000 tok/s
    paced = OfferedLoad(specs, now=0.0)
    for i in range(100):
        paced.offer(90, now=i * 0.1)  # exactly the request rate, under the token rate
    assert paced.overshoot() == {"rpm": 0.0, "tpm": 0.0}

    flood = OfferedLoad(specs, now=0.0)
    for _ in range(25):
        flood.offer(10, now=0.0)  # 25 requests at once against a burst of 10
    assert flood.overshoot() == {"rpm": pytest.approx(15.0), "tpm": 0.0}


def test_offered_load_allows_one_oversized_request_from_a_full_bucket() -> None:
    load = OfferedLoad(bucket_specs(rpm=None, rps=None, tpm=6_000, burst_s=1.0), now=0.0)
    load.offer(250, now=0.0)  # what the enforced bucket admits
    assert load.overshoot()["tpm"] == 0.0
    load.offer(100, now=2.0)  # the debt of 150 is repaid to +50: 50 short of the 100 needed
    assert load.overshoot()["tpm"] == pytest.approx(50.0)


def test_sliding_windows_find_the_busiest_interval() -> None:
    window = SlidingWindowMax(1.0)
    for t in (0.0, 0.5, 0.9, 1.2, 1.3, 1.4, 3.0):
        window.add(t, tokens=10)
    # (0.4, 1.4] holds 0.5, 0.9, 1.2, 1.3, 1.4
    assert window.max_requests == 5 and window.max_tokens == 50


def test_stats_count_accepted_requests_per_second() -> None:
    recorder = StatsRecorder(now=100.0)
    for t in (100.1, 100.2, 101.5, 103.9):
        recorder.accept(t, prompt_tokens=7, completion_tokens=3)
    snapshot = recorder.snapshot(now=104.0, overshoot_by_limit={"rpm": 2.5, "tpm": 0.0})
    assert snapshot.accepted_per_second == (2, 1, 0, 1)
    assert snapshot.accepted_tokens == 40 and snapshot.max_requests_1s == 2 and snapshot.max_tokens_60s == 40
    assert snapshot.overshoot_requests == 2.5 and snapshot.overshoot_tokens == 0.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.02, "20ms"),
        (0.4999, "500ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (360.0, "6m0s"),
        (3723.25, "1h2m3.25s"),
    ],
)
def test_durations_are_formatted_as_openai_does(seconds: float, text: str) -> None:
    assert format_openai_duration(seconds) == text


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after_headers(0.1) == {"Retry-After": "1", "retry-after-ms": "100"}
    assert retry_after_headers(2.01) == {"Retry-After": "3", "retry-after-ms": "2010"}


def test_header_styles_name_the_same_values_differently() -> None:
    limiter = RateLimiter(bucket_specs(rpm=600, rps=None, tpm=60_000, burst_s=1.0), now=0.0)
    limiter.admit(400, now=0.0)
    requests, tokens = limiter.request_state(0.0), limiter.token_state(0.0)
    assert rate_limit_headers("openai", requests, tokens) == {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "100ms",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": "600",
        "x-ratelimit-reset-tokens": "400ms",
    }
    assert rate_limit_headers("moonshot", requests, tokens) == {
        "X-RateLimit-Limit": "600",
        "X-RateLimit-Remaining": "9",
        "X-RateLimit-Reset": "0.1",
        "X-RateLimit-Limit-Tokens": "60000",
        "X-RateLimit-Remaining-Tokens": "600",
        "X-RateLimit-Reset-Tokens": "0.4",
    }
    assert rate_limit_headers("none", requests, tokens) == {}


async def test_fifo_slots_hand_over_in_arrival_order_and_skip_abandoned_waiters() -> None:
    slots = FifoSlots(1)
    assert slots.try_take()
    first, second, third = slots.enqueue(), slots.enqueue(), slots.enqueue()
    assert not slots.try_take()  # nobody jumps the queue
    slots.abandon(second)
    slots.release(10.0)
    assert first.done() and not third.done()
    assert first.result() == 10.0  # the waiter learns when its slot came free, to start its answer time there
    slots.release(10.5)
    assert third.done() and slots.in_use == 1
    slots.abandon(third)  # it had the slot: abandoning passes it on (nobody waits, so it is freed)
    assert slots.in_use == 0 and slots.try_take()
    fourth = slots.enqueue()
    fifth = slots.enqueue()
    slots.abandon(fourth)
    slots.release(11.0)
    assert fifth.result() == 11.0
    await asyncio.sleep(0)
