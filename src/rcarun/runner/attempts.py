"""One paid attempt on a backbone: admitted by its gate, sent, settled, and recorded as a ``calls`` row
whatever happens. What it reveals about the backbone (a pause, a stop, a refused key, a learned rate, a cut
generation) is counted, stored as an event and, once per backbone, said to the user.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from rcarun.backends import (
    CallProgress,
    ChatRequest,
    ChatResult,
    PromptSize,
    Usage,
    get_preset,
    replay_body,
    utf8_length,
)
from rcarun.budgets import RetryDecision, Ticket, cut_usage, estimated_usage, implausible_usage
from rcarun.errors import (
    BACKBONE_FAULTS,
    AuthError,
    CallError,
    ConnectionFailed,
    ModelNotFound,
    QuotaExhausted,
    RateLimited,
    StopRequested,
    StreamRefused,
    TransportError,
)
from rcarun.runner.calls import PlannedRequest
from rcarun.runner.runtime import BackboneRuntime, RunContext
from rcarun.store import CallRow, EventRow, UsageSource, utc_timestamp
from rcarun.text import repair_surrogates

__all__ = ["Attempt", "Failed", "FailureCounts", "PaidAttempts"]

# A pause at least this long is recorded as an event, and one this long said on the terminal too.
_RECORDED_PAUSE_S = 1.0
_ANNOUNCED_PAUSE_S = 10.0
# A request may meet this many times as many 429s as other failures before it gives up.
_RATE_LIMIT_ALLOWANCE = 5


@dataclass(frozen=True, slots=True)
class Failed:
    """A paid attempt that failed, and the gate's decision about it (made while the attempt still held its
    concurrency slot, so a burst of 429s from one overload shrinks concurrency once)."""

    error: CallError
    decision: RetryDecision


Attempt = ChatResult | Failed
"""A paid attempt's outcome: the answer, or the failure and the gate's decision about it."""


@dataclass(frozen=True, slots=True)
class _Sent:
    """An attempt on its way: its row's keys, request and ticket, when it left, and what has arrived."""

    base: dict[str, Any]
    request: ChatRequest
    prompt: PromptSize
    ticket: Ticket
    pauses_before: int
    started_at: str = field(default_factory=utc_timestamp)
    started: float = field(default_factory=time.perf_counter)
    progress: CallProgress = field(default_factory=CallProgress)

    def latency_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000


