"""LLMs that wrap the `LLM` a method was given, so a method can run another method inside it.

Self-consistency runs its base method several times at a non-zero temperature, each draw numbered so the call
cache keeps them apart; Continual Search runs its base method once and keeps the conversation of its final call
to continue it. Both do it by handing the base method a wrapper instead of changing the base method.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from rcarun.methods.llm import LLM, ChatOptions, Message, Reasoning, Reply, ToolChoice

__all__ = ["DelegatingLLM", "Exchange", "ResampledLLM", "TranscriptLLM"]


class DelegatingLLM:
    """Forwards everything to ``inner``; subclasses change what they need."""

    def __init__(self, inner: LLM) -> None:
        self._inner = inner

    @property
    def context_window(self) -> int | None:
        return self._inner.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._inner.estimate_tokens(text)

    @property
    def backbone(self) -> str:
        return self._inner.backbone

    def for_backbone(self, name: str) -> LLM:
        return self._rewrap(self._inner.for_backbone(name))

    def _rewrap(self, inner: LLM) -> LLM:
        """The same wrapper around another backbone's LLM (subclasses keep their behaviour there)."""
        return inner

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply:
        return await self._inner.chat(messages, stage=stage, max_tokens=max_tokens, **options)


class ResampledLLM(DelegatingLLM):
    """Every call as draw number ``sample`` at ``temperature``, whatever the wrapped method asks for."""

    def __init__(self, inner: LLM, *, sample: int, temperature: float | None) -> None:
        super().__init__(inner)
        self.sample = sample
        self.temperature = temperature

    def _rewrap(self, inner: LLM) -> LLM:
        return ResampledLLM(inner, sample=self.sample, temperature=self.temperature)

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply:
        options["temperature"] = self.temperature
        options["sample"] = self.sample
        return await super().chat(messages, stage=stage, max_tokens=max_tokens, **options)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One call the wrapped method made: what it sent and what came back."""

    stage: str
    messages: tuple[Message, ...]
    reply: Reply
    max_tokens: int
    temperature: float | None
    reasoning: Reasoning | None
    tools: tuple[Mapping[str, Any], ...]
    tool_choice: ToolChoice | None


class TranscriptLLM(DelegatingLLM):
    """Keeps every exchange of the wrapped method, in order."""

    def __init__(self, inner: LLM) -> None:
        super().__init__(inner)
        self.exchanges: list[Exchange] = []

    def last(self, stage: str) -> Exchange | None:
        """The last exchange of ``stage`` (a retried final call: the retry), or None."""
        return next((e for e in reversed(self.exchanges) if e.stage == stage), None)

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply:
        reply = await super().chat(messages, stage=stage, max_tokens=max_tokens, **options)
        self.exchanges.append(
            Exchange(
                stage=stage,
                messages=tuple(messages),
                reply=reply,
                max_tokens=max_tokens,
                temperature=options.get("temperature"),
                reasoning=options.get("reasoning"),
                tools=tuple(options.get("tools") or ()),
                tool_choice=options.get("tool_choice"),
            )
        )
        return reply
