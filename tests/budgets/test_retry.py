"""RetryPolicy: one decision per error class; Retry-After vs reset vs backoff; attempts run out."""

from __future__ import annotations

import math
import random

import pytest

from rcarun.budgets import RetryDecision, RetryPolicy
from rcarun.errors import (
    AuthError,
    BadRequest,
    CallError,
    ConfigError,
    ContextOverflow,
    MalformedResponse,
    QuotaExhausted,
    RateLimited,
    ServerError,
    TransportError,
)


def no_jitter(**overrides: float) -> RetryPolicy:
    return RetryPolicy(jitter=0.0, **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error", [ServerError("502", status=502), TransportError("reset"), MalformedResponse("not json")]
)
def test_transient_errors_retry_with_exponential_backoff(error: CallError) -> None:
    policy = no_jitter(base_s=0.5, cap_s=3.0)
    delays = [policy.decide(error, attempt).delay_s for attempt in range(1, 6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    decision = policy.decide(error, 1)
    assert decision.retry and decision.pause_backbone_s == 0 and not decision.shrink_concurrency


@pytest.mark.parametrize(
    "error",
    [
        BadRequest("bad", status=400),
        ContextOverflow("too long", status=400),
        AuthError("no", status=401),
        QuotaExhausted("out of credit", status=429),
    ],
)
def test_fatal_errors_are_not_retried(error: CallError) -> None:
    assert RetryPolicy().decide(error, 1) == RetryDecision(retry=False)


def test_rate_limit_pauses_for_the_longest_of_retry_after_reset_and_backoff() -> None:
    policy = no_jitter(base_s=1.0)
    by_retry_after = policy.decide(RateLimited("429", retry_after_s=7.0, reset_s=2.5), 1)
    assert by_retry_after == RetryDecision(
        retry=True, delay_s=7.0, pause_backbone_s=7.0, shrink_concurrency=True, asked_s=7.0
    )
    assert policy.decide(RateLimited("429", retry_after_s=1.0, reset_s=12.0), 1).pause_backbone_s == 12.0
    # Nothing from the provider, or less than the backoff (8 s at attempt 4): the backoff wins.
    assert policy.decide(RateLimited("429"), 4).pause_backbone_s == 8.0
    assert policy.decide(RateLimited("429", retry_after_s=2.0), 4).pause_backbone_s == 8.0


@pytest.mark.parametrize(
    ("retry_after_s", "reset_s"),
    [(86_400.0, None), (None, 3.2e9), (math.inf, None), (301.0, 2.0), (2.0, 99_999.0)],
)
def test_a_provider_asking_for_more_than_max_pause_stops_the_backbone_instead_of_pausing_it(
    retry_after_s: float | None, reset_s: float | None
) -> None:
    decision = no_jitter(max_pause_s=300.0).decide(
        RateLimited("429", retry_after_s=retry_after_s, reset_s=reset_s), 1
    )
    assert decision.stop_backbone and not decision.retry
    assert decision.pause_backbone_s == 0.0 and decision.delay_s == 0.0
    assert decision.asked_s == max(retry_after_s or 0.0, reset_s or 0.0)


def test_a_pause_up_to_max_pause_is_honoured_and_backoff_never_exceeds_it() -> None:
    policy = no_jitter(base_s=10.0, cap_s=1_000.0, max_pause_s=30.0)
    assert policy.decide(RateLimited("429", retry_after_s=30.0), 1).pause_backbone_s == 30.0
    assert policy.decide(RateLimited("429"), 6).pause_backbone_s == 30.0  # backoff of 320 s, capped
    assert not policy.decide(RateLimited("429", retry_after_s=30.0), 1).stop_backbone


@pytest.mark.parametrize("max_pause_s", [0.0, -1.0, math.inf, math.nan])
def test_max_pause_must_be_finite_and_positive(max_pause_s: float) -> None:
    with pytest.raises(ConfigError, match="max_pause_s"):
        RetryPolicy(max_pause_s=max_pause_s)


def test_exhausted_attempts_stop_retrying_but_a_rate_limit_still_slows_the_backbone() -> None:
    policy = no_jitter(max_attempts=3)
    assert policy.decide(ServerError("500"), 2).retry
    assert policy.decide(ServerError("500"), 3) == RetryDecision(retry=False)
    last = policy.decide(RateLimited("429", retry_after_s=5.0), 3)
    assert not last.retry and last.pause_backbone_s == 5.0 and last.shrink_concurrency


def test_jitter_stays_within_its_band_and_under_the_cap() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=10.0, jitter=0.25, rng=random.Random(7))
    samples = [policy.backoff_s(3) for _ in range(2_000)]  # nominal 4 s
    assert 3.0 <= min(samples) < 3.1 and 4.9 < max(samples) <= 5.0
    assert len(set(samples)) > 1_000  # actually spread, so retries do not march in lockstep
    assert max(policy.backoff_s(50) for _ in range(100)) <= 10.0
    assert policy.backoff_s(10_000) <= 10.0  # no overflow for absurd attempt numbers


def test_an_unclassified_call_error_is_not_retried() -> None:
    assert not RetryPolicy().decide(CallError("?"), 1).retry
