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
    Budget,
    Price,
    PriceTable,
    RateLimiter,
    RetryPolicy,
    SpendLedger,
)
from rcarun.budgets.limits import Grant
from rcarun.budgets.refusals import RefusalCounting
from rcarun.errors import BudgetExhausted, RateLimited

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


@pytest.mark.parametrize("signal", ["bare", "openai-headers", "retry-after"])
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


def test_a_bare_refusal_learns_what_was_accepted_and_probes_upward_but_never_above_the_declaration() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=64, rpm=600.0), retry=RetryPolicy(jitter=0.0))

    async def main() -> list[float | None]:
        loop = asyncio.get_running_loop()
        seen: list[float | None] = []
        # 90 accepted calls spread over the first 30 s, then a bare 429: 90 in 30 s is 180 per minute.
        for _ in range(90):
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(30.0 / 90)
        gate.on_error(RateLimited("429"), 1)
        seen.append(gate.learned_limits[0])
        # A later refusal with more accepted in the window never raises the limit it set.
        gate.on_error(RateLimited("429"), 1)
        seen.append(gate.learned_limits[0])
        # A refusal-free minute of calls (120 a minute, under the limit) sets a probe 5 % up, one step per
        # quiet window; the limit itself climbs only as requests go over it and are accepted, one at a time.
        end = loop.time() + 61.0
        while loop.time() < end:
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(0.5)
        seen.append(gate.learned_limits[0])
        seen.append(gate._probe_to.get("requests"))
        for _ in range(100):  # back to back: the window fills to the limit, then goes over one at a time
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
        seen.append(gate.learned_limits[0])
        return seen

    learned, again, untested, target, probed = run_virtual(main)
    assert learned == pytest.approx(180.0, rel=0.02)
    assert again is not None and learned is not None and again <= learned
    assert untested == again
    assert target == pytest.approx(again * 1.05)
    assert probed == pytest.approx(again * 1.05)


def test_a_bare_refusal_on_a_token_limit_learns_tokens_in_the_providers_own_count() -> None:
    # Only tokens declared: a bare refusal is about tokens, and the learned limit is what was accepted as the
    # provider metered it (its usage reports), whatever rcarun estimated before sending.
    gate = BackboneGate("b", BackboneLimits(concurrency=8, tpm=1_000_000.0), retry=RetryPolicy(jitter=0.0))

    async def main() -> tuple[float | None, float | None]:
        for _ in range(60):
            async with gate.admit(100, 100) as ticket:
                ticket.settle(Usage(prompt_tokens=900, completion_tokens=100))
            await asyncio.sleep(1.0)
        gate.on_error(RateLimited("429"), 1)
        return gate.learned_limits

    rpm, tpm = run_virtual(main)
    assert rpm is None
    assert tpm == pytest.approx(60 * 1_000, rel=0.03)


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


class PerSecondServer(WindowServer):
    """A per-minute limit also enforced per second (OpenAI's quantized limits): an arrival is refused when the
    last second already holds ``rpm / 60`` accepted ones, or the last minute ``rpm``; refusals are bare."""

    def arrive(self, at: float) -> RateLimited | None:
        while self.accepted and self.accepted[0] <= at - _WINDOW_S:
            self.accepted.popleft()
        in_last_second = sum(1 for accepted_at in self.accepted if accepted_at > at - 1.0)
        ok = len(self.accepted) < self.rpm and in_last_second < self.rpm / _WINDOW_S
        self.log.append((at, ok))
        if ok:
            self.accepted.append(at)
            return None
        return RateLimited("429")


def test_after_a_refusal_what_leaves_the_window_is_sent_again_at_the_declared_pace() -> None:
    # The outside measurement's window [20, 80) s: the first minute's 200 leave the server's window from 60 s
    # on, and the gate sends them again as they leave instead of pacing at 200 / 60 a second (0.63-0.73).
    server = WindowServer(rpm=200, signal="retry-after")
    gate = _run(server, BackboneLimits(concurrency=8, rpm=400.0), seconds=130.0)
    assert gate.limiter.catches_up
    assert server.goodput(20.0, 80.0) >= 0.93
    assert server.busiest_minute() <= 200


def test_refusals_that_go_on_past_a_buckets_refill_read_the_first_window_as_full() -> None:
    # A bare 429 at 29 s after 200 accepted: scaled to a minute that is 413/min, as a bucket provider would
    # allow. But requests sent over a second later are refused too, with nothing accepted: a bucket would have
    # refilled, a full window does not, so the limit is the window's count, learned long before it frees.
    server = WindowServer(rpm=200, signal="bare")
    gate = _run(server, BackboneLimits(concurrency=8, rpm=400.0), seconds=45.0)
    assert gate.learned_limits[0] == pytest.approx(200.0, rel=0.01)
    refused, _ = server.refusals(0.0, 45.0)
    assert refused <= 12


