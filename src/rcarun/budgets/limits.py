"""Requests/min and tokens/min limits for one backbone: two limits (`buckets`) behind one FIFO queue.

Strict arrival order, so the heaviest items finish, and prompts larger than a burst are admitted (into debt),
so huge trajectories still run: what aiolimiter and asyncio-throttle do not do. Limits may change while running
(a provider states a lower one, or the gate learns one). Model and reasons: docs/reliability.md ("The limiter").
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .buckets import Bucket, WindowLog

__all__ = ["MAX_BURST_S", "Clock", "Grant", "RateLimiter"]

# Seconds, monotonic. None means "the running loop's time", which is also what the wake-up timers use.
Clock = Callable[[], float]

# A burst of a few seconds absorbs scheduling jitter; a minute's worth would trip providers' shorter windows.
MAX_BURST_S = 10.0


@dataclass(frozen=True, slots=True)
class Grant:
    """What one admission took (``serial``: its place in admission order); `RateLimiter.settle` it later."""

    tokens: int
    admitted_at: float
    serial: int

    def amount(self, kind: str) -> float:
        """What it takes of ``kind`` ("requests": one; "tokens": its tokens)."""
        return 1.0 if kind == "requests" else float(self.tokens)


class _Waiter:
    __slots__ = ("future", "tokens")

    def __init__(self, tokens: int, future: asyncio.Future[Grant]) -> None:
        self.tokens = tokens
        self.future = future


class RateLimiter:
    """Admits calls in strict arrival order within a requests/min and a tokens/min limit (None: unlimited).

    One loop timer wakes the head when its deficit is refilled; nothing polls. Create it anywhere; use it from
    the loop that awaits it. ``full_slack_s``: an oversized weight waits until its bucket has been full this
    long; ``window_s``: the provider's counting window (None: a plain token bucket).
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
            Bucket(requests_per_minute, burst_s, full_slack_s, window_s=window_s)
            if requests_per_minute is not None
            else None
        )
        self._tokens = (
            Bucket(tokens_per_minute, burst_s, full_slack_s, window_s=window_s)
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
        """Reconcile a grant (once) with the tokens reported: refund the excess, or take the shortfall as debt."""
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
        """Pace to lower limits from now on; return the kinds lowered or set ("requests", "tokens").

        A limit not below the current one changes nothing; one on an unpaced kind only with ``set_unpaced``
        (`set_limits`).
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
        """Pace to these limits from now on, up or down (None: as it is); return whether anything changed.

        A newly paced kind starts EMPTY (the provider's window is full now: that is why it is set), its window
        log holding ``sent[kind]``, the (time, amount) pairs the provider already counted, oldest first.
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
                bucket = Bucket(
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

    def _window_log(self, kind: str) -> WindowLog | None:
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
