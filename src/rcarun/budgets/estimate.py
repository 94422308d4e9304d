"""Prompt-token estimates before a call, calibrated against what each backbone's tokenizer reports.

The bytes-per-token ratio is learned per backbone, leaning high (an underestimate earns 429s); until the first
report a budget reserves the most a bill is believed to be. `implausible_usage` says when a reported usage cannot
be the bill; such calls, and cut ones, are charged conservative estimates. Why and how: docs/reliability.md
("Token estimates and bills we cannot believe").
"""

from __future__ import annotations

import math

from rcarun.backends.streaming import CallProgress
from rcarun.backends.types import PromptSize, Usage
from rcarun.errors import CallError, ConnectionFailed, MalformedResponse, ResponseTooLarge, TransportError

__all__ = ["TokenEstimator", "cut_usage", "estimated_usage", "implausible_usage"]

# What the chat template adds per message at most, and per request, in tokens.
_TEMPLATE_TOKENS_PER_MESSAGE = 64
_TEMPLATE_TOKENS_PER_REQUEST = 4096
# The most prompt tokens per character a bill is believed to hold: a byte-level tokenizer gives at most one per
# UTF-8 byte and a character is at most four bytes; a provider may count more than its tokenizer (a hidden
# prompt, a rule of its own) and that is still the bill, up to this.
_MAX_TOKENS_PER_CHAR = 4
# The most completion tokens a bill is believed to hold, in output budgets: some providers bill past max_tokens.
_MAX_OUTPUT_BUDGETS = 2.0


class TokenEstimator:
    """Estimates prompt tokens from UTF-8 bytes with a bytes-per-token ratio smoothed fast down (``fall_weight``)
    and slowly up (``rise_weight``), raised by ``margin``; reports under ``min_calibration_tokens`` are ignored."""

    def __init__(
        self,
        bytes_per_token: float = 4.0,
        *,
        margin: float = 0.05,
        fall_weight: float = 0.5,
        rise_weight: float = 0.05,
        min_calibration_tokens: int = 64,
    ) -> None:
        if not bytes_per_token > 0:
            raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self._bytes_per_token = bytes_per_token
        self._margin = margin
        self._fall_weight = fall_weight
        self._rise_weight = rise_weight
        self._min_calibration_tokens = min_calibration_tokens
        self._samples = 0
        self._unreported_answers = 0
        # The most completion tokens any report showed, in output budgets (at least 1); None before any report.
        self._output_budgets: float | None = None

    @property
    def bytes_per_token(self) -> float:
        """The current ratio."""
        return self._bytes_per_token

    @property
    def samples(self) -> int:
        """Reports used for calibration so far."""
        return self._samples

    @property
    def answered(self) -> bool:
        """Whether any answer has been settled: reported (and calibrating), or charged `unreported`."""
        return self._output_budgets is not None or self._unreported_answers > 0

    def estimate(self, utf8_bytes: int) -> int:
        """Estimated prompt tokens for ``utf8_bytes`` bytes of message content, margin included."""
        return math.ceil(utf8_bytes / self._bytes_per_token * (1.0 + self._margin))

    def reservation(self, prompt: PromptSize) -> int:
        """What a budget must reserve for ``prompt``: the estimate once calibrated; before, the most a bill is
        believed to be, or `unreported` once an answer came without a bill to believe."""
        if self._samples:
            return self.estimate(prompt.utf8_bytes)
        if self._unreported_answers:
            return self.unreported(prompt)
        return max(self.estimate(prompt.utf8_bytes), _MAX_TOKENS_PER_CHAR * prompt.chars)

    def unreported(self, prompt: PromptSize) -> int:
        """Prompt tokens to charge when the provider's count is missing or no bill can be: the estimate once a
        report calibrated the ratio, one token per UTF-8 byte before (the most a byte-level tokenizer bills)."""
        if self._samples:
            return self.estimate(prompt.utf8_bytes)
        return max(self.estimate(prompt.utf8_bytes), prompt.utf8_bytes)

    def reserved_output(self, max_tokens: int) -> int:
        """Completion tokens to reserve for ``max_tokens``: twice it until a report shows how this backbone bills,
        then the budget times the most billed past it; the budget once an answer came without a bill to believe."""
        if self._output_budgets is not None:
            budgets = self._output_budgets
        elif self._unreported_answers:
            budgets = 1.0
        else:
            budgets = _MAX_OUTPUT_BUDGETS
        return math.ceil(max_tokens * budgets)

    def calibrate_output(self, max_tokens: int, reported_completion_tokens: int) -> None:
        """Fold one provider report's completion tokens into what `reserved_output` reserves."""
        if max_tokens <= 0:
            return
        billed = min(_MAX_OUTPUT_BUDGETS, max(1.0, reported_completion_tokens / max_tokens))
        self._output_budgets = billed if self._output_budgets is None else max(self._output_budgets, billed)

    def note_unreported(self) -> None:
        """An answer came without usage to believe: until a report comes, calls are charged `unreported`."""
        self._unreported_answers += 1

    def calibrate(self, utf8_bytes: int, reported_prompt_tokens: int) -> None:
        """Fold one provider report into the ratio."""
        if reported_prompt_tokens < self._min_calibration_tokens or utf8_bytes <= 0:
            return
        observed = utf8_bytes / reported_prompt_tokens
        if observed < self._bytes_per_token:
            weight = 1.0 if self._samples == 0 else self._fall_weight
        else:
            weight = self._rise_weight
        self._bytes_per_token += weight * (observed - self._bytes_per_token)
        self._samples += 1


