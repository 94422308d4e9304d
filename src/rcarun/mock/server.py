"""The simulated backbone: an OpenAI-compatible chat-completions server on loopback.

Every test, the demo and the benchmark talk to this server instead of a provider. It answers from the JSON
schema the request carries (`answers`), enforces limits the way providers do (`limits`: token buckets with 429
+ Retry-After, a concurrency cap that rejects or queues with keep-alive blank lines), injects reproducible
faults, and measures what the client offered (`stats`). The request path is kept lean — no per-request
logging unless the request log is switched on, stdlib JSON, O(1) bookkeeping — because the benchmark needs it
to sustain ~1,000 requests/s on one core.

A request with ``"stream": true`` is answered as server-sent events, as OpenAI's chat completions stream: a
role chunk at once, then the thinking text (in ``reasoning_field``) and the content or tool-call deltas about a
token a chunk (``tokens_per_chunk``), timed as a model generates them (the first ``latency_s`` plus the prefill
after arrival, each further token ``latency_per_token_s`` later, so the stream ends when the whole body would
have left), a last choice chunk with the ``finish_reason``, the usage chunk when ``stream_options.include_usage``
asks for it (Moonshot style: ``usage`` inside that last choice, always) and ``data: [DONE]``. The chunks add up
to exactly the message the unstreamed body carries. A queued stream is kept alive with ``: keep-alive``
comments, as DeepSeek does; chunks due within 5 ms of each other go out in one write, so fast tokens cost the
simulator little CPU.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /mock/stats``, ``GET /mock/log`` (the request
log, when ``request_log_size`` > 0), ``POST /mock/reset``, and vLLM's face, so that rcarun's managed replicas
are tested without a GPU: ``GET /health`` (503 during ``startup_delay_s``), ``GET /version``, ``GET /metrics``
(Prometheus text with vLLM's gauge names for requests running and waiting and KV-cache usage) and
``max_model_len`` in every ``/v1/models`` card, as vLLM's ``ModelCard`` carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import itertools
import json
import math
import random
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web

from .answers import (
    CONTROL_SEQUENCES,
    HUGE_STEP,
    LONE_SURROGATE,
    answer_seed,
    count_text_tokens,
    filler_sentence,
    filler_text,
    generate_value,
    message_text,
    schema_from_request,
    simulate_tool_calls,
    tool_calls_text,
    tool_prompt_chars,
    with_control_sequences,
    with_huge_step,
    with_lone_surrogate,
)
from .config import MockConfig
from .headers import rate_limit_headers, retry_after_headers
from .limits import Admission, FifoSlots, OfferedLoad, RateLimiter, bucket_specs
from .stats import MockStats, RequestLog, RequestLogEntry, StatsRecorder, request_digest
from .streaming import EVENT_STREAM_CONTENT_TYPE, stream_plan, write_on_time

__all__ = ["MockServer", "is_loopback_host"]

# Tokens a message costs beyond its text (role and separators), as OpenAI's accounting does.
_MESSAGE_OVERHEAD_TOKENS = 4
# Distinct first messages remembered for prefix caching before the memory is cleared.
_PREFIX_CACHE_LIMIT = 100_000
_CLIENT_MAX_SIZE = 64 * 1024 * 1024
_JSON_CONTENT_TYPE = "application/json"
# Fault kinds served as normal 200 answers (admitted, charged, timed like one) with something hostile inside.
_ANSWER_FAULTS = frozenset(("huge_step", "surrogate", "bad_usage", "control"))
_BAD_USAGE_KINDS = ("missing", "huge", "infinity", "negative")
# What a "long_pause" 429 asks for: a day, a date 73 years away, and a number that parses to infinity.
_LONG_PAUSES = ("86400", "Wed, 21 Oct 2099 07:28:00 GMT", "1e400")
_HUGE_STEP_TEXT = str(HUGE_STEP)
_DETAILED_OUTCOMES = _ANSWER_FAULTS | {"long_pause"}
# Fault kinds served as answers (admitted, charged) that the wire cuts off after about half of them.
_CUT_FAULTS = frozenset(("stream_stall", "stream_drop"))
# What a queued request is kept alive with: blank lines before a JSON body, SSE comments before a stream.
_KEEPALIVE_BODY = b"\n"
_KEEPALIVE_STREAM = b": keep-alive\n\n"
_REFUSED_STREAM_MESSAGE = "stream is not supported by this server"


def is_loopback_host(host: str) -> bool:
    """True for "localhost" and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _RequestError(Exception):
    """A request the server answers with a 400 (never leaves this module)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class _State:
    """Everything `MockServer.reset` restores: limits, meters, random streams and caches."""

    def __init__(self, config: MockConfig, now: float) -> None:
        specs = bucket_specs(config.rpm, config.rps, config.tpm, config.burst_s)
        self.limiter = RateLimiter(specs, now)
        self.offered = OfferedLoad(specs, now)
        self.stats = StatsRecorder(now)
        # Separate streams so that fault draws do not shift sampling noise and vice versa.
        self.fault_rng = random.Random(f"faults:{config.seed}")
        self.sample_rng = random.Random(f"sampling:{config.seed}")
        self.length_rng = random.Random(f"length:{config.seed}")
        # Which variant a fault takes, on a stream of its own so that the new kinds never shift the others.
        self.variant_rng = random.Random(f"variants:{config.seed}")
        self.request_log = RequestLog(config.request_log_size) if config.request_log_size > 0 else None
        self.seen_first_messages: set[int] = set()
        # The capacity-bounded prefix cache (``prefix_cache_entries`` > 0): first-message keys, oldest use first.
        self.prefix_cache: OrderedDict[int, None] = OrderedDict()
        self.prefix_hits = 0
        self.prefix_misses = 0
        self.completion_ids = itertools.count(1)
        # Prompt + completion tokens of the requests generating now: what the simulated KV cache holds.
        self.kv_tokens = 0


class MockServer:
    """The simulator running inside the caller's event loop.

    Use as ``async with MockServer(config) as server:`` and point a client at ``server.base_url``.

    Args:
        config: how the simulated backbone behaves.
        host: a loopback address (anything else is refused).
        port: TCP port; 0 picks a free one (read it back from ``server.port``).
        clock: monotonic seconds; replaceable for tests.
    """

    def __init__(
        self,
        config: MockConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not is_loopback_host(host):
            raise ValueError(f"the mock server only listens on loopback, not on {host!r}")
        self.config = config if config is not None else MockConfig()
        self.host = host
        self._requested_port = port
        self._clock = clock
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._state = _State(self.config, clock())
        self._started_at = clock()
        self._slots = FifoSlots(self.config.max_concurrency) if self.config.max_concurrency else None
        self._expected_authorization = (
            f"Bearer {self.config.api_key}".encode() if self.config.api_key is not None else None
        )
        self._fault_table = tuple(
            (kind, rate)
            for kind, rate in (
                ("error_500", self.config.error_500_rate),
                ("error_503", self.config.error_503_rate),
                ("timeout", self.config.timeout_rate),
                ("reset", self.config.reset_rate),
                ("malformed", self.config.malformed_rate),
                ("rate_limit", self.config.rate_limit_rate),
                # After the original kinds, so that they keep their share of each draw (see `_draw_fault`).
                ("huge_step", self.config.huge_step_rate),
                ("surrogate", self.config.surrogate_rate),
                ("bad_usage", self.config.bad_usage_rate),
                ("long_pause", self.config.long_pause_rate),
                ("stream_stall", self.config.stream_stall_rate),
                ("stream_drop", self.config.stream_drop_rate),
                ("bare_rate_limit", self.config.bare_rate_limit_rate),
                ("control", self.config.control_rate),
            )
            if rate > 0
        )

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the mock server is not started")
        return self._port

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT`` (the ``/mock/*`` routes live here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        return f"{self.root_url}/v1"

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=_CLIENT_MAX_SIZE)
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_get("/mock/stats", self._handle_stats)
        app.router.add_get("/mock/log", self._handle_log)
        app.router.add_post("/mock/reset", self._handle_reset)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/version", self._handle_version)
        app.router.add_get("/metrics", self._handle_metrics)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the mock server is already started")
        self._closing = asyncio.Event()
        runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port, backlog=2048)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        self._started_at = self._clock()
        self.reset()

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        # Wake hanging ("timeout" fault) handlers so that shutdown does not wait for them.
        self._closing.set()
        await runner.cleanup()

    async def __aenter__(self) -> MockServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # ---------------------------------------------------------------------------------------- measurement

    def stats(self) -> MockStats:
        """Counters since the last reset (or start)."""
        state = self._state
        return state.stats.snapshot(self._clock(), state.offered.overshoot())

    @property
    def prefix_hits(self) -> int:
        """Requests since the last reset whose first message the prefix cache held (``prefix_cache_entries``
        > 0 only): how a benchmark sees whether its routing kept prefixes warm."""
        return self._state.prefix_hits

    @property
    def prefix_misses(self) -> int:
        """Requests since the last reset whose first message the prefix cache did not hold."""
        return self._state.prefix_misses

    def request_log(self) -> dict[str, Any]:
        """The request log since the last reset: ``{"size", "total", "dropped", "entries": [...]}``.

        Raises:
            RuntimeError: the log is off (``request_log_size`` is 0).
        """
        log = self._state.request_log
        if log is None:
            raise RuntimeError("the request log is off; set MockConfig.request_log_size")
        return log.to_dict()

    def reset(self) -> None:
        """Zero the counters and restore limits, random streams and the prefix cache to their initial state.

        Requests in flight when this is called finish against the old counters.
        """
        self._state = _State(self.config, self._clock())

    # ------------------------------------------------------------------------------------------- handlers

    async def _handle_models(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._unauthorized({})
        config = self.config
        card = {
            "id": config.model,
            "object": "model",
            "created": 0,
            "owned_by": "rcarun-mock",
            "root": config.model_root or config.model,
            "parent": None,
            "max_model_len": config.context_window,
            "permission": [],
        }
        return _json_response(200, {"object": "list", "data": [card]})

    async def _handle_health(self, request: web.Request) -> web.Response:
        if self._clock() - self._started_at < self.config.startup_delay_s:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _handle_version(self, request: web.Request) -> web.Response:
        return _json_response(200, {"version": self.config.server_version})

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(status=200, text=self.metrics_text(), content_type="text/plain", charset="utf-8")

    def metrics_text(self) -> str:
        """vLLM's scheduler and KV-cache gauges in Prometheus text format, labelled as vLLM labels them."""
        config = self.config
        state = self._state
        running = max(0, state.stats.generating)
        waiting = self._slots.waiting if self._slots is not None else 0
        if config.kv_cache_tokens is not None:
            usage = min(1.0, state.kv_tokens / config.kv_cache_tokens)
        elif config.max_concurrency:
            usage = min(1.0, running / config.max_concurrency)
        else:
            usage = 0.0
        labels = f'{{engine="0",model_name="{_label_value(config.model)}"}}'
        gauges = (
            ("num_requests_running", "Number of requests in model execution batches.", float(running)),
            ("num_requests_waiting", "Number of requests waiting to be processed.", float(waiting)),
            (config.kv_cache_metric, "KV-cache usage. 1 means 100 percent usage.", usage),
        )
        lines: list[str] = []
        for name, help_text, value in gauges:
            lines += [
                f"# HELP vllm:{name} {help_text}",
                f"# TYPE vllm:{name} gauge",
                f"vllm:{name}{labels} {value!r}",
            ]
        return "\n".join(lines) + "\n"

    async def _handle_stats(self, request: web.Request) -> web.Response:
        return _json_response(200, self.stats().to_dict())

    async def _handle_log(self, request: web.Request) -> web.Response:
        log = self._state.request_log
        if log is None:
            return _error_response(
                404, "the request log is off; set request_log_size", "invalid_request_error", None, {}
            )
        return _json_response(200, log.to_dict())

    async def _handle_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return _json_response(200, {"reset": True})

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        state = self._state
        recorder = state.stats
        recorder.request_started()
        log = state.request_log
        seq, arrived_at = (log.next_seq(), time.time()) if log is not None else (0, 0.0)
        notes = _RequestNotes()
        response: web.StreamResponse | None = None
        try:
            response = await self._serve_chat(request, state, notes)
            return response
        finally:
            recorder.request_finished()
            if log is not None:
                log.add(notes.log_entry(seq, arrived_at, response))

    async def _serve_chat(
        self, request: web.Request, state: _State, notes: _RequestNotes
    ) -> web.StreamResponse:
        config = self.config
        recorder = state.stats
        # The simulated answer time runs from here, so reading, checking and composing count inside it: the
        # answer leaves ``latency_s`` after it arrived (or after its queue slot came free), which makes
        # concurrency / latency the server's real ceiling.
        arrived = self._clock()
        if not self._authorized(request):
            recorder.errors_4xx += 1
            notes.outcome = "unauthorized"
            return self._unauthorized(self._limit_headers(state))
        if config.quota_exhausted:
            recorder.rejected("quota")
            notes.outcome = "rejected_quota"
            return _error_response(
                429,
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                "insufficient_quota",
                self._limit_headers(state),
            )
        try:
            body = _parse_body(await request.read())
        except _RequestError as error:
            recorder.errors_4xx += 1
            notes.outcome = "bad_request"
            return _error_response(
                400, error.message, "invalid_request_error", None, self._limit_headers(state), error.param
            )

        if state.request_log is not None:
            notes.digest = request_digest(body["messages"], body["max_tokens"])
            notes.max_tokens = body["max_tokens"]
        stream: bool = body["stream"]
        if stream and config.refuse_stream:
            recorder.errors_4xx += 1
            notes.outcome = "stream_refused"
            return _error_response(
                400,
                _REFUSED_STREAM_MESSAGE,
                "invalid_request_error",
                None,
                self._limit_headers(state),
                "stream",
            )
        answer_fault: str | None = None
        cut_fault: str | None = None
        if self._fault_table:
            fault = self._draw_fault(state)
            if fault in _ANSWER_FAULTS:
                # Served as an answer, below; counted only once it is (a limit may still refuse the request).
                answer_fault = fault
            elif fault in _CUT_FAULTS:
                cut_fault = fault  # an answer too, cut off on the wire once it is being sent
            elif fault is not None:
                recorder.fault(fault)
                notes.outcome = fault
                return await self._serve_fault(request, state, fault, notes)

        messages: list[dict[str, Any]] = body["messages"]
        chars_per_token = config.chars_per_token
        texts = [message_text(message) for message in messages]
        prompt_tokens = sum(math.ceil(len(text) / chars_per_token) for text in texts)
        prompt_tokens += _MESSAGE_OVERHEAD_TOKENS * len(messages)
        prompt_tokens += math.ceil(tool_prompt_chars(body) / chars_per_token)
        max_tokens: int | None = body["max_tokens"]
        if config.context_window is not None and prompt_tokens + (max_tokens or 0) > config.context_window:
            recorder.errors_4xx += 1
            notes.outcome = "context_overflow"
            requested = prompt_tokens + (max_tokens or 0)
            message = (
                f"This model's maximum context length is {config.context_window} tokens. "
                f"However, you requested {requested} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens or 0} in the completion). "
                "Please reduce the length of the messages or completion."
            )
            return _error_response(
                400, message, "BadRequestError", 400, self._limit_headers(state), "messages"
            )

        model = body["model"] or config.model
        answer = self._compose_answer(body, messages, model, state)
        if answer_fault is not None:
            answer, notes.detail = _hostile_answer(answer_fault, answer, state)
            if notes.detail is None:  # nothing to make hostile (no step field, tool calls): a plain answer
                answer_fault = None
        completion = _fit_to_budget(answer, config.reasoning_tokens, max_tokens, chars_per_token)
        length_fault = False
        # Only text answers are cut: a tool-call answer is one the budget holds or refuses whole. The draw is
        # made for every answer, hostile ones too (which are not cut), so the stream stays in step.
        if (
            config.length_rate > 0
            and state.length_rng.random() < config.length_rate
            and isinstance(answer, str)
            and answer_fault is None
            and cut_fault is None
        ):
            cut = _cut_short(answer, config.reasoning_tokens, max_tokens, chars_per_token)
            if cut is not None:
                completion, length_fault = cut, True
        if answer_fault in ("huge_step", "surrogate", "control") and not _still_hostile(
            answer_fault, completion
        ):
            # The output budget cut the answer before its hostile part: what goes out is a plain length stop.
            answer_fault, notes.detail = None, None
        charged_tokens = prompt_tokens + completion.completion_tokens

        now = self._clock()
        state.offered.offer(charged_tokens, now)
        slots = self._slots
        holds_slot = False
        if slots is not None and config.over_concurrency == "429":
            if not slots.try_take():
                recorder.rejected("concurrency")
                notes.outcome = "rejected_concurrency"
                return self._concurrency_rejection(state)
            holds_slot = True
        admission = state.limiter.admit(charged_tokens, now)
        if not admission.accepted:
            if holds_slot and slots is not None:
                slots.release(now)
            recorder.rejected(admission.limit_name or "rpm")
            notes.outcome = f"rejected_{admission.limit_name or 'rpm'}"
            return self._limit_rejection(state, admission, model, charged_tokens)

        recorder.accept(now, prompt_tokens, completion.completion_tokens)
        if answer_fault is not None:
            recorder.fault(answer_fault)
        if cut_fault is not None:
            recorder.fault(cut_fault)
        if completion.finish_reason == "length":
            recorder.length_stops += 1
        if length_fault:
            recorder.length_faults += 1
        first_message_key = hash((messages[0].get("role"), texts[0]))
        first_message_tokens = math.ceil(len(texts[0]) / chars_per_token) + _MESSAGE_OVERHEAD_TOKENS
        cached_tokens = 0
        if config.prefix_cache_entries > 0:
            if _prefix_cache_hit(state, first_message_key, config.prefix_cache_entries):
                cached_tokens = first_message_tokens
        elif first_message_key in state.seen_first_messages:
            cached_tokens = first_message_tokens
        else:
            if len(state.seen_first_messages) >= _PREFIX_CACHE_LIMIT:
                state.seen_first_messages.clear()
            state.seen_first_messages.add(first_message_key)
        # Prefill time counts only the tokens the cache did not hold (without a capacity model, all of them).
        uncached_tokens = prompt_tokens - (cached_tokens if config.prefix_cache_entries > 0 else 0)

        streamed: web.StreamResponse | None = None
        if slots is not None and not holds_slot:
            if slots.try_take():
                holds_slot = True
            else:
                queued = await self._wait_in_queue(request, state, slots, stream)
                if queued is None:  # the client left while queued; nothing more can be sent
                    notes.outcome = "client_left"
                    return web.Response(status=200)
                streamed, arrived = queued
                holds_slot = True
        recorder.generation_started()
        state.kv_tokens += charged_tokens
        if stream:
            return await self._stream_answer(
                request,
                state,
                notes,
                _StreamJob(
                    completion=completion,
                    model=model,
                    prompt_tokens=prompt_tokens,
                    cached_tokens=cached_tokens,
                    answer_fault=answer_fault,
                    detail=notes.detail,
                    cut_fault=cut_fault,
                    include_usage=body["include_usage"],
                    first_token_at=(
                        arrived + config.latency_s + config.latency_per_prompt_token_s * uncached_tokens
                    ),
                    charged_tokens=charged_tokens,
                    holds_slot=holds_slot,
                ),
                streamed,
            )
        latency = (
            config.latency_s
            + config.latency_per_token_s * completion.completion_tokens
            + config.latency_per_prompt_token_s * uncached_tokens
        )
        try:
            remaining = latency - (self._clock() - arrived)
            if remaining > 0:
                await asyncio.sleep(remaining)
        finally:
            recorder.generation_finished()
            state.kv_tokens -= charged_tokens
            if holds_slot and slots is not None:
                # The scheduled end, even when this task woke late: the slot's next holder starts from there.
                slots.release(min(self._clock(), arrived + latency))

        completion_id = _completion_id(state)
        payload = self._completion_body(
            completion_id, model, completion, prompt_tokens, cached_tokens, answer_fault, notes.detail
        )
        if state.request_log is not None:
            notes.outcome = _answer_outcome(completion, answer_fault)
            notes.completion_id = completion_id
        if cut_fault is not None:
            return await self._cut_body(request, state, streamed, payload, cut_fault, notes)
        notes.completion_tokens_sent = completion.completion_tokens
        if streamed is not None:
            await streamed.write(payload)
            await streamed.write_eof()
            return streamed
        return web.Response(
            status=200, body=payload, content_type=_JSON_CONTENT_TYPE, headers=self._limit_headers(state)
        )

    # ------------------------------------------------------------------------------------------ streaming

    async def _stream_answer(
        self,
        request: web.Request,
        state: _State,
        notes: _RequestNotes,
        job: _StreamJob,
        queued: web.StreamResponse | None,
    ) -> web.StreamResponse:
        """Send ``job``'s answer as server-sent events, each chunk when the model would have generated it.

        The generation (the ``generating`` count, the KV tokens, the concurrency slot) is held until the last
        chunk is written, the stream is cut ("stream_stall", "stream_drop") or the client goes away; a client
        that leaves is logged as "client_left" with the tokens sent so far, and nothing raises out.
        """
        recorder = state.stats
        slots = self._slots
        generating = True

        def end_generation(at: float) -> None:
            nonlocal generating
            if generating:
                generating = False
                recorder.generation_finished()
                state.kv_tokens -= job.charged_tokens
                if job.holds_slot and slots is not None:
                    slots.release(at)

        completion_id = _completion_id(state)
        notes.completion_id = completion_id
        usage = self._usage(
            job.completion, job.prompt_tokens, job.cached_tokens, job.answer_fault, job.detail
        )
        plan = stream_plan(
            self.config,
            job.completion,
            completion_id=completion_id,
            model=job.model,
            usage=usage,
            include_usage=job.include_usage,
            ascii_only=job.answer_fault == "surrogate",
        )
        chunks = plan.chunks if job.cut_fault is None else plan.chunks[: plan.pieces // 2]
        response = queued if queued is not None else self._event_stream(state)
        try:
            await response.prepare(request)  # at once when it was queued: its headers went out then
            await response.write(plan.role)
            notes.completion_tokens_sent = 0
            await write_on_time(
                response,
                chunks,
                job.first_token_at,
                self.config.latency_per_token_s,
                self._clock,
                lambda tokens: setattr(notes, "completion_tokens_sent", tokens),
            )
        except ConnectionError:
            notes.outcome = "client_left"
            return response
        finally:
            # The stream's scheduled end, even when this task woke late: the slot's next holder starts there.
            scheduled_end = job.first_token_at + self.config.latency_per_token_s * (
                chunks[-1].due_tokens if chunks else 0
            )
            end_generation(min(self._clock(), scheduled_end))
        if job.cut_fault is None:
            notes.outcome = _answer_outcome(job.completion, job.answer_fault)
            return response
        notes.outcome = job.cut_fault
        await self._cut_connection(request, job.cut_fault)
        return response

    def _event_stream(self, state: _State) -> web.StreamResponse:
        """A 200 response for server-sent events, with the rate-limit headers (not yet prepared)."""
        headers = self._limit_headers(state)
        headers["Cache-Control"] = "no-cache"
        response = web.StreamResponse(status=200, headers=headers)
        response.content_type = EVENT_STREAM_CONTENT_TYPE
        response.charset = "utf-8"
        return response

    async def _cut_body(
        self,
        request: web.Request,
        state: _State,
        queued: web.StreamResponse | None,
        payload: bytes,
        kind: str,
        notes: _RequestNotes,
    ) -> web.StreamResponse:
        """An unstreamed answer cut off on the wire: the first half of ``payload`` (its Content-Length says the
        whole, unless the queue already started the body), then a stall or a close as ``kind`` says."""
        response = queued
        if response is None:
            response = web.StreamResponse(status=200, headers=self._limit_headers(state))
            response.content_type = _JSON_CONTENT_TYPE
            response.content_length = len(payload)
        try:
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
        except ConnectionError:
            notes.outcome = "client_left"
            return response
        notes.outcome = kind
        notes.completion_tokens_sent = 0  # half a JSON body: no completion a client could read
        await self._cut_connection(request, kind)
        return response

    async def _cut_connection(self, request: web.Request, kind: str) -> None:
        """End an answer cut off on the wire: "stream_stall" holds the connection silent for ``hang_s`` and then
        drops it; "stream_drop" closes it at once (what was written still goes out)."""
        if kind == "stream_stall":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.config.hang_s)
            _drop_connection(request)
            return
        transport = request.transport
        if transport is not None:
            transport.close()

    # ------------------------------------------------------------------------------------ answer and body

    def _compose_answer(
        self, body: Mapping[str, Any], messages: list[dict[str, Any]], model: str, state: _State
    ) -> str | list[dict[str, Any]]:
        """The answer text, or the tool calls (wire shape) when the simulated model calls tools this round."""
        seed = answer_seed(messages, model, body.get("seed"))
        temperature = body["temperature"]
        if temperature is None or temperature > 0:
            # A sampled model answers differently each time; the server's own stream keeps runs reproducible.
            seed ^= state.sample_rng.getrandbits(64)
        rng = random.Random(seed)
        if body.get("tools"):
            calls = simulate_tool_calls(body, model=model, rounds_max=self.config.tool_rounds_max, rng=rng)
            if calls is not None:
                return calls
        schema = schema_from_request(body)
        if schema is not None:
            return json.dumps(generate_value(schema, rng), ensure_ascii=False)
        response_format = body.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "json_object":
            return json.dumps({"answer": filler_sentence(rng)})
        return filler_sentence(rng)

    def _completion_body(
        self,
        completion_id: str,
        model: str,
        completion: _Completion,
        prompt_tokens: int,
        cached_tokens: int,
        answer_fault: str | None = None,
        detail: str | None = None,
    ) -> bytes:
        """The completion's JSON body; ``answer_fault`` "bad_usage" replaces usage by its ``detail`` variant,
        "surrogate" writes the body with ASCII escapes (a lone surrogate cannot be UTF-8).
        """
        config = self.config
        message: dict[str, Any] = {"role": "assistant", "content": completion.content}
        if completion.tool_calls is not None:
            message["content"] = None
            message["tool_calls"] = completion.tool_calls
        if config.reasoning_field is not None:
            message[config.reasoning_field] = (
                filler_text(completion.reasoning_tokens, config.chars_per_token)
                if completion.reasoning_tokens > 0
                else None
            )
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": completion.finish_reason}
            ],
        }
        usage = self._usage(completion, prompt_tokens, cached_tokens, answer_fault, detail)
        if usage is not None:
            body["usage"] = usage
        # json.dumps writes float("inf") as the bare word Infinity, as the "infinity" usage means to.
        return json.dumps(body, ensure_ascii=answer_fault == "surrogate").encode()

    def _usage(
        self,
        completion: _Completion,
        prompt_tokens: int,
        cached_tokens: int,
        answer_fault: str | None,
        detail: str | None,
    ) -> dict[str, Any] | None:
        """The answer's ``usage`` in the configured style; a "bad_usage" answer's ``detail`` variant of it
        (None: the usage is missing)."""
        total = prompt_tokens + completion.completion_tokens
        usage: dict[str, Any]
        if self.config.usage_style == "deepseek":
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "total_tokens": total,
                "prompt_cache_hit_tokens": cached_tokens,
                "prompt_cache_miss_tokens": prompt_tokens - cached_tokens,
                "completion_tokens_details": {"reasoning_tokens": completion.reasoning_tokens},
            }
        else:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "total_tokens": total,
                "prompt_tokens_details": {"cached_tokens": cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": completion.reasoning_tokens},
            }
        if answer_fault == "bad_usage":
            return _spoiled_usage(usage, detail)
        return usage

    # ----------------------------------------------------------------------------------- limits and queue

    def _limit_headers(self, state: _State) -> dict[str, str]:
        style = self.config.headers
        if style == "none" or not state.limiter.enabled:
            return {}
        now = self._clock()
        return rate_limit_headers(style, state.limiter.request_state(now), state.limiter.token_state(now))

    def _limit_rejection(self, state: _State, admission: Admission, model: str, tokens: int) -> web.Response:
        headers = self._limit_headers(state)
        headers.update(retry_after_headers(admission.retry_after_s))
        spec = admission.spec
        assert spec is not None
        period = "min" if spec.period_s == 60.0 else "s"
        label = f"{spec.unit} per {period} ({spec.name.upper()})"
        requested = tokens if spec.unit == "tokens" else 1
        if admission.too_large:
            message = (
                f"Request too large for {model} on {label}: Limit {spec.limit}, Requested {requested}. "
                "The input or output tokens must be reduced in order to run successfully."
            )
        else:
            message = (
                f"Rate limit reached for {model} on {label}: Limit {spec.limit}, Requested {requested}. "
                f"Please try again in {admission.retry_after_s * 1000:.0f}ms."
            )
        if self.config.headers == "moonshot":
            return _error_response(429, message, "rate_limit_reached_error", None, headers)
        return _error_response(429, message, spec.unit, "rate_limit_exceeded", headers)

    def _concurrency_rejection(self, state: _State) -> web.Response:
        headers = self._limit_headers(state)
        headers.update(retry_after_headers(self.config.latency_s))
        message = f"Too many concurrent requests: the limit is {self.config.max_concurrency}."
        error_type = "rate_limit_reached_error" if self.config.headers == "moonshot" else "requests"
        return _error_response(429, message, error_type, "rate_limit_exceeded", headers)

    async def _wait_in_queue(
        self, request: web.Request, state: _State, slots: FifoSlots, stream: bool
    ) -> tuple[web.StreamResponse, float] | None:
        """Hold the request FIFO until it gets a slot, keeping the connection alive with blank lines (with
        ``: keep-alive`` comments when it asked for a stream).

        Like DeepSeek, the 200 status and headers go out at once; the JSON body (or the event stream) follows
        the keep-alive lines. Returns the started response holding a slot with the moment that slot came free
        (where the request's answer time starts), or None when the client left while queued.
        """
        waiter = slots.enqueue()
        response = (
            self._event_stream(state)
            if stream
            else web.StreamResponse(status=200, headers=self._limit_headers(state))
        )
        if not stream:
            response.content_type = _JSON_CONTENT_TYPE
        keepalive = _KEEPALIVE_STREAM if stream else _KEEPALIVE_BODY
        try:
            await response.prepare(request)
            keepalive_s = self.config.keepalive_s
            while True:
                done, _ = await asyncio.wait((waiter,), timeout=keepalive_s)
                if done:
                    return response, waiter.result()
                await response.write(keepalive)
        except ConnectionError:
            slots.abandon(waiter)
            return None
        except BaseException:
            slots.abandon(waiter)
            raise

    # --------------------------------------------------------------------------------------------- faults

    def _draw_fault(self, state: _State) -> str | None:
        """One draw per request, walking the table's kinds in order (each takes a slice as wide as its rate).

        Kinds with rate 0 are not in the table and kinds added later come last, so neither moves an earlier
        kind's slice: for a given seed the same requests meet the same original faults.
        """
        draw = state.fault_rng.random()
        for kind, rate in self._fault_table:
            if draw < rate:
                return kind
            draw -= rate
        return None

    async def _serve_fault(
        self, request: web.Request, state: _State, kind: str, notes: _RequestNotes
    ) -> web.StreamResponse:
        if kind == "long_pause":
            retry_after = state.variant_rng.choice(_LONG_PAUSES)
            notes.detail = retry_after
            headers = self._limit_headers(state)
            headers["Retry-After"] = retry_after
            if retry_after.isdigit():  # OpenAI's precise header agrees when the pause is a plain number
                headers["retry-after-ms"] = str(int(retry_after) * 1000)
            moonshot = self.config.headers == "moonshot"
            return _error_response(
                429,
                "The service is unavailable for scheduled maintenance. Please retry after the time given.",
                "engine_overloaded_error" if moonshot else "requests",
                None if moonshot else "rate_limit_exceeded",
                headers,
            )
        if kind == "rate_limit":
            headers = self._limit_headers(state)
            headers.update(retry_after_headers(self.config.rate_limit_retry_after_s))
            return _error_response(
                429,
                "The server is currently overloaded with other requests. Please retry after a brief wait.",
                "requests",
                "rate_limit_exceeded",
                headers,
            )
        if kind == "bare_rate_limit":
            return _error_response(
                429, "Too many requests. Please slow down.", "requests", "rate_limit_exceeded", {}
            )
        if kind == "error_500":
            return _error_response(
                500,
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
                self._limit_headers(state),
            )
        if kind == "error_503":
            return _error_response(
                503,
                "The engine is currently overloaded, please try again later.",
                "server_error",
                None,
                self._limit_headers(state),
            )
        if kind == "malformed":
            variants = (
                b'{"id": "chatcmpl-mock", "object": "chat.completion", "choices": [{"index": 0, "mess',
                b'{"object": "chat.completion", "choices": []}',
                b"<html><body><h1>502 Bad Gateway</h1></body></html>",
            )
            return web.Response(
                status=200,
                body=state.fault_rng.choice(variants),
                content_type=_JSON_CONTENT_TYPE,
                headers=self._limit_headers(state),
            )
        if kind == "timeout":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.config.hang_s)
        _drop_connection(request)
        # Never written: the transport is gone, and aiohttp treats the failed write as a lost client.
        return web.Response(status=200)

    # ----------------------------------------------------------------------------------------------- auth

    def _authorized(self, request: web.Request) -> bool:
        expected = self._expected_authorization
        if expected is None:
            return True
        return hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected)

    def _unauthorized(self, headers: dict[str, str]) -> web.Response:
        return _error_response(
            401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key", headers
        )


