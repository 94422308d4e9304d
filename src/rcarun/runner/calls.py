"""One `llm.chat` call planned once, for the sweep and for its dry run alike.

`ItemSession` (a sweep) and `EstimatingLLM` (``rcarun estimate``) both turn a method's call into a `CallPlan`
here, so the wire messages, the first output budget and its clamp, the request's hash, its cache key and
whether it is shared across methods cannot drift apart between what is paid and what is estimated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcarun.backends import ChatMessage, ChatRequest, ChatToolCall, PromptSize, prompt_size
from rcarun.budgets import TokenEstimator, clamp_to_context, next_length_budget
from rcarun.methods import Message
from rcarun.methods.llm import ChatOptions
from rcarun.runner.cache import call_cache_key
from rcarun.runner.config import BackboneConfig, StageConfig

__all__ = ["CallPlan", "Caller", "PlannedRequest", "plan_call", "wire_message"]

_UNCONFIGURED = StageConfig()  # a stage the sweep does not configure (frozen: one instance serves every call)


@dataclass(frozen=True, slots=True)
class Caller:
    """What a plan depends on besides the call: the backbone (by name, its config and prompt-token estimator,
    in a session the gate's), the sweep's stage policies, the item (method label and realization, both in the
    cache key), and the method's stage traits: stages identical across its conditions (``shareable_stages``) and
    stages whose first budget its own settings fix (``budgeted_stages``: the stage table yields)."""

    backbone: str
    config: BackboneConfig
    estimator: TokenEstimator
    stages: Mapping[str, StageConfig]
    method_label: str
    realization: int = 0
    shareable_stages: frozenset[str] = frozenset()
    budgeted_stages: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """The request at one output budget: its canonical bytes (stored), their SHA-256 and its call cache key."""

    request: ChatRequest
    body: bytes
    sha256: str
    key: str


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One ``llm.chat`` call before it is sent, the same for every attempt but the output budget.

    ``prompt_tokens`` is the estimator's figure (with its margin), which budgets are clamped against;
    ``first_budget`` follows the stage precedence and the clamp; a ``shareable`` call's answer serves every
    method of the run (its cache key leaves the method out).
    """

    caller: Caller
    stage: str
    policy: StageConfig
    messages: tuple[ChatMessage, ...]
    tools: tuple[Mapping[str, Any], ...]
    size: PromptSize
    prompt_tokens: int
    first_budget: int
    shareable: bool
    options: ChatOptions

    @property
    def schema(self) -> Mapping[str, Any] | None:
        return self.options.get("schema")

    def at(self, budget: int) -> PlannedRequest:
        """The request sent with output budget ``budget``."""
        options = self.options
        request = ChatRequest(
            messages=self.messages,
            max_tokens=budget,
            temperature=options.get("temperature"),
            schema=options.get("schema"),
            reasoning=options.get("reasoning"),
            tools=self.tools,
            tool_choice=options.get("tool_choice"),
        )
        body = request.canonical_bytes()
        sha = hashlib.sha256(body).hexdigest()
        caller = self.caller
        key = call_cache_key(
            backbone=caller.backbone,
            model=caller.config.model,
            request_sha256=sha,
            stage=self.stage,
            realization=caller.realization,
            method_label=None if self.shareable else caller.method_label,
            sample=options.get("sample", 0),
        )
        return PlannedRequest(request, body, sha, key)

    def grown(self, budget: int, prompt_tokens: int | None = None) -> int | None:
        """The budget after a length stop at ``budget`` (doubled up to the stage's cap, the model's maximum
        output and the context left after the prompt), or None when it cannot grow."""
        config = self.caller.config
        return next_length_budget(
            budget,
            cap=self.policy.length_cap,
            model_max_output=config.max_output_tokens,
            context_window=config.context_window,
            prompt_tokens=prompt_tokens or self.prompt_tokens,
        )

    def budget_chain(self) -> list[int]:
        """The first budget and each grown budget the stage's length retries may use (prompt as estimated)."""
        chain = [self.first_budget]
        for _ in range(self.policy.length_retries):
            grown = self.grown(chain[-1])
            if grown is None:
                break
            chain.append(grown)
        return chain


def plan_call(
    caller: Caller, messages: Sequence[Message], *, stage: str, max_tokens: int, options: ChatOptions
) -> CallPlan:
    """Plan one ``llm.chat`` call of ``caller``'s method (its arguments as the method passed them)."""
    policy = caller.stages.get(stage) or _UNCONFIGURED
    wire_messages = tuple(wire_message(m) for m in messages)
    tools = tuple(options.get("tools") or ())
    # Tool specs and earlier calls' arguments are prompt too: the budget and the reservation must cover them.
    size = prompt_size(wire_messages, tools)
    prompt_tokens = caller.estimator.estimate(size.utf8_bytes)
    config = caller.config
    budget = clamp_to_context(
        policy.first_budget(max_tokens, method_sets_it=stage in caller.budgeted_stages),
        context_window=config.context_window,
        prompt_tokens_estimate=prompt_tokens,
        model_max_output=config.max_output_tokens,
    )
    return CallPlan(
        caller=caller,
        stage=stage,
        policy=policy,
        messages=wire_messages,
        tools=tools,
        size=size,
        prompt_tokens=prompt_tokens,
        first_budget=budget,
        shareable=policy.shareable or stage in caller.shareable_stages,
        options=options,
    )


def wire_message(message: Message) -> ChatMessage:
    """A method's message as the backends send it."""
    return ChatMessage(
        message.role,
        message.content,
        tool_calls=tuple(ChatToolCall(c.id, c.name, c.arguments) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
    )
