"""Prompt-token estimates before a call, calibrated against what each backbone's tokenizer reports.

Token limits are reserved before the call, when only the prompt's characters are known. A fixed 4 characters
per token is wrong for code, JSON-heavy agent logs and non-English text, and an underestimate is what earns
429s (and 400s on a full context). So the ratio is learned per backbone from reported usage, moving quickly
towards fewer characters per token (more tokens: safe) and slowly the other way, so that estimates lean
high.
"""

from __future__ import annotations

import math

__all__ = ["TokenEstimator"]


class TokenEstimator:
    """Estimates prompt tokens from characters with a conservatively smoothed chars-per-token ratio.

    Args:
        chars_per_token: the starting ratio.
        margin: estimates are raised by this fraction, for the spread between prompts of one backbone.
        fall_weight: smoothing weight when a report shows more tokens than the ratio predicts (react fast).
        rise_weight: smoothing weight when it shows fewer (relax slowly).
        min_calibration_tokens: reports below this are ignored; chat-template overhead dominates them.
    """

    def __init__(
        self,
        chars_per_token: float = 4.0,
        *,
        margin: float = 0.05,
        fall_weight: float = 0.5,
        rise_weight: float = 0.05,
        min_calibration_tokens: int = 64,
    ) -> None:
        if not chars_per_token > 0:
            raise ValueError(f"chars_per_token must be positive, got {chars_per_token}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self._chars_per_token = chars_per_token
        self._margin = margin
        self._fall_weight = fall_weight
        self._rise_weight = rise_weight
        self._min_calibration_tokens = min_calibration_tokens
        self._samples = 0

    @property
    def chars_per_token(self) -> float:
        """The current ratio."""
        return self._chars_per_token

    @property
    def samples(self) -> int:
        """Reports used for calibration so far."""
        return self._samples

    def estimate(self, prompt_chars: int) -> int:
        """Estimated prompt tokens for ``prompt_chars`` characters of message content, margin included."""
        return math.ceil(prompt_chars / self._chars_per_token * (1.0 + self._margin))

    def calibrate(self, prompt_chars: int, reported_prompt_tokens: int) -> None:
        """Fold one provider report into the ratio."""
        if reported_prompt_tokens < self._min_calibration_tokens or prompt_chars <= 0:
            return
        observed = prompt_chars / reported_prompt_tokens
        weight = self._fall_weight if observed < self._chars_per_token else self._rise_weight
        self._chars_per_token += weight * (observed - self._chars_per_token)
        self._samples += 1