class _RequestNotes:
    """What the handler decided about one chat request, for the request log (filled on the deciding paths)."""

    __slots__ = ("completion_id", "completion_tokens_sent", "detail", "digest", "max_tokens", "outcome")

    def __init__(self) -> None:
        self.outcome: str | None = None
        self.digest: str | None = None
        self.max_tokens: int | None = None
        self.completion_id: str | None = None
        self.detail: str | None = None
        self.completion_tokens_sent: int | None = None

    def log_entry(self, seq: int, arrived_at: float, response: web.StreamResponse | None) -> RequestLogEntry:
        outcome = self.outcome
        dropped = response is None or outcome in ("timeout", "reset", "client_left")
        if outcome is None:
            outcome = "cancelled" if response is None else f"http_{response.status}"
        return RequestLogEntry(
            seq=seq,
            arrived_at=arrived_at,
            at=time.time(),
            status=None if dropped or response is None else response.status,
            outcome=outcome,
            request_digest=self.digest,
            max_tokens=self.max_tokens,
            completion_id=self.completion_id,
            # A hostile answer that a limit refused (or a queue lost) went out as that, not as the fault.
            detail=self.detail if outcome in _DETAILED_OUTCOMES else None,
            completion_tokens_sent=self.completion_tokens_sent,
        )


