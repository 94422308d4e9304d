"""RateLimiter: strict FIFO over weighted waiters, debt for oversized weights, conformance, settle, pause,
cancellation and timer-driven wake-ups — all in virtual time, so every admission time is exact."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from rcarun.budgets import Grant, RateLimiter

from .conftest import VirtualTimeLoop, run_virtual

# tokens_per_minute=600 with burst_s=1 gives a bucket of 10 tokens refilling at 10 tokens/s.
TEN_PER_S = 600.0


def now() -> float:
    return asyncio.get_running_loop().time()


async def record(limiter: RateLimiter, tokens: int, label: str, log: list[tuple[str, float]]) -> Grant:
    grant = await limiter.acquire(tokens)
    log.append((label, grant.admitted_at))
    return grant


async def start_in_order(*coros: Any) -> list[asyncio.Task[Any]]:
    """Start tasks so that each has reached its first await (and queued) before the next starts."""
    tasks = []
    for coro in coros:
        tasks.append(asyncio.create_task(coro))
        await asyncio.sleep(0)
    return tasks


def test_heavy_head_is_not_overtaken_by_lighter_waiters_behind_it() -> None:
    async def main() -> list[tuple[str, float]]:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        await limiter.acquire(10)  # drain the bucket at t=0
        log: list[tuple[str, float]] = []
        tasks = await start_in_order(
            record(limiter, 2, "light-1", log),
            record(limiter, 8, "heavy", log),
            record(limiter, 1, "light-2", log),
            record(limiter, 1, "light-3", log),
        )
        await asyncio.gather(*tasks)
        return log

    log = run_virtual(main)
    assert [label for label, _ in log] == ["light-1", "heavy", "light-2", "light-3"]
    # Each is admitted the moment its own deficit is refilled, not later: 2/10, +8/10, +1/10, +1/10 s.
    assert [at for _, at in log] == pytest.approx([0.2, 1.0, 1.1, 1.2])


def test_new_arrival_queues_behind_waiters_even_when_the_bucket_could_serve_it() -> None:
    async def main() -> list[tuple[str, float]]:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        await limiter.acquire(6)  # 4 left
        log: list[tuple[str, float]] = []
        (heavy,) = await start_in_order(record(limiter, 9, "heavy", log))
        late = asyncio.create_task(record(limiter, 1, "late-light", log))  # 4 tokens would serve it now
        await asyncio.gather(heavy, late)
        return log

    assert run_virtual(main) == [("heavy", pytest.approx(0.5)), ("late-light", pytest.approx(0.6))]


def test_request_bucket_spaces_requests_at_the_declared_rate() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(60.0, None, burst_s=2.0)  # 1 request/s, burst of 2
        return [(await limiter.acquire(0)).admitted_at for _ in range(5)]

    assert run_virtual(main) == pytest.approx([0.0, 0.0, 1.0, 2.0, 3.0])


def test_admission_waits_for_the_slower_of_the_two_buckets() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(120.0, TEN_PER_S, burst_s=1.0)  # 2 requests/s (burst 2), 10 tokens/s (burst 10)
        times = [(await limiter.acquire(8)).admitted_at, (await limiter.acquire(1)).admitted_at]
        times.append((await limiter.acquire(10)).admitted_at)  # tokens: 9 short (0.9 s); requests: 1 (0.5 s)
        times.append((await limiter.acquire(0)).admitted_at)  # requests: 0.2 short after the last take
        return times

    assert run_virtual(main) == pytest.approx([0.0, 0.0, 0.9, 1.0])


def test_weight_above_capacity_runs_on_a_full_bucket_and_leaves_debt() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        first = await limiter.acquire(25)  # full bucket: admitted at once, level 10 - 25 = -15
        second = await limiter.acquire(1)  # waits for the debt plus one token: 16 / 10 s
        await limiter.acquire(5)  # level 0 after second: 5 / 10 s later
        fourth = await limiter.acquire(25)  # oversized on a half-full bucket waits until it is full
        return [first.admitted_at, second.admitted_at, fourth.admitted_at]

    assert run_virtual(main) == pytest.approx([0.0, 1.6, 1.6 + 0.5 + 1.0])


def test_backlog_drains_at_exactly_the_declared_rate() -> None:
    async def main() -> float:
        limiter = RateLimiter(None, 60_000.0, burst_s=2.0)  # 1,000 tokens/s, capacity 2,000
        grants = await asyncio.gather(*(limiter.acquire(100) for _ in range(500)))
        return max(grant.admitted_at for grant in grants)

    # 50,000 tokens, 2,000 of them from the initial burst: the last admission is at 48 s, not a tick later.
    assert run_virtual(main) == pytest.approx(48.0)


def _max_excess(events: Sequence[tuple[float, float]], rate_per_s: float) -> float:
    """max over windows [t_i, t_j] of (amount admitted in the window - rate * (t_j - t_i))."""
    best_start = float("-inf")
    prefix = 0.0
    worst = float("-inf")
    for at, amount in events:
        best_start = max(best_start, rate_per_s * at - prefix)
        prefix += amount
        worst = max(worst, prefix - rate_per_s * at + best_start)
    return worst


def _conformance_trial(seed: int, oversized: bool) -> None:
    rng = random.Random(seed)
    rpm = rng.choice([None, rng.uniform(30.0, 3_000.0)])
    tpm = rng.uniform(3_000.0, 300_000.0)
    burst_s = rng.uniform(0.1, 5.0)
    token_rate = tpm / 60.0
    token_capacity = token_rate * burst_s
    largest = token_capacity * (3.0 if oversized else 1.0)
    admitted: list[tuple[float, float]] = []

    async def client(limiter: RateLimiter, arrive_at: float, tokens: int, actual: int, hold_s: float) -> None:
        await asyncio.sleep(arrive_at)
        grant = await limiter.acquire(tokens)
        never_sent = actual < 0
        admitted.append((grant.admitted_at, 0.0 if never_sent else float(actual)))
        await asyncio.sleep(hold_s)
        if never_sent:
            limiter.give_back(grant)
        else:
            limiter.settle(grant, actual)

    async def main() -> None:
        limiter = RateLimiter(rpm, tpm, burst_s)
        arrive_at = 0.0
        clients = []
        for _ in range(200):
            # Bursts of simultaneous arrivals, quiet gaps and steady trickles, in random mixture.
            arrive_at += rng.choice([0.0, 0.0, rng.expovariate(1.0), rng.uniform(0.0, 3 * burst_s)])
            tokens = rng.randint(0, max(1, int(largest)))
            # Providers report at most what was reserved here; -1 marks a call never sent (given back).
            actual = -1 if rng.random() < 0.1 else rng.randint(0, tokens)
            clients.append(client(limiter, arrive_at, tokens, actual, rng.uniform(0.0, 5.0)))
        await asyncio.gather(*clients)

    run_virtual(main)
    assert len(admitted) == 200
    assert [at for at, _ in admitted] == sorted(at for at, _ in admitted)
    slack = 1e-6 * max(1.0, largest)
    assert _max_excess(admitted, token_rate) <= max(token_capacity, largest) + slack
    if rpm is not None:
        requests = [(at, 1.0) for at, _ in admitted]
        assert _max_excess(requests, rpm / 60.0) <= max(rpm / 60.0 * burst_s, 1.0) + 1e-6


@pytest.mark.parametrize("seed", range(25))
def test_admitted_stream_conforms_to_the_bucket_for_any_arrival_pattern(seed: int) -> None:
    _conformance_trial(seed, oversized=False)


@pytest.mark.parametrize("seed", range(100, 110))
def test_with_oversized_weights_the_excess_is_bounded_by_the_largest_weight(seed: int) -> None:
    _conformance_trial(seed, oversized=True)


def test_settle_refunds_unused_tokens_and_wakes_the_head_at_once() -> None:
    async def main() -> tuple[float, float]:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        grant = await limiter.acquire(10)
        (waiter,) = await start_in_order(limiter.acquire(6))
        await asyncio.sleep(0.1)  # level 1 by now; the waiter would otherwise be admitted at 0.6
        limiter.settle(grant, 4)  # refund 6
        admitted = (await waiter).admitted_at
        # Level after: 1 + 6 - 6 = 1, so 10 more tokens take 0.9 s.
        return admitted, (await limiter.acquire(10)).admitted_at

    assert run_virtual(main) == pytest.approx((0.1, 1.0))


def test_settle_charges_an_underestimate_as_debt() -> None:
    async def main() -> float:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        grant = await limiter.acquire(10)
        limiter.settle(grant, 15)  # the provider counted 5 more: level -5
        return (await limiter.acquire(5)).admitted_at

    assert run_virtual(main) == pytest.approx(1.0)


def test_refund_never_fills_the_bucket_beyond_capacity() -> None:
    async def main() -> float:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        grant = await limiter.acquire(4)
        await asyncio.sleep(10)
        limiter.settle(grant, 0)  # bucket already full: the refund is dropped
        await limiter.acquire(10)
        return (await limiter.acquire(1)).admitted_at

    assert run_virtual(main) == pytest.approx(10.1)


def test_pause_blocks_admission_until_the_given_time_and_only_extends() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(6_000.0, None, burst_s=1.0)  # plenty of quota
        limiter.pause_until(5.0)
        (waiter,) = await start_in_order(limiter.acquire(0))
        limiter.pause_until(3.0)  # shorter: ignored
        first = (await waiter).admitted_at
        limiter.pause_until(now() + 2.0)
        second = await limiter.acquire(0)
        return [first, second.admitted_at, limiter.paused_until]

    assert run_virtual(main) == pytest.approx([5.0, 7.0, 7.0])


def test_pause_arriving_while_a_waiter_is_queued_delays_it() -> None:
    async def main() -> float:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        await limiter.acquire(10)
        (waiter,) = await start_in_order(limiter.acquire(5))  # due at 0.5
        limiter.pause_until(4.0)
        return (await waiter).admitted_at

    assert run_virtual(main) == pytest.approx(4.0)


def test_cancelling_the_head_wakes_the_next_waiter_and_consumes_nothing() -> None:
    async def main() -> tuple[list[tuple[str, float]], int]:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        await limiter.acquire(10)
        log: list[tuple[str, float]] = []
        heavy, light, middle, last = await start_in_order(
            record(limiter, 9, "heavy", log),
            record(limiter, 1, "light", log),
            record(limiter, 3, "middle", log),
            record(limiter, 1, "last", log),
        )
        await asyncio.sleep(0.25)
        heavy.cancel()
        middle.cancel()
        for task in (heavy, middle):
            with pytest.raises(asyncio.CancelledError):
                await task
        waiting_after_cancel = limiter.waiting
        await asyncio.gather(light, last)
        return log, waiting_after_cancel

    log, waiting_after_cancel = run_virtual(main)
    # At 0.25 s there are 2.5 tokens: light (1) and last (1) go in that instant; nothing of the cancelled
    # heavy's 9 was taken, and the cancelled middle is skipped.
    assert log == [("light", pytest.approx(0.25)), ("last", pytest.approx(0.25))]
    assert waiting_after_cancel == 0


def test_grant_given_to_a_waiter_cancelled_in_the_same_instant_is_returned() -> None:
    async def main() -> float:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0)
        grant = await limiter.acquire(10)
        (waiter,) = await start_in_order(limiter.acquire(5))
        limiter.settle(grant, 0)  # refund admits the waiter synchronously...
        waiter.cancel()  # ...but it is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return (await limiter.acquire(10)).admitted_at  # the full bucket is still there

    assert run_virtual(main) == pytest.approx(0.0)


class _CountingLoop(VirtualTimeLoop):
    def __init__(self) -> None:
        super().__init__()
        self.timers_armed = 0

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        self.timers_armed += 1
        return super().call_at(when, callback, *args, context=context)


def test_waiters_are_woken_by_one_timer_per_head_not_by_polling() -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, _CountingLoop)
        limiter = RateLimiter(60.0, None, burst_s=1.0)  # 1 request/s, so 1,000 waiters take 999 s
        grants = await asyncio.gather(*(limiter.acquire(0) for _ in range(1_000)))
        return loop.timers_armed, max(grant.admitted_at for grant in grants)

    with asyncio.Runner(loop_factory=_CountingLoop) as runner:
        timers_armed, last = runner.run(main())
    assert last == pytest.approx(999.0)
    # One timer per admission after the first; a 10 ms poller would have armed ~1,000 x 100,000 over 999 s.
    assert timers_armed <= 1_000


def test_rejects_negative_weights_and_bad_limits() -> None:
    with pytest.raises(ValueError):
        RateLimiter(0.0, None)
    with pytest.raises(ValueError):
        RateLimiter(None, 100.0, burst_s=60.0)

    async def main() -> None:
        await RateLimiter(None, None).acquire(-1)

    with pytest.raises(ValueError):
        run_virtual(main)


def test_unlimited_limiter_admits_at_once() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(None, None)
        return [(await limiter.acquire(10**9)).admitted_at for _ in range(3)]

    assert run_virtual(main) == [0.0, 0.0, 0.0]


def test_oversized_weight_waits_until_the_bucket_has_stayed_full_for_the_slack() -> None:
    async def main() -> list[tuple[str, float]]:
        limiter = RateLimiter(None, TEN_PER_S, burst_s=1.0, full_slack_s=0.3)
        log: list[tuple[str, float]] = []
        await record(limiter, 25, "big-1", log)  # full since forever: admitted at once, 15 tokens of debt
        await record(limiter, 25, "big-2", log)  # full again at 2.5 s, then 0.3 s more
        await record(limiter, 4, "small", log)  # within capacity: no slack, 15 + 4 tokens of refill
        grant = await limiter.acquire(10)  # exactly the capacity counts as oversized
        limiter.give_back(grant)  # giving the latest grant back restores "full since" as it was
        await record(limiter, 10, "whole", log)
        return log

    log = run_virtual(main)
    assert log == [
        ("big-1", pytest.approx(0.0)),
        ("big-2", pytest.approx(2.8)),
        ("small", pytest.approx(4.7)),
        ("whole", pytest.approx(6.0)),  # full at 5.7, + 0.3; the give-back did not restart the wait
    ]


def test_a_lowered_limit_is_paced_at_the_lowered_rate() -> None:
    async def main() -> list[float]:
        # 120/min declared, lowered to 36/min: the bucket refills at 0.6 a second from then on.
        limiter = RateLimiter(120.0, None, burst_s=1.0, window_s=10.0)
        assert limiter.lower_limits(36.0, None) == {"requests"}
        return [(await limiter.acquire(0)).admitted_at for _ in range(4)]

    assert run_virtual(main) == pytest.approx([0.0, 1 / 0.6, 2 / 0.6, 3 / 0.6])


def test_a_limit_set_where_none_was_declared_starts_its_window_from_what_was_already_sent() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(None, None, burst_s=1.0, window_s=10.0)
        # 5 of a 6-per-window limit were sent at 0-4 s; the limit is set at 4 s, from an empty bucket.
        await asyncio.sleep(4.0)
        sent = {"requests": [(float(at), 1.0) for at in range(5)]}
        limiter.lower_limits(36.0, None, set_unpaced=True, sent=sent)
        return [(await limiter.acquire(0)).admitted_at for _ in range(3)]

    # One fits the window once the bucket holds one (0.6 a second, capacity 0.6); the next when the send at 0 s
    # leaves the window; the one after at the bucket's pace.
    assert run_virtual(main) == pytest.approx([5.0, 10.0, 10.0 + 1 / 0.6])


def test_a_dropped_request_limit_admits_its_waiters_at_once() -> None:
    async def main() -> list[float]:
        limiter = RateLimiter(6.0, None, burst_s=1.0, window_s=10.0)
        await limiter.acquire(0)  # the bucket (capacity 0.1) is empty now: the next waits 10 s
        waiter = asyncio.ensure_future(limiter.acquire(0))
        await asyncio.sleep(1.0)
        limiter.drop_request_limit()
        first = (await waiter).admitted_at
        return [first, (await limiter.acquire(0)).admitted_at, limiter.requests_per_minute or -1.0]

    assert run_virtual(main) == pytest.approx([1.0, 1.0, -1.0])
