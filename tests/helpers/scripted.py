"""A scripted LLM: methods are tested against canned replies, with every request kept for inspection.

``replies`` is either a list of answers, served in order, or a callable that writes the answer to each request
(given the request as recorded in ``requests``: its messages, ``system`` and ``user`` texts, stage and options),
for methods whose number of calls depends on the log. An answer is a text (decoded as JSON when it is JSON,
finish_reason "stop") or a whole `Reply`, for tool calls, length stops and usage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from rcarun.methods import Message, Reply
from rcarun.methods.llm import ChatOptions

__all__ = ["Answer", "ScriptedLLM", "numbered"]

Answer = str | Reply


@dataclass
class ScriptedLLM:
    replies: list[str] | list[Answer] | Callable[[dict[str, Any]], Answer]
    context_window: int | None = None
    chars_per_token: float = 4.0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def estimate_tokens(self, text: str) -> int:
        return int(len(text) / self.chars_per_token) + 1

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply:
        tools = options.get("tools")
        self.requests.append(
            {
                "messages": list(messages),
                "system": messages[0].content,
                "user": messages[-1].content,
                "stage": stage,
                "max_tokens": max_tokens,
                "schema": options.get("schema"),
                "temperature": options.get("temperature"),
                "reasoning": options.get("reasoning"),
                "tools": list(tools) if tools is not None else None,
                "tool_choice": options.get("tool_choice"),
                "sample": options.get("sample", 0),
            }
        )
        answer = self.replies(self.requests[-1]) if callable(self.replies) else self.replies.pop(0)
        if isinstance(answer, Reply):
            return answer
        try:
            parsed, error = json.loads(answer), None
        except json.JSONDecodeError as exc:
            parsed, error = None, str(exc)
        return Reply(text=answer, parsed=parsed, parse_error=error, finish_reason="stop")


def numbered(
    answer: Callable[[int, dict[str, Any]], Answer], *, context_window: int | None = None
) -> ScriptedLLM:
    """A `ScriptedLLM` whose reply to the i-th call (from 0) is ``answer(i, request)``."""
    llm = ScriptedLLM(
        replies=lambda request: answer(len(llm.requests) - 1, request), context_window=context_window
    )
    return llm
