"""Rate-limit headers in the dialects real backbones speak, so clients' header parsing is tested against them.

- "openai": ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``; resets are durations in OpenAI's
  (Go-like) format: "20ms", "1s", "1.5s", "6m0s".
- "moonshot": Kimi's documentation names ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and
  ``X-RateLimit-Reset`` (https://www.kimi.com/help/kimi-api/api-rate-limits) without saying how the reset is
  written or naming token headers. Our choice, documented here: those three describe the request limit, the
  reset is seconds until the bucket is full as a plain decimal number ("0.5", "6"), and the token limit uses
  the same names with a ``-Tokens`` suffix (``X-RateLimit-Limit-Tokens`` ...).
- "none": no rate-limit headers at all, as DeepSeek.

Values describe the token bucket truthfully: "remaining" is how many whole requests (tokens) would be admitted
right now, "reset" is the time until the bucket is full again, "limit" is the declared per-period limit. The
request headers describe the rpm bucket when rpm is declared, else the rps bucket (then "limit" is per
second). A 429 additionally carries ``Retry-After`` (whole seconds, at least 1) and ``retry-after-ms``.
"""

from __future__ import annotations

import math

from .config import HeaderStyle
from .limits import BucketState

__all__ = ["format_openai_duration", "rate_limit_headers", "retry_after_headers"]


def format_openai_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in ``x-ratelimit-reset-*``: "20ms", "1s", "1.5s", "6m0s", "1h2m3s"."""
    milliseconds = round(seconds * 1000)
    if milliseconds <= 0:
        return "0s"
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    hours, rest_ms = divmod(milliseconds, 3_600_000)
    minutes, rest_ms = divmod(rest_ms, 60_000)
    secs = _trim_decimal(rest_ms / 1000)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _trim_decimal(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def rate_limit_headers(
    style: HeaderStyle, requests: BucketState | None, tokens: BucketState | None
) -> dict[str, str]:
    """The rate-limit headers of one response in ``style`` (empty for "none" or when no limit is declared)."""
    headers: dict[str, str] = {}
    if style == "openai":
        if requests is not None:
            headers["x-ratelimit-limit-requests"] = str(requests.spec.limit)
            headers["x-ratelimit-remaining-requests"] = str(requests.remaining)
            headers["x-ratelimit-reset-requests"] = format_openai_duration(requests.reset_s)
        if tokens is not None:
            headers["x-ratelimit-limit-tokens"] = str(tokens.spec.limit)
            headers["x-ratelimit-remaining-tokens"] = str(tokens.remaining)
            headers["x-ratelimit-reset-tokens"] = format_openai_duration(tokens.reset_s)
    elif style == "moonshot":
        if requests is not None:
            headers["X-RateLimit-Limit"] = str(requests.spec.limit)
            headers["X-RateLimit-Remaining"] = str(requests.remaining)
            headers["X-RateLimit-Reset"] = _trim_decimal(requests.reset_s)
        if tokens is not None:
            headers["X-RateLimit-Limit-Tokens"] = str(tokens.spec.limit)
            headers["X-RateLimit-Remaining-Tokens"] = str(tokens.remaining)
            headers["X-RateLimit-Reset-Tokens"] = _trim_decimal(tokens.reset_s)
    return headers


def retry_after_headers(wait_s: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (at least 1, rounded up) and ``retry-after-ms``."""
    return {
        "Retry-After": str(max(1, math.ceil(wait_s))),
        "retry-after-ms": str(max(1, math.ceil(wait_s * 1000))),
    }
