"""Following what a provider says of its limits: headers that state them, refusals that reveal them.

A stated limit lowers a declared one or becomes the limit where none was declared; a refusal that states nothing
may teach a request rate (`learned_rate`); nothing here ever raises a limit. The gate holds one follower and
applies the pauses it returns. Rules and reasons: docs/reliability.md ("The gate").
"""

from __future__ import annotations

from collections.abc import Callable

from rcarun.backends.types import RateLimitInfo
from rcarun.errors import RateLimited, ReportedLimits

from .learned_rate import LearnedRate, RateChange
from .limits import RateLimiter

__all__ = ["LimitFollower"]


class LimitFollower:
    """Sets ``limiter``'s limits from what the provider says, over the declared ``rpm`` and ``tpm``."""

    def __init__(
        self,
        limiter: RateLimiter,
        *,
        rpm: float | None,
        tpm: float | None,
        window_s: float | None,
        learns_from_refusals: bool,
        now: Callable[[], float],
    ) -> None:
        self.limiter = limiter
        self._rpm = rpm
        self._tpm = tpm
        self._window_s = window_s or 60.0
        self._learns = learns_from_refusals
        self._now = now
        # Requests are paced at the lowest of the declared, the lowest stated and the learned rate.
        self._learned = LearnedRate(self._window_s)
        self._stated_rpm: float | None = None
        self._rate_changes: list[RateChange] = []
        # Smoothed tokens per settled call, for pausing on a spent token quota nobody declared.
        self._mean_call_tokens = 0.0

    def note_call_tokens(self, tokens: int) -> None:
        self._mean_call_tokens = (
            float(tokens) if self._mean_call_tokens == 0 else 0.9 * self._mean_call_tokens + 0.1 * tokens
        )

    def headers_pause(self, info: RateLimitInfo) -> float:
        """Adopt the limits an answer states; the pause until a window reported exhausted, that nothing paces,
        holds one more (0 for none)."""
        self._adopt_stated(info)
        pause = 0.0
        if (
            self.limiter.requests_per_minute is None
            and info.remaining_requests is not None
            and info.remaining_requests <= 0
        ):
            pause = max(pause, self._one_more_s(1.0, info.limit_requests, info.reset_requests_s))
        if (
            self.limiter.tokens_per_minute is None
            and info.remaining_tokens is not None
            and info.remaining_tokens <= 0
        ):
            pause = max(
                pause, self._one_more_s(self._mean_call_tokens, info.limit_tokens, info.reset_tokens_s)
            )
        return pause

    def refusal_pause(self, error: RateLimited) -> float | None:
        """Follow a refusal: adopt what it states, learn from a bare one, drain the refused buckets; return
        ``Retry-After``, else the time until each exhausted window holds one more, else None."""
        info = error.rate_limit
        requests_out = (
            info is not None and info.remaining_requests is not None and info.remaining_requests <= 0
        )
        tokens_out = info is not None and info.remaining_tokens is not None and info.remaining_tokens <= 0
        if not (requests_out or tokens_out):
            if self._tpm is not None and self._rpm is None:
                tokens_out = True
            else:
                requests_out = True
        if info is not None:
            self._adopt_stated(info)
        # The headers are None when the refusal carries none of them (`parse_rate_limit_headers`).
        bare = error.retry_after_s is None and info is None
        change = self._learned.refused(self._now(), states_limit=not (bare and self._learns))
        if change is not None:
            self._follow(change)
        # The provider's window is full now: what the buckets still hold was refused, not available.
        self.limiter.drain(requests=requests_out, tokens=tokens_out)

        if error.retry_after_s is not None:
            return error.retry_after_s
        if info is None:
            return None
        pauses = []
        if requests_out and info.reset_requests_s is not None:
            pauses.append(self._one_more_s(1.0, self.limiter.requests_per_minute, info.reset_requests_s))
        if tokens_out and info.reset_tokens_s is not None:
            pauses.append(
                self._one_more_s(self._mean_call_tokens, self.limiter.tokens_per_minute, info.reset_tokens_s)
            )
        return max(pauses) if pauses else None

    def take_rate_changes(self) -> list[RateChange]:
        changes, self._rate_changes = self._rate_changes, []
        return changes

    def accepted(self) -> None:
        change = self._learned.accepted(self._now())
        if change is not None:
            self._follow(change)

    def _follow(self, change: RateChange) -> None:
        """Pace requests at the lowest of the declared, the stated and the learned rate, and keep the change."""
        self._rate_changes.append(change)
        rates = [rate for rate in (self._rpm, self._stated_rpm, self._learned.held_rpm) if rate is not None]
        rpm = min(rates) if rates else None
        if rpm == self.limiter.requests_per_minute:
            return
        if rpm is None:
            self.limiter.drop_request_limit()
        else:
            self.limiter.set_limits(
                rpm, None, sent={"requests": self._learned.accepted_in_window(self._now())}
            )

    def _adopt_stated(self, info: ReportedLimits) -> None:
        """A limit the provider states: lowers a declared one, or becomes the limit where none was declared."""
        requests = (
            info.limit_requests if info.limit_requests is not None and info.limit_requests > 0 else None
        )
        tokens = info.limit_tokens if info.limit_tokens is not None and info.limit_tokens > 0 else None
        if requests is not None:
            self._stated_rpm = requests if self._stated_rpm is None else min(self._stated_rpm, requests)
        if requests is not None or tokens is not None:
            # A request limit set where none was paced starts its window log with what the provider accepted.
            unpaced = requests is not None and self.limiter.requests_per_minute is None
            sent = {"requests": self._learned.accepted_in_window(self._now())} if unpaced else None
            self.limiter.lower_limits(requests, tokens, set_unpaced=True, sent=sent)

    def _one_more_s(self, amount: float, limit_per_minute: float | None, reset_s: float | None) -> float:
        """Seconds until a provider's window holds ``amount`` more at ``limit_per_minute``; a stated reset within
        the window bounds it, one beyond it (a longer limit's) is waited out whole."""
        if reset_s is not None and reset_s > self._window_s:
            return reset_s
        if limit_per_minute is None or limit_per_minute <= 0:
            return reset_s or 0.0
        refill = amount * 60.0 / limit_per_minute
        return min(refill, reset_s) if reset_s else refill
