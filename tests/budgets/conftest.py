"""A virtual-time event loop for limiter tests: timers fire in order, instantly, and time is exact.

aiolimiter's tests patch ``loop.time`` (MockLoopTime) and advance it by hand. Here the loop advances its own
clock to the next timer whenever nothing is ready, so a test can simply ``await asyncio.sleep(3600)`` and
assert on ``loop.time()``: no real waiting, no timing flakiness, and every admission time is exact.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# Real seconds a virtual loop may block on I/O with no timer pending before the test is declared deadlocked.
_DEADLOCK_S = 5.0


class _VirtualTimeSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events: list[Any] = super().select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        if timeout is None:
            events = super().select(_DEADLOCK_S)
            if not events:
                raise RuntimeError("virtual-time loop: every task waits and no timer is pending (deadlock)")
            return events
        self._loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_VirtualTimeSelector(self))

    def time(self) -> float:
        return self.now


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to completion on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main())  # type: ignore[arg-type]


@pytest.fixture
def virtual() -> Callable[[Callable[[], Awaitable[Any]]], Any]:
    """``virtual(main)`` runs the coroutine function ``main`` in virtual time and returns its result."""
    return run_virtual
