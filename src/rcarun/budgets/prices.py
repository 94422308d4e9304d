"""What a call costs in USD, from a backbone's price table.

Prices are per million tokens, lower for cache hits, and may change by UTC time of day (DeepSeek's off-peak
hours); a reservation takes the worst case, as neither the hits nor the hour of completion are known yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time

from rcarun.backends.types import Usage
from rcarun.errors import ConfigError

__all__ = ["Price", "PriceTable", "PriceWindow"]

_TOKENS_PER_PRICE_UNIT = 1_000_000


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million uncached prompt, cached prompt and completion (reasoning included) tokens."""

    input_per_mtok: float
    cached_input_per_mtok: float
    output_per_mtok: float

    def __post_init__(self) -> None:
        if min(self.input_per_mtok, self.cached_input_per_mtok, self.output_per_mtok) < 0:
            raise ConfigError(f"prices must be >= 0, got {self}")

    def cost_usd(self, usage: Usage) -> float:
        """Uncached prompt x input + cached x cached input + completion x output."""
        cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        uncached = usage.prompt_tokens - cached
        return (
            uncached * self.input_per_mtok
            + cached * self.cached_input_per_mtok
            + usage.completion_tokens * self.output_per_mtok
        ) / _TOKENS_PER_PRICE_UNIT

    def worst_case_usd(self, prompt_tokens: int, max_tokens: int) -> float:
        """Cost if nothing is cached and the whole output budget is used."""
        return (
            prompt_tokens * max(self.input_per_mtok, self.cached_input_per_mtok)
            + max_tokens * self.output_per_mtok
        ) / _TOKENS_PER_PRICE_UNIT


@dataclass(frozen=True, slots=True)
class PriceWindow:
    """A price in force from ``start`` to ``end`` (exclusive), UTC time of day; ``end <= start`` wraps midnight.
    ``weekdays`` (0 = Monday; None: all) are the days a window starts on (Friday 22:00-06:00 covers Saturday 02:00)."""

    start: time
    end: time
    price: Price
    weekdays: frozenset[int] | None = None

    def __post_init__(self) -> None:
        for moment in (self.start, self.end):
            offset = moment.utcoffset()
            if offset is not None and offset.total_seconds() != 0:
                raise ConfigError(f"price window times are UTC times of day, got {moment.isoformat()}")
        if _naive(self.start) == _naive(self.end):
            raise ConfigError(f"price window {self.start.isoformat()}-{self.end.isoformat()} is empty")
        if self.weekdays is not None and (not self.weekdays or not self.weekdays <= frozenset(range(7))):
            raise ConfigError(
                f"price window weekdays must be a non-empty set of 0 (Monday) .. 6, got {self.weekdays}"
            )

    def applies(self, at: datetime) -> bool:
        """Whether the window is in force at the UTC moment ``at`` (time of day and, if set, weekday)."""
        moment = at.time()
        if not self.contains(moment):
            return False
        if self.weekdays is None:
            return True
        started_yesterday = _naive(self.end) <= _naive(self.start) and moment < _naive(self.end)
        return (at.weekday() - started_yesterday) % 7 in self.weekdays

    def contains(self, moment: time) -> bool:
        """Whether the UTC time of day ``moment`` falls inside the window."""
        start, end, moment = _naive(self.start), _naive(self.end), _naive(moment)
        if start < end:
            return start <= moment < end
        return moment >= start or moment < end


@dataclass(frozen=True, slots=True)
class PriceTable:
    """A backbone's prices: the default, overridden by the first window that contains the time of day."""

    default: Price
    windows: tuple[PriceWindow, ...] = ()

    def price_at(self, at: datetime) -> Price:
        """The price in force at ``at``; `ValueError` for a naive time (it would be read in the local zone)."""
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError("price lookups need a timezone-aware datetime")
        utc = at.astimezone(UTC)
        for window in self.windows:
            if window.applies(utc):
                return window.price
        return self.default

    def cost_usd(self, usage: Usage, at: datetime) -> float:
        """USD for ``usage`` billed at ``at``."""
        return self.price_at(at).cost_usd(usage)

    def worst_case_usd(self, prompt_tokens: int, max_tokens: int) -> float:
        """The most the call could cost at any time of day, for reservations."""
        return max(
            price.worst_case_usd(prompt_tokens, max_tokens)
            for price in (self.default, *(window.price for window in self.windows))
        )


def _naive(moment: time) -> time:
    return moment.replace(tzinfo=None)
