"""Rate-limit header formats parse into exact seconds and counts."""

from __future__ import annotations

import pytest

from rcarun.backends import RateLimitInfo, get_preset, longest_reset_s, parse_rate_limit_headers
from rcarun.backends.ratelimits import parse_duration_s, parse_retry_after_s

NOW = 1_750_000_000.0  # a pinned Unix time: 2025-06-15T15:06:40Z


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1.5s", 1.5),
        ("1h2m3.5s", 3723.5),
        ("2m", 120.0),
        ("0s", 0.0),
        ("30", 30.0),
        ("0.25", 0.25),
        (" 7s ", 7.0),
        (str(NOW + 42), 42.0),  # a Unix timestamp: time left until it
        (str(NOW - 5), 0.0),  # already past: never negative
    ],
)
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration_s(text, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "1s2", "-3", "m5", "nan"])
def test_unparseable_durations_are_none(text: str) -> None:
    assert parse_duration_s(text, now=NOW) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("12", 12.0),
        ("0.5", 0.5),
        ("Sun, 15 Jun 2025 15:07:10 GMT", 30.0),  # HTTP date 30 s after NOW
        ("Sun, 15 Jun 2025 15:00:00 GMT", 0.0),  # in the past
    ],
)
def test_retry_after_seconds_or_http_date(text: str, seconds: float) -> None:
    assert parse_retry_after_s(text, now=NOW) == pytest.approx(seconds)


def test_retry_after_garbage_is_none() -> None:
    assert parse_retry_after_s("whenever", now=NOW) is None


def test_openai_headers() -> None:
    headers = {
        "x-ratelimit-limit-requests": "5000",
        "x-ratelimit-remaining-requests": "4999",
        "x-ratelimit-reset-requests": "12ms",
        "x-ratelimit-limit-tokens": "800000",
        "x-ratelimit-remaining-tokens": "799000",
        "x-ratelimit-reset-tokens": "6m0s",
        "retry-after": "2",
    }
    info = parse_rate_limit_headers(headers, get_preset("openai").rate_limit_headers, now=NOW)
    assert info == RateLimitInfo(
        limit_requests=5000,
        remaining_requests=4999,
        reset_requests_s=pytest.approx(0.012),
        limit_tokens=800000,
        remaining_tokens=799000,
        reset_tokens_s=360.0,
        retry_after_s=2.0,
    )
    assert longest_reset_s(info) == 360.0


def test_moonshot_unsuffixed_headers_count_as_requests() -> None:
    headers = {"x-ratelimit-limit": "200", "x-ratelimit-remaining": "0", "x-ratelimit-reset": str(NOW + 17)}
    info = parse_rate_limit_headers(headers, get_preset("kimi").rate_limit_headers, now=NOW)
    assert info is not None
    assert (info.limit_requests, info.remaining_requests) == (200, 0)
    assert info.reset_requests_s == pytest.approx(17.0)
    assert info.limit_tokens is None and info.retry_after_s is None


def test_retry_after_ms_wins_over_retry_after() -> None:
    info = parse_rate_limit_headers({"retry-after": "3", "retry-after-ms": "1500"}, {}, now=NOW)
    assert info == RateLimitInfo(retry_after_s=1.5)


def test_deepseek_reads_no_limit_headers_but_still_retry_after() -> None:
    names = get_preset("deepseek").rate_limit_headers
    assert parse_rate_limit_headers({"x-ratelimit-limit-requests": "9"}, names, now=NOW) is None
    assert parse_rate_limit_headers({"retry-after": "4"}, names, now=NOW) == RateLimitInfo(retry_after_s=4.0)


def test_no_headers_no_info() -> None:
    assert parse_rate_limit_headers({"content-type": "application/json"}, {}, now=NOW) is None
    assert longest_reset_s(None) is None
