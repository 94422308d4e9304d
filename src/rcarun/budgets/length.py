"""Output budgets: clamp the first attempt to the context, and double the budget after a length stop.

Thinking takes an unpredictable share of ``max_tokens``, so the LongRCA protocol retries a length stop with
twice the budget (capped per stage); every budget also fits the room the prompt leaves (vLLM answers 400 else).
"""

from __future__ import annotations

from rcarun.errors import ContextOverflow

__all__ = [
    "DEFAULT_CONTEXT_SAFETY_TOKENS",
    "DEFAULT_LENGTH_CAP",
    "clamp_to_context",
    "next_length_budget",
]

DEFAULT_LENGTH_CAP = 65_536

# Room left for what a characters-based prompt estimate misses: chat-template tokens and tokenizer variance.
DEFAULT_CONTEXT_SAFETY_TOKENS = 128


def next_length_budget(
    current: int,
    *,
    cap: int = DEFAULT_LENGTH_CAP,
    model_max_output: int | None,
    context_window: int | None,
    prompt_tokens: int,
) -> int | None:
    """The budget for a retry after a length stop at ``current``, within ``cap``, the model's limits and the room
    the reported (exact) ``prompt_tokens`` leave; None when it could not be larger."""
    budget = min(2 * current, cap)
    if model_max_output is not None:
        budget = min(budget, model_max_output)
    if context_window is not None:
        budget = min(budget, context_window - prompt_tokens)
    return budget if budget > current else None


def clamp_to_context(
    max_tokens: int,
    *,
    context_window: int | None,
    prompt_tokens_estimate: int,
    model_max_output: int | None,
    safety_tokens: int = DEFAULT_CONTEXT_SAFETY_TOKENS,
) -> int:
    """The first attempt's budget: ``max_tokens`` bounded by the model's output limit and the context's room
    (`ContextOverflow` when none is left)."""
    budget = max_tokens
    if model_max_output is not None:
        budget = min(budget, model_max_output)
    if context_window is not None:
        room = context_window - prompt_tokens_estimate - safety_tokens
        if room < 1:
            raise ContextOverflow(
                f"prompt of about {prompt_tokens_estimate} tokens leaves no room for output in a "
                f"{context_window}-token context window (safety margin {safety_tokens})",
                status=None,
            )
        budget = min(budget, room)
    return budget
