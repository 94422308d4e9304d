"""A scripted LLM: methods are tested against canned replies, with every request kept for inspection.

``replies`` is either a list of answer texts, served in order, or a callable that writes the answer to each
request (given the request as recorded in ``requests``), for methods whose number of calls depends on the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from rcarun.methods import Message, Reply


@dataclass
class ScriptedLLM:
    replies: list[str] | Callable[[dict[str, Any]], str]
    context_window: int | None = None
    chars_per_token: float = 4.0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def estimate_tokens(self, text: str) -> int:
        return int(len(text) / self.chars_per_token) + 1

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        stage: str,
        max_tokens: int,
        schema: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        reasoning: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        sample: int = 0,
    ) -> Reply:
        self.requests.append(
            {
                "messages": list(messages),
                "stage": stage,
                "max_tokens": max_tokens,
                "schema": schema,
                "temperature": temperature,
                "reasoning": reasoning,
                "sample": sample,
            }
        )
        import json

        text = self.replies(self.requests[-1]) if callable(self.replies) else self.replies.pop(0)
        try:
            parsed, error = json.loads(text), None
        except json.JSONDecodeError as exc:
            parsed, error = None, str(exc)
        return Reply(text=text, parsed=parsed, parse_error=error, finish_reason="stop")


@pytest.fixture
def scripted() -> type[ScriptedLLM]:
    return ScriptedLLM