def implausible_usage(
    usage: Usage,
    *,
    prompt: PromptSize,
    messages: int,
    max_tokens: int,
    context_window: int | None = None,
) -> str | None:
    """Why ``usage`` cannot be what the provider billed for this request, or None when it can be."""
    prompt_ceiling = (
        _MAX_TOKENS_PER_CHAR * prompt.chars
        + _TEMPLATE_TOKENS_PER_MESSAGE * messages
        + _TEMPLATE_TOKENS_PER_REQUEST
    )
    if usage.prompt_tokens > prompt_ceiling:
        return f"usage.prompt_tokens {usage.prompt_tokens} is more than a prompt of {prompt.chars} characters can be"
    if context_window is not None and usage.prompt_tokens > context_window + _TEMPLATE_TOKENS_PER_REQUEST:
        return f"usage.prompt_tokens {usage.prompt_tokens} is more than the {context_window}-token context window"
    if usage.completion_tokens > _MAX_OUTPUT_BUDGETS * max_tokens + _TEMPLATE_TOKENS_PER_REQUEST:
        return (
            f"usage.completion_tokens {usage.completion_tokens} is more than twice the output budget "
            f"of {max_tokens}"
        )
    return None


def estimated_usage(
    estimator: TokenEstimator, *, prompt: PromptSize, answer_bytes: int, max_tokens: int, finish_reason: str
) -> Usage:
    """A conservative bill for a call whose usage is missing or implausible: the prompt at `unreported`, the
    answer by its text, or the whole budget after a length stop (hidden reasoning cannot be counted otherwise)."""
    completion = (
        max_tokens if finish_reason == "length" else min(max_tokens, max(1, estimator.estimate(answer_bytes)))
    )
    return Usage(prompt_tokens=estimator.unreported(prompt), completion_tokens=completion)


def cut_usage(
    estimator: TokenEstimator,
    error: CallError | None,
    progress: CallProgress,
    *,
    prompt: PromptSize,
    max_tokens: int,
) -> Usage | None:
    """What an attempt that ended without an answer may have cost, or None when nothing was generated (no
    request sent, or an error status). ``error`` None: cancelled. Rules: docs/reliability.md ("A cut call is
    never free")."""
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
    return Usage(prompt_tokens=estimator.unreported(prompt), completion_tokens=completion)
