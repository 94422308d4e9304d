"""All-at-once that notes when each item first asks for its call: the rcarun client's probe for queueing delay.

A module of its own so that the peers' processes, which import `rcarun_bench.clients`, never load
`rcarun.methods` (their RSS must not include it); only the rcarun client imports it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rcarun.data import Trajectory
from rcarun.methods import LLM, Attribution, Message, Method, Reply, create_method, method, registered_methods
from rcarun.methods.proxies import DelegatingLLM

__all__ = ["TIMED_METHOD", "asked_at", "register_timed_method"]

TIMED_METHOD = "bench-timed-all-at-once"

asked_at: defaultdict[str, list[tuple[float, int]]] = defaultdict(list)
"""qid -> (time.time(), prompt characters) at which that trajectory's items first asked for a call."""


class _TimedLLM(DelegatingLLM):
    """The session a method sees, noting the moment the method asks for a call (the item is runnable)."""

    def __init__(self, inner: LLM, on_chat: Callable[[Sequence[Message]], None]) -> None:
        super().__init__(inner)
        self._on_chat = on_chat

    def _rewrap(self, inner: LLM) -> LLM:
        return _TimedLLM(inner, self._on_chat)

    async def chat(self, messages: Sequence[Message], **options: Any) -> Reply:
        self._on_chat(messages)
        # Straight to the session, not through `DelegatingLLM.chat`: the probe is the bench's, so the CPU it
        # adds to every call is counted against rcarun's client; one coroutine less keeps that small.
        return await self._inner.chat(messages, **options)


class _TimedAllAtOnce(Method):
    """All-at-once, unchanged, except that it notes when each item first asks for its call."""

    def __init__(self, label: str, options: Mapping[str, Any]) -> None:
        self.label = label
        self._inner = create_method("all-at-once", label=label, options=options)

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        asked = False

        def note(messages: Sequence[Message]) -> None:
            nonlocal asked
            if not asked:
                asked = True
                prompt_chars = 0
                for message in messages:
                    prompt_chars += len(message.content)
                asked_at[trajectory.qid].append((time.time(), prompt_chars))

        return await self._inner.attribute(trajectory, _TimedLLM(llm, note))


def register_timed_method() -> None:
    """Register the timed method (in the rcarun client's process only: never where methods are listed)."""
    if TIMED_METHOD not in registered_methods():
        method(TIMED_METHOD)(_TimedAllAtOnce)
