"""What to do after a failed attempt: retry or not, how long to wait, whether the backbone must slow down.

Backends never retry (STYLE.md); the runner asks this policy instead, so the reaction to each error class
lives in one place and reads from the class alone. A rate limit is about the backbone, not the call: even
when the call has used up its attempts, the backbone is still paused and its concurrency cut, because other
items are about to hit the same wall.

Every pause has a ceiling, ``max_pause_s``. A provider that asks for longer (a ``Retry-After`` of a day, an
HTTP date decades ahead, ``1e400``) is not waited for in silence: the decision says to stop the backbone for
this session, so the runner can say so and leave its items for a later resume while other backbones go on.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from rcarun.errors import CallError, ConfigError, FatalCallError, RateLimited, RetryableError

__all__ = ["RetryDecision", "RetryPolicy"]

# 2**60 backoff multipliers are already far above any cap; the bound keeps float conversion finite.
_MAX_DOUBLINGS = 60


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """The policy's answer for one failed attempt.

    Attributes:
        retry: whether to make another attempt.
        delay_s: seconds to wait before that attempt (0 when not retrying and not rate-limited).
        pause_backbone_s: seconds during which the whole backbone admits nothing (0 for no pause).
        shrink_concurrency: whether the backbone's concurrency limit should take a multiplicative decrease.
        stop_backbone: the provider asked to wait longer than ``max_pause_s``: admit nothing more on this
            backbone in this session (no retry, no pause).
        asked_s: what the provider asked to wait (Retry-After or its reset headers, in seconds; may be inf),
            when it said.
    """

    retry: bool
    delay_s: float = 0.0
    pause_backbone_s: float = 0.0
    shrink_concurrency: bool = False
    stop_backbone: bool = False
    asked_s: float | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded attempts, and rate limits honoured as the provider asks.

    Attributes:
        max_attempts: attempts per call, the first included.
        base_s: backoff after the first failure, doubled per further failure.
        cap_s: no single backoff exceeds this.
        jitter: backoff is multiplied by a uniform factor in [1 - jitter, 1 + jitter] (then capped).
        rng: random source for the jitter; pass a seeded one for repeatable tests.
        max_pause_s: the longest the backbone is ever paused; a provider asking for more stops it instead.
    """

    max_attempts: int = 6
    base_s: float = 0.5
    cap_s: float = 60.0
    jitter: float = 0.25
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    max_pause_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"retry max_attempts must be >= 1, got {self.max_attempts}")
        if not (0 <= self.base_s < math.inf and 0 <= self.cap_s < math.inf):
            raise ConfigError(
                f"retry base_s and cap_s must be finite and >= 0, got {self.base_s} and {self.cap_s}"
            )
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"retry jitter must be in [0, 1], got {self.jitter}")
        if not 0 < self.max_pause_s < math.inf:
            raise ConfigError(f"retry max_pause_s must be finite and > 0, got {self.max_pause_s}")

    def too_long(self, seconds: float) -> bool:
        """Whether a pause of ``seconds`` (inf or NaN included) is more than this policy ever waits."""
        return not seconds <= self.max_pause_s

    def backoff_s(self, attempt: int) -> float:
        """Jittered exponential backoff after failed attempt number ``attempt`` (1-based)."""
        doublings = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
        delay = min(self.cap_s, self.base_s * 2.0**doublings)
        spread = self.jitter * (2.0 * self.rng.random() - 1.0)
        return min(self.cap_s, delay * (1.0 + spread))

    def decide(self, error: CallError, attempt: int, *, asked_s: float | None = None) -> RetryDecision:
        """Decide after attempt number ``attempt`` (1-based) failed with ``error``.

        ``asked_s``: for a rate limit, the pause the refusal calls for as the gate reads it (its headers against
        the limits it paces by, `BackboneGate.learn_from_refusal`); without it, the longest of ``Retry-After``
        and the reset headers.
        """
        attempts_left = attempt < self.max_attempts
        if isinstance(error, RateLimited):
            asked = asked_s if asked_s is not None else max(error.retry_after_s or 0.0, error.reset_s or 0.0)
            if self.too_long(asked):
                return RetryDecision(retry=False, stop_backbone=True, asked_s=asked)
            pause = min(self.max_pause_s, max(asked, self.backoff_s(attempt)))
            return RetryDecision(
                retry=attempts_left,
                delay_s=pause,
                pause_backbone_s=pause,
                shrink_concurrency=True,
                asked_s=asked if asked > 0 else None,
            )
        if isinstance(error, FatalCallError) or not isinstance(error, RetryableError) or not attempts_left:
            return RetryDecision(retry=False)
        return RetryDecision(retry=True, delay_s=self.backoff_s(attempt))
