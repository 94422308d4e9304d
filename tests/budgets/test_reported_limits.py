"""A provider that reports a lower limit than the one declared is believed: the gate paces to its number."""

from __future__ import annotations

import asyncio

import pytest

from rcarun.backends.types import RateLimitInfo
from rcarun.budgets import BackboneGate, BackboneLimits, RateLimiter

from .conftest import run_virtual


def test_a_lower_reported_request_limit_slows_admission_to_it() -> None:
    # Declared 600/min (10/s), burst 1 s less the 0.05-s jitter allowance: 9.5 requests at once.
    backbone = BackboneGate("b", BackboneLimits(concurrency=100, rpm=600.0, burst_s=1.0))

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        # The provider says 300/min (5/s): from now on the bucket refills at 5/s and holds 4.75 at most.
        backbone.on_rate_limit_headers(RateLimitInfo(limit_requests=300, remaining_requests=200))
        times: list[float] = []

        async def one() -> None:
            async with backbone.admit(1, 1):
                times.append(loop.time())

        await asyncio.gather(*(one() for _ in range(24)))
        return times

    times = run_virtual(main)
    # 4 at once (4.75 in the bucket), then one every 0.2 s: the 24th at (24 - 4.75) / 5 = 3.85 s.
    assert times[:4] == [0.0] * 4
    assert times[-1] == pytest.approx(3.85)


def test_reported_limits_never_raise_the_declared_ones_nor_touch_undeclared_ones() -> None:
    limiter = RateLimiter(600.0, None, burst_s=1.0, clock=lambda: 0.0)

    assert not limiter.lower_limits(1_200.0, None)
    assert not limiter.lower_limits(600.0, 50_000.0)
    assert limiter.requests_per_minute == pytest.approx(600.0)
    assert limiter.tokens_per_minute is None
    assert limiter.lower_limits(300.0, None)
    assert limiter.requests_per_minute == pytest.approx(300.0)
