"""Prompt-token estimates before a call, calibrated against what each backbone's tokenizer reports.

Token limits are reserved before the call, when only the prompt's characters are known. A fixed 4 characters
per token is wrong for code, JSON-heavy agent logs and non-English text, and an underestimate is what earns
429s (and 400s on a full context). So the ratio is learned per backbone from reported usage, moving quickly
towards fewer characters per token (more tokens: safe) and slowly the other way, so that estimates lean
high. The first report that shows more tokens than assumed replaces the starting ratio outright.

A spend budget needs more than a good guess: what a call can cost. Until the first report, nothing is known
about the tokenizer, so `TokenEstimator.worst_case` assumes one token per character (CJK text and code come
close; English is near four characters per token), and the ledger reserves that; from the first report on it
reserves the calibrated estimate. A first wave of calls admitted at chars/4 is what let a 30-dollar budget
spend 44 dollars on prompts that tokenized at twice the guess.

A provider's usage is the bill, unless it cannot be one: `implausible_usage` says when (more prompt tokens
than the prompt has UTF-8 bytes plus template overhead, more completion tokens than twice the output budget,
more prompt tokens than the context window). Such a call, and one with no usage at all, is charged
`estimated_usage`, a conservative estimate from the request and the answer text; an attempt cut short after
it was sent, `cut_usage`, from what had arrived.
"""

from __future__ import annotations

import math

from rcarun.backends.streaming import CallProgress
from rcarun.backends.types import Usage
from rcarun.errors import CallError, ConnectionFailed, MalformedResponse, ResponseTooLarge, TransportError

__all__ = ["TokenEstimator", "estimated_usage", "implausible_usage"]

# What the chat template adds per message at most, and per request, in tokens (byte-level tokenizers never
# give more than one token per UTF-8 byte, and a character is at most four bytes).
_TEMPLATE_TOKENS_PER_MESSAGE = 64
_TEMPLATE_TOKENS_PER_REQUEST = 4096
_MAX_TOKENS_PER_CHAR = 4


class TokenEstimator:
    """Estimates prompt tokens from characters with a conservatively smoothed chars-per-token ratio.

    Args:
        chars_per_token: the starting ratio.
        margin: estimates are raised by this fraction, for the spread between prompts of one backbone.
        fall_weight: smoothing weight when a report shows more tokens than the ratio predicts (react fast).
        rise_weight: smoothing weight when it shows fewer (relax slowly).
        min_calibration_tokens: reports below this are ignored; chat-template overhead dominates them.
        worst_chars_per_token: the ratio `worst_case` assumes before any report.
    """

    def __init__(
        self,
        chars_per_token: float = 4.0,
        *,
        margin: float = 0.05,
        fall_weight: float = 0.5,
        rise_weight: float = 0.05,
        min_calibration_tokens: int = 64,
        worst_chars_per_token: float = 1.0,
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
        self._worst_chars_per_token = min(worst_chars_per_token, chars_per_token)
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

    def worst_case(self, prompt_chars: int) -> int:
        """What a budget must reserve for ``prompt_chars``: the estimate once a report calibrated the ratio,
        one token per ``worst_chars_per_token`` characters before."""
        if self._samples:
            return self.estimate(prompt_chars)
        return max(self.estimate(prompt_chars), math.ceil(prompt_chars / self._worst_chars_per_token))

    def calibrate(self, prompt_chars: int, reported_prompt_tokens: int) -> None:
        """Fold one provider report into the ratio."""
        if reported_prompt_tokens < self._min_calibration_tokens or prompt_chars <= 0:
            return
        observed = prompt_chars / reported_prompt_tokens
        if observed < self._chars_per_token:
            weight = 1.0 if self._samples == 0 else self._fall_weight
        else:
            weight = self._rise_weight
        self._chars_per_token += weight * (observed - self._chars_per_token)
        self._samples += 1


def implausible_usage(
    usage: Usage,
    *,
    prompt_chars: int,
    messages: int,
    max_tokens: int,
    context_window: int | None = None,
) -> str | None:
    """Why ``usage`` cannot be what the provider billed for this request, or None when it can be."""
    prompt_ceiling = (
        _MAX_TOKENS_PER_CHAR * prompt_chars
        + _TEMPLATE_TOKENS_PER_MESSAGE * messages
        + _TEMPLATE_TOKENS_PER_REQUEST
    )
    if usage.prompt_tokens > prompt_ceiling:
        return f"usage.prompt_tokens {usage.prompt_tokens} is more than a prompt of {prompt_chars} characters can be"
    if context_window is not None and usage.prompt_tokens > context_window + _TEMPLATE_TOKENS_PER_REQUEST:
        return f"usage.prompt_tokens {usage.prompt_tokens} is more than the {context_window}-token context window"
    if usage.completion_tokens > 2 * max_tokens + _TEMPLATE_TOKENS_PER_REQUEST:
        return (
            f"usage.completion_tokens {usage.completion_tokens} is more than twice the output budget "
            f"of {max_tokens}"
        )
    return None


def estimated_usage(
    estimator: TokenEstimator, *, prompt_chars: int, answer_chars: int, max_tokens: int, finish_reason: str
) -> Usage:
    """A conservative bill for a call whose usage is missing or implausible.

    The prompt is charged as the budget reserves it (`TokenEstimator.worst_case`); the answer as its visible
    text estimates, or the whole output budget when the answer stopped for length (hidden reasoning a provider
    does not show cannot be counted otherwise).
    """
    completion = (
        max_tokens if finish_reason == "length" else min(max_tokens, max(1, estimator.estimate(answer_chars)))
    )
    return Usage(prompt_tokens=estimator.worst_case(prompt_chars), completion_tokens=completion)


def cut_usage(
    estimator: TokenEstimator,
    error: CallError | None,
    progress: CallProgress,
    *,
    prompt_chars: int,
    max_tokens: int,
) -> Usage | None:
    """What an attempt that ended without an answer may have cost (a conservative bill that no usage report
    will ever replace), or None when it cost nothing. ``error`` None: the attempt was cancelled.

    Nothing when no request went out (no connection) or the server refused it with an error status. Else the
    provider was, or may have been, generating: the prompt is charged as the budget reserves it
    (`TokenEstimator.worst_case`), and the completion as what was generated: streamed, the tokens received;
    unstreamed, the whole ``max_tokens`` (it may have been generated in full before the cut), or for a body that
    arrived whole but unreadable the tokens it holds. An error object within an accepted stream is charged for
    what the stream had carried, if anything. Never capped at ``max_tokens``: a stream that ran past its budget
    was billed past it.
    """
    if isinstance(error, ConnectionFailed) or (progress.status is not None and not progress.answered):
        return None
    streamed = progress.streamed
    cut_short = error is None or isinstance(error, TransportError | ResponseTooLarge | MalformedResponse)
    if not cut_short and not (streamed and progress.tokens):
        return None
    if streamed:
        completion = max(progress.tokens, estimator.estimate(progress.text_chars))
    elif isinstance(error, MalformedResponse):
        completion = estimator.estimate(progress.bytes_received)
    else:
        completion = max_tokens
    return Usage(prompt_tokens=estimator.worst_case(prompt_chars), completion_tokens=completion)
