"""The `LLM` a method receives: the only door from a method to a model.

Methods build prompts and parse answers; the call cache, limits, retries, budgets, spend and storage happen
behind ``llm.chat`` in the runner's session, so a method can be tested with a scripted LLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypedDict, Unpack

__all__ = ["LLM", "ChatOptions", "Message", "Reasoning", "Reply", "ToolCall", "ToolChoice"]

Reasoning = Literal["off", "low", "medium", "high"]
# Whether the model may ("auto"), must ("required") or must not ("none") call the offered tools.
ToolChoice = Literal["auto", "none", "required"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model asked for (OpenAI-style function calling).

    ``arguments`` is the JSON text exactly as the model wrote it: it may not be valid JSON, and deciding what to
    do about that is the method's business (it answers the call with an error, never guesses).
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation.

    An assistant turn that asked for tools carries ``tool_calls`` (its ``content`` may be empty); each answer to
    one of those calls is a ``tool`` message naming the call in ``tool_call_id``.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


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
        tool_calls: the functions the model asked to call (finish_reason "tool_calls"); empty otherwise.
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
    tool_calls: tuple[ToolCall, ...] = ()


class ChatOptions(TypedDict, total=False):
    """The request options of ``llm.chat`` beyond its stage and budget, each part of the request's identity.

    Absent means no schema, the provider's temperature, reasoning and tool choice, no tools, draw 0. ``schema``
    is the JSON schema the reply is decoded against; ``tools`` are OpenAI-style function specs, whose calls come
    back in ``Reply.tool_calls``; ``sample`` numbers independent draws of one request (self-consistency), which
    never share a cached answer. A new option is declared here once, and every `LLM` takes it.
    """

    schema: Mapping[str, Any] | None
    temperature: float | None
    reasoning: Reasoning | None
    tools: Sequence[Mapping[str, Any]] | None
    sample: int
    tool_choice: ToolChoice | None


class LLM(Protocol):
    """What a method may ask of a model.

    ``stage`` names the call's role in the method ("attribution", "summary", ...): stage budgets, the call cache
    and the cost report are keyed by it. ``max_tokens`` is the first attempt's output budget; a length stop is
    retried with the budget doubled up to the stage's cap. A tool conversation is one ``chat`` call per round.

    Raises:
        rcarun.errors.FatalCallError: the call cannot succeed (bad request, context overflow, auth, quota);
            the runner records the item as failed.
        rcarun.errors.BudgetExhausted: the run's spend budget stops admission; the item is left for resume.
    """

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply: ...

    @property
    def backbone(self) -> str:
        """The name of the backbone this LLM sends to (as named in the sweep)."""
        ...

    def for_backbone(self, name: str) -> LLM:
        """The same work item's LLM on backbone ``name`` of the sweep (a judge panel asks several).

        Raises:
            rcarun.errors.ConfigError: the sweep defines no backbone called ``name``.
        """
        ...

    @property
    def context_window(self) -> int | None:
        """The backbone's context window in tokens, when known, so a method can apply its truncation policy."""
        ...

    def estimate_tokens(self, text: str) -> int:
        """Estimated prompt tokens of ``text`` for this backbone (its UTF-8 bytes over the calibrated ratio)."""
        ...
