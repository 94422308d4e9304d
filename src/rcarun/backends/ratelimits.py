"""Rate-limit headers turned into numbers, so that budgets can pause on facts rather than guesses.

Providers disagree on names (data in `Preset.rate_limit_headers`) and on units (Go durations, seconds, Unix
times, HTTP dates); this module knows the formats. Sources: docs/reliability.md ("Rate-limit headers").
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

from rcarun.backends.types import RateLimitInfo

__all__ = [
    "longest_reset_s",
    "parse_duration_s",
    "parse_rate_limit_headers",
    "parse_retry_after_s",
]

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")
_SECONDS_PER_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# A reset value this large cannot be a duration in seconds (it would be 30+ years): it is a Unix timestamp.
_EPOCH_THRESHOLD_S = 1_000_000_000.0


def parse_duration_s(value: str, *, now: float | None = None) -> float | None:
    """Seconds from ``"6m0s"``, ``"20ms"``, ``"1h2m"``, plain ``"30"``, or a Unix time (the time left until it,
    never negative); None for anything unparseable."""
    text = value.strip()
    if not text:
        return None
    try:
        plain = float(text)
    except ValueError:
        pass
    else:
        if plain != plain or plain < 0:  # NaN or negative
            return None
        if plain >= _EPOCH_THRESHOLD_S:
            return max(0.0, plain - (time.time() if now is None else now))
        return plain
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
        position = match.end()
    if position != len(text) or position == 0:
        return None
    return total


def parse_retry_after_s(value: str, *, now: float | None = None) -> float | None:
    """Seconds from a Retry-After value: delta-seconds or an HTTP date (RFC 9110); never negative."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _parse_count(value: str) -> int | None:
    try:
        return int(float(value.strip()))
    except ValueError:
        return None


_FIELD_PARSERS: dict[str, Callable[[str, float | None], float | int | None]] = {
    "limit_requests": lambda value, now: _parse_count(value),
    "remaining_requests": lambda value, now: _parse_count(value),
    "limit_tokens": lambda value, now: _parse_count(value),
    "remaining_tokens": lambda value, now: _parse_count(value),
    "reset_requests_s": lambda value, now: parse_duration_s(value, now=now),
    "reset_tokens_s": lambda value, now: parse_duration_s(value, now=now),
}


def parse_rate_limit_headers(
    headers: Mapping[str, str],
    names: Mapping[str, tuple[str, ...]],
    *,
    now: float | None = None,
) -> RateLimitInfo | None:
    """The headers (lower-case names) a preset names, as a `RateLimitInfo`, or None when none is present;
    ``retry-after-ms`` wins over ``Retry-After`` (more precise). ``now`` is pinned by tests."""
    values: dict[str, float | int | None] = {}
    for field_name, candidates in names.items():
        parse = _FIELD_PARSERS[field_name]
        for header in candidates:
            raw = headers.get(header)
            if raw is not None:
                values[field_name] = parse(raw, now)
                break
    retry_after_s: float | None = None
    retry_after_ms = headers.get("retry-after-ms")
    if retry_after_ms is not None:
        try:
            milliseconds = float(retry_after_ms.strip())
        except ValueError:
            milliseconds = float("nan")
        retry_after_s = max(0.0, milliseconds / 1000.0) if milliseconds == milliseconds else None
    if retry_after_s is None and "retry-after" in headers:
        retry_after_s = parse_retry_after_s(headers["retry-after"], now=now)
    if retry_after_s is None and not any(value is not None for value in values.values()):
        return None
    return RateLimitInfo(
        limit_requests=_as_int(values.get("limit_requests")),
        remaining_requests=_as_int(values.get("remaining_requests")),
        reset_requests_s=_as_float(values.get("reset_requests_s")),
        limit_tokens=_as_int(values.get("limit_tokens")),
        remaining_tokens=_as_int(values.get("remaining_tokens")),
        reset_tokens_s=_as_float(values.get("reset_tokens_s")),
        retry_after_s=retry_after_s,
    )


def longest_reset_s(info: RateLimitInfo | None) -> float | None:
    """The longest of the request and token reset times (what a 429 should wait for at least), if any."""
    if info is None:
        return None
    resets = [reset for reset in (info.reset_requests_s, info.reset_tokens_s) if reset is not None]
    return max(resets) if resets else None


def _as_int(value: float | int | None) -> int | None:
    return None if value is None else int(value)


def _as_float(value: float | int | None) -> float | None:
    return None if value is None else float(value)
