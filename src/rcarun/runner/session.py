"""The `LLM` a method receives for one work item: plan → answer (cache, shared, or paid) → grow → reply.

Everything a method should never think about happens behind ``llm.chat`` here: the call cache (an interrupted
item's finished attempts are served, not paid again), answers shared across the method's conditions within the
run (`rcarun.runner.runtime.SharedCalls`), paid attempts with their retries (`rcarun.runner.attempts`), and
length-triggered retries with the budget grown up to the stage's cap. Tool calls pass straight through: the
offered tools are part of the request, and the calls come back in ``Reply.tool_calls`` however it was answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Unpack

from rcarun.backends import ChatResult, ChatToolCall, Usage, get_preset, utf8_length
from rcarun.backends.wire import replay_completion
from rcarun.errors import BACKBONE_FAULTS, CallError, ConfigError, StopRequested
from rcarun.methods import Message, Reply, ToolCall
from rcarun.methods.llm import ChatOptions
from rcarun.runner.answers import parse_json_answer
from rcarun.runner.attempts import Failed, FailureCounts, PaidAttempts
from rcarun.runner.calls import Caller, CallPlan, PlannedRequest, plan_call
from rcarun.runner.runtime import BackboneRuntime, RunContext, WorkItem
from rcarun.store import CallRow, blob_sha256, utc_timestamp

__all__ = ["ItemSession"]


class ItemSession:
    """Implements `rcarun.methods.LLM` for one work item on one backbone."""

    def __init__(
        self,
        context: RunContext,
        runtime: BackboneRuntime,
        item: WorkItem,
        shareable_stages: frozenset[str] = frozenset(),
        budgeted_stages: frozenset[str] = frozenset(),
    ) -> None:
        self._context = context
        self._runtime = runtime
        self._item = item
        self._caller = Caller(
            backbone=runtime.name,
            config=runtime.config,
            estimator=runtime.gate.estimator,
            stages=context.config.stages,
            method_label=item.method,
            realization=item.realization,
            shareable_stages=shareable_stages,
            budgeted_stages=budgeted_stages,
        )
        self._paid = PaidAttempts(context, runtime)
        self._own_attempts = 0
        # Sessions of the same item on other backbones (a judge panel's judges), made on first use.
        self._on_other_backbones: dict[str, ItemSession] = {}

    @property
    def attempts(self) -> int:
        """Attempts made for this item, on every backbone it addressed."""
        return self._own_attempts + sum(s.attempts for s in self._on_other_backbones.values())

    @property
    def backbone(self) -> str:
        return self._runtime.name

    def for_backbone(self, name: str) -> ItemSession:
        if name == self._runtime.name:
            return self
        session = self._on_other_backbones.get(name)
        if session is None:
            runtime = self._context.runtimes.get(name)
            if runtime is None:
                known = ", ".join(sorted(self._context.runtimes)) or "none"
                raise ConfigError(
                    f"item {self._item.item_id} asks for backbone {name!r}, not in the sweep ({known})"
                )
            caller = self._caller
            session = ItemSession(
                self._context, runtime, self._item, caller.shareable_stages, caller.budgeted_stages
            )
            self._on_other_backbones[name] = session
        return session

    @property
    def context_window(self) -> int | None:
        return self._runtime.config.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._runtime.gate.estimator.estimate(utf8_length(text))

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Unpack[ChatOptions]
    ) -> Reply:
        plan = plan_call(self._caller, messages, stage=stage, max_tokens=max_tokens, options=options)
        budget = plan.first_budget
        length_retries_left = plan.policy.length_retries
        attempts, totals = 0, Usage()
        while True:
            result, attempts = await self._answer(plan, plan.at(budget), attempts)
            totals = _add_usage(totals, result.usage)
            if result.finish_reason == "length" and length_retries_left > 0:
                grown = plan.grown(budget, result.usage.prompt_tokens)
                if grown is not None:
                    length_retries_left -= 1
                    self._runtime.counters.length_retries += 1
                    budget = grown
                    continue
            return _reply(result, plan, attempts, totals)

    async def _answer(self, plan: CallPlan, planned: PlannedRequest, attempt: int) -> tuple[ChatResult, int]:
        """The answer to one request, with the number of the attempt that got it (``attempt`` made before):
        from the cache, from another item sharing it, or paid for and retried as the gate decides."""
        failures = FailureCounts()  # a length retry is a new request with its own retry allowance
        shared = self._context.shared
        # The shareable key this call is sending for the whole run: others wait for its final outcome, across its
        # retries, so one request is answered (and paid) once however many conditions ask it at once.
        leading: str | None = None
        try:
            while True:
                attempt += 1
                self._own_attempts += 1
                result: ChatResult | None = None
                if leading is None:
                    if self._context.cache_lookups or plan.shareable:
                        result = self._from_cache(planned, plan.stage, attempt)
                    if result is None and plan.shareable:
                        result = await self._from_shared(planned, plan.stage, attempt)
                        if result is None:
                            shared.lead(planned.key)  # no await since the look: nobody leads it now
                            leading = planned.key
                if result is None:
                    base = self._base_row(plan.stage, attempt, planned)
                    outcome = await self._paid.attempt(planned, base, plan.size, failures)
                    if isinstance(outcome, Failed):
                        await self._after_failure(outcome)
                        continue
                    result = outcome
                    if leading is not None:
                        shared.settle(leading, result)
                        leading = None
                return result, attempt
        finally:
            if leading is not None:
                # Gave up (or was stopped or cancelled) while leading: waiters send their own request.
                shared.settle(leading, None)

    async def _after_failure(self, failed: Failed) -> None:
        """Wait before the retry the gate decided on; raise when there is none."""
        runtime, error, decision = self._runtime, failed.error, failed.decision
        if decision.stop_backbone:
            raise StopRequested(runtime.stopped or str(error))
        if isinstance(error, BACKBONE_FAULTS) and (runtime.stopped or not decision.retry):
            # About the backbone, not this item: left for a resume once the key, quota, model or server is
            # fixed, not failed for good.
            if not runtime.stopped:
                self._paid.note_left(error)
            raise StopRequested(str(error))
        if not decision.retry:
            raise error
        with runtime.stop_guard():
            await asyncio.sleep(decision.delay_s)

    def _base_row(self, stage: str, attempt: int, planned: PlannedRequest) -> dict[str, Any]:
        return {
            **self._item.row_keys(self._context.run_id),
            # A judge panel's item sends to several backbones: each call is recorded under the one it went to.
            "backbone": self._runtime.name,
            "model": self._runtime.config.model,
            "stage": stage,
            "attempt": attempt,
            "max_tokens": planned.request.max_tokens,
            "cache_key": planned.key,
            "request_sha256": planned.sha256,
        }

    def _from_cache(self, planned: PlannedRequest, stage: str, attempt: int) -> ChatResult | None:
        """The stored answer to this request (this run's, or any run's with ``cache = "global"``)."""
        scope = self._context.run_id if self._context.config.sweep.cache == "run" else None
        cached = self._context.store.lookup_call(planned.key, scope)
        if cached is None:
            return None
        text, reasoning_text = cached.text, cached.reasoning_text
        tool_calls: tuple[ChatToolCall, ...] = ()
        if text is None:
            # Only the raw body was kept: read the answer out of it the way the backend did.
            preset = get_preset(self._runtime.config.provider)
            try:
                replayed = replay_completion(cached.raw_body or b"", preset, self._runtime.name)
            except CallError:
                return None  # a stored body that no longer parses is no answer: call again
            text, reasoning_text, tool_calls = replayed.text, replayed.reasoning_text, replayed.tool_calls
        self._record_cached(
            stage,
            attempt,
            planned,
            finish_reason=cached.finish_reason,
            response_sha256=cached.response_sha256,
            response_text_sha256=cached.response_text_sha256,
            reasoning_text_sha256=cached.reasoning_text_sha256,
        )
        return ChatResult(
            text=text,
            reasoning_text=reasoning_text,
            finish_reason=cached.finish_reason or "stop",
            usage=Usage(
                prompt_tokens=cached.prompt_tokens,
                cached_prompt_tokens=cached.cached_tokens,
                completion_tokens=cached.completion_tokens,
                reasoning_tokens=cached.reasoning_tokens,
            ),
            latency_s=0.0,
            model=cached.model or "",
            tool_calls=tool_calls,
        )

    async def _from_shared(self, planned: PlannedRequest, stage: str, attempt: int) -> ChatResult | None:
        """Another item's answer to the same shareable request, sent or just received; recorded as cached.

        None when nobody is sending it: the caller then leads it, before its next await.
        """
        shared = self._context.shared
        while (result := shared.finished(planned.key)) is None:
            pending = shared.in_flight(planned.key)
            if pending is None:
                return None
            result = await asyncio.shield(pending)
            if result is not None:
                break
            # The leader gave up; another waiter may have taken the lead meanwhile: look again.
        self._record_cached(
            stage,
            attempt,
            planned,
            finish_reason=result.finish_reason,
            response_sha256=blob_sha256(result.raw_body) if result.raw_body else None,
            response_text_sha256=None if result.raw_body else blob_sha256(result.text.encode()),
        )
        return result

    def _record_cached(self, stage: str, attempt: int, planned: PlannedRequest, **answer: Any) -> None:
        """A ``calls`` row for an answer served without a call (from results.db or another item's call)."""
        now = utc_timestamp()
        self._context.writer.add_call(
            CallRow(
                **self._base_row(stage, attempt, planned),
                status="cached",
                started_at=now,
                ended_at=now,
                latency_ms=0.0,
                **answer,
            )
        )
        self._runtime.counters.cached_calls += 1


def _reply(result: ChatResult, plan: CallPlan, attempts: int, totals: Usage) -> Reply:
    """The method's reply: the final attempt's answer, decoded against the schema, with usage summed."""
    parsed: Any = None
    parse_error: str | None = None
    if plan.schema is not None:
        parsed, parse_error = parse_json_answer(result.text, plan.schema)
        if parse_error and result.finish_reason == "length":
            parse_error = f"{parse_error} (output budget exhausted: finish_reason=length)"
    return Reply(
        text=result.text,
        parsed=parsed,
        parse_error=parse_error,
        finish_reason=result.finish_reason,
        attempts=attempts,
        prompt_tokens=totals.prompt_tokens,
        completion_tokens=totals.completion_tokens,
        reasoning_tokens=totals.reasoning_tokens,
        cached_tokens=totals.cached_prompt_tokens,
        reasoning_text=result.reasoning_text,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in result.tool_calls),
    )


def _add_usage(left: Usage, right: Usage) -> Usage:
    return Usage(
        prompt_tokens=left.prompt_tokens + right.prompt_tokens,
        cached_prompt_tokens=left.cached_prompt_tokens + right.cached_prompt_tokens,
        completion_tokens=left.completion_tokens + right.completion_tokens,
        reasoning_tokens=left.reasoning_tokens + right.reasoning_tokens,
    )
