"""How many calls one backbone may have in flight, adapted to the provider's 429s (AIMD), in FIFO order.

Some providers limit concurrency and publish no number (DeepSeek), so the limit halves on a rate-limit signal and
grows by one after each clean round. Only the first 429 of one overload counts: the others come from calls
admitted before the cut.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

__all__ = ["AdaptiveConcurrency", "ConcurrencySlot"]


@dataclass(frozen=True, slots=True)
class ConcurrencySlot:
    """One held slot; ``epoch`` counts the decreases before it (a 429 on an older one was already answered)."""

    epoch: int


class AdaptiveConcurrency:
    """FIFO async slots whose limit moves between ``minimum`` and ``limit`` (the ceiling and start)."""

    def __init__(self, limit: int, minimum: int = 1) -> None:
        if minimum < 1:
            raise ValueError(f"minimum must be >= 1, got {minimum}")
        if limit < minimum:
            raise ValueError(f"limit ({limit}) must be >= minimum ({minimum})")
        self._ceiling = limit
        self._minimum = minimum
        self._limit = limit
        self._in_flight = 0
        # Cancelled waiters stay in the deque until they reach the head; ``_waiting`` counts the live ones.
        self._queue: deque[asyncio.Future[ConcurrencySlot]] = deque()
        self._waiting = 0
        self._epoch = 0
        self._clean_completions = 0
        # For 429s reported without a slot: after a decrease, ignore them until a round's worth of outcomes
        # (the limit before the cut, i.e. the calls that could have been in flight) has been seen.
        self._outcomes_since_decrease = 0
        self._round_after_decrease = 0

    @property
    def limit(self) -> int:
        """Current limit."""
        return self._limit

    @property
    def ceiling(self) -> int:
        """Configured limit; recovery never goes above it."""
        return self._ceiling

    @property
    def minimum(self) -> int:
        return self._minimum

    @property
    def in_flight(self) -> int:
        """Slots currently held."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """Callers queued for a slot."""
        return self._waiting

    @property
    def decreases(self) -> int:
        """How many times the limit has been cut."""
        return self._epoch

    async def acquire(self) -> ConcurrencySlot:
        """Wait for a slot behind everyone who asked earlier; pair with `release`."""
        if self._waiting == 0 and self._in_flight < self._limit:
            self._queue.clear()
            self._in_flight += 1
            return ConcurrencySlot(self._epoch)
        future: asyncio.Future[ConcurrencySlot] = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        self._waiting += 1
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            else:
                future.cancel()
                self._waiting -= 1
            raise

    def release(self, slot: ConcurrencySlot) -> None:
        """Give a slot back and hand it to the next waiter if the limit allows."""
        del slot  # kept in the signature so that every acquire visibly pairs with one release
        self._in_flight -= 1
        self._wake()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[ConcurrencySlot]:
        """Hold a slot for the duration of the block."""
        held = await self.acquire()
        try:
            yield held
        finally:
            self.release(held)

    def on_success(self) -> None:
        """Count a completion without a rate-limit signal; a whole clean round adds one to the limit."""
        self._outcomes_since_decrease += 1
        self._clean_completions += 1
        if self._clean_completions >= self._limit:
            self._clean_completions = 0
            if self._limit < self._ceiling:
                self._limit += 1
                self._wake()

    def on_rate_limited(self, slot: ConcurrencySlot | None = None) -> bool:
        """Halve the limit on a rate-limit signal, at most once per round; return whether it was cut. With
        ``slot``, it counts only if the call came after the last cut; without, once a round has passed."""
        self._outcomes_since_decrease += 1
        self._clean_completions = 0
        if slot is not None:
            fresh = slot.epoch == self._epoch
        else:
            fresh = self._outcomes_since_decrease >= self._round_after_decrease
        if not fresh or self._limit <= self._minimum:
            return False
        self._round_after_decrease = self._limit
        self._limit = max(self._minimum, self._limit // 2)
        self._epoch += 1
        self._outcomes_since_decrease = 0
        return True

    def _wake(self) -> None:
        queue = self._queue
        # ``_waiting`` may still count a waiter whose future `Task.cancel` has already cancelled: its
        # ``except`` in `acquire` (which decrements the count) runs only when its task next runs. Such a
        # future is skipped here and the queue may run dry before the count does, so the queue bounds the loop.
        while queue and self._waiting and self._in_flight < self._limit:
            future = queue.popleft()
            if future.done():
                continue
            self._waiting -= 1
            self._in_flight += 1
            future.set_result(ConcurrencySlot(self._epoch))
