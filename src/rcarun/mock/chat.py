"""The chat-completions route as a pipeline of steps, each of which answers the request or passes it on.

The steps run in the order a provider decides (docs/simulator.md lists them); the answer is composed before
admission because its size is what the token limits charge. What passes them all is answered as one JSON body
or as server-sent events.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .answers import message_text, tool_prompt_chars
from .completion import (
    answer_outcome,
    completion_body,
    compose_answer,
    cut_short,
    fit_to_budget,
    usage,
)
from .config import MockConfig
from .faults import (
    ANSWER_FAULTS,
    CUT_FAULTS,
    draw_fault,
    fault_response,
    fault_table,
    hostile_answer,
    still_hostile,
)
from .headers import rate_limit_headers
from .http import JSON_CONTENT_TYPE, RequestError, drop_connection, error_response, is_authorized, parse_body
from .limits import FifoSlots
from .refusals import (
    QUOTA,
    REFUSED_STREAM,
    UNAUTHORIZED,
    concurrency_rejection,
    context_overflow_message,
    limit_rejection,
)
from .state import ChatCall, RequestNotes, ServerState
from .stats import request_digest
from .streaming import EVENT_STREAM_CONTENT_TYPE, stream_plan, write_on_time

__all__ = ["ChatRoute", "Step"]

# Tokens a message costs beyond its text (role and separators), as OpenAI's accounting does.
_MESSAGE_OVERHEAD_TOKENS = 4
# Distinct first messages remembered for prefix caching before the memory is cleared.
_PREFIX_CACHE_LIMIT = 100_000
# What a queued request is kept alive with: blank lines before a JSON body, SSE comments before a stream.
_KEEPALIVE_BODY = b"\n"
_KEEPALIVE_STREAM = b": keep-alive\n\n"
Step = Callable[[ChatCall], Awaitable[web.StreamResponse | None]]


class ChatRoute:
    """``POST /v1/chat/completions`` for one server: its config, clock and concurrency slots."""

    def __init__(
        self,
        config: MockConfig,
        clock: Callable[[], float],
        slots: FifoSlots | None,
        expected_authorization: bytes | None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._slots = slots
        self._expected_authorization = expected_authorization
        self._fault_table = fault_table(config)
        # Set when the server stops, to wake hanging ("timeout", "stream_stall") handlers.
        self.closing = asyncio.Event()
        self.steps: tuple[Step, ...] = (
            self._authorize,
            self._check_quota,
            self._parse,
            self._refuse_stream,
            self._meet_fault,
            self._fit_context,
            self._compose,
            self._admit,
            self._look_up_prefix,
            self._take_slot,
        )

    async def handle(self, request: web.Request, state: ServerState) -> web.StreamResponse:
        """Serve one request, counting it and logging what it got (the request log, when on)."""
        recorder = state.stats
        recorder.request_started()
        log = state.request_log
        seq, arrived_at = (log.next_seq(), time.time()) if log is not None else (0, 0.0)
        notes = RequestNotes()
        response: web.StreamResponse | None = None
        try:
            response = await self._serve(ChatCall(request, state, notes, self._clock()))
            return response
        finally:
            recorder.request_finished()
            if log is not None:
                log.add(notes.log_entry(seq, arrived_at, response))

    async def _serve(self, call: ChatCall) -> web.StreamResponse:
        for step in self.steps:
            response = await step(call)
            if response is not None:
                return response
        if call.body["stream"]:
            return await self._stream_answer(call)
        return await self._send_body(call)

    # ------------------------------------------------------------------------------------------- steps

    async def _authorize(self, call: ChatCall) -> web.StreamResponse | None:
        if is_authorized(call.request, self._expected_authorization):
            return None
        return self._refuse(call, "unauthorized", *UNAUTHORIZED)

    async def _check_quota(self, call: ChatCall) -> web.StreamResponse | None:
        if not self.config.quota_exhausted:
            return None
        call.state.stats.rejected("quota")
        call.notes.outcome = "rejected_quota"
        return error_response(*QUOTA, self._limit_headers(call.state))

    async def _parse(self, call: ChatCall) -> web.StreamResponse | None:
        try:
            call.body = body = parse_body(await call.request.read())
        except RequestError as error:
            return self._refuse(
                call, "bad_request", 400, error.message, "invalid_request_error", None, error.param
            )
        if call.state.request_log is not None:
            call.notes.digest = request_digest(body["messages"], body["max_tokens"])
            call.notes.max_tokens = body["max_tokens"]
        return None

    async def _refuse_stream(self, call: ChatCall) -> web.StreamResponse | None:
        if not (call.body["stream"] and self.config.refuse_stream):
            return None
        return self._refuse(call, "stream_refused", *REFUSED_STREAM, "stream")

    async def _meet_fault(self, call: ChatCall) -> web.StreamResponse | None:
        if not self._fault_table:
            return None
        state = call.state
        fault = draw_fault(self._fault_table, state.fault_rng)
        if fault in ANSWER_FAULTS:
            # Served as an answer; counted only once it is (a limit may still refuse the request).
            call.answer_fault = fault
        elif fault in CUT_FAULTS:
            call.cut_fault = fault  # an answer too, cut off on the wire once it is being sent
        elif fault is not None:
            state.stats.fault(fault)
            call.notes.outcome = fault
            if fault not in ("timeout", "reset"):
                response, call.notes.detail = fault_response(
                    fault, self.config, lambda: self._limit_headers(state), state.fault_rng, state.variant_rng
                )
                return response
            if fault == "timeout":
                await self._hang()
            drop_connection(call.request)
            # Never written: the transport is gone, and aiohttp treats the failed write as a lost client.
            return web.Response(status=200)
        return None

    async def _fit_context(self, call: ChatCall) -> web.StreamResponse | None:
        body = call.body
        messages = body["messages"]
        chars_per_token = self.config.chars_per_token
        call.texts = texts = [message_text(message) for message in messages]
        prompt_tokens = sum(math.ceil(len(text) / chars_per_token) for text in texts)
        prompt_tokens += _MESSAGE_OVERHEAD_TOKENS * len(messages)
        prompt_tokens += math.ceil(tool_prompt_chars(body) / chars_per_token)
        call.prompt_tokens = prompt_tokens
        window = self.config.context_window
        max_tokens = body["max_tokens"] or 0
        if window is None or prompt_tokens + max_tokens <= window:
            return None
        message = context_overflow_message(window, prompt_tokens, max_tokens)
        return self._refuse(call, "context_overflow", 400, message, "BadRequestError", 400, "messages")

    async def _compose(self, call: ChatCall) -> web.StreamResponse | None:
        config, state, notes = self.config, call.state, call.notes
        body = call.body
        max_tokens: int | None = body["max_tokens"]
        call.model = body["model"] or config.model
        answer = compose_answer(body, body["messages"], call.model, state.sample_rng, config.tool_rounds_max)
        if call.answer_fault is not None:
            answer, notes.detail = hostile_answer(call.answer_fault, answer, state.variant_rng)
            if notes.detail is None:  # nothing to make hostile (no step field, tool calls): a plain answer
                call.answer_fault = None
        completion = fit_to_budget(answer, config.reasoning_tokens, max_tokens, config.chars_per_token)
        # Only text answers are cut: a tool-call answer is one the budget holds or refuses whole. The draw is
        # made for every answer, hostile ones too (which are not cut), so the stream stays in step.
        if (
            config.length_rate > 0
            and state.length_rng.random() < config.length_rate
            and isinstance(answer, str)
            and call.answer_fault is None
            and call.cut_fault is None
        ):
            cut = cut_short(answer, config.reasoning_tokens, max_tokens, config.chars_per_token)
            if cut is not None:
                completion, call.length_fault = cut, True
        if call.answer_fault in ("huge_step", "surrogate", "control") and not still_hostile(
            call.answer_fault, completion.content
        ):
            # The output budget cut the answer before its hostile part: what goes out is a plain length stop.
            call.answer_fault, notes.detail = None, None
        call.completion = completion
        call.charged_tokens = call.prompt_tokens + completion.completion_tokens
        return None

    async def _admit(self, call: ChatCall) -> web.StreamResponse | None:
        state, notes = call.state, call.notes
        recorder = state.stats
        now = self._clock()
        state.offered.offer(call.charged_tokens, now)
        slots = self._slots
        if slots is not None and self.config.over_concurrency == "429":
            if not slots.try_take():
                recorder.rejected("concurrency")
                notes.outcome = "rejected_concurrency"
                return concurrency_rejection(self.config, self._limit_headers(state))
            call.holds_slot = True
        admission = state.limiter.admit(call.charged_tokens, now)
        if not admission.accepted:
            if call.holds_slot and slots is not None:
                slots.release(now)
            recorder.rejected(admission.limit_name or "rpm")
            notes.outcome = f"rejected_{admission.limit_name or 'rpm'}"
            headers = self._limit_headers(state)
            return limit_rejection(self.config, headers, admission, call.model, call.charged_tokens)
        completion = call.completion
        recorder.accept(now, call.prompt_tokens, completion.completion_tokens)
        if call.answer_fault is not None:
            recorder.fault(call.answer_fault)
        if call.cut_fault is not None:
            recorder.fault(call.cut_fault)
        if completion.finish_reason == "length":
            recorder.length_stops += 1
        if call.length_fault:
            recorder.length_faults += 1
        return None

    async def _look_up_prefix(self, call: ChatCall) -> web.StreamResponse | None:
        config, state = self.config, call.state
        first_text = call.texts[0]
        key = hash((call.body["messages"][0].get("role"), first_text))
        first_tokens = math.ceil(len(first_text) / config.chars_per_token) + _MESSAGE_OVERHEAD_TOKENS
        if config.prefix_cache_entries > 0:
            if state.prefix_cache_hit(key, config.prefix_cache_entries):
                call.cached_tokens = first_tokens
        elif key in state.seen_first_messages:
            call.cached_tokens = first_tokens
        else:
            if len(state.seen_first_messages) >= _PREFIX_CACHE_LIMIT:
                state.seen_first_messages.clear()
            state.seen_first_messages.add(key)
        # Prefill time counts only the tokens the cache did not hold (without a capacity model, all of them).
        cached = call.cached_tokens if config.prefix_cache_entries > 0 else 0
        call.uncached_tokens = call.prompt_tokens - cached
        return None

    async def _take_slot(self, call: ChatCall) -> web.StreamResponse | None:
        slots = self._slots
        if slots is not None and not call.holds_slot:
            if not slots.try_take():
                queued = await self._wait_in_queue(call, slots)
                if queued is None:  # the client left while queued; nothing more can be sent
                    call.notes.outcome = "client_left"
                    return web.Response(status=200)
                call.queued, call.arrived = queued
            call.holds_slot = True
        call.state.stats.generation_started()
        call.state.kv_tokens += call.charged_tokens
        return None

    # ---------------------------------------------------------------------------------------- answering

    async def _send_body(self, call: ChatCall) -> web.StreamResponse:
        """Answer with one JSON body once the model would have generated it."""
        config, state, notes, completion = self.config, call.state, call.notes, call.completion
        latency = (
            config.latency_s
            + config.latency_per_token_s * completion.completion_tokens
            + config.latency_per_prompt_token_s * call.uncached_tokens
        )
        try:
            remaining = latency - (self._clock() - call.arrived)
            if remaining > 0:
                await asyncio.sleep(remaining)
        finally:
            self._end_generation(call, call.arrived + latency)
        completion_id = state.next_completion_id()
        ascii_only = call.answer_fault == "surrogate"
        payload = completion_body(
            config, completion_id, call.model, completion, self._usage(call), ascii_only
        )
        if state.request_log is not None:
            notes.outcome = answer_outcome(completion, call.answer_fault)
            notes.completion_id = completion_id
        if call.cut_fault is not None:
            return await self._cut_body(call, payload, call.cut_fault)
        notes.completion_tokens_sent = completion.completion_tokens
        if call.queued is not None:
            await call.queued.write(payload)
            await call.queued.write_eof()
            return call.queued
        headers = self._limit_headers(state)
        return web.Response(status=200, body=payload, content_type=JSON_CONTENT_TYPE, headers=headers)

    async def _stream_answer(self, call: ChatCall) -> web.StreamResponse:
        """Send the answer as server-sent events, each chunk when the model would have generated it.

        The generation (count, KV tokens, slot) is held until the last chunk is written, the stream is cut or
        the client goes away; a client that leaves is logged as "client_left" with the tokens sent so far.
        """
        config, notes, completion = self.config, call.notes, call.completion
        first_token_at = (
            call.arrived + config.latency_s + config.latency_per_prompt_token_s * call.uncached_tokens
        )
        completion_id = call.state.next_completion_id()
        notes.completion_id = completion_id
        plan = stream_plan(
            config,
            completion,
            completion_id=completion_id,
            model=call.model,
            usage=self._usage(call),
            include_usage=call.body["include_usage"],
            ascii_only=call.answer_fault == "surrogate",
        )
        chunks = plan.chunks if call.cut_fault is None else plan.chunks[: plan.pieces // 2]
        response = call.queued if call.queued is not None else self._event_stream(call.state)
        try:
            await response.prepare(call.request)  # at once when it was queued: its headers went out then
            await response.write(plan.role)
            notes.completion_tokens_sent = 0
            await write_on_time(
                response,
                chunks,
                first_token_at,
                config.latency_per_token_s,
                self._clock,
                lambda tokens: setattr(notes, "completion_tokens_sent", tokens),
            )
        except ConnectionError:
            notes.outcome = "client_left"
            return response
        finally:
            last_due = chunks[-1].due_tokens if chunks else 0
            self._end_generation(call, first_token_at + config.latency_per_token_s * last_due)
        if call.cut_fault is None:
            notes.outcome = answer_outcome(completion, call.answer_fault)
            return response
        notes.outcome = call.cut_fault
        await self._cut_connection(call.request, call.cut_fault)
        return response

    def _usage(self, call: ChatCall) -> dict[str, Any] | None:
        return usage(
            self.config,
            call.completion,
            call.prompt_tokens,
            call.cached_tokens,
            call.answer_fault,
            call.notes.detail,
        )

    def _end_generation(self, call: ChatCall, scheduled_end: float) -> None:
        call.state.stats.generation_finished()
        call.state.kv_tokens -= call.charged_tokens
        if call.holds_slot and self._slots is not None:
            # The scheduled end, even when this task woke late: the slot's next holder starts from there.
            self._slots.release(min(self._clock(), scheduled_end))

    def _event_stream(self, state: ServerState) -> web.StreamResponse:
        """A 200 response for server-sent events, with the rate-limit headers (not yet prepared)."""
        headers = self._limit_headers(state)
        headers["Cache-Control"] = "no-cache"
        response = web.StreamResponse(status=200, headers=headers)
        response.content_type = EVENT_STREAM_CONTENT_TYPE
        response.charset = "utf-8"
        return response

    async def _cut_body(self, call: ChatCall, payload: bytes, kind: str) -> web.StreamResponse:
        """An unstreamed answer cut off on the wire: the first half of ``payload`` (its Content-Length says the
        whole, unless the queue already started the body), then a stall or a close as ``kind`` says."""
        response = call.queued
        if response is None:
            response = web.StreamResponse(status=200, headers=self._limit_headers(call.state))
            response.content_type = JSON_CONTENT_TYPE
            response.content_length = len(payload)
        try:
            await response.prepare(call.request)
            await response.write(payload[: len(payload) // 2])
        except ConnectionError:
            call.notes.outcome = "client_left"
            return response
        call.notes.outcome = kind
        call.notes.completion_tokens_sent = 0  # half a JSON body: no completion a client could read
        await self._cut_connection(call.request, kind)
        return response

    async def _cut_connection(self, request: web.Request, kind: str) -> None:
        """ "stream_stall" holds the connection silent for ``hang_s`` and then drops it; "stream_drop" closes it
        at once (what was written still goes out)."""
        if kind == "stream_stall":
            await self._hang()
            drop_connection(request)
            return
        transport = request.transport
        if transport is not None:
            transport.close()

    async def _hang(self) -> None:
        """Wait ``hang_s``, or until the server stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closing.wait(), self.config.hang_s)

    # ------------------------------------------------------------------------------ refusals and queue

    def _refuse(
        self,
        call: ChatCall,
        outcome: str,
        status: int,
        message: str,
        error_type: str,
        code: str | int | None,
        param: str | None = None,
    ) -> web.Response:
        """A client error (4xx) for a request the server will not serve."""
        call.state.stats.errors_4xx += 1
        call.notes.outcome = outcome
        return error_response(status, message, error_type, code, self._limit_headers(call.state), param)

    def _limit_headers(self, state: ServerState) -> dict[str, str]:
        style = self.config.headers
        if style == "none" or not state.limiter.enabled:
            return {}
        now = self._clock()
        return rate_limit_headers(style, state.limiter.request_state(now), state.limiter.token_state(now))

    async def _wait_in_queue(
        self, call: ChatCall, slots: FifoSlots
    ) -> tuple[web.StreamResponse, float] | None:
        """Hold the request FIFO until it gets a slot, keeping the connection alive with blank lines (``:
        keep-alive`` comments before a stream).

        Like DeepSeek, the 200 status and headers go out at once. Returns the started response with the moment
        its slot came free (where its answer time starts), or None when the client left while queued.
        """
        stream: bool = call.body["stream"]
        waiter = slots.enqueue()
        if stream:
            response = self._event_stream(call.state)
        else:
            response = web.StreamResponse(status=200, headers=self._limit_headers(call.state))
            response.content_type = JSON_CONTENT_TYPE
        keepalive = _KEEPALIVE_STREAM if stream else _KEEPALIVE_BODY
        try:
            await response.prepare(call.request)
            while True:
                done, _ = await asyncio.wait((waiter,), timeout=self.config.keepalive_s)
                if done:
                    return response, waiter.result()
                await response.write(keepalive)
        except ConnectionError:
            slots.abandon(waiter)
            return None
        except BaseException:
            slots.abandon(waiter)
            raise
