"""Prices: cost by token kind, time-of-day windows (wrapping midnight) and the worst case for reservations."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta, timezone

import pytest

from rcarun.backends.types import Usage
from rcarun.budgets import Price, PriceTable, PriceWindow
from rcarun.errors import ConfigError

PEAK = Price(input_per_mtok=0.27, cached_input_per_mtok=0.07, output_per_mtok=1.10)
OFF_PEAK = Price(input_per_mtok=0.135, cached_input_per_mtok=0.035, output_per_mtok=0.55)
# DeepSeek-style: off-peak 16:30-00:30 UTC, wrapping midnight.
TABLE = PriceTable(default=PEAK, windows=(PriceWindow(time(16, 30), time(0, 30), OFF_PEAK),))


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, 1, hour, minute, tzinfo=UTC)


def test_cost_counts_uncached_cached_and_completion_with_reasoning_inside() -> None:
    usage = Usage(
        prompt_tokens=1_000_000,
        cached_prompt_tokens=400_000,
        completion_tokens=200_000,
        reasoning_tokens=150_000,
    )
    # 600k x 0.27 + 400k x 0.07 + 200k x 1.10 (reasoning is part of completion, not added again)
    assert PEAK.cost_usd(usage) == pytest.approx(0.162 + 0.028 + 0.22)


@pytest.mark.parametrize(
    ("moment", "price"),
    [
        (at(12), PEAK),
        (at(16, 29), PEAK),
        (at(16, 30), OFF_PEAK),  # start inclusive
        (at(23, 59), OFF_PEAK),
        (at(0, 0), OFF_PEAK),  # wrapped past midnight
        (at(0, 29), OFF_PEAK),
        (at(0, 30), PEAK),  # end exclusive
    ],
)
def test_windows_apply_by_utc_time_of_day_and_wrap_midnight(moment: datetime, price: Price) -> None:
    assert TABLE.price_at(moment) == price


def test_other_timezones_are_converted_to_utc_and_naive_times_refused() -> None:
    beijing = timezone(timedelta(hours=8))
    assert TABLE.price_at(datetime(2026, 3, 2, 0, 45, tzinfo=beijing)) == OFF_PEAK  # 16:45 UTC
    with pytest.raises(ValueError):
        TABLE.price_at(datetime(2026, 3, 1, 12, 0))


def test_cost_uses_the_window_in_force() -> None:
    usage = Usage(prompt_tokens=2_000_000, completion_tokens=1_000_000)
    assert TABLE.cost_usd(usage, at(12)) == pytest.approx(0.54 + 1.10)
    assert TABLE.cost_usd(usage, at(20)) == pytest.approx(0.27 + 0.55)


def test_worst_case_assumes_no_cache_the_whole_budget_and_the_dearest_window() -> None:
    assert TABLE.worst_case_usd(1_000_000, 1_000_000) == pytest.approx(0.27 + 1.10)


def test_invalid_prices_and_windows_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        Price(-1.0, 0.0, 0.0)
    with pytest.raises(ConfigError):
        PriceWindow(time(3), time(3), PEAK)


def test_weekday_windows_follow_the_day_a_window_starts_on() -> None:
    peak = Price(input_per_mtok=2.0, cached_input_per_mtok=0.2, output_per_mtok=8.0)
    off = Price(input_per_mtok=1.0, cached_input_per_mtok=0.1, output_per_mtok=4.0)
    weekdays = frozenset(range(5))  # Monday..Friday
    table = PriceTable(
        default=off,
        windows=(
            PriceWindow(start=time(1), end=time(4), price=peak, weekdays=weekdays),
            PriceWindow(
                start=time(22), end=time(2), price=peak, weekdays=frozenset({4})
            ),  # Friday night only
        ),
    )
    friday = datetime(2026, 11, 27, tzinfo=UTC)  # a Friday
    assert table.price_at(friday.replace(hour=2)) is peak
    assert table.price_at((friday + timedelta(days=1)).replace(hour=3)) is off  # Saturday 03:00: weekend
    assert (
        table.price_at((friday + timedelta(days=1)).replace(hour=1, minute=30)) is peak
    )  # Friday's 22-02 window
    assert table.price_at((friday + timedelta(days=2)).replace(hour=1, minute=30)) is off  # Sunday
    assert table.price_at(friday.replace(hour=23)) is peak
    assert table.price_at((friday - timedelta(days=1)).replace(hour=23)) is off  # Thursday night


def test_empty_or_out_of_range_weekdays_are_refused() -> None:
    price = Price(input_per_mtok=1.0, cached_input_per_mtok=0.1, output_per_mtok=4.0)
    with pytest.raises(ConfigError):
        PriceWindow(start=time(1), end=time(4), price=price, weekdays=frozenset())
    with pytest.raises(ConfigError):
        PriceWindow(start=time(1), end=time(4), price=price, weekdays=frozenset({7}))
