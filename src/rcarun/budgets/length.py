"""Output budgets: clamp the first attempt to the context, and double the budget after a length stop.

Reasoning models spend an unpredictable share of ``max_tokens`` on thinking, so a fixed budget either wastes
money or truncates answers. The LongRCA protocol retries a ``finish_reason == "length"`` attempt once with
twice the budget, capped at 65,536 tokens; the cap and the retry count are per stage. Self-hosted vLLM
answers 400 when prompt + max_tokens exceeds the context window, so every budget is also bounded by the room
the prompt leaves.
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
    """The budget for a retry after a length stop, or None when it could not be larger than ``current``.

    Args:
        current: the ``max_tokens`` of the attempt that stopped for length.
        cap: the stage's ceiling.
        model_max_output: the model's maximum output tokens, when known.
        context_window: the model's context window in tokens, when known.
        prompt_tokens: the prompt tokens the provider reported for that attempt (exact, so no safety margin).
    """
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
    """The first attempt's budget: ``max_tokens`` bounded by the model's output limit and the context's room.

    Raises:
        ContextOverflow: the prompt leaves no room for even one output token; the call would fail anyway.
    """
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
