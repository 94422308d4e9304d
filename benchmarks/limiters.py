"""Measure asyncio-throttle, aiolimiter and rcarun's RateLimiter against what a sweep needs from a limiter.

Why this exists: the design card names both packages as candidates; the choice (ours) must rest on numbers.
Four questions, each answered for each limiter on the real event loop:

1. FIFO: a heavy request queued behind light ones and ahead of others — where is it admitted? And under a
   steady stream of light requests, how long does the heavy one wait?
2. Token weights: can one acquisition take a weight, and one above the bucket's capacity?
3. CPU: process time per acquisition with 5,000 concurrent waiters on a fast rate.
4. Polling: loop timers armed per acquisition (a poller arms one per waiter per poll interval).

Run: ``.venv/bin/python benchmarks/limiters.py`` (about 10 s on two cores).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiolimiter import AsyncLimiter
from asyncio_throttle import Throttler

from rcarun.budgets import RateLimiter

# A weighted acquire, or None when the library cannot weigh (then weight is ignored).
Acquire = Callable[[int], Awaitable[Any]]


class _CountingLoop(asyncio.SelectorEventLoop):
    """Counts timers armed, so that polling shows up as a number."""

    timers_armed = 0

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        self.timers_armed += 1
        return super().call_at(when, callback, *args, context=context)


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    weighted: bool
    # (units per second, capacity in units) -> weighted acquire
    make: Callable[[float, float], Acquire]


def _throttle(rate: float, capacity: float) -> Acquire:
    throttler = Throttler(rate_limit=int(capacity), period=capacity / rate)

    async def acquire(weight: int) -> None:
        await throttler.acquire()

    return acquire


def _aiolimiter(rate: float, capacity: float) -> Acquire:
    limiter = AsyncLimiter(capacity, capacity / rate)
    return limiter.acquire


def _rcarun(rate: float, capacity: float) -> Acquire:
    limiter = RateLimiter(None, rate * 60.0, burst_s=capacity / rate)
    return limiter.acquire


CANDIDATES = (
    Candidate("asyncio-throttle 1.0.2", False, _throttle),
    Candidate("aiolimiter 1.3.0", True, _aiolimiter),
    Candidate("rcarun RateLimiter", True, _rcarun),
)


def run(main: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    with asyncio.Runner(loop_factory=_CountingLoop) as runner:
        result = runner.run(main())  # type: ignore[arg-type]
        loop = runner.get_loop()
        assert isinstance(loop, _CountingLoop)
        return result, loop.timers_armed


def fifo_position(candidate: Candidate) -> tuple[int, int]:
    """Queue L1..L5 (weight 1), H (weight 8), L6..L20 at once on a drained 10-unit bucket at 100 units/s.

    Returns H's admission position (FIFO says 6) and how many requests queued after H got in before it.
    """

    async def main() -> tuple[int, int]:
        acquire = candidate.make(100.0, 10.0)
        for _ in range(10):
            await acquire(1)
        labels = [*(f"L{i}" for i in range(1, 6)), "H", *(f"L{i}" for i in range(6, 21))]
        order: list[int] = []

        async def one(index: int, weight: int) -> None:
            await acquire(weight)
            order.append(index)

        tasks = []
        for index, label in enumerate(labels):
            tasks.append(asyncio.create_task(one(index, 8 if label == "H" else 1)))
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        heavy_at = order.index(5)
        return heavy_at + 1, sum(1 for index in order[:heavy_at] if index > 5)

    result, _ = run(main)
    return result  # type: ignore[no-any-return]


def heavy_wait_under_stream(candidate: Candidate) -> tuple[float, int]:
    """Lights (weight 1) arrive at 120/s for 1 s into a drained 100 units/s bucket; H (weight 8) at 50 ms.

    Returns H's wait in ms and how many lights that arrived after H were admitted before it.
    """

    async def main() -> tuple[float, int]:
        acquire = candidate.make(100.0, 10.0)
        for _ in range(10):
            await acquire(1)
        loop = asyncio.get_running_loop()
        admitted: list[tuple[str, float]] = []
        heavy_arrival = 0.0

        async def one(label: str, weight: int) -> None:
            await acquire(weight)
            admitted.append((label, loop.time()))

        async def heavy() -> None:
            nonlocal heavy_arrival
            await asyncio.sleep(0.05)
            heavy_arrival = loop.time()
            await one("H", 8)

        heavy_task = asyncio.create_task(heavy())
        lights = []
        start = loop.time()
        for _ in range(120):
            lights.append(asyncio.create_task(one(f"L@{loop.time() - start:.3f}", 1)))
            await asyncio.sleep(1 / 120)
        await asyncio.gather(heavy_task, *lights)
        heavy_at = next(at for label, at in admitted if label == "H")
        overtook = sum(
            1
            for label, at in admitted
            if label != "H" and float(label[2:]) + start > heavy_arrival and at < heavy_at
        )
        return (heavy_at - heavy_arrival) * 1000, overtook

    result, _ = run(main)
    return result  # type: ignore[no-any-return]


def weights(candidate: Candidate) -> str:
    if not candidate.weighted:
        return "no (acquire() takes no amount)"

    async def main() -> str:
        acquire = candidate.make(100.0, 10.0)
        await acquire(5)
        try:
            await asyncio.wait_for(acquire(25), timeout=2.0)
        except ValueError as error:
            return f"yes, up to capacity only ({type(error).__name__} for 25 > 10)"
        return "yes, and above capacity (debt)"

    result, _ = run(main)
    return result  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class CpuResult:
    wall_s: float
    cpu_us_per_acquire: float
    timers_per_acquire: float


def cpu(candidate: Candidate, waiters: int = 5_000, weighted: bool = False) -> CpuResult:
    """``waiters`` tasks acquire at once from a 10,000 units/s bucket of 100 units (ideal wall: 0.5 s).

    Weighted: weights 1..20 (mean 10.5) at 100,000 units/s, capacity 1,000 (ideal wall: ~0.52 s).
    """
    rng = random.Random(1)
    sizes = [rng.randint(1, 20) if weighted else 1 for _ in range(waiters)]
    rate, capacity = (100_000.0, 1_000.0) if weighted else (10_000.0, 100.0)

    async def main() -> tuple[float, float]:
        acquire = candidate.make(rate, capacity)
        started_wall, started_cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(acquire(size) for size in sizes))
        return time.perf_counter() - started_wall, time.process_time() - started_cpu

    (wall, cpu_s), timers = run(main)
    return CpuResult(wall, cpu_s / waiters * 1e6, timers / waiters)


def main() -> None:
    print("Limiter comparison (benchmarks/limiters.py); real event loop, Python", end=" ")
    print(sys.version.split()[0])
    rows = []
    for candidate in CANDIDATES:
        position, jumped = fifo_position(candidate)
        wait_ms, overtook = heavy_wait_under_stream(candidate)
        unit = cpu(candidate)
        weighted = cpu(candidate, weighted=True) if candidate.weighted else None
        rows.append((candidate, position, jumped, wait_ms, overtook, weights(candidate), unit, weighted))

    print()
    print("1. FIFO: H (weight 8) queued 6th of 21 on a drained 10-unit bucket, 100 units/s")
    print("   and H arriving at 50 ms into a 120/s stream of weight-1 requests on a drained bucket")
    for candidate, position, jumped, wait_ms, overtook, *_ in rows:
        note = "" if candidate.weighted else "  (no weights: H counted as 1)"
        print(
            f"   {candidate.name:24s} queue: H admitted {position:2d}th, before it {jumped:2d} queued after it; "
            f"stream: H waited {wait_ms:5.0f} ms, overtaken by {overtook:3d}{note}"
        )
    print()
    print("2. Token weights")
    for candidate, *_, answer, _, _ in rows:
        print(f"   {candidate.name:24s} {answer}")
    print()
    print("3./4. 5,000 concurrent waiters; CPU per acquire and loop timers armed per acquire")
    print(f"   {'limiter':24s} {'case':26s} {'wall s':>7s} {'CPU us/acq':>11s} {'timers/acq':>11s}")
    for candidate, *_, unit, weighted in rows:
        for label, result in (("unit, 10k/s (ideal 0.50 s)", unit), ("weights 1-20, 100k/s", weighted)):
            if result is None:
                print(f"   {candidate.name:24s} {label:26s} {'n/a':>7s}")
                continue
            print(
                f"   {candidate.name:24s} {label:26s} {result.wall_s:7.2f} {result.cpu_us_per_acquire:11.1f} "
                f"{result.timers_per_acquire:11.2f}"
            )


if __name__ == "__main__":
    main()
