"""`EstimatingLLM`: the `LLM` a method runs against in ``rcarun estimate``, which counts and sends nothing.

It plans each call as the sweep's session does (`rcarun.runner.calls.plan_call`), answers with a synthetic,
seeded value, and counts the call's tokens expected and at worst, following the length retries the session
would make. The cost model is described in ``docs/estimate.md``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from rcarun.backends import ChatMessage, utf8_length
from rcarun.budgets import TokenEstimator
from rcarun.errors import ConfigError
from rcarun.methods import Message, Reply, ToolCall, ToolChoice
from rcarun.methods.llm import ChatOptions
from rcarun.mock.answers import (
    DEFAULT_TOOL_ROUNDS_MAX,
    count_text_tokens,
    filler_sentence,
    generate_value,
    simulate_tool_calls,
    tool_calls_text,
)
from rcarun.runner.answers import parse_json_answer
from rcarun.runner.calls import Caller, CallPlan, plan_call
from rcarun.runner.config import BackboneConfig, StageConfig

__all__ = ["EstimatingLLM", "Tally"]


@dataclass(slots=True)
class Tally:
    """Counts of one item (backbone × method × trajectory) in one dry run."""

    calls: int = 0
    shared_calls: int = 0
    attempts: int = 0
    prompt_expected: int = 0
    prompt_worst: int = 0
    output_expected: int = 0
    output_worst: int = 0
    failed: int = 0
    # The longest length-retry chain of one call (attempts, output budget summed), for bounds built on it.
    chain_attempts: int = 0
    chain_output: int = 0


class EstimatingLLM:
    """The `LLM` protocol for a dry run: counts what the request would cost and answers with a synthetic value.

    ``name``, ``stages``, ``method_label`` and the method's stage traits are what `rcarun.runner.calls.Caller`
    holds; ``shared`` holds the shareable requests already counted for this backbone × trajectory ×
    realization; ``tally`` takes this item's counts; ``sample`` (the dry run's number) seeds the answers;
    ``reasoning_tokens`` are expected per call; ``sibling`` makes the item's LLM on another backbone.
    """

    def __init__(
        self,
        backbone: BackboneConfig,
        *,
        name: str,
        stages: Mapping[str, StageConfig],
        method_label: str,
        shareable_stages: frozenset[str],
        budgeted_stages: frozenset[str] = frozenset(),
        shared: set[str],
        tally: Tally,
        sample: int = 0,
        reasoning_tokens: int = 0,
        sibling: Callable[[str], EstimatingLLM] | None = None,
    ) -> None:
        self._backbone = backbone
        self._name = name
        self._estimator = TokenEstimator(backbone.chars_per_token)
        self._caller = Caller(
            backbone=name,
            config=backbone,
            estimator=self._estimator,
            stages=stages,
            method_label=method_label,
            shareable_stages=shareable_stages,
            budgeted_stages=budgeted_stages,
        )
        self._shared = shared
        self._tally = tally
        self._sample = sample
        self._reasoning_tokens = reasoning_tokens
        self._sibling = sibling
        self.plans: list[CallPlan] = []  # every call's plan, in order

    @property
    def backbone(self) -> str:
        return self._name

    def for_backbone(self, name: str) -> EstimatingLLM:
        if name == self._name:
            return self
        if self._sibling is None:
            raise ConfigError(f"this dry run reaches no backbone but {self._name!r}")
        return self._sibling(name)

    @property
    def context_window(self) -> int | None:
        return self._backbone.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._estimator.estimate(utf8_length(text))

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply:
        plan = plan_call(self._caller, messages, stage=stage, max_tokens=max_tokens, options=options)
        self.plans.append(plan)
        key = plan.at(plan.first_budget)
        answer, tool_calls = self._answer(plan, key.sha256)
        if plan.shareable and key.key in self._shared:
            self._tally.shared_calls += 1
            return _reply(answer, plan.schema, "stop", attempts=1, tool_calls=tool_calls)
        if plan.shareable:
            self._shared.add(key.key)
        self._tally.calls += 1
        return self._count(plan, answer, tool_calls)

    def _answer(self, plan: CallPlan, request_sha: str) -> tuple[str, tuple[ToolCall, ...]]:
        """The synthetic answer (as text) and the tool calls it makes, if any."""
        # Seeded by backbone and request (not the method), so a shared request gets one answer in every method.
        seed = f"{self._name}:{request_sha}:{self._sample}:{plan.options.get('sample', 0)}"
        rng = random.Random(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8]))
        tool_choice = plan.options.get("tool_choice")
        tool_calls = _simulated_tool_calls(plan.messages, plan.tools, tool_choice, self._backbone.model, rng)
        if tool_calls:
            calls = [{"function": {"name": c.name, "arguments": c.arguments}} for c in tool_calls]
            return tool_calls_text(calls), tool_calls
        if plan.schema is not None:
            return json.dumps(generate_value(plan.schema, rng), ensure_ascii=False), ()
        return filler_sentence(rng), ()

    def _count(self, plan: CallPlan, answer: str, tool_calls: tuple[ToolCall, ...]) -> Reply:
        """Count one paid call through its length retries, and the reply its final attempt gets."""
        tally = self._tally
        chain = plan.budget_chain()
        tally.prompt_worst += plan.prompt_tokens * len(chain)
        tally.output_worst += sum(chain)
        tally.chain_attempts = max(tally.chain_attempts, len(chain))
        tally.chain_output = max(tally.chain_output, sum(chain))

        cpt = self._backbone.chars_per_token
        needed = self._reasoning_tokens + count_text_tokens(answer, cpt)
        # Attempts until a budget holds the whole output, or the chain ends.
        attempts = next((i + 1 for i, room in enumerate(chain) if needed <= room), len(chain))
        final_budget = chain[attempts - 1]
        tally.attempts += attempts
        tally.prompt_expected += math.ceil(plan.size.chars / cpt) * attempts
        tally.output_expected += sum(chain[: attempts - 1]) + min(needed, final_budget)
        if needed <= final_budget:
            return _reply(answer, plan.schema, "stop", attempts=attempts, tool_calls=tool_calls)
        if tool_calls:
            return _reply("", plan.schema, "length", attempts=attempts)  # calls cut short are no calls
        # Out of budget even after the retries: thinking first, then what is left of the answer.
        room = max(0, final_budget - self._reasoning_tokens)
        return _reply(answer[: math.floor(room * cpt)], plan.schema, "length", attempts=attempts)


def _reply(
    text: str,
    schema: Mapping[str, Any] | None,
    finish_reason: str,
    *,
    attempts: int,
    tool_calls: tuple[ToolCall, ...] = (),
) -> Reply:
    if tool_calls:
        text, schema, finish_reason = "", None, "tool_calls"
    parsed, parse_error = parse_json_answer(text) if schema is not None else (None, None)
    return Reply(text, parsed, parse_error, finish_reason, attempts=attempts, tool_calls=tool_calls)


def _simulated_tool_calls(
    messages: Sequence[ChatMessage],
    tools: Sequence[Mapping[str, Any]],
    tool_choice: ToolChoice | None,
    model: str,
    rng: random.Random,
) -> tuple[ToolCall, ...]:
    """The calls the simulator would make for this request (its rule, its default number of rounds)."""
    if not tools:
        return ()
    body: dict[str, Any] = {
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in m.tool_calls
                ],
            }
            for m in messages
        ],
        "tools": list(tools),
        "tool_choice": tool_choice,
    }
    calls = simulate_tool_calls(body, model=model, rounds_max=DEFAULT_TOOL_ROUNDS_MAX, rng=rng)
    return tuple(
        ToolCall(call["id"], call["function"]["name"], call["function"]["arguments"]) for call in calls or ()
    )