class PaidAttempts:
    """Paid attempts on one backbone of a run."""

    __slots__ = ("_context", "_runtime")

    def __init__(self, context: RunContext, runtime: BackboneRuntime) -> None:
        self._context = context
        self._runtime = runtime

    async def attempt(
        self, planned: PlannedRequest, base: dict[str, Any], prompt: PromptSize, failures: FailureCounts
    ) -> Attempt:
        """One paid attempt of ``planned``, recorded under ``base`` (its row's keys) whatever happens.

        Raises:
            StopRequested: this backbone (or the whole run) stopped before the request was sent.
        """
        runtime, gate, writer = self._runtime, self._runtime.gate, self._context.writer
        request = planned.request
        writer.put_blob(planned.body, planned.sha256)
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
                sent = _Sent(base, request, prompt, ticket, pauses_before=gate.pauses_started)
                runtime.in_flight.add(sent.progress)
                try:
                    result = await self._chat_recording_lost_sends(sent)
                except CallError as error:
                    return self._failed(error, sent, failures)
                except asyncio.CancelledError:
                    self._record_cancelled(sent)
                    raise
                finally:
                    runtime.in_flight.discard(sent.progress)
                await self._answered(result, sent)
        return result

    def _failed(self, error: CallError, sent: _Sent, failures: FailureCounts) -> Failed:
        """Charge, record and judge a failed attempt."""
        runtime, gate, progress = self._runtime, self._runtime.gate, sent.progress
        cut = cut_usage(
            gate.estimator, error, progress, prompt=sent.prompt, max_tokens=sent.request.max_tokens
        )
        cost = sent.ticket.settle(cut, reported=False, completed=False) if cut is not None else 0.0
        # A generation under way when cut (silence, a drop, the deadline; tokens charged) is paid again if sent
        # again: bounded. An unreadable answer or an error in a stream is retried as before.
        generating = isinstance(error, TransportError) and cut is not None and cut.completion_tokens > 0
        decision = gate.on_error(error, failures.count(error, cut=generating), sent.ticket)
        self._note_rate_changes()
        runtime.counters.record_error(error)
        if generating and decision.retry and failures.cuts > runtime.config.retry.cut_retries:
            decision = RetryDecision(retry=False)
        self._context.writer.add_call(
            CallRow(
                **sent.base,
                status="rate_limited" if isinstance(error, RateLimited) else "error",
                started_at=sent.started_at,
                ended_at=utc_timestamp(),
                latency_ms=sent.latency_ms(),
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
        elif gate.pauses_started > sent.pauses_before:
            self._note_pause(decision.pause_backbone_s, error.status, decision.asked_s)
        return Failed(error, decision)

    def _record_cancelled(self, sent: _Sent) -> None:
        """Ctrl-C or a stop mid-call: what arrived is kept, and a generation under way is charged."""
        progress, estimator = sent.progress, self._runtime.gate.estimator
        cut = cut_usage(estimator, None, progress, prompt=sent.prompt, max_tokens=sent.request.max_tokens)
        cost = sent.ticket.settle(cut, reported=False, completed=False) if cut is not None else 0.0
        self._context.writer.add_call(
            CallRow(
                **sent.base,
                status="cancelled",
                started_at=sent.started_at,
                ended_at=utc_timestamp(),
                latency_ms=sent.latency_ms(),
                error="cancelled before the provider answered"
                if progress.status is None
                else "cancelled while the answer was arriving",
                error_kind="cancelled",
                http_status=progress.status,
                **self._cut_columns(progress, cut, cost),
            )
        )
        if cut is not None:
            self._runtime.counters.cut_calls += 1

    async def _answered(self, result: ChatResult, sent: _Sent) -> None:
        """Learn from an answer's rate-limit headers, free its slot, then settle and record it."""
        runtime, gate = self._runtime, self._runtime.gate
        runtime.consecutive_faults = 0
        pause = gate.on_rate_limit_headers(result.rate_limit)
        if gate.retry.too_long(pause):
            # The answer stands; it is the backbone's next calls that cannot be waited for.
            self._stop_backbone(200, pause, "its rate-limit headers", "")
        elif gate.pauses_started > sent.pauses_before:
            self._note_pause(pause, 200, None)
        ended_at = utc_timestamp()
        sent.ticket.release_slot()
        try:
            # The slot is free: let the call it was handed to go out before this one is settled and recorded. Two
            # turns of the loop: one for the woken caller to start its request, one for aiohttp to write it.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        finally:
            # Settled and recorded even when cancelled in between: the provider answered and charged.
            usage, source = self._billable_usage(result, sent.request, sent.prompt)
            cost = sent.ticket.settle(usage, reported=source == "reported")
            self._note_rate_changes()
            self._record_answer(sent, result, usage, source, ended_at, cost)

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

    async def _chat_recording_lost_sends(self, sent: _Sent) -> ChatResult:
        """The backend's call. A send lost on a stale kept-alive connection (sent again by the transport without
        counting an attempt) still gets its own row: every request that left is recorded."""
        try:
            return await self._runtime.backend.chat(sent.request, sent.progress)
        finally:
            for seconds, why in sent.progress.lost_sends:
                error = f"{why} (a kept-alive connection the server had closed; sent again at once)"
                self._context.writer.add_call(
                    CallRow(
                        **sent.base,
                        status="error",
                        started_at=sent.started_at,
                        ended_at=utc_timestamp(),
                        latency_ms=seconds * 1000,
                        error=error[:2000],
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
        """Count a charged attempt cut short; say the first generation cut on the backbone, and what comes next."""
        runtime = self._runtime
        runtime.counters.cut_calls += 1
        if not generating or not self._first("cut"):
            return
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
        if not self._first("stream_refused"):
            return
        self._context.announce(
            f"backbone {self._runtime.name!r}: the server refuses to stream; its calls are sent unstreamed from now on "
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

    def note_left(self, error: CallError) -> None:
        """An item left for a resume by an error about the backbone (a refused key, no credit, no such model):
        the cause is said once, stored, and closes the run's summary."""
        runtime = self._runtime
        runtime.left_because = (
            f"backbone {runtime.name!r}: items are left for a resume after {type(error).__name__}: {error}; "
            f"{self._fault_advice(error)}"
        )
        if not self._first("left"):
            return
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
        """A new pause of the backbone: an event from a second (shorter ones pace a spent rate-limit bucket), a line
        when it is long enough to look like a hang."""
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
            if change.kind != "learned" or not self._first("rate_learned"):
                continue
            self._context.announce(
                f"backbone {runtime.name!r}: {change.refused} of the last minute's {change.accepted + change.refused} "
                f"requests were refused with no limit stated; holding it to {change.rpm:,.0f} requests/min, raised "
                "by a quarter each minute without a refusal (declare limits.rpm to skip this)"
            )

    def _first(self, what: str) -> bool:
        """Whether ``what`` is new on this backbone (said once per backbone, however many items meet it)."""
        announced = self._runtime.announced
        if what in announced:
            return False
        announced.add(what)
        return True

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
        sent: _Sent,
        result: ChatResult,
        usage: Usage,
        usage_source: UsageSource,
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
                **sent.base,
                status="length" if result.finish_reason == "length" else "ok",
                started_at=sent.started_at,
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


@dataclass(slots=True)
class FailureCounts:
    """Failed attempts of one request, by kind: 429s get `_RATE_LIMIT_ALLOWANCE` times as many tries as other
    failures (they say "later", not "never"); cut generations, each paid, are bounded by ``retry.cut_retries``."""

    rate_limited: int = 0
    other: int = 0
    cuts: int = 0

    def count(self, error: CallError, *, cut: bool = False) -> int:
        """Record ``error`` and return the attempt number the retry policy should judge it as."""
        if cut:
            self.cuts += 1
        if isinstance(error, RateLimited):
            self.rate_limited += 1
            return max(1, self.rate_limited // _RATE_LIMIT_ALLOWANCE)
        self.other += 1
        return self.other
