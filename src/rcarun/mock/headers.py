"""Rate-limit headers in the dialects real backbones speak ("openai", "moonshot", "none"), so that clients'
header parsing is tested against them; docs/simulator.md spells each out. Values describe the token bucket
truthfully; a 429 adds ``Retry-After`` (whole seconds, at least 1) and ``retry-after-ms``.
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
