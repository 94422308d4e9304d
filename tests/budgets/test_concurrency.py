"""AdaptiveConcurrency: FIFO slots, a limit that moves while callers wait, one cut per round, slow recovery."""

from __future__ import annotations

import asyncio

import pytest

from rcarun.budgets import AdaptiveConcurrency, ConcurrencySlot

from .conftest import run_virtual


def test_slots_are_granted_in_arrival_order_up_to_the_limit() -> None:
    async def main() -> list[int]:
        slots = AdaptiveConcurrency(2)
        order: list[int] = []

        async def worker(index: int) -> None:
            async with slots.slot():
                order.append(index)
                await asyncio.sleep(1.0)

        await asyncio.gather(*(worker(index) for index in range(6)))
        assert slots.in_flight == 0
        return order

    assert run_virtual(main) == [0, 1, 2, 3, 4, 5]


def test_peak_in_flight_never_exceeds_a_limit_cut_while_callers_wait() -> None:
    async def main() -> tuple[int, float]:
        slots = AdaptiveConcurrency(8)
        peak_after_cut = 0
        cut = False

        async def worker() -> None:
            nonlocal peak_after_cut
            slot = await slots.acquire()
            if cut:
                peak_after_cut = max(peak_after_cut, slots.in_flight)
            await asyncio.sleep(1.0)
            slots.release(slot)

        tasks = [asyncio.create_task(worker()) for _ in range(40)]
        await asyncio.sleep(0.5)
        held = ConcurrencySlot(slots.decreases)
        assert slots.on_rate_limited(held)  # 8 -> 4 while 8 run and 32 wait
        cut = True
        await asyncio.gather(*tasks)
        return peak_after_cut, asyncio.get_running_loop().time()

    peak, finished_at = run_virtual(main)
    assert peak == 4
    # 8 finish at t=1; then 32 more at 4 per second (the limit grows back only after clean rounds, which
    # this test does not report): 1 + 8 = 9 s.
    assert finished_at == pytest.approx(9.0)


def test_a_burst_of_429s_from_one_overload_cuts_the_limit_once() -> None:
    slots = AdaptiveConcurrency(16)
    overloaded = [ConcurrencySlot(slots.decreases) for _ in range(16)]  # all admitted before any cut
    cuts = [slots.on_rate_limited(slot) for slot in overloaded]
    assert cuts.count(True) == 1
    assert slots.limit == 8
    # A call admitted after the cut that is rate-limited again is fresh evidence: cut again.
    assert slots.on_rate_limited(ConcurrencySlot(slots.decreases))
    assert slots.limit == 4


def test_without_slots_a_429_burst_within_one_round_cuts_once() -> None:
    slots = AdaptiveConcurrency(16)
    assert slots.on_rate_limited()
    # The other 15 calls that were in flight report 429 too: the same round, ignored.
    assert not any(slots.on_rate_limited() for _ in range(15))
    assert slots.limit == 8
    assert slots.on_rate_limited()  # the 17th outcome is from a call admitted under the new limit
    assert slots.limit == 4


def test_limit_never_drops_below_the_minimum() -> None:
    slots = AdaptiveConcurrency(8, minimum=3)
    for _ in range(5):
        slots.on_rate_limited(ConcurrencySlot(slots.decreases))
    assert slots.limit == 3


def test_recovery_adds_one_per_clean_round_up_to_the_ceiling() -> None:
    slots = AdaptiveConcurrency(8)
    slots.on_rate_limited(ConcurrencySlot(0))
    assert slots.limit == 4
    limits = []
    for _ in range(4 + 5 + 6 + 7 + 8 + 50):
        slots.on_success()
        limits.append(slots.limit)
    # A round is as many clean completions as the current limit: +1 after 4, then after 5 more, ...
    assert limits[3] == 5 and limits[2] == 4
    assert limits[3 + 5] == 6 and limits[3 + 4] == 5
    assert limits[-1] == 8  # capped at the configured ceiling


def test_a_429_restarts_the_clean_round() -> None:
    slots = AdaptiveConcurrency(4, minimum=4)  # the minimum pins the limit so only the counting shows
    slots.on_rate_limited(ConcurrencySlot(0))
    for _ in range(3):
        slots.on_success()
    slots.on_rate_limited(ConcurrencySlot(0))
    for _ in range(3):
        slots.on_success()
    assert slots.limit == 4


def test_raising_the_limit_wakes_waiters_immediately() -> None:
    async def main() -> float:
        slots = AdaptiveConcurrency(2)
        slots.on_rate_limited(ConcurrencySlot(0))  # limit 1
        first = await slots.acquire()
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(1.0)
        assert not waiter.done()
        slots.on_success()  # one clean completion is a whole round at limit 1: limit 2
        second = await waiter
        slots.release(first)
        slots.release(second)
        return asyncio.get_running_loop().time()

    assert run_virtual(main) == pytest.approx(1.0)


def test_cancelled_waiter_gives_its_place_and_any_granted_slot_back() -> None:
    async def main() -> tuple[int, int, int]:
        slots = AdaptiveConcurrency(1)
        held = await slots.acquire()
        cancelled = asyncio.create_task(slots.acquire())
        behind = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        slots.release(held)  # goes to `behind`, not to the cancelled waiter
        slot = await behind
        # Granted-then-cancelled in the same instant: the slot comes back.
        racer = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        slots.release(slot)
        racer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await racer
        return slots.in_flight, slots.waiting, slots.limit

    assert run_virtual(main) == (0, 0, 1)


def test_release_between_a_waiters_cancel_and_its_cleanup_wakes_no_one_and_raises_nothing() -> None:
    """`Task.cancel` cancels the awaited future at once; the waiter's own cleanup runs only when its task next
    runs. A release in between must skip the dead future instead of popping past the end of the queue (the
    campaign's `IndexError: pop from an empty deque`, which turned interrupted items into failed ones)."""

    async def main() -> tuple[int, int]:
        slots = AdaptiveConcurrency(1)
        held = await slots.acquire()
        waiters = [asyncio.create_task(slots.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        for waiter in waiters:
            waiter.cancel()  # every queued future is cancelled now; no waiter has run its except yet
        slots.release(held)  # the waiters' count is still 3 while their futures are all done
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(result, asyncio.CancelledError) for result in results)
        return slots.in_flight, slots.waiting

    assert run_virtual(main) == (0, 0)