def test_a_probe_refused_at_the_counted_limit_ends_probing_and_sends_its_extra_slowly() -> None:
    # The learned 200/min is probed up 5 % after a quiet minute; the strict window refuses the extra and holds
    # 200 again: that is the provider's limit, so no later minute probes (and draws refusals) again. The extra
    # goes out at 200/min, not at the declared pace, so the probe costs a few refusals, not all it allowed.
    server = WindowServer(rpm=200, signal="bare")
    gate = _run(server, BackboneLimits(concurrency=32, rpm=400.0), seconds=400.0, workers=32)
    first = server.first_refusal()
    assert first is not None
    refused_later = [at for at, ok in server.log if not ok and at > first + 2 * _WINDOW_S]
    assert len(refused_later) <= 5
    assert max(refused_later, default=0.0) < first + 3 * _WINDOW_S
    assert gate.learned_limits[0] == pytest.approx(200.0, rel=0.01)


def test_a_provider_that_meters_per_second_is_detected_and_paced_at_the_limit() -> None:
    server = PerSecondServer(rpm=240, signal="bare")
    gate = _run(server, BackboneLimits(concurrency=8, rpm=480.0), seconds=400.0)
    # Catching up drew a refusal while the window held well under the limit it had counted over a minute.
    assert not gate.limiter.catches_up
    refused, total = server.refusals(120.0, 400.0)
    assert refused < 0.02 * total and total > 100


def test_a_preset_that_meters_finer_than_its_window_paces_a_lowered_limit_from_the_start() -> None:
    from rcarun.backends import get_preset

    assert get_preset("openai").meters_finer_than_window
    assert not get_preset("openai-compatible").meters_finer_than_window
    gate = BackboneGate("b", BackboneLimits(concurrency=8, rpm=400.0, meters_finer_than_window=True))
    assert not gate.limiter.catches_up


@dataclass
class TokenWindowServer:
    """A strict sliding minute of tokens that charges the prompt and the whole output budget at arrival (as
    OpenAI meters), and says so in OpenAI's headers."""

    tpm: int
    accepted: deque[tuple[float, int]] = field(default_factory=deque)
    log: list[tuple[float, bool, int]] = field(default_factory=list)

    def arrive(self, at: float, charge: int) -> RateLimited | None:
        while self.accepted and self.accepted[0][0] <= at - _WINDOW_S:
            self.accepted.popleft()
        used = sum(tokens for _, tokens in self.accepted)
        ok = used + charge <= self.tpm
        self.log.append((at, ok, charge))
        if ok:
            self.accepted.append((at, charge))
            return None
        reset = self.accepted[-1][0] + _WINDOW_S - at
        info = RateLimitInfo(limit_tokens=self.tpm, remaining_tokens=0, reset_tokens_s=reset)
        return RateLimited("429", reset_s=reset, rate_limit=info)

    def goodput(self, start: float, end: float) -> float:
        tokens = sum(charge for at, ok, charge in self.log if ok and start <= at < end)
        return tokens / (self.tpm * (end - start) / _WINDOW_S)

    def refusals(self, start: float, end: float) -> tuple[int, int]:
        inside = [ok for at, ok, _ in self.log if start <= at < end]
        return inside.count(False), len(inside)


def test_a_provider_that_meters_the_output_budget_is_detected_from_its_token_refusal() -> None:
    # The backbone refunds unused output by default; this provider charges 100 + 1,000 at arrival and the calls
    # use 100 + 50, so the refunds would fill its minute early, every minute.
    # 330,000 tokens/min: 300 calls of 1,100 a minute, each a fifth of the client's one-second burst.
    server = TokenWindowServer(tpm=330_000)
    gate = BackboneGate("b", BackboneLimits(concurrency=8, tpm=330_000.0), retry=RetryPolicy(jitter=0.0))

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            attempt = 0
            while loop.time() < 240.0:
                async with gate.admit(100, 1_000) as ticket:
                    await asyncio.sleep(_LATENCY_S)
                    refusal = server.arrive(loop.time(), 1_100)
                    if refusal is None:
                        ticket.settle(Usage(prompt_tokens=100, completion_tokens=50))
                        attempt = 0
                        continue
                    attempt += 1
                    decision = gate.on_error(refusal, attempt, ticket)
                await asyncio.sleep(decision.delay_s)

        await asyncio.gather(*(worker() for _ in range(8)))

    run_virtual(main)
    assert gate.meters_output_budget
    first = next(at for at, ok, _ in server.log if not ok)
    settled = max(first, _WINDOW_S) + 30.0
    assert server.goodput(settled, 240.0) >= 0.95
    refused, total = server.refusals(settled, 240.0)
    assert refused < 0.02 * total


