"""The event loop a sweep runs on: asyncio's own, or uvloop on request.

uvloop (a loop written in C over libuv) is the usual advice for cutting an asyncio program's CPU, and issue 17
asked for it where it measures better. It did not, here: on the bench's latency-bound workload (3,200 calls, 64
in flight, 100 ms simulated latency; `benchmarks/profile_calls.py`), eight interleaved pairs of runs took a
median 0.96 ms of CPU per call on uvloop against 0.88 ms on asyncio's loop, with runs of either spread over
±20 % on this shared 2-core machine. A sweep's loop work is mostly aiohttp's Python code and the socket calls
themselves, which uvloop does not change. So asyncio's loop is the default, and uvloop is one setting away for
a machine where it does measure better: ``RCARUN_EVENT_LOOP=uvloop`` (``pip install 'rcarun[uvloop]'``).
Nothing in rcarun depends on the loop: the runner uses only asyncio's public API, and aiohttp and the openai
SDK run on both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from rcarun.errors import ConfigError

__all__ = ["EVENT_LOOP_ENV", "EventLoopChoice", "event_loop_choice", "loop_factory", "run"]

EVENT_LOOP_ENV = "RCARUN_EVENT_LOOP"
EventLoopChoice = Literal["asyncio", "uvloop"]
_CHOICES: tuple[EventLoopChoice, ...] = ("asyncio", "uvloop")

_T = TypeVar("_T")


def event_loop_choice(value: str | None = None) -> EventLoopChoice:
    """``value``, else ``$RCARUN_EVENT_LOOP``, else ``asyncio``, checked.

    Raises:
        ConfigError: not one of asyncio, uvloop.
    """
    chosen = value if value is not None else os.environ.get(EVENT_LOOP_ENV, "").strip() or "asyncio"
    for choice in _CHOICES:
        if chosen == choice:
            return choice
    raise ConfigError(f"{EVENT_LOOP_ENV}={chosen!r}: expected one of {', '.join(_CHOICES)}")


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the chosen loop (None: asyncio's default).

    Raises:
        ConfigError: the choice is invalid, or uvloop was chosen and cannot be imported.
    """
    if event_loop_choice(choice) == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        raise ConfigError(
            f"{EVENT_LOOP_ENV}=uvloop but uvloop cannot be imported ({exc}); install it "
            f"(pip install 'rcarun[uvloop]') or unset {EVENT_LOOP_ENV}"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, _T], *, choice: str | None = None) -> _T:
    """Run ``main`` to completion on a new loop of the chosen kind, as `asyncio.run` does (the same Ctrl-C
    handling: `asyncio.Runner` installs it whatever the loop)."""
    try:
        factory = loop_factory(choice)
    except ConfigError:
        main.close()  # never awaited: closed, so no "was never awaited" warning follows the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
