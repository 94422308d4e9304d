"""The two halves of one rate limit: a token bucket that paces, and a log of what the last window admitted.

A bucket holds ``burst_s`` seconds of quota, refills at ``limit / 60`` per second and may go into debt; a window
log keeps a strict sliding window within the limit. Model and reasons: docs/reliability.md ("The limiter").
"""

from __future__ import annotations

import bisect
import math
from collections import deque

__all__ = ["LEVEL_TOLERANCE", "Bucket", "WindowLog"]

# Relative slack when comparing a refilled level with a need: the timer fires exactly when the deficit is
# refilled, and float rounding must not turn that into a second, near-zero wait.
LEVEL_TOLERANCE = 1e-9


# Level peaks a bucket remembers for refunds (bounds memory and the cost of a refund); grants older than the
# remembered peaks get no refund, which is safe.
_MAX_PEAKS = 256


class Bucket:
    """One token bucket; ``level`` may go negative (debt). Refunds recompute history through the level peaks
    kept since each grant, so quota that would have overflowed is never given back (docs/reliability.md)."""

    __slots__ = (
        "burst_s",
        "capacity",
        "forgotten_before",
        "full_since",
        "full_slack_s",
        "last_take",
        "level",
        "log",
        "peaks",
        "per_minute",
        "rate_per_s",
        "updated_at",
    )

    def __init__(
        self,
        per_minute: float,
        burst_s: float,
        full_slack_s: float = 0.0,
        *,
        window_s: float | None = None,
        start_full: bool = True,
    ) -> None:
        self.burst_s = burst_s
        self.per_minute = per_minute
        self.capacity = per_minute / 60.0 * burst_s
        self.rate_per_s = per_minute / 60.0
        # The log holds each admission a little past the window (``full_slack_s``, the arrival jitter): the
        # provider dates it on arrival, which may come later than the admission.
        self.log = (
            WindowLog(window_s, per_minute / 60.0 * window_s, full_slack_s) if window_s is not None else None
        )
        self.level = self.capacity if start_full else 0.0
        self.updated_at: float | None = None
        # An oversized weight waits until the bucket has been full this long (see `wait_s`).
        self.full_slack_s = full_slack_s
        self.full_since = -math.inf
        # (serial, full_since before it) of the latest take, so giving that grant back restores the full time.
        self.last_take: tuple[int, float] = (0, -math.inf)
        # (serial, level before a decrease), serials increasing and levels strictly decreasing.
        self.peaks: list[tuple[int, float]] = []
        # Grants admitted before this serial may need forgotten peaks; they get no refund.
        self.forgotten_before = 0

    def refill(self, now: float) -> None:
        if self.updated_at is not None and now > self.updated_at:
            level = self.level + (now - self.updated_at) * self.rate_per_s
            if level >= self.capacity and self.level < self.capacity:
                self.full_since = self.updated_at + (self.capacity - self.level) / self.rate_per_s
            self.level = min(self.capacity, level)
        if self.updated_at is None or now > self.updated_at:
            self.updated_at = now

    def wait_s(self, weight: float) -> float:
        """Seconds until ``weight`` may be taken (after `refill`); an oversized weight also waits until the bucket
        has been full ``full_slack_s``, so the provider's bucket is full when it arrives."""
        need = min(weight, self.capacity) - self.level
        if need > LEVEL_TOLERANCE * max(1.0, self.capacity):
            return need / self.rate_per_s + (self.full_slack_s if weight >= self.capacity else 0.0)
        if self.full_slack_s > 0 and weight >= self.capacity and self.updated_at is not None:
            remaining = self.full_since + self.full_slack_s - self.updated_at
            # Same tolerance as for levels: a timer set for this moment must not wake to a near-zero wait.
            return remaining if remaining > LEVEL_TOLERANCE * max(1.0, self.full_slack_s) else 0.0
        return 0.0

    def take(self, amount: float, serial: int) -> None:
        """Lower the level (an admission, or a charge on settlement), remembering the peak it ends."""
        peaks = self.peaks
        while peaks and peaks[-1][1] <= self.level:
            peaks.pop()
        peaks.append((serial, self.level))
        if len(peaks) > _MAX_PEAKS:
            self.forgotten_before = peaks[_MAX_PEAKS // 2 - 1][0]
            del peaks[: _MAX_PEAKS // 2]
        self.last_take = (serial, self.full_since)
        self.level -= amount
        if self.level < self.capacity:
            self.full_since = math.inf

    def set_rate(self, per_minute: float, last_serial: int) -> None:
        """Pace to ``per_minute`` with the same burst (after `refill`); grants up to ``last_serial`` lose refunds."""
        self.per_minute = per_minute
        if self.log is not None:
            self.log.cap = per_minute / 60.0 * self.log.window_s
        self.capacity = per_minute / 60.0 * self.burst_s
        self.rate_per_s = per_minute / 60.0
        self.level = min(self.level, self.capacity)
        self.full_since = math.inf if self.level < self.capacity else self.full_since
        self.peaks.clear()
        self.forgotten_before = last_serial + 1

    def refund(self, amount: float, serial: int) -> None:
        """Recount the grant admitted as ``serial`` at ``amount`` less (refill to now first)."""
        if serial < self.forgotten_before:
            return
        peaks = self.peaks
        index = bisect.bisect_right(peaks, serial, key=_peak_serial)
        # Every peak after the grant is at most the first one, so the history lifts uniformly by this much.
        lift = min(amount, self.capacity - peaks[index][1]) if index < len(peaks) else amount
        refund = min(lift, self.capacity - self.level)
        if refund <= 0:
            return
        if index < len(peaks):
            lifted = [(peak_serial, level + lift) for peak_serial, level in peaks[index:]]
            earlier = peaks[:index]
            while earlier and earlier[-1][1] <= lifted[0][1]:
                earlier.pop()
            self.peaks = earlier + lifted
        self.level += refund
        if self.level >= self.capacity and self.updated_at is not None:
            restored = self.last_take[1] if self.last_take[0] == serial else self.updated_at
            self.full_since = min(self.full_since, restored)


class WindowLog:
    """What one limit admitted in the last ``window_s`` seconds: ``[time, amount, serial]`` entries in admission
    order (a settlement changes its amount in place) and their sum."""

    __slots__ = ("cap", "entries", "held_s", "total", "window_s")

    def __init__(self, window_s: float, cap: float, slack_s: float = 0.0) -> None:
        self.window_s = window_s
        self.held_s = window_s + slack_s
        self.cap = cap
        self.entries: deque[list[float]] = deque()
        self.total = 0.0

    def expire(self, now: float) -> None:
        horizon = now - self.held_s
        entries = self.entries
        while entries and entries[0][0] <= horizon:
            self.total -= entries.popleft()[1]
        if not entries:
            self.total = 0.0  # no float drift left behind

    def wait_s(self, weight: float, now: float) -> float:
        """Seconds until ``weight`` fits in the window (call right after `expire`). A weight above the whole
        cap fits an empty window."""
        tolerance = LEVEL_TOLERANCE * max(1.0, self.cap)
        excess = self.total + min(weight, self.cap) - self.cap
        if excess <= tolerance:
            return 0.0
        for at, amount, _ in self.entries:
            excess -= amount
            if excess <= tolerance:
                return max(0.0, at + self.held_s - now)
        return 0.0  # unreachable: the whole log expiring frees everything

    def add(self, at: float, amount: float, serial: int) -> None:
        self.entries.append([at, amount, float(serial)])
        self.total += amount

    def adjust(self, serial: int, delta: float) -> None:
        """Change the amount of the admission ``serial`` by ``delta`` (never below 0); gone entries are ignored."""
        entries = self.entries
        index = bisect.bisect_left(entries, float(serial), key=lambda entry: entry[2])
        if index < len(entries) and entries[index][2] == serial:
            entry = entries[index]
            change = max(-entry[1], delta)
            entry[1] += change
            self.total += change


def _peak_serial(peak: tuple[int, float]) -> int:
    return peak[0]
