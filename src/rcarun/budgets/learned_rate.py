"""The one request rate rcarun learns by itself, from refusals that state no limit.

The rule: a refusal that states no limit (a bare 429 or 503: no Retry-After, no ``x-ratelimit-*`` headers)
teaches a request rate only when the last window (a minute) holds at least 20 answered requests and a tenth or
more of them were refused; the backbone is then held to the requests that window accepted, once per window at
most. Each window without a refusal raises the held rate by a quarter, and once it has doubled from where it was
learned it is released.

Why so little: a limit the user declares, or the provider states in headers, is paced exactly by the limiter
(`rcarun.budgets.limits`), and Retry-After and reset headers say when to come back. What is left is a provider
that refuses without a word. One refusal, or a sporadic 1-2 % of them (a gateway's passing overload), says
nothing about a rate: adaptive concurrency and the retry backoff absorb those, and holding the backbone to what
a near-empty window accepted would throttle the whole run (issue 35, N6). A tenth refused over a full window is a
limit; holding to what it accepted stops the refusals, and raising the held rate lets it find its way back up.
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
    """A change of the learned request rate, for the run's events and the user's one line.

    Attributes:
        kind: ``learned`` (a rate is held now, or lower than before), ``raised`` (a refusal-free window), or
            ``released`` (nothing learned is held any more).
        rpm: the held requests per minute after the change; None when released.
        accepted / refused: the answers in the last window when it changed.
    """

    kind: Literal["learned", "raised", "released"]
    rpm: float | None
    accepted: int
    refused: int


class LearnedRate:
    """One backbone's learned request rate (module docstring): fed every answer, it says when the rate changes.

    Args:
        window_s: the window the provider counts its per-minute limit over (a minute: 60).
    """

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
        """What the provider accepted in the window, as (time, requests) per slot, each dated at its slot's end
        (it leaves the window no earlier than its requests did): a limiter that starts pacing requests only now
        starts its window log with them."""
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