def test_deepseeks_preset_reads_a_bare_429_as_concurrency_and_learns_no_rate_from_it() -> None:
    from rcarun.backends import get_preset

    assert get_preset("deepseek").refusals_count_a_window is False
    assert get_preset("openai-compatible").refusals_count_a_window is True


def test_the_count_of_accepted_calls_is_kept_per_time_slot_not_per_call() -> None:
    # 12,000 calls in 40 s (300 a second, settling out of order): the refusal learns their rate, and what the
    # gate holds for it is a few hundred slot totals, not an entry per call, however fast the backbone goes.
    gate = BackboneGate("b", BackboneLimits(concurrency=64, rpm=100_000.0), retry=RetryPolicy(jitter=0.0))

    async def main() -> tuple[float | None, int]:
        loop = asyncio.get_running_loop()
        for step in range(400):
            tickets = []
            for _ in range(30):
                context = gate.admit(10, 10)
                tickets.append((context, await context.__aenter__()))
            for context, ticket in reversed(tickets):
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
                await context.__aexit__(None, None, None)
            await asyncio.sleep(0.1)
            assert loop.time() == pytest.approx((step + 1) * 0.1)
        held = len(gate._accepted)
        gate.on_error(RateLimited("429"), 1)
        return gate.learned_limits[0], held

    learned, held = run_virtual(main)
    assert learned == pytest.approx(12_000 * 60 / 40, rel=0.01)
    assert held <= 241


@pytest.mark.parametrize(("latency_s", "workers"), [(0.05, 8), (0.5, 32)])
def test_where_the_provider_does_not_count_refusals_their_room_is_sent_again_as_the_window_frees(
    latency_s: float, workers: int
) -> None:
    # The first minute's 200 leave the server's window from 60 s on. The ten or so requests refused around
    # 30 s are not in it (a strict window counts what it accepts): kept in the client's log, they held 5 % of
    # the catch-up back (0.945-0.95 here). One request sent into the room of one of them, accepted, and nothing
    # refused a round trip later, tells the gate; then they all leave its log.
    server = WindowServer(rpm=200, signal="bare")
    gate = _run(server, BackboneLimits(concurrency=workers, rpm=400.0), 130.0, workers, latency_s)
    assert gate._refusals.counted is False
    assert server.goodput(20.0, 80.0) >= 0.97
    assert server.busiest_minute() <= 200
    first = server.first_refusal()
    assert first is not None
    # Nothing refused while the window frees (the learned limit's probe comes a refusal-free minute later).
    assert [at for at, ok in server.log if not ok and first + 10.0 < at < 110.0] == []


@pytest.mark.parametrize(("latency_s", "workers"), [(0.05, 8), (0.5, 32)])
def test_where_the_provider_counts_refusals_one_trial_shows_it_and_refusals_stay_counted(
    latency_s: float, workers: int
) -> None:
    # OpenAI's rule: refused requests count too. The trial's one request (and what was sent beside it in the
    # same round trip) is refused; that is the cost of asking, once, and no limit is learned from it. (A bare
    # 429: a provider that states its limits and reset leaves nothing to ask while the gate waits the reset.)
    server = WindowServer(rpm=200, signal="bare", counts_refusals=True)
    gate = _run(server, BackboneLimits(concurrency=workers, rpm=400.0), 400.0, workers, latency_s)
    assert gate._refusals.counted is True
    assert gate.learned_limits[0] == pytest.approx(200.0, rel=0.01)
    first = server.first_refusal()
    assert first is not None
    trial = [at for at, ok in server.log if not ok and first + 10.0 < at < first + 40.0]
    assert 1 <= len(trial) <= 6
    assert server.goodput(20.0, 80.0) >= 0.9
    assert server.goodput(120.0, 400.0) >= 0.98
    refused, total = server.refusals(first + 40.0, 400.0)
    assert refused < 0.02 * total


def test_a_provider_known_to_count_refusals_is_never_asked() -> None:
    # The openai preset says so from OpenAI's guide: the refused requests stay in the log from the start, no
    # request is sent into their room, and against a server that does count them nothing more is refused.
    from rcarun.backends import get_preset

    assert get_preset("openai").counts_refused_requests is True
    assert get_preset("openai-compatible").counts_refused_requests is None
    server = WindowServer(rpm=200, signal="bare", counts_refusals=True)
    limits = BackboneLimits(concurrency=8, rpm=400.0, counts_refused_requests=True)
    gate = _run(server, limits, 130.0)
    assert gate._refusals.counted is True and not gate._refusals.deciding
    first = server.first_refusal()
    assert first is not None
    # Nothing refused while the window frees (the learned limit's probe comes a refusal-free minute later).
    assert [at for at, ok in server.log if not ok and first + 10.0 < at < first + 55.0] == []


