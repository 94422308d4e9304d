"""What to do after a failed attempt: retry or not, how long to wait, whether the backbone must slow down.

Backends never retry; the runner asks this policy, so each error class's reaction lives in one place. A rate
limit is about the backbone: it is paused and its concurrency cut even when the call is out of attempts. A
provider asking to wait beyond ``max_pause_s`` stops the backbone for the session instead of a silent wait.
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
    """The policy's answer for one failed attempt; ``stop_backbone``: the provider asked to wait beyond
    ``max_pause_s`` (``asked_s``, may be inf), so nothing more goes to it this session."""

    retry: bool
    delay_s: float = 0.0
    pause_backbone_s: float = 0.0
    shrink_concurrency: bool = False
    stop_backbone: bool = False
    asked_s: float | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff (``base_s`` doubling, at most ``cap_s``, times 1 ± ``jitter``) for ``max_attempts``
    attempts in all, and rate limits honoured as the provider asks, up to ``max_pause_s``."""

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
        """Decide after attempt number ``attempt`` (1-based) failed; ``asked_s`` is the gate's reading of a
        refusal's pause (without it: the longest of ``Retry-After`` and the reset headers)."""
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
