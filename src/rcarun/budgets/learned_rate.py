"""The one request rate rcarun learns by itself, from refusals that state no limit.

When a window holds at least 20 answered requests and a tenth or more were refused without a word, the backbone
is held to what that window accepted; refusal-free windows raise it by a quarter until it is released. Rule and
reasons: docs/reliability.md ("The learned request rate").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = ["LearnedRate", "RateChange"]

# The evidence a bare refusal needs before it teaches a rate.
MIN_ANSWERED = 20
MIN_REFUSED_SHARE = 0.1
# The held rate grows this much per refusal-free window, and is released at this multiple of where it was learned.
RAISE_BY = 1.25
RELEASE_AT = 2.0
# The window's answers are counted per slot (a sixtieth of it): memory stays bounded however fast answers come.
_SLOTS = 60


@dataclass(frozen=True, slots=True)
class RateChange:
    """A change of the learned rate (``learned``, ``raised`` or ``released``: ``rpm`` None), for events and lines."""

    kind: Literal["learned", "raised", "released"]
    rpm: float | None
    accepted: int
    refused: int


class LearnedRate:
    """One backbone's learned request rate over the provider's ``window_s``: fed every answer, it says when the
    rate changes."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._slot_s = window_s / _SLOTS
        # [slot, accepted, refused], oldest first, and their sums.
        self._slots: deque[list[int]] = deque()
        self._accepted = 0
        self._refused = 0
        self.held_rpm: float | None = None
        self._learned_rpm = math.inf
        self._learned_at = -math.inf
        self._quiet_since = -math.inf  # the later of the last refusal and the last change of the held rate

    def accepted(self, now: float) -> RateChange | None:
        """An answer was accepted at ``now``: after a refusal-free window, the held rate rises or is released."""
        self._count(now, accepted=1)
        if self.held_rpm is None or now - self._quiet_since < self.window_s:
            return None
        self._quiet_since = now
        raised = self.held_rpm * RAISE_BY
        if raised >= RELEASE_AT * self._learned_rpm:
            self.held_rpm, self._learned_rpm = None, math.inf
            return RateChange("released", None, self._accepted, self._refused)
        self.held_rpm = raised
        return RateChange("raised", raised, self._accepted, self._refused)

    def refused(self, now: float, *, states_limit: bool) -> RateChange | None:
        """A request was refused at ``now``; one that states no limit (``states_limit`` False) may teach a rate."""
        self._count(now, refused=1)
        self._quiet_since = now
        answered = self._accepted + self._refused
        if (
            states_limit
            or now - self._learned_at < self.window_s
            or answered < MIN_ANSWERED
            or self._refused < MIN_REFUSED_SHARE * answered
            or self._accepted == 0
        ):
            return None
        rpm = self._accepted * 60.0 / self.window_s
        if self.held_rpm is not None and rpm >= self.held_rpm:
            return None
        self.held_rpm = self._learned_rpm = rpm
        self._learned_at = now
        return RateChange("learned", rpm, self._accepted, self._refused)

    def accepted_in_window(self, now: float) -> list[tuple[float, float]]:
        """What the provider accepted in the window, as (time, requests) per slot dated at its end: the window log
        of a limiter that starts pacing requests only now."""
        self._expire(now)
        return [((slot + 1) * self._slot_s, float(accepted)) for slot, accepted, _ in self._slots if accepted]

    def _count(self, now: float, *, accepted: int = 0, refused: int = 0) -> None:
        self._expire(now)
        slot = math.floor(now / self._slot_s)
        slots = self._slots
        if slots and slots[-1][0] >= slot:
            slots[-1][1] += accepted
            slots[-1][2] += refused
        else:
            slots.append([slot, accepted, refused])
        self._accepted += accepted
        self._refused += refused

    def _expire(self, now: float) -> None:
        # A slot leaves once all of it is older than the window.
        horizon = math.floor((now - self.window_s) / self._slot_s)
        slots = self._slots
        while slots and slots[0][0] < horizon:
            _, accepted, refused = slots.popleft()
            self._accepted -= accepted
            self._refused -= refused
