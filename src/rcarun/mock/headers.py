"""Rate-limit headers in the dialects real backbones speak ("openai", "moonshot", "none"), so that clients'
header parsing is tested against them; docs/simulator.md spells each out. Values describe the token bucket
truthfully; a 429 adds ``Retry-After`` (whole seconds, at least 1) and ``retry-after-ms``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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
    dialect = _DIALECTS.get(style)
    if dialect is None:
        return headers
    names, write_reset = dialect
    for state, (limit, remaining, reset) in zip((requests, tokens), names, strict=True):
        if state is not None:
            headers[limit] = str(state.spec.limit)
            headers[remaining] = str(state.remaining)
            headers[reset] = write_reset(state.reset_s)
    return headers


def retry_after_headers(wait_s: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (at least 1, rounded up) and ``retry-after-ms``."""
    return {
        "Retry-After": str(max(1, math.ceil(wait_s))),
        "retry-after-ms": str(max(1, math.ceil(wait_s * 1000))),
    }


# style: the (limit, remaining, reset) header names of the request bucket and the token bucket, and how a reset
# is written.
_DIALECTS: dict[str, tuple[tuple[tuple[str, str, str], ...], Callable[[float], str]]] = {
    "openai": (
        tuple(
            (f"x-ratelimit-limit-{unit}", f"x-ratelimit-remaining-{unit}", f"x-ratelimit-reset-{unit}")
            for unit in ("requests", "tokens")
        ),
        format_openai_duration,
    ),
    "moonshot": (
        tuple(
            (f"X-RateLimit-Limit{suffix}", f"X-RateLimit-Remaining{suffix}", f"X-RateLimit-Reset{suffix}")
            for suffix in ("", "-Tokens")
        ),
        _trim_decimal,
    ),
}
