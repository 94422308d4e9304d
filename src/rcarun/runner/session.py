"""The `LLM` a method receives for one work item: cache lookup → budgets → backend → record, per attempt.

Everything a method should never think about lives here, in one loop per ``llm.chat`` call:
- the call cache (a finished attempt of an interrupted item is served, not paid again, on resume), and for
  stages a method declares shareable across its conditions, the answer another item of the same run is
  getting or just got (`rcarun.runner.runtime.SharedCalls`);
- admission through the backbone's gate (pause after 429, adaptive concurrency, requests/tokens per minute,
  spend budget), with the token reservation settled against the reported usage;
- retries of retryable errors as the retry policy decides, each attempt its own ``calls`` row (429s get five
  times the allowance of other failures: they mean "later", not "never");
- length-triggered retries with the budget doubled, up to the stage's cap, the model's maximum output and the
  context left after the prompt;
- pricing of every attempt and the row that records it (request and response kept as blobs).

Tool calls pass straight through: the offered tools and ``tool_choice`` are part of the request (so of its hash
and cache key), and the calls the model asks for come back in ``Reply.tool_calls`` whether the answer was paid
for, replayed from a stored body, or shared by another item. Each round of a tool conversation is its own
``llm.chat`` call and its own ``calls`` row.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rcarun.backends import (
    CallProgress,
    ChatMessage,
    ChatRequest,
    ChatResult,
    ChatToolCall,
    PromptSize,
    Usage,
    get_preset,
    parse_completion,
    prompt_size,
    replay_body,
    utf8_length,
)
from rcarun.budgets import (
    RetryDecision,
    clamp_to_context,
    cut_usage,
    estimated_usage,
    implausible_usage,
    next_length_budget,
)
from rcarun.errors import (
    BACKBONE_FAULTS,
    AuthError,
    CallError,
    ConfigError,
    ConnectionFailed,
    ModelNotFound,
    QuotaExhausted,
    RateLimited,
    StopRequested,
    StreamRefused,
    TransportError,
)
from rcarun.methods import Message, Reasoning, Reply, ToolCall, ToolChoice
from rcarun.runner.answers import parse_json_answer
from rcarun.runner.cache import call_cache_key
from rcarun.runner.runtime import BackboneRuntime, RunContext, WorkItem
from rcarun.store import CallRow, EventRow, UsageSource, blob_sha256, utc_timestamp
from rcarun.text import repair_surrogates

__all__ = ["ItemSession"]

# A pause at least this long is recorded as an event, and one this long said on the terminal too (the sweep
# would look stuck otherwise).
_RECORDED_PAUSE_S = 1.0
_ANNOUNCED_PAUSE_S = 10.0
# A request may meet this many times as many 429s as other failures before it gives up.
_RATE_LIMIT_ALLOWANCE = 5


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
        # Stages the method declares identical across its conditions (e.g. RCTA's summary and outline).
        self._shareable_stages = shareable_stages
        # Stages whose output budget the method's own settings fix (a preset): the stage table does not apply.
        self._budgeted_stages = budgeted_stages
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
            session = ItemSession(
                self._context, runtime, self._item, self._shareable_stages, self._budgeted_stages
            )
            self._on_other_backbones[name] = session
        return session

    @property
    def context_window(self) -> int | None:
        return self._runtime.config.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._runtime.gate.estimator.estimate(utf8_length(text))

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
        sample: int = 0,
        tool_choice: ToolChoice | None = None,
    ) -> Reply:
        runtime = self._runtime
        config = runtime.config
        stage_policy = self._context.config.stage(stage)
        wire_messages = tuple(_wire_message(m) for m in messages)
        wire_tools = tuple(tools or ())
        # Tool specs and earlier calls' arguments are prompt too: the reservation must cover them.
        request_size = prompt_size(wire_messages, wire_tools)
        estimated_prompt = runtime.gate.estimator.estimate(request_size.utf8_bytes)
        budget = clamp_to_context(
            stage_policy.first_budget(max_tokens, method_sets_it=stage in self._budgeted_stages),
            context_window=config.context_window,
            prompt_tokens_estimate=estimated_prompt,
            model_max_output=config.max_output_tokens,
        )
        length_retries_left = stage_policy.length_retries
        failures = _FailureCounts()
        attempt = 0
        totals = Usage()
        shareable = stage_policy.shareable or stage in self._shareable_stages
        # The shareable key this call is sending for the whole run: others wait for its final outcome, across
        # its retries, so one request is answered (and paid) once however many conditions ask it at once.
        leading: str | None = None
        try:
            while True:
                attempt += 1
                self._own_attempts += 1
                request = ChatRequest(
                    messages=wire_messages,
                    max_tokens=budget,
                    temperature=temperature,
                    schema=schema,
                    reasoning=reasoning,
                    tools=wire_tools,
                    tool_choice=tool_choice,
                )
                request_json = request.canonical_bytes()
                request_sha = hashlib.sha256(request_json).hexdigest()
                key = call_cache_key(
                    backbone=runtime.name,
                    model=config.model,
                    request_sha256=request_sha,
                    stage=stage,
                    realization=self._item.realization,
                    method_label=None if shareable else self._item.method,
                    sample=sample,
                )
                result: ChatResult | None = None
                if key != leading:
                    if self._context.cache_lookups or shareable:
                        result = self._from_cache(key, request, stage, attempt, request_sha)
                    if result is None and shareable:
                        result = await self._from_shared(key, request, stage, attempt, request_sha)
                        if result is None:
                            self._context.shared.lead(key)  # no await since the look: nobody leads it now
                            leading = key
                if result is None:
                    request_sha = self._context.writer.put_blob(request_json, request_sha)
                    outcome = await self._call_backend(
                        key, request, stage, attempt, request_size, failures, request_sha
                    )
                    if isinstance(outcome, tuple):
                        error, decision = outcome
                        if decision.stop_backbone:
                            raise StopRequested(runtime.stopped or str(error))
                        if isinstance(error, BACKBONE_FAULTS) and (runtime.stopped or not decision.retry):
                            # About the backbone, not this item: left for a resume once the key, quota, model
                            # or server is fixed, not failed for good.
                            if not runtime.stopped:
                                self._note_left(error)
                            raise StopRequested(str(error))
                        if not decision.retry:
                            raise error
                        with runtime.stop_guard():
                            await asyncio.sleep(decision.delay_s)
                        continue
                    result = outcome
                    if leading == key:
                        self._context.shared.settle(key, result)
                        leading = None
                    failures.clear()  # a length retry is a new request with its own retry allowance
                totals = _add_usage(totals, result.usage)
                if result.finish_reason == "length" and length_retries_left > 0:
                    grown = next_length_budget(
                        budget,
                        cap=stage_policy.length_cap,
                        model_max_output=config.max_output_tokens,
                        context_window=config.context_window,
                        prompt_tokens=result.usage.prompt_tokens or estimated_prompt,
                    )
                    if grown is not None:
                        length_retries_left -= 1
                        runtime.counters.length_retries += 1
                        budget = grown
                        continue
                parsed: Any = None
                parse_error: str | None = None
                if schema is not None:
                    parsed, parse_error = parse_json_answer(result.text, schema)
                    if parse_error and result.finish_reason == "length":
                        parse_error = f"{parse_error} (output budget exhausted: finish_reason=length)"
                return Reply(
                    text=result.text,
                    parsed=parsed,
                    parse_error=parse_error,
                    finish_reason=result.finish_reason,
                    attempts=attempt,
                    prompt_tokens=totals.prompt_tokens,
                    completion_tokens=totals.completion_tokens,
                    reasoning_tokens=totals.reasoning_tokens,
                    cached_tokens=totals.cached_prompt_tokens,
                    reasoning_text=result.reasoning_text,
                    tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in result.tool_calls),
                )
        finally:
            if leading is not None:
                # Gave up (or was stopped or cancelled) while leading: waiters send their own request.
                self._context.shared.settle(leading, None)

    def _base_row(
        self, stage: str, attempt: int, max_tokens: int, key: str, request_sha: str
    ) -> dict[str, Any]:
        return {
            **self._item.row_keys(self._context.run_id),
            # A judge panel's item sends to several backbones: each call is recorded under the one it went to.
            "backbone": self._runtime.name,
            "model": self._runtime.config.model,
            "stage": stage,
            "attempt": attempt,
            "max_tokens": max_tokens,
            "cache_key": key,
            "request_sha256": request_sha,
        }

    def _from_cache(
        self, key: str, request: ChatRequest, stage: str, attempt: int, request_sha: str
    ) -> ChatResult | None:
        scope = self._context.run_id if self._context.config.sweep.cache == "run" else None
        cached = self._context.store.lookup_call(key, scope)
        if cached is None:
            return None
        text, reasoning_text = cached.text, cached.reasoning_text
        tool_calls: tuple[ChatToolCall, ...] = ()
        if text is None:
            # Only the raw body was kept: read the answer out of it the way the backend did.
            try:
                replayed = parse_completion(
                    200,
                    {},
                    cached.raw_body or b"",
                    get_preset(self._runtime.config.provider),
                    0.0,
                    "",
                    backbone=self._runtime.name,
                )
            except CallError:
                return None  # a stored body that no longer parses is no answer: call again
            text, reasoning_text, tool_calls = replayed.text, replayed.reasoning_text, replayed.tool_calls
        now = utc_timestamp()
        self._context.writer.add_call(
            CallRow(
                **self._base_row(stage, attempt, request.max_tokens, key, request_sha),
                status="cached",
                started_at=now,
                ended_at=now,
                finish_reason=cached.finish_reason,
                response_sha256=cached.response_sha256,
                response_text_sha256=cached.response_text_sha256,
                reasoning_text_sha256=cached.reasoning_text_sha256,
                latency_ms=0.0,
            )
        )
        self._runtime.counters.cached_calls += 1
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

    async def _from_shared(
        self, key: str, request: ChatRequest, stage: str, attempt: int, request_sha: str
    ) -> ChatResult | None:
        """Another item's answer to the same shareable request, sent or just received; recorded as cached.

        None when nobody is sending it: the caller then leads it, before its next await.
        """
        shared = self._context.shared
        while (result := shared.finished(key)) is None:
            pending = shared.in_flight(key)
            if pending is None:
                return None
            result = await asyncio.shield(pending)
            if result is not None:
                break
            # The leader gave up; another waiter may have taken the lead meanwhile: look again.
        now = utc_timestamp()
        self._context.writer.add_call(
            CallRow(
                **self._base_row(stage, attempt, request.max_tokens, key, request_sha),
                status="cached",
                started_at=now,
                ended_at=now,
                finish_reason=result.finish_reason,
                response_sha256=blob_sha256(result.raw_body) if result.raw_body else None,
                response_text_sha256=None if result.raw_body else blob_sha256(result.text.encode()),
                latency_ms=0.0,
            )
        )
        self._runtime.counters.cached_calls += 1
        return result

    async def _call_backend(
        self,
        key: str,
        request: ChatRequest,
        stage: str,
        attempt: int,
        prompt: PromptSize,
        failures: _FailureCounts,
        request_sha: str,
    ) -> ChatResult | tuple[CallError, RetryDecision]:
        """One paid attempt: admitted by the gate, recorded whatever happens.

        Returns the result, or the error with the gate's decision about it (made while the attempt still held its
        concurrency slot, so a burst of 429s from one overload shrinks concurrency once).

        Raises:
            StopRequested: this backbone (or the whole run) stopped before the request was sent.
        """
        runtime = self._runtime
        writer = self._context.writer
        gate = runtime.gate
        base = self._base_row(stage, attempt, request.max_tokens, key, request_sha)
        estimated_prompt = gate.estimator.estimate(prompt.utf8_bytes)
        with runtime.stop_guard() as guard:
            # Backpressure: a call is not started while the writer is behind, so memory stays bounded by the
            # writer's queue however fast answers come back.
            await writer.wait_for_room()
            async with gate.admit(estimated_prompt, request.max_tokens, prompt=prompt) as ticket:
                write_pause = self._context.write_pause
                if write_pause is not None and write_pause.paused:
                    await write_pause.wait()  # no call goes out while its answer could not be kept
                guard.disarm()  # from here on the request goes out: a stop lets it finish and be recorded
                if runtime.stopped is not None:
                    raise StopRequested(runtime.stopped)
                started_at = utc_timestamp()
                started = time.perf_counter()
                pauses_before = gate.pauses_started
                progress = CallProgress()
                runtime.in_flight.add(progress)
                try:
                    result = await self._chat_recording_lost_sends(request, progress, base, started_at)
                except CallError as error:
                    cut = cut_usage(
                        gate.estimator,
                        error,
                        progress,
                        prompt=prompt,
                        max_tokens=request.max_tokens,
                    )
                    cost = ticket.settle(cut, reported=False, completed=False) if cut is not None else 0.0
                    # A generation under way when cut (silence, a drop, the deadline; tokens charged) is paid again
                    # if sent again: bounded. An unreadable answer or an error in a stream is retried as before.
                    generating = (
                        isinstance(error, TransportError) and cut is not None and cut.completion_tokens > 0
                    )
                    decision = gate.on_error(error, failures.count(error, cut=generating), ticket)
                    self._note_rate_changes()
                    runtime.counters.record_error(error)
                    if generating and decision.retry and failures.cuts > runtime.config.retry.cut_retries:
                        decision = RetryDecision(retry=False)
                    writer.add_call(
                        CallRow(
                            **base,
                            status="rate_limited" if isinstance(error, RateLimited) else "error",
                            started_at=started_at,
                            ended_at=utc_timestamp(),
                            latency_ms=(time.perf_counter() - started) * 1000,
                            error=str(error)[:2000],
                            error_kind=error.kind,
                            http_status=error.status,
                            **self._cut_columns(progress, cut, cost),
                        )
                    )
                    if cut is not None:
                        self._note_cut(error, cut, cost, retried=decision.retry, generating=generating)
                    if isinstance(error, StreamRefused):
                        self._note_stream_refused(error)
                        decision = RetryDecision(retry=True)
                    elif decision.stop_backbone:
                        self._stop_backbone(error.status, decision.asked_s, "its answer", str(error))
                    elif isinstance(error, BACKBONE_FAULTS):
                        self._note_fault(error)
                    elif gate.pauses_started > pauses_before:
                        self._note_pause(decision.pause_backbone_s, error.status, decision.asked_s)
                    return error, decision
                except asyncio.CancelledError:
                    # Ctrl-C or a stop mid-call: what arrived is kept, and a generation under way is charged.
                    cut = cut_usage(
                        gate.estimator,
                        None,
                        progress,
                        prompt=prompt,
                        max_tokens=request.max_tokens,
                    )
                    cost = ticket.settle(cut, reported=False, completed=False) if cut is not None else 0.0
                    writer.add_call(
                        CallRow(
                            **base,
                            status="cancelled",
                            started_at=started_at,
                            ended_at=utc_timestamp(),
                            latency_ms=(time.perf_counter() - started) * 1000,
                            error="cancelled before the provider answered"
                            if progress.status is None
                            else "cancelled while the answer was arriving",
                            error_kind="cancelled",
                            http_status=progress.status,
                            **self._cut_columns(progress, cut, cost),
                        )
                    )
                    if cut is not None:
                        runtime.counters.cut_calls += 1
                    raise
                finally:
                    runtime.in_flight.discard(progress)
                runtime.consecutive_faults = 0
                pause = gate.on_rate_limit_headers(result.rate_limit)
                if gate.retry.too_long(pause):
                    # The answer stands; it is the backbone's next calls that cannot be waited for.
                    self._stop_backbone(200, pause, "its rate-limit headers", "")
                elif gate.pauses_started > pauses_before:
                    self._note_pause(pause, 200, None)
                ended_at = utc_timestamp()
                ticket.release_slot()
                try:
                    # The slot is free: let the call it was handed to go out before this attempt is settled and
                    # recorded and its item goes on to parse the answer and build its next prompt. Two turns of
                    # the loop: one for the woken caller to start its request, one for aiohttp to write it
                    # (before Python 3.12 aiohttp writes a request body from a task of its own, which would
                    # otherwise wait behind all of that). When a sweep's answers come in clumps (a provider
                    # freeing its slots together), every microsecond before the send is paid once per answer.
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                finally:
                    # Settled and recorded even when cancelled in between: the provider answered and charged.
                    usage, source = self._billable_usage(result, request, prompt)
                    cost = ticket.settle(usage, reported=source == "reported")
                    self._note_rate_changes()
                    self._record_answer(base, result, usage, source, started_at, ended_at, cost)
        return result

    def _billable_usage(
        self, result: ChatResult, request: ChatRequest, prompt: PromptSize
    ) -> tuple[Usage, UsageSource]:
        """The usage to charge: the provider's, or a conservative estimate when it sent none or nonsense."""
        runtime = self._runtime
        problem = result.usage_problem or implausible_usage(
            result.usage,
            prompt=prompt,
            messages=len(request.messages),
            max_tokens=request.max_tokens,
            context_window=runtime.config.context_window,
        )
        if problem is None:
            return result.usage, "reported"
        answer_bytes = utf8_length(result.text) + utf8_length(result.reasoning_text)
        answer_bytes += sum(
            utf8_length(call.name) + utf8_length(call.arguments) for call in result.tool_calls
        )
        usage = estimated_usage(
            runtime.gate.estimator,
            prompt=prompt,
            answer_bytes=answer_bytes,
            max_tokens=request.max_tokens,
            finish_reason=result.finish_reason,
        )
        runtime.counters.usage_estimated += 1
        if runtime.counters.usage_estimated == 1:
            self._event(
                "usage_estimated",
                problem=problem,
                charged={"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
            )
        return usage, "estimated"

    async def _chat_recording_lost_sends(
        self, request: ChatRequest, progress: CallProgress, base: dict[str, Any], started_at: str
    ) -> ChatResult:
        """The backend's call; a send a stale kept-alive connection lost, which the transport sent again once
        without counting an attempt, still gets its own row: every request that left is recorded."""
        try:
            return await self._runtime.backend.chat(request, progress)
        finally:
            for seconds, why in progress.lost_sends:
                self._context.writer.add_call(
                    CallRow(
                        **base,
                        status="error",
                        started_at=started_at,
                        ended_at=utc_timestamp(),
                        latency_ms=seconds * 1000,
                        error=f"{why} (a kept-alive connection the server had closed; sent again at once)"[
                            :2000
                        ],
                        error_kind="stale_connection",
                    )
                )

    def _cut_columns(self, progress: CallProgress, cut: Usage | None, cost: float) -> dict[str, Any]:
        """The columns of an attempt that ended early: what it received, and what it was charged."""
        columns: dict[str, Any] = {
            "streamed": progress.streamed if progress.answered else None,
            "ttft_ms": None if (ttft := progress.ttft_s()) is None else ttft * 1000,
        }
        body = progress.partial_body()
        if body is not None:
            columns["response_sha256"] = self._context.writer.put_blob(body)
        if cut is not None:
            columns.update(
                prompt_tokens=cut.prompt_tokens,
                completion_tokens=cut.completion_tokens,
                cost_usd=cost,
                usage_source="estimated",
            )
        return columns

    def _note_cut(
        self, error: CallError, cut: Usage, cost: float, *, retried: bool, generating: bool
    ) -> None:
        """An attempt cut short was charged: counted; a generation cut (tokens charged) is said once per backbone
        with what the run does next."""
        runtime = self._runtime
        runtime.counters.cut_calls += 1
        if not generating or "cut" in runtime.announced:
            return
        runtime.announced.add("cut")
        retries = runtime.config.retry.cut_retries
        then = (
            f"such a call is sent again up to {retries} time{'s' if retries != 1 else ''} (retry.cut_retries), "
            "each attempt paid"
            if retries
            else "such a call is not sent again (retry.cut_retries = 0)"
        )
        self._context.announce(
            f"backbone {runtime.name!r}: a generation was cut ({error.kind}: {error}); charged an estimated "
            f"{cut.prompt_tokens:,} + {cut.completion_tokens:,} tokens (${cost:.4f}); {then}"
        )
        self._event(
            "generation_cut",
            cause=error.kind,
            charged={"prompt_tokens": cut.prompt_tokens, "completion_tokens": cut.completion_tokens},
            cost_usd=cost,
            retried=retried,
        )

    def _note_stream_refused(self, error: CallError) -> None:
        runtime = self._runtime
        if "stream_refused" in runtime.announced:
            return
        runtime.announced.add("stream_refused")
        self._context.announce(
            f"backbone {runtime.name!r}: the server refuses to stream; its calls are sent unstreamed from now on "
            "(set stream = false for it to skip the refused attempt next time)"
        )
        self._event("stream_refused", status=error.status, message=str(error)[:300])

    def _stop_backbone(self, status: int | None, asked_s: float | None, where: str, message: str) -> None:
        """Stop this backbone for the session: one line for the user, one event in results.db."""
        runtime = self._runtime
        limit = runtime.gate.retry.max_pause_s
        asked = "forever" if asked_s is None or not asked_s < float("inf") else f"{asked_s:,.0f} s"
        reason = (
            f"backbone {runtime.name!r} stopped: HTTP {status if status is not None else '-'}, the provider asked "
            f"(in {where}) to wait {asked}, more than max_pause_s = {limit:g} s; the other backbones go on, its "
            "unfinished items are left for a resume (rerun the same sweep command)"
        )
        if runtime.stop(reason):
            self._context.announce(reason)
            self._event(
                "backbone_stopped",
                status=status,
                asked_s=asked_s if asked_s is not None and asked_s < float("inf") else None,
                max_pause_s=limit,
                message=message[:300],
            )

    def _note_fault(self, error: CallError) -> None:
        """Count an error about the backbone; enough of them in a row stop it (fail fast on what will not heal)."""
        runtime = self._runtime
        runtime.consecutive_faults += 1
        retry = runtime.config.retry
        connecting = isinstance(error, ConnectionFailed)
        limit = retry.connection_failures if connecting else retry.fail_fast_after
        if runtime.consecutive_faults < limit:
            return
        what = "attempts in a row could not connect" if connecting else "calls in a row were refused"
        reason = (
            f"backbone {runtime.name!r} stopped: {runtime.consecutive_faults} {what} ({type(error).__name__}: "
            f"{error}); {self._fault_advice(error)}; "
            "the other backbones go on, its unfinished items are left for a resume (rerun the same sweep command)"
        )
        if runtime.stop(reason):
            self._context.announce(reason)
            self._event("backbone_stopped", status=error.status, cause=error.kind, message=str(error)[:300])

    def _note_left(self, error: CallError) -> None:
        """An item left for a resume by an error about the backbone (a refused key, no credit, no such model)
        before enough of them in a row stopped it: the cause is said once, stored, and closes the run's summary."""
        runtime = self._runtime
        runtime.left_because = (
            f"backbone {runtime.name!r}: items are left for a resume after {type(error).__name__}: {error}; "
            f"{self._fault_advice(error)}"
        )
        if "left" in runtime.announced:
            return
        runtime.announced.add("left")
        self._context.announce(runtime.left_because)
        self._event("items_left", status=error.status, cause=error.kind, message=str(error)[:300])

    def _fault_advice(self, error: CallError) -> str:
        config = self._runtime.config
        hint = {
            AuthError: f"check the key in ${config.api_key_env} (api_key_env)"
            if config.api_key_env
            else "the endpoint wants a key: set api_key_env",
            QuotaExhausted: "the account is out of credit",
            ModelNotFound: f"check model {config.model!r} and base_url",
            ConnectionFailed: "is the server up, and is base_url right?",
        }
        return next((text for kind, text in hint.items() if isinstance(error, kind)), "")

    def _note_pause(self, seconds: float, status: int | None, asked_s: float | None) -> None:
        """A new pause of the backbone: an event when it lasts a second or more (shorter ones are the pacing of
        a spent rate-limit bucket, many a minute), a line when it is long enough to look like a hang."""
        if seconds < _RECORDED_PAUSE_S:
            return
        self._event("backbone_paused", seconds=round(seconds, 3), status=status, asked_s=asked_s)
        if seconds >= _ANNOUNCED_PAUSE_S:
            asked = f", as the provider asked ({asked_s:g} s)" if asked_s else ""
            self._context.announce(
                f"backbone {self._runtime.name!r} paused for {seconds:.0f} s after HTTP {status}{asked}"
            )

    def _note_rate_changes(self) -> None:
        """Record each change of the rate learned from bare refusals as an event; say the first learned one."""
        runtime = self._runtime
        for change in runtime.gate.take_rate_changes():
            rpm = round(change.rpm, 1) if change.rpm is not None else None
            self._event(f"rate_{change.kind}", rpm=rpm, accepted=change.accepted, refused=change.refused)
            if change.kind != "learned" or "rate_learned" in runtime.announced:
                continue
            runtime.announced.add("rate_learned")
            self._context.announce(
                f"backbone {runtime.name!r}: {change.refused} of the last minute's {change.accepted + change.refused} "
                f"requests were refused with no limit stated; holding it to {change.rpm:,.0f} requests/min, raised "
                "by a quarter each minute without a refusal (declare limits.rpm to skip this)"
            )

    def _event(self, kind: str, **detail: Any) -> None:
        self._context.writer.add_event(
            EventRow(
                run_id=self._context.run_id,
                kind=kind,
                detail_json=json.dumps({"backbone": self._runtime.name, **detail}, sort_keys=True),
            )
        )

    def _record_answer(
        self,
        base: dict[str, Any],
        result: ChatResult,
        usage: Usage,
        usage_source: UsageSource,
        started_at: str,
        ended_at: str,
        cost: float,
    ) -> None:
        runtime = self._runtime
        writer = self._context.writer
        raw_body = result.raw_body
        if not raw_body and result.tool_calls:
            # No body came (an in-process engine), but tool calls fit no other column: keep a body that
            # replays to the same answer, so the call cache serves them too.
            raw_body = replay_body(result, get_preset(runtime.config.provider))
        writer.add_call(
            CallRow(
                **base,
                status="length" if result.finish_reason == "length" else "ok",
                started_at=started_at,
                ended_at=ended_at,
                finish_reason=result.finish_reason,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                reasoning_tokens=usage.reasoning_tokens,
                cached_tokens=usage.cached_prompt_tokens,
                cost_usd=cost,
                latency_ms=result.latency_s * 1000,
                # The raw body holds the answer: its text is stored apart only when there is no body to keep.
                response_sha256=writer.put_blob(raw_body) if raw_body else None,
                response_text_sha256=None
                if raw_body
                else writer.put_blob(repair_surrogates(result.text).encode()),
                reasoning_text_sha256=(
                    writer.put_blob(repair_surrogates(result.reasoning_text).encode())
                    if result.reasoning_text and not raw_body
                    else None
                ),
                endpoint=result.endpoint or None,
                usage_source=usage_source,
                streamed=result.streamed if result.raw_body else None,
                ttft_ms=None if result.ttft_s is None else result.ttft_s * 1000,
                decode_tokens_per_s=result.decode_tokens_per_s,
            )
        )
        if result.streamed:
            runtime.counters.streamed_tokens += usage.completion_tokens


class _FailureCounts:
    """Failed attempts of one request, by kind.

    Rate limits are counted apart from other failures and allowed `_RATE_LIMIT_ALLOWANCE` times as many tries:
    a 429 says "later", not "never", and a sweep that hits its provider's limit should slow down, not fail items.
    Cut generations are counted too: each was paid, and the backbone's ``retry.cut_retries`` bounds them.
    """

    __slots__ = ("cuts", "other", "rate_limited")

    def __init__(self) -> None:
        self.rate_limited = 0
        self.other = 0
        self.cuts = 0

    def count(self, error: CallError, *, cut: bool = False) -> int:
        """Record ``error`` and return the attempt number the retry policy should judge it as."""
        if cut:
            self.cuts += 1
        if isinstance(error, RateLimited):
            self.rate_limited += 1
            return max(1, self.rate_limited // _RATE_LIMIT_ALLOWANCE)
        self.other += 1
        return self.other

    def clear(self) -> None:
        self.rate_limited = 0
        self.other = 0
        self.cuts = 0


def _wire_message(message: Message) -> ChatMessage:
    return ChatMessage(
        message.role,
        message.content,
        tool_calls=tuple(ChatToolCall(c.id, c.name, c.arguments) for c in message.tool_calls),
        tool_call_id=message.tool_call_id,
    )


def _add_usage(left: Usage, right: Usage) -> Usage:
    return Usage(
        prompt_tokens=left.prompt_tokens + right.prompt_tokens,
        cached_prompt_tokens=left.cached_prompt_tokens + right.cached_prompt_tokens,
        completion_tokens=left.completion_tokens + right.completion_tokens,
        reasoning_tokens=left.reasoning_tokens + right.reasoning_tokens,
    )
