"""After a refusal the gate paces to the provider's real limit instead of pausing until its window is empty.

Issue 17: against a server that counts a strict sliding minute and sends OpenAI's ``x-ratelimit-reset-*`` (the
time until everything counted has left the window), one 429 used to stop rcarun for about a minute. Here a
strict-window server runs in virtual time (`conftest.run_virtual`), so every figure is exact and nothing waits:
it counts arrivals in the last 60 s, refuses the one over the limit, and tells it each way providers do. The
client is a handful of workers around one `BackboneGate`, as the runner's session uses it.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import pytest

from rcarun.backends.types import RateLimitInfo, Usage
from rcarun.budgets import (
    BackboneGate,
    BackboneLimits,
    RateLimiter,
    RetryPolicy,
)
from rcarun.errors import RateLimited

from .conftest import run_virtual

Signal = Literal["bare", "openai-headers", "retry-after"]
_WINDOW_S = 60.0
_LATENCY_S = 0.05


@dataclass
class WindowServer:
    """A strict sliding minute: an arrival is refused when the last 60 s already hold ``rpm`` accepted ones
    (``counts_refusals``: ``rpm`` arrivals, refused ones included, as OpenAI says it counts)."""

    rpm: int
    signal: Signal
    counts_refusals: bool = False
    accepted: deque[float] = field(default_factory=deque)
    log: list[tuple[float, bool]] = field(default_factory=list)

    def arrive(self, at: float) -> RateLimited | None:
        while self.accepted and self.accepted[0] <= at - _WINDOW_S:
            self.accepted.popleft()
        ok = len(self.accepted) < self.rpm
        self.log.append((at, ok))
        if ok or self.counts_refusals:
            self.accepted.append(at)
        if ok:
            return None
        until_one_fits = self.accepted[0] + _WINDOW_S - at
        until_empty = self.accepted[-1] + _WINDOW_S - at  # OpenAI's reset: back to the initial state
        if self.signal == "bare":
            return RateLimited("429")
        if self.signal == "retry-after":
            return RateLimited("429", retry_after_s=float(math.ceil(until_one_fits)))
        info = RateLimitInfo(limit_requests=self.rpm, remaining_requests=0, reset_requests_s=until_empty)
        return RateLimited("429", reset_s=until_empty, rate_limit=info)

    def goodput(self, start: float, end: float) -> float:
        """Accepted arrivals in [start, end) as a share of the limit over that span."""
        accepted = sum(1 for at, ok in self.log if ok and start <= at < end)
        return accepted / (self.rpm * (end - start) / _WINDOW_S)

    def refusals(self, start: float, end: float) -> tuple[int, int]:
        inside = [ok for at, ok in self.log if start <= at < end]
        return inside.count(False), len(inside)

    def first_refusal(self) -> float | None:
        return next((at for at, ok in self.log if not ok), None)

    def busiest_minute(self) -> int:
        times = [at for at, ok in self.log if ok]
        most, start = 0, 0
        for end, at in enumerate(times):
            while times[start] <= at - _WINDOW_S:
                start += 1
            most = max(most, end - start + 1)
        return most


def _run(
    server: WindowServer,
    limits: BackboneLimits,
    seconds: float,
    workers: int = 8,
    latency_s: float = _LATENCY_S,
) -> BackboneGate:
    gate = BackboneGate("b", limits, retry=RetryPolicy(max_attempts=1_000, jitter=0.0))

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            attempt = 0
            while loop.time() < seconds:
                async with gate.admit(100, 100) as ticket:
                    await asyncio.sleep(latency_s / 2)
                    refusal = server.arrive(loop.time())
                    await asyncio.sleep(latency_s / 2)
                    if refusal is None:
                        ticket.settle(Usage(prompt_tokens=100, completion_tokens=10))
                        attempt = 0
                        continue
                    attempt += 1
                    decision = gate.on_error(refusal, attempt, ticket)
                await asyncio.sleep(decision.delay_s)

        await asyncio.gather(*(worker() for _ in range(workers)))

    run_virtual(main)
    return gate


@pytest.mark.parametrize("signal", ["openai-headers", "retry-after"])
def test_an_undeclared_lower_limit_is_back_at_full_allowance_within_30_s_of_the_first_refusal(
    signal: Signal,
) -> None:
    # The client is told 400 requests/min; the server allows 200 and says so only by refusing.
    server = WindowServer(rpm=200, signal=signal)
    gate = _run(server, BackboneLimits(concurrency=8, rpm=400.0), seconds=300.0)
    first = server.first_refusal()
    assert first is not None
    # The window the server filled before its first refusal must drain whatever any client does: the server
    # accepts nothing until the first minute's arrivals leave it. Measured from then on:
    settled = max(first, server.log[0][0] + _WINDOW_S) + 30.0
    # Over whole windows: the client sends again what leaves the server's window as fast as it leaves, so each
    # minute repeats the first one's shape (a burst at the declared pace, then quiet), full in every window.
    end = settled + 3 * _WINDOW_S
    assert server.goodput(settled, end) >= 0.95
    assert server.busiest_minute() <= 200
    refused, total = server.refusals(settled, 300.0)
    assert refused < 0.02 * total
    assert gate.learned_limits[0] is not None and gate.learned_limits[0] <= 400.0


def test_an_undeclared_limit_told_by_bare_refusals_is_learned_at_the_limit_and_tested_every_other_minute() -> (
    None
):
    # Bare 429s state nothing: the rate is learned from what the refusing minute accepted (the server's limit),
    # raised by a quarter after a refusal-free minute, refused again, learned again. That probing costs about a
    # tenth of the requests refused and 7 % of the goodput (virtual time: 0.935 over three windows).
    server = WindowServer(rpm=200, signal="bare")
    gate = _run(server, BackboneLimits(concurrency=8, rpm=400.0), seconds=300.0)
    first = server.first_refusal()
    assert first is not None
    settled = max(first, server.log[0][0] + _WINDOW_S) + 30.0
    assert server.goodput(settled, settled + 3 * _WINDOW_S) >= 0.9
    refused, total = server.refusals(settled, 300.0)
    assert refused < 0.12 * total
    learned = [change.rpm for change in gate.take_rate_changes() if change.kind == "learned"]
    assert len(learned) >= 2
    assert learned == pytest.approx([200.0] * len(learned), rel=0.02)


def test_declared_limits_are_kept_in_every_minute_from_the_start() -> None:
    # Declared = enforced: a bucket that starts full and refills at limit / 60 would send one request too many
    # in the first minute; the window-safe refill never does.
    server = WindowServer(rpm=300, signal="openai-headers")
    _run(server, BackboneLimits(concurrency=8, rpm=300.0), seconds=200.0)
    assert server.first_refusal() is None
    assert server.busiest_minute() <= 300
    assert server.goodput(20.0, 200.0) >= 0.97


def test_a_reset_within_the_window_is_an_upper_bound_not_the_pause() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=4))
    info = RateLimitInfo(limit_requests=200, remaining_requests=0, reset_requests_s=45.0)

    async def main() -> float:
        return gate.on_error(RateLimited("429", reset_s=45.0, rate_limit=info), 1).pause_backbone_s

    pause = run_virtual(main)
    # One more request fits after 60 / 200 s at the stated limit (the policy's backoff may be longer).
    assert pause < 1.0
    assert gate.learned_limits == (200, None)


def test_a_reset_beyond_the_window_belongs_to_a_longer_limit_and_stops_the_backbone() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=4), retry=RetryPolicy(max_pause_s=300.0))
    info = RateLimitInfo(limit_requests=10_000, remaining_requests=0, reset_requests_s=86_400.0)

    async def main() -> bool:
        return gate.on_error(RateLimited("429", reset_s=86_400.0, rate_limit=info), 1).stop_backbone

    assert run_virtual(main)


def test_retry_after_is_the_pause_when_the_provider_sends_it() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=4), retry=RetryPolicy(jitter=0.0))

    async def main() -> float:
        return gate.on_error(RateLimited("429", retry_after_s=7.0), 1).pause_backbone_s

    assert run_virtual(main) == pytest.approx(7.0)


def test_the_window_safe_limiter_admits_at_most_the_limit_in_any_minute_even_after_idling() -> None:
    limiter = RateLimiter(120.0, None, burst_s=2.0, window_s=60.0)

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        times: list[float] = []
        for phase_end in (70.0, 100.0, 200.0):
            while loop.time() < phase_end:
                await limiter.acquire(0)
                times.append(loop.time())
            await asyncio.sleep(5.0)  # idle: the bucket refills to its burst
        return times

    times = run_virtual(main)
    start = 0
    for end, at in enumerate(times):
        while times[start] <= at - 60.0:
            start += 1
        assert end - start + 1 <= 120


def _accept_then_refuse(gate: BackboneGate, refusal: RateLimited) -> tuple[float | None, float | None]:
    async def main() -> tuple[float | None, float | None]:
        for _ in range(120):
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(0.5)
        for _ in range(20):
            gate.on_error(refusal, 1)
            await asyncio.sleep(0.1)
        return gate.learned_limits

    return run_virtual(main)


def test_a_refusal_that_asks_for_a_short_wait_sets_no_limit() -> None:
    # Retry-After 0.1 s after 120 calls a minute: not a full window (that would ask for the time until its oldest
    # arrival leaves), so there is nothing to learn; refusals that are not about the rate never ratchet it down.
    gate = BackboneGate("b", BackboneLimits(concurrency=8), retry=RetryPolicy(jitter=0.0))
    assert _accept_then_refuse(gate, RateLimited("429", retry_after_s=0.1)) == (None, None)


def test_where_refusals_mean_concurrency_no_limit_is_learned_from_them() -> None:
    limits = BackboneLimits(concurrency=8, learns_from_refusals=False)
    gate = BackboneGate("b", limits, retry=RetryPolicy(jitter=0.0))
    assert _accept_then_refuse(gate, RateLimited("429")) == (None, None)


def test_repeated_bare_refusals_lower_a_learned_limit_at_most_once_a_window() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=8), retry=RetryPolicy(jitter=0.0))
    rpm, _ = _accept_then_refuse(gate, RateLimited("429"))
    # 120 accepted in the last minute; twenty refusals in two seconds do not lower it twenty times.
    assert rpm == pytest.approx(120.0, rel=0.02)


def test_deepseeks_preset_reads_a_bare_429_as_concurrency_and_learns_no_rate_from_it() -> None:
    from rcarun.backends import get_preset

    assert get_preset("deepseek").refusals_count_a_window is False
    assert get_preset("openai-compatible").refusals_count_a_window is True
