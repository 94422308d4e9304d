"""Requests/min and tokens/min limits for one backbone: two token buckets behind one FIFO queue.

Why our own limiter rather than aiolimiter or asyncio-throttle (measured in ``benchmarks/limiters.py``):
asyncio-throttle counts requests only and polls with ``sleep(0.01)``; aiolimiter takes weights but keeps its
waiters in a heap ordered by weight, so a long-trajectory request is overtaken by every lighter one behind
it, and it refuses a weight above its capacity. A sweep needs the opposite on both counts: strict arrival
order, so the heaviest items finish, and admission of prompts larger than a burst, so huge trajectories
still run.

The model: each bucket holds ``burst_s`` seconds of quota (``capacity = limit / 60 * burst_s``), starts full,
and refills at ``limit / 60`` per second. An acquisition takes one request and ``tokens`` tokens. A weight
above a bucket's capacity is admitted once that bucket is full and drives it negative (debt), which later
admissions wait out. Hence, for weights within capacity, the admitted stream conforms: in every window of
length ``w``, admitted amount <= rate * w + capacity.

With ``window_s`` (the gate passes 60), each limit also keeps a log of what it admitted in the last
``window_s`` seconds (`_WindowLog`), and admits nothing that would take a window of that length above the
limit's share of it: the limit as a provider with a strict sliding minute counts it. A bucket alone admits
``limit + capacity`` in a minute that starts with a full bucket (the start of a sweep, or after a pause), and
such a provider answers the last of them with a 429 (issue 17). The bucket still paces within the window, at
the full ``limit / 60``, so providers that meter shorter windows see no burst beyond it either. Limits may
change while running (`set_limits`, `lower_limits`, `drop_request_limit`): a provider states a lower one, or the
gate learns a request rate from bare refusals and later releases it (`rcarun.budgets.learned_rate`).
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MAX_BURST_S", "Clock", "Grant", "RateLimiter"]

# Seconds, monotonic. None means "the running loop's time", which is also what the wake-up timers use.
Clock = Callable[[], float]

# A burst of a few seconds absorbs scheduling jitter; a minute's worth would trip providers' shorter windows.
MAX_BURST_S = 10.0

# Relative slack when comparing a refilled level with a need: the timer fires exactly when the deficit is
# refilled, and float rounding must not turn that into a second, near-zero wait.
_LEVEL_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Grant:
    """What one admission took; hand it to `RateLimiter.settle` once the provider reports the usage.

    Attributes:
        tokens: tokens reserved at admission (estimated prompt plus requested output budget).
        admitted_at: clock time of admission, in seconds.
        serial: position in the limiter's admission order.
    """

    tokens: int
    admitted_at: float
    serial: int

    def amount(self, kind: str) -> float:
        """What it takes of ``kind`` ("requests": one; "tokens": its tokens)."""
        return 1.0 if kind == "requests" else float(self.tokens)


# Level peaks a bucket remembers for refunds (bounds memory and the cost of a refund); grants older than the
# remembered peaks get no refund, which is safe.
_MAX_PEAKS = 256


class _Bucket:
    """One token bucket; ``level`` may go negative (debt) after an oversized weight or a charge.

    Refunds are where a naive bucket goes wrong: adding the unused part of a grant back to the level creates
    quota that, had the grant taken only its actual amount, would have overflowed the capacity meanwhile. So
    the level is kept equal to the bucket's history recomputed with every settled grant at its actual amount
    (pending grants count at their reservation). Changing one grant's amount by ``d`` at admission lifts the
    later history by ``min(d, capacity - highest level since)``; to compute that, the bucket keeps the level
    just before each decrease as a stack of strictly decreasing peaks, keyed by admission serial, and lifts
    the peaks after the grant along with the level.
    """

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
            _WindowLog(window_s, per_minute / 60.0 * window_s, full_slack_s) if window_s is not None else None
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
        """Seconds until ``weight`` may be taken (call right after `refill`).

        An oversized weight needs a full bucket that has stayed full for ``full_slack_s``: a provider that
        meters the same bucket sees the request a little later or earlier than we send it, and its bucket must
        be full too when the request arrives.
        """
        need = min(weight, self.capacity) - self.level
        if need > _LEVEL_TOLERANCE * max(1.0, self.capacity):
            return need / self.rate_per_s + (self.full_slack_s if weight >= self.capacity else 0.0)
        if self.full_slack_s > 0 and weight >= self.capacity and self.updated_at is not None:
            remaining = self.full_since + self.full_slack_s - self.updated_at
            # Same tolerance as for levels: a timer set for this moment must not wake to a near-zero wait.
            return remaining if remaining > _LEVEL_TOLERANCE * max(1.0, self.full_slack_s) else 0.0
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
        """Limit and pace to ``per_minute`` from now on, with the same seconds of burst (call right after
        `refill`). The remembered peaks were levels on the old scale, so grants up to ``last_serial`` get no
        refund."""
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


class _WindowLog:
    """What one limit admitted in the last ``window_s`` seconds, oldest first, and its sum.

    Entries are ``[time, amount, serial]`` in admission (serial) order; a settlement changes its grant's amount
    in place, so the log counts what the provider counted. Memory: one entry per admission in the window.
    """

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
        tolerance = _LEVEL_TOLERANCE * max(1.0, self.cap)
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


class _Waiter:
    __slots__ = ("future", "tokens")

    def __init__(self, tokens: int, future: asyncio.Future[Grant]) -> None:
        self.tokens = tokens
        self.future = future


class RateLimiter:
    """Admits calls in strict arrival order within a requests/min and a tokens/min budget.

    Waiters are woken by one loop timer set for the moment the head's deficit is refilled; nothing polls.
    Create it anywhere; it binds to the running loop only while someone waits. Call every method from inside
    the loop that awaits it.

    Args:
        requests_per_minute: request limit, or None for no request limit.
        tokens_per_minute: token limit, or None for no token limit.
        burst_s: bucket capacity in seconds of quota (a few seconds; a whole minute would let a client send
            60 s of quota at once and trip the provider's shorter windows).
        clock: monotonic seconds; defaults to the running loop's time.
        full_slack_s: a weight at or above a bucket's capacity waits until the bucket has been full this long,
            so a provider metering the same bucket is full too when the request arrives.
        window_s: the provider's counting window (60 for a strict sliding minute): no window this long ever
            admits more than the limit's share of it; None paces as a plain token bucket (module docstring).
    """

    def __init__(
        self,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        burst_s: float = 1.0,
        clock: Clock | None = None,
        *,
        full_slack_s: float = 0.0,
        window_s: float | None = None,
    ) -> None:
        for label, value in (
            ("requests_per_minute", requests_per_minute),
            ("tokens_per_minute", tokens_per_minute),
        ):
            if value is not None and not value > 0:
                raise ValueError(f"{label} must be positive or None, got {value!r}")
        if not 0 < burst_s <= MAX_BURST_S:
            raise ValueError(f"burst_s must be in (0, {MAX_BURST_S:g}] seconds, got {burst_s!r}")
        if full_slack_s < 0:
            raise ValueError(f"full_slack_s must be >= 0, got {full_slack_s!r}")
        if window_s is not None and not burst_s < window_s < math.inf:
            raise ValueError(f"window_s must be longer than burst_s and finite, got {window_s!r}")
        self._requests = (
            _Bucket(requests_per_minute, burst_s, full_slack_s, window_s=window_s)
            if requests_per_minute is not None
            else None
        )
        self._tokens = (
            _Bucket(tokens_per_minute, burst_s, full_slack_s, window_s=window_s)
            if tokens_per_minute is not None
            else None
        )
        self._window_s = window_s
        self._burst_s = burst_s
        self._full_slack_s = full_slack_s
        self._clock = clock
        # Cancelled waiters stay in the deque until they reach the head; ``_waiting`` counts the live ones.
        self._queue: deque[_Waiter] = deque()
        self._waiting = 0
        self._timer: asyncio.TimerHandle | None = None
        self._paused_until = -math.inf
        self._admitted = 0
        # Serials order admissions and charges, so a refund can tell which level peaks came after its grant.
        self._serial = 0

    @property
    def waiting(self) -> int:
        """Callers queued for admission."""
        return self._waiting

    @property
    def admitted(self) -> int:
        """Admissions so far (given-back grants included)."""
        return self._admitted

    @property
    def last_serial(self) -> int:
        """The serial of the latest admission (or settlement charge): every grant admitted so far is at most it."""
        return self._serial

    @property
    def paused_until(self) -> float:
        """Clock time before which nothing is admitted (-inf when never paused)."""
        return self._paused_until

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def acquire(self, tokens: int) -> Grant:
        """Wait for one request and ``tokens`` tokens, behind everyone who asked earlier.

        Raises:
            ValueError: ``tokens`` is negative.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        if self._waiting == 0:
            self._queue.clear()
            now = self._now()
            if self._wait_s(tokens, now) <= 0:
                return self._take(tokens, now)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(tokens, future)
        self._queue.append(waiter)
        self._waiting += 1
        if self._waiting == 1:
            self._admit_ready()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Admitted in the instant we were cancelled: the caller never sees the grant, so return it.
                self._return_grant(future.result())
            else:
                future.cancel()
                self._waiting -= 1
            self._admit_ready()
            raise

    def settle(self, grant: Grant, actual_tokens: int) -> None:
        """Reconcile a grant with the tokens the provider reported: refund the excess or charge the shortfall.

        Call once per grant. Refunds keep the admitted stream, counted at the settled amounts, conforming to
        the bucket. A charge (the reservation was too small) is taken at settlement as debt, which delays later
        admissions; the stream counted at a charged amount cannot conform retroactively.
        """
        bucket = self._tokens
        if bucket is None or actual_tokens == grant.tokens:
            return
        bucket.refill(self._now())
        if bucket.log is not None:
            bucket.log.adjust(grant.serial, actual_tokens - grant.tokens)
        if actual_tokens < grant.tokens:
            bucket.refund(grant.tokens - actual_tokens, grant.serial)
            if self._waiting:
                self._admit_ready()
        else:
            self._serial += 1
            bucket.take(actual_tokens - grant.tokens, self._serial)

    def give_back(self, grant: Grant) -> None:
        """Return an unused grant whole (request and tokens), e.g. when the call was never sent."""
        self._return_grant(grant)
        if self._waiting:
            self._admit_ready()

    def _adjust_logs(self, grant: Grant, sign: int) -> None:
        for kind in ("requests", "tokens"):
            log = self._window_log(kind)
            if log is not None:
                log.adjust(grant.serial, sign * grant.amount(kind))

    @property
    def requests_per_minute(self) -> float | None:
        """The request limit paced to now, None when requests are unlimited."""
        return self._requests.per_minute if self._requests is not None else None

    @property
    def tokens_per_minute(self) -> float | None:
        """The token limit paced to now, None when tokens are unlimited."""
        return self._tokens.per_minute if self._tokens is not None else None

    def lower_limits(
        self,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        *,
        set_unpaced: bool = False,
        sent: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    ) -> frozenset[str]:
        """Pace to lower limits from now on (a provider reported them, or a refusal taught them).

        A limit at or above the current one, or None, changes nothing; so does a limit on something this
        limiter does not pace, unless ``set_unpaced`` (then it is paced from now on, from an empty bucket: see
        `set_limits`, which takes ``sent``). Returns the kinds lowered or set ("requests", "tokens"), empty when
        nothing changed.
        """
        changed: list[str] = []
        limits: dict[str, float | None] = {}
        for kind, limit, bucket in (
            ("requests", requests_per_minute, self._requests),
            ("tokens", tokens_per_minute, self._tokens),
        ):
            lowers = limit is not None and (
                (bucket is None and set_unpaced) or (bucket is not None and 0 < limit < bucket.per_minute)
            )
            limits[kind] = limit if lowers else None
            if lowers:
                changed.append(kind)
        self.set_limits(limits["requests"], limits["tokens"], sent=sent)
        return frozenset(changed)

    def drain(self, *, requests: bool, tokens: bool) -> None:
        """Empty the named buckets (debt stays): the provider refused, so its own window is full now."""
        now = self._now()
        for bucket, named in ((self._requests, requests), (self._tokens, tokens)):
            if bucket is not None and named:
                bucket.refill(now)
                if bucket.level > 0:
                    self._serial += 1
                    bucket.take(bucket.level, self._serial)

    def set_limits(
        self,
        requests_per_minute: float | None,
        tokens_per_minute: float | None,
        *,
        sent: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    ) -> bool:
        """Pace to these limits from now on, up or down; None leaves that limit as it is.

        A limit on something not paced until now gets a bucket that starts EMPTY: it is set because the
        provider refused or counted what was sent, so its own window is full now. Its window log starts with
        ``sent[kind]``, (time, amount) pairs oldest first of what the provider already counted (the limiter
        kept no log of a kind it did not pace). Returns True when anything changed.
        """
        now = self._now()
        changed = False
        for kind, limit in (("requests", requests_per_minute), ("tokens", tokens_per_minute)):
            if limit is None:
                continue
            if not limit > 0 or math.isinf(limit):
                raise ValueError(f"{kind} per minute must be positive and finite, got {limit!r}")
            bucket = self._requests if kind == "requests" else self._tokens
            if bucket is None:
                bucket = _Bucket(
                    limit, self._burst_s, self._full_slack_s, window_s=self._window_s, start_full=False
                )
                if bucket.log is not None and sent is not None:
                    for at, amount in sent.get(kind, ()):
                        bucket.log.add(at, amount, 0)
                bucket.updated_at = now
                bucket.forgotten_before = self._serial + 1
                if kind == "requests":
                    self._requests = bucket
                else:
                    self._tokens = bucket
                changed = True
            elif limit != bucket.per_minute:
                bucket.refill(now)
                bucket.set_rate(limit, self._serial)
                changed = True
        if changed and self._waiting:
            self._admit_ready()
        return changed

    def drop_request_limit(self) -> None:
        """Pace requests no more (a learned rate was released and nothing else limits them)."""
        self._requests = None
        if self._waiting:
            self._admit_ready()

    def _window_log(self, kind: str) -> _WindowLog | None:
        """The window log of ``kind`` ("requests" or "tokens"); None when that kind keeps none."""
        bucket = self._requests if kind == "requests" else self._tokens
        return bucket.log if bucket is not None else None

    def pause_until(self, until: float) -> None:
        """Admit nothing before clock time ``until`` (a provider said 429). Pauses only ever extend."""
        if until > self._paused_until:
            self._paused_until = until
            if self._waiting:
                self._admit_ready()

    def _return_grant(self, grant: Grant) -> None:
        now = self._now()
        for bucket, amount in ((self._requests, 1), (self._tokens, grant.tokens)):
            if bucket is not None:
                bucket.refill(now)
                bucket.refund(amount, grant.serial)
        self._adjust_logs(grant, -1)

    def _wait_s(self, tokens: int, now: float) -> float:
        wait = max(0.0, self._paused_until - now)
        for bucket, weight in ((self._requests, 1), (self._tokens, tokens)):
            if bucket is None:
                continue
            bucket.refill(now)
            wait = max(wait, bucket.wait_s(weight))
            if bucket.log is not None:
                bucket.log.expire(now)
                wait = max(wait, bucket.log.wait_s(weight, now))
        return wait

    def _take(self, tokens: int, now: float) -> Grant:
        self._serial += 1
        for bucket, weight in ((self._requests, 1), (self._tokens, tokens)):
            if bucket is not None:
                bucket.take(weight, self._serial)
                if bucket.log is not None:
                    bucket.log.add(now, weight, self._serial)
        self._admitted += 1
        return Grant(tokens=tokens, admitted_at=now, serial=self._serial)

    def _admit_ready(self) -> None:
        """Admit waiters from the head while both buckets allow, then arm one timer for the new head."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queue = self._queue
        if self._waiting == 0:
            queue.clear()
            return
        now = self._now()
        while queue:
            head = queue[0]
            if head.future.done():
                queue.popleft()
                continue
            wait = self._wait_s(head.tokens, now)
            if wait > 0:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_at(loop.time() + wait, self._on_timer)
                return
            queue.popleft()
            self._waiting -= 1
            head.future.set_result(self._take(head.tokens, now))

    def _on_timer(self) -> None:
        self._timer = None
        self._admit_ready()
