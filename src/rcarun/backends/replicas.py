"""Spreading one backbone's calls over several replicas of the same server (self-hosted vLLM).

Replicas of one model behind separate URLs are balanced by fewest outstanding requests: a replica that is slow
(long prompts, a busier GPU) keeps its calls longer and so automatically receives fewer new ones, which plain
round-robin cannot do. Ties go round-robin so that idle replicas warm up evenly. Everything runs on one event
loop, so the counters need no lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ReplicaBalancer"]


class ReplicaBalancer:
    """Chooses the base URL for each call: fewest in flight, ties by round-robin."""

    __slots__ = ("_cursor", "_outstanding", "_urls")

    def __init__(self, urls: tuple[str, ...]) -> None:
        if not urls:
            raise ValueError("ReplicaBalancer needs at least one URL")
        self._urls = urls
        self._outstanding = [0] * len(urls)
        self._cursor = 0

    @property
    def urls(self) -> tuple[str, ...]:
        return self._urls

    def outstanding(self) -> tuple[int, ...]:
        """Calls currently in flight per replica, in `urls` order."""
        return tuple(self._outstanding)

    def acquire(self) -> int:
        """Index of the replica for the next call; the caller must `release` it when the call ends."""
        count = len(self._urls)
        if count == 1:
            self._outstanding[0] += 1
            return 0
        best = self._cursor
        for offset in range(1, count):
            index = (self._cursor + offset) % count
            # Strict '<' keeps the first minimum met from the cursor on: that is the round-robin tie-break.
            if self._outstanding[index] < self._outstanding[best]:
                best = index
        self._outstanding[best] += 1
        self._cursor = (best + 1) % count
        return best

    def release(self, index: int) -> None:
        self._outstanding[index] -= 1

    @contextmanager
    def lease(self) -> Iterator[str]:
        """The chosen base URL for the duration of one call."""
        index = self.acquire()
        try:
            yield self._urls[index]
        finally:
            self.release(index)
