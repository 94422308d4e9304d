"""The `LLM` a method receives: the only door from a method to a model.

Methods are pure orchestration (build prompts, parse and validate answers). Everything else — call cache, rate
and token limits, retries, length-triggered budget doubling, spend accounting and storage — happens behind
``llm.chat`` in the runner's session, so a method can be tested with a scripted LLM and never thinks about
limits. Every attempt the session makes (retries included) becomes one row in results.db's ``calls`` table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["LLM", "Message", "Reasoning", "Reply"]

Reasoning = Literal["off", "low", "medium", "high"]


@dataclass(frozen=True, slots=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True, slots=True)
class Reply:
    """The final attempt's answer to one ``llm.chat`` call.

    Attributes:
        text: the answer's content.
        parsed: the JSON value decoded from ``text`` when a schema was given and the text is JSON, else None.
        parse_error: why ``text`` could not be decoded as JSON (None when it could, or when no schema was given).
        finish_reason: "stop", "length", ... of the final attempt; "length" means the budget ran out even after
            the configured length retries.
        attempts: how many attempts the session made (cache hits count as attempts served from the cache).
        prompt_tokens / completion_tokens / reasoning_tokens / cached_tokens: summed over all attempts.
        reasoning_text: thinking text of the final attempt, when the provider returns it.
    """

    text: str
    parsed: Any
    parse_error: str | None
    finish_reason: str
    attempts: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    reasoning_text: str = ""


class LLM(Protocol):
    """What a method may ask of a model.

    ``stage`` names the call's role in the method ("attribution", "summary", ...): stage budgets, the call cache
    and the cost report are keyed by it. ``max_tokens`` is the first attempt's output budget; a length stop is
    retried with the budget doubled up to the stage's cap, as configured for the run.

    Raises:
        rcarun.errors.FatalCallError: the call cannot succeed (bad request, context overflow, auth, quota);
            the runner records the item as failed.
        rcarun.errors.BudgetExhausted: the run's spend budget stops admission; the item is left for resume.
    """

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        stage: str,
        max_tokens: int,
        schema: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        reasoning: Reasoning | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Reply: ...

    @property
    def context_window(self) -> int | None:
        """The backbone's context window in tokens, when known, so a method can apply its truncation policy."""
        ...

    def estimate_tokens(self, text: str) -> int:
        """Estimated prompt tokens of ``text`` for this backbone (calibrated chars-per-token)."""
        ...
