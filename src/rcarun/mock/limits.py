"""Rate limits as a provider enforces them, and the same limits as a yardstick for what a client offered.

Each declared limit (rpm, rps, tpm) is a token bucket refilled at limit/period, holding ``burst_s`` seconds of
quota. Admission charges every bucket or none. A request costing more than a bucket holds is admitted only into a
full bucket and drives it into debt, repaid at the refill rate, so the long-run rate stays exact. `OfferedLoad`
replays every arrival through unenforced copies of the buckets: its largest deficit is how far the client asked
beyond the limits. `FifoSlots` is the concurrency cap, first come first served. Every method takes ``now``
(monotonic seconds), so the logic is tested with plain numbers.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass

__all__ = [
    "Admission",
    "BucketSpec",
    "BucketState",
    "FifoSlots",
    "OfferedLoad",
    "RateLimiter",
    "TokenBucket",
    "bucket_specs",
]

# Float slack so that a bucket refilled to exactly the needed level admits despite rounding.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One declared limit as a bucket.

    Attributes:
        name: "rpm", "rps" or "tpm".
        limit: the declared number per period (for headers and messages).
        period_s: 60 for per-minute limits, 1 for per-second.
        capacity: most units the bucket holds (burst).
        unit: "requests" or "tokens".
    """

    name: str
    limit: int
    period_s: float
    capacity: float
    unit: str

    @property
    def rate(self) -> float:
        """Units per second."""
        return self.limit / self.period_s