async def _full_window_with_refusals(
    refused: int, counted: bool | None
) -> tuple[RateLimiter, RefusalCounting, list[Grant]]:
    """A 2-s window holding 10 requests (5 at once, then 5 a second), full after the 10th; ``refused`` of the
    first ones refused."""
    limiter = RateLimiter(300.0, None, burst_s=1.0, window_s=2.0)
    refusals = RefusalCounting(limiter, 2.0, counted=counted)
    grants = [await limiter.acquire(1) for _ in range(10)]
    now = asyncio.get_running_loop().time()
    for grant in grants[:refused]:
        refusals.refused(grant, now, requests=True, tokens=False, explained=False)
    return limiter, refusals, grants


def test_a_trial_ends_undecided_when_its_request_goes_unanswered_or_a_probe_explains_its_refusal() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        limiter, refusals, grants = await _full_window_with_refusals(refused=3, counted=None)
        assert refusals.watching and refusals.counted is None
        assert limiter.room_in_window("requests") == 0.0  # the refusals still hold their room
        # An admission that fills the window starts the trial: the oldest refusal leaves the log.
        refusals.admitted(grants[-1], loop.time())
        assert refusals.deciding and limiter.room_in_window("requests") == 1.0
        user = await limiter.acquire(1)
        refusals.admitted(user, loop.time())
        assert not refusals.watching  # the trial's room is used up
        refusals.abandoned(user)  # cancelled before any answer: nothing learned
        assert refusals.counted is None and not refusals.deciding
        assert limiter.room_in_window("requests") == -1.0  # the trial's refusal counted again
        # Asked again at the next full window: this time its user is refused, but a probe explains it.
        refusals.admitted(user, loop.time())
        assert refusals.deciding and limiter.room_in_window("requests") == 0.0
        limiter.give_back(user)
        second_user = await limiter.acquire(1)
        refusals.admitted(second_user, loop.time())
        of_trial = refusals.refused(second_user, loop.time(), requests=True, tokens=False, explained=True)
        assert of_trial and refusals.counted is None and not refusals.deciding
        assert loop.time() < 2.0  # all inside one window

    run_virtual(main)


def test_once_refusals_are_known_not_to_count_a_refusal_their_room_explains_counts_them_again() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        limiter, refusals, _ = await _full_window_with_refusals(refused=3, counted=False)
        assert limiter.room_in_window("requests") == 3.0  # known not to count: out of the log at once
        sent = [await limiter.acquire(1) for _ in range(3)]
        assert limiter.room_in_window("requests") == 0.0
        # One of them is refused where the window would be over its limit with the three dropped refusals
        # counted: the provider counted them after all.
        refusals.refused(sent[0], loop.time(), requests=True, tokens=False, explained=False)
        assert refusals.counted is True
        assert limiter.room_in_window("requests") == -3.0
        assert loop.time() < 2.0

    run_virtual(main)


def test_a_trial_whose_user_never_answers_ends_undecided_a_window_later_and_excuses_nothing() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        limiter, refusals, grants = await _full_window_with_refusals(refused=3, counted=None)
        refusals.admitted(grants[-1], loop.time())
        user = await limiter.acquire(1)
        refusals.admitted(user, loop.time())
        assert refusals.deciding
        # The user is lost (no answer, no abandon): a window on, the next event ends the trial undecided, and a
        # refusal then is news again, not the trial's cost.
        await asyncio.sleep(2.5)
        late = await limiter.acquire(1)
        of_trial = refusals.refused(late, loop.time(), requests=True, tokens=False, explained=False)
        assert not of_trial and not refusals.deciding and refusals.counted is None

    run_virtual(main)


def test_an_admission_given_back_before_it_is_sent_does_not_hold_a_trial() -> None:
    # A trial's user that the spend budget stops before it is sent: the gate hands its grant back, and the
    # trial ends undecided instead of waiting for an answer that never comes.
    prices = PriceTable(default=Price(input_per_mtok=1.0, cached_input_per_mtok=0.5, output_per_mtok=4.0))
    ledger = SpendLedger(per_backbone={"b": Budget(max_usd=0.01)})
    limits = BackboneLimits(concurrency=4, rpm=600.0, window_s=2.0, burst_s=1.0)
    gate = BackboneGate("b", limits, prices=prices, ledger=ledger)

    async def main() -> None:
        grants = [await gate.limiter.acquire(1) for _ in range(20)]  # the 2-s window's 20: full
        for grant in grants[:3]:
            gate._refusals.refused(grant, gate._now(), requests=True, tokens=False, explained=False)
        gate._refusals.admitted(grants[-1], gate._now())
        assert gate._refusals.deciding and gate._refusals.watching
        with pytest.raises(BudgetExhausted):
            async with gate.admit(1_000, 10_000):  # the trial's user, worst case $0.041 > $0.01
                pytest.fail("admitted over budget")
        assert not gate._refusals.deciding

    run_virtual(main)