class _Completion:
    """What the simulated model generated within its budget."""

    __slots__ = ("completion_tokens", "content", "finish_reason", "reasoning_tokens", "tool_calls")

    def __init__(
        self,
        content: str,
        reasoning_tokens: int,
        completion_tokens: int,
        finish_reason: str,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> None:
        self.content = content
        self.reasoning_tokens = reasoning_tokens
        self.completion_tokens = completion_tokens
        self.finish_reason = finish_reason
        self.tool_calls = tool_calls


@dataclass(frozen=True, slots=True)
class _StreamJob:
    """What a streamed answer needs once its request is admitted and holds its slot."""

    completion: _Completion
    model: str
    prompt_tokens: int
    cached_tokens: int
    answer_fault: str | None
    detail: str | None
    cut_fault: str | None
    include_usage: bool
    first_token_at: float  # clock time the first token falls due: arrival (or slot) + latency_s + prefill
    charged_tokens: int
    holds_slot: bool


def _completion_id(state: _State) -> str:
    return f"chatcmpl-mock{next(state.completion_ids):012x}"


def _answer_outcome(completion: _Completion, answer_fault: str | None) -> str:
    """The request log's outcome of an answer sent whole."""
    if answer_fault is not None:
        return answer_fault
    return "length" if completion.finish_reason == "length" else "ok"


def _prefix_cache_hit(state: _State, key: int, capacity: int) -> bool:
    """Look ``key`` up in the LRU prefix cache and record it as most recently used (inserted on a miss, the
    least recently used entry evicted beyond ``capacity``), as vLLM keeps a prefix's blocks until memory runs
    short. The entry is made at admission, so calls that share a prefix and arrive together mostly hit."""
    cache = state.prefix_cache
    if key in cache:
        cache.move_to_end(key)
        state.prefix_hits += 1
        return True
    state.prefix_misses += 1
    cache[key] = None
    if len(cache) > capacity:
        cache.popitem(last=False)
    return False


def _hostile_answer(
    kind: str, answer: str | list[dict[str, Any]], state: _State
) -> tuple[str | list[dict[str, Any]], str | None]:
    """The answer made hostile for fault ``kind`` with its log detail; the detail is None when ``answer`` has
    nothing to spoil (tool calls; no step field for "huge_step").
    """
    if kind == "bad_usage":
        return answer, state.variant_rng.choice(_BAD_USAGE_KINDS)
    if isinstance(answer, list):
        return answer, None
    if kind == "huge_step":
        spoiled = with_huge_step(answer)
        return (answer, None) if spoiled is None else (spoiled[0], ",".join(spoiled[1]))
    if kind == "control":
        return with_control_sequences(answer)
    return with_lone_surrogate(answer)


def _still_hostile(kind: str, completion: _Completion) -> bool:
    """Whether the content sent still holds what made the answer hostile (the budget may have cut it off)."""
    if kind == "huge_step":
        return _HUGE_STEP_TEXT in completion.content
    if kind == "control":
        return CONTROL_SEQUENCES in completion.content
    return LONE_SURROGATE in completion.content


def _spoiled_usage(usage: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """``usage`` made into the "bad_usage" variant ``kind`` (None for "missing")."""
    if kind == "missing":
        return None
    if kind == "huge":
        usage["prompt_tokens"] = 10**20
        usage["total_tokens"] = 10**20 + usage["completion_tokens"]
    elif kind == "infinity":
        usage["prompt_tokens"] = math.inf
        usage["total_tokens"] = math.inf
    else:  # "negative"
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            usage[name] = -max(1, usage[name])
    return usage


def _fit_to_budget(
    answer: str | list[dict[str, Any]], reasoning_tokens: int, max_tokens: int | None, chars_per_token: float
) -> _Completion:
    """Cut reasoning and answer to ``max_tokens`` as a model does: thinking first, then the answer.

    Tool calls (a list) are all or nothing: calls cut short are no calls, so a budget too small for them is a
    length stop with no content.
    """
    if isinstance(answer, list):
        calls_tokens = count_text_tokens(tool_calls_text(answer), chars_per_token)
        if max_tokens is None or max_tokens >= reasoning_tokens + calls_tokens:
            return _Completion("", reasoning_tokens, reasoning_tokens + calls_tokens, "tool_calls", answer)
        return _Completion("", min(max_tokens, reasoning_tokens), max_tokens, "length")
    answer_tokens = count_text_tokens(answer, chars_per_token)
    if max_tokens is None or max_tokens >= reasoning_tokens + answer_tokens:
        return _Completion(answer, reasoning_tokens, reasoning_tokens + answer_tokens, "stop")
    if max_tokens < reasoning_tokens:
        # The budget ran out while thinking: no content at all (the "empty content" length stop).
        return _Completion("", max_tokens, max_tokens, "length")
    content_tokens = max_tokens - reasoning_tokens
    content = answer[: math.floor(content_tokens * chars_per_token)]
    return _Completion(content, reasoning_tokens, max_tokens, "length")


def _cut_short(
    answer: str, reasoning_tokens: int, max_tokens: int | None, chars_per_token: float
) -> _Completion | None:
    """The ``length_rate`` fault: the answer stopped at a tenth of ``max_tokens``; None if it cannot be cut.

    When the whole answer is shorter than that (or no budget was given), it stops at a tenth of its own length.
    """
    whole = reasoning_tokens + count_text_tokens(answer, chars_per_token)
    cut_at = max(1, max_tokens // 10) if max_tokens is not None else 0
    if cut_at >= whole or cut_at == 0:
        cut_at = max(1, whole // 10)
    if cut_at >= whole:
        return None
    return _fit_to_budget(answer, reasoning_tokens, cut_at, chars_per_token)


def _parse_body(raw: bytes) -> dict[str, Any]:
    """The request body with ``max_tokens``, ``temperature``, ``model`` and ``stream`` normalised (and
    ``include_usage`` added: whether ``stream_options`` asked for the usage chunk).

    Raises:
        _RequestError: the body is not a valid chat-completion request.
    """
    try:
        body = json.loads(raw)
    except ValueError:
        raise _RequestError("We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise _RequestError("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _RequestError("'messages' must be a non-empty array.", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _RequestError(f"messages[{index}] must be an object with a 'role'.", f"messages[{index}]")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise _RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}.", "max_tokens")
    body["max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise _RequestError(f"temperature must be a number, got {temperature!r}.", "temperature")
    body["temperature"] = temperature
    model = body.get("model")
    body["model"] = model if isinstance(model, str) else ""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _RequestError(f"stream must be a boolean, got {stream!r}.", "stream")
    body["stream"] = stream is True
    options = body.get("stream_options")
    include_usage: object = None
    if options is not None:
        if not isinstance(options, dict):
            raise _RequestError(f"stream_options must be an object, got {options!r}.", "stream_options")
        include_usage = options.get("include_usage")
        if include_usage is not None and not isinstance(include_usage, bool):
            raise _RequestError(
                f"stream_options.include_usage must be a boolean, got {include_usage!r}.",
                "stream_options.include_usage",
            )
    body["include_usage"] = include_usage is True
    return body


def _drop_connection(request: web.Request) -> None:
    """Close the connection with a TCP reset, as a crashed proxy or server does."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _label_value(text: str) -> str:
    """``text`` escaped for a Prometheus label value (backslash, quote, newline)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type=_JSON_CONTENT_TYPE, headers=headers
    )


def _error_response(
    status: int,
    message: str,
    error_type: str,
    code: str | int | None,
    headers: Mapping[str, str],
    param: str | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return _json_response(status, body, headers)