def bucket_specs(rpm: int | None, rps: int | None, tpm: int | None, burst_s: float) -> tuple[BucketSpec, ...]:
    """The buckets for the declared limits; request buckets hold at least one request."""
    specs: list[BucketSpec] = []
    if rpm is not None:
        specs.append(BucketSpec("rpm", rpm, 60.0, max(1.0, rpm * burst_s / 60.0), "requests"))
    if rps is not None:
        specs.append(BucketSpec("rps", rps, 1.0, max(1.0, rps * burst_s), "requests"))
    if tpm is not None:
        specs.append(BucketSpec("tpm", tpm, 60.0, tpm * burst_s / 60.0, "tokens"))
    return tuple(specs)


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket seen from outside, for rate-limit headers.

    Attributes:
        spec: the bucket's declaration.
        remaining: whole units admissible right now (never negative).
        reset_s: seconds until the bucket is full again.
    """

    spec: BucketSpec
    remaining: int
    reset_s: float


class TokenBucket:
    """An enforced token bucket (starts full)."""

    __slots__ = ("level", "spec", "updated_at")

    def __init__(self, spec: BucketSpec, now: float) -> None:
        self.spec = spec
        self.level = spec.capacity
        self.updated_at = now

    def refill(self, now: float) -> None:
        elapsed = now - self.updated_at
        if elapsed > 0:
            self.level = min(self.spec.capacity, self.level + elapsed * self.spec.rate)
            self.updated_at = now

    def wait_s(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` is admissible (0 when it is now)."""
        self.refill(now)
        needed = min(cost, self.spec.capacity)
        if self.level + _EPSILON >= needed:
            return 0.0
        return (needed - self.level) / self.spec.rate

    def take(self, cost: float) -> None:
        self.level -= cost

    def state(self, now: float) -> BucketState:
        self.refill(now)
        remaining = max(0, math.floor(self.level + _EPSILON))
        reset_s = max(0.0, (self.spec.capacity - self.level) / self.spec.rate)
        return BucketState(self.spec, remaining, reset_s)


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict on one request.

    Attributes:
        accepted: every bucket was charged.
        retry_after_s: when rejected, seconds until the binding bucket would admit it.
        limit_name: the bucket that rejected ("rpm", "rps", "tpm") or None.
        too_large: the request's tokens exceed the whole per-minute token limit; waiting cannot help.
        spec: the rejecting bucket's declaration.
    """

    accepted: bool
    retry_after_s: float = 0.0
    limit_name: str | None = None
    too_large: bool = False
    spec: BucketSpec | None = None


_ACCEPTED = Admission(accepted=True)


class RateLimiter:
    """The enforced buckets of one server."""

    __slots__ = ("_buckets", "_request_buckets", "_token_buckets")

    def __init__(self, specs: tuple[BucketSpec, ...], now: float) -> None:
        self._buckets = tuple(TokenBucket(spec, now) for spec in specs)
        self._request_buckets = tuple(b for b in self._buckets if b.spec.unit == "requests")
        self._token_buckets = tuple(b for b in self._buckets if b.spec.unit == "tokens")

    @property
    def enabled(self) -> bool:
        return bool(self._buckets)

    def admit(self, tokens: int, now: float) -> Admission:
        """Charge one request of ``tokens`` tokens against every bucket, or none of them."""
        worst: TokenBucket | None = None
        worst_wait = 0.0
        for bucket in self._token_buckets:
            if tokens > bucket.spec.limit:
                return Admission(False, bucket.spec.period_s, bucket.spec.name, True, bucket.spec)
        for bucket in self._buckets:
            cost = 1 if bucket.spec.unit == "requests" else tokens
            wait = bucket.wait_s(cost, now)
            if wait > worst_wait:
                worst, worst_wait = bucket, wait
        if worst is not None:
            return Admission(False, worst_wait, worst.spec.name, False, worst.spec)
        for bucket in self._request_buckets:
            bucket.take(1)
        for bucket in self._token_buckets:
            bucket.take(tokens)
        return _ACCEPTED

    def request_state(self, now: float) -> BucketState | None:
        """The request bucket headers describe: rpm when declared, else rps."""
        return self._request_buckets[0].state(now) if self._request_buckets else None

    def token_state(self, now: float) -> BucketState | None:
        return self._token_buckets[0].state(now) if self._token_buckets else None


class _ReplayBucket:
    __slots__ = ("level", "max_deficit", "spec", "updated_at")

    def __init__(self, spec: BucketSpec, now: float) -> None:
        self.spec = spec
        self.level = spec.capacity
        self.updated_at = now
        self.max_deficit = 0.0

    def offer(self, cost: float, now: float) -> None:
        elapsed = now - self.updated_at
        if elapsed > 0:
            self.level = min(self.spec.capacity, self.level + elapsed * self.spec.rate)
            self.updated_at = now
        # The enforced bucket admits when level >= min(cost, capacity); anything short of that is overshoot.
        deficit = min(cost, self.spec.capacity) - self.level
        if deficit > self.max_deficit + _EPSILON:
            self.max_deficit = deficit
        self.level -= cost


class OfferedLoad:
    """Every arrival (accepted or rejected) replayed through unenforced buckets of the declared limits."""

    __slots__ = ("_buckets",)

    def __init__(self, specs: tuple[BucketSpec, ...], now: float) -> None:
        self._buckets = tuple(_ReplayBucket(spec, now) for spec in specs)

    def offer(self, tokens: int, now: float) -> None:
        for bucket in self._buckets:
            bucket.offer(1 if bucket.spec.unit == "requests" else tokens, now)

    def overshoot(self) -> dict[str, float]:
        """Largest deficit per declared limit, in that limit's unit (0 means the client stayed within it)."""
        return {bucket.spec.name: round(bucket.max_deficit, 6) for bucket in self._buckets}


class FifoSlots:
    """A concurrency cap whose freed slots go to waiters strictly in arrival order.

    A waiter is handed the moment its slot came free, not the moment its task next runs: a GPU server's
    scheduler starts the next queued sequence when a slot frees, whatever its HTTP front end is doing, so the
    simulator's own event-loop delay must not stretch a slot's occupancy beyond the configured latency.
    """

    __slots__ = ("_free", "_waiters", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._waiters: deque[asyncio.Future[float]] = deque()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        """Requests queued for a slot (vLLM's ``num_requests_waiting``)."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    def try_take(self) -> bool:
        """Take a slot if one is free and nobody is queued ahead."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    def enqueue(self) -> asyncio.Future[float]:
        """Join the queue; the future completes, with the moment the slot came free, when one is handed over."""
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def abandon(self, waiter: asyncio.Future[float]) -> None:
        """Leave the queue; a slot already handed over is passed on, as free since the same moment."""
        if waiter.done() and not waiter.cancelled():
            self.release(waiter.result())
        else:
            waiter.cancel()

    def release(self, freed_at: float) -> None:
        """Free a slot at ``freed_at`` (the holder's scheduled end): the next waiter starts from then."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(freed_at)
                return
        self._free += 1
