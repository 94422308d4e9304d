"""The backend for every OpenAI-compatible chat API: DeepSeek, OpenAI, Kimi, vLLM servers, the mock.

Per call: pick a replica, build the body, hand it to the transport, read the answer (streamed or whole) under the
size cap and deadline, and turn it into a `ChatResult` or a typed error. It never sleeps, loops or retries; what
an attempt received stays in the runner's `CallProgress`. Details: docs/reliability.md ("The
OpenAI-compatible backend").
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator

from rcarun.backends.presets import Preset, get_preset
from rcarun.backends.registry import backend
from rcarun.backends.replicas import ReplicaBalancer, prefix_key
from rcarun.backends.settings import BackendSettings, Secret, redact_secrets
from rcarun.backends.streaming import (
    CallProgress,
    ChunkAssembler,
    EventDecoder,
    StreamError,
    render_completion,
)
from rcarun.backends.transports import LOST_SENDS, ResponseStream, create_transport
from rcarun.backends.types import ChatRequest, ChatResult
from rcarun.backends.wire import (
    Redactor,
    build_body,
    completion_result,
    error_for_status,
    parse_completion,
    provider_message,
    refuses_streaming,
)
from rcarun.errors import (
    CallDeadline,
    CallError,
    MalformedResponse,
    ResponseTooLarge,
    ServerError,
    StreamRefused,
    TransportError,
)

__all__ = ["OpenAICompatBackend"]

_EVENT_STREAM = "text/event-stream"
# Pauses between the reads of a streamed answer (see `_read_stream`): a share of the stream's time so far, within
# bounds; a shorter pause than the least is not worth its timer.
_GATHER_SHARE = 0.1
_GATHER_MAX_S = 0.2
_GATHER_MIN_S = 0.005


@backend("openai-compat")
class OpenAICompatBackend:
    """`Backend` over HTTP for any OpenAI-compatible provider, shaped by the provider's `Preset`.

    Raises `ConfigError` for an unknown preset or transport, or an unset key variable.
    """

    __slots__ = ("_api_key", "_preset", "_redact", "_replicas", "_stream", "_transport", "name", "settings")

    def __init__(self, settings: BackendSettings) -> None:
        self.name = settings.name
        self.settings = settings
        self._preset = get_preset(settings.provider)
        self._api_key: Secret | None = settings.read_api_key()
        self._redact: Redactor = functools.partial(redact_secrets, secret=self._api_key)
        self._transport = create_transport(settings, self._api_key)
        self._replicas = ReplicaBalancer(settings.base_urls)
        self._stream = settings.stream if settings.stream is not None else self._preset.streams

    @property
    def preset(self) -> Preset:
        return self._preset

    @property
    def replicas(self) -> ReplicaBalancer:
        return self._replicas

    @property
    def streams(self) -> bool:
        """Whether answers are asked for as server-sent events now (False once the server refused to stream)."""
        return self._stream

    def __repr__(self) -> str:
        settings = self.settings
        return (
            f"OpenAICompatBackend(name={settings.name!r}, provider={settings.provider!r}, "
            f"model={settings.model!r}, transport={settings.transport!r}, replicas={len(settings.base_urls)}, "
            f"stream={self._stream})"
        )

    async def chat(self, request: ChatRequest, progress: CallProgress | None = None) -> ChatResult:
        """Send one request and translate the answer, keeping ``progress`` up to date as it arrives.

        Raises:
            rcarun.errors.CallError: the subclass says whether to retry, pause the backbone or give up.
        """
        stream = self._stream
        body = build_body(request, self.settings, self._preset, stream=stream)
        if progress is None:
            progress = CallProgress()
        replicas = self._replicas
        # The affinity key is hashed only when it is used: a long first message costs a digest per call.
        key = None
        if replicas.affinity and len(replicas.urls) > 1 and request.messages:
            first = request.messages[0]
            key = prefix_key(first.role, first.content)
        try:
            with replicas.lease(key) as base_url:
                progress.sent_at = time.perf_counter()
                deadline = asyncio.timeout(self.settings.max_call_s)
                lost_sends = LOST_SENDS.set(progress.lost_sends)  # where a transport notes a send it lost
                try:
                    async with deadline:
                        return await self._exchange(base_url, body, progress, stream)
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    raise CallDeadline(
                        f"{self.name}: the call ran past max_call_s = {self.settings.max_call_s:g} s"
                        f"{_received(progress)}"
                    ) from None
                finally:
                    LOST_SENDS.reset(lost_sends)
        except CallError as error:
            if self._api_key is not None:
                _scrub(error, self._api_key)
            raise

    async def _exchange(
        self, base_url: str, body: dict[str, object], progress: CallProgress, stream: bool
    ) -> ChatResult:
        async with self._transport.post_chat(base_url, body) as response:
            status, headers = response.status, response.headers
            progress.status = status
            if stream and 200 <= status < 300 and _is_event_stream(response):
                return await self._read_stream(response, progress, base_url)
            raw = await self._read_body(response, progress)
        latency_s = time.perf_counter() - progress.sent_at
        if stream and refuses_streaming(status, raw):
            # Remembered for every later call of this backbone: it is the server, not this request.
            self._stream = False
            message = provider_message(None, raw, redact=self._redact)
            raise StreamRefused(
                f"{self.name}: HTTP {status}: the server refuses to stream ({message}); "
                "answers are asked for unstreamed from now on (set stream = false to say so in the config)",
                status=status,
            )
        return parse_completion(
            status,
            headers,
            raw,
            self._preset,
            latency_s,
            base_url,
            backbone=self.name,
            redact=self._redact,
        )

    async def _read_body(self, response: ResponseStream, progress: CallProgress) -> bytes:
        """The whole body, read as it arrives, refused past the size cap (never held whole beyond it)."""
        parts = [chunk async for chunk in self._capped(response, progress)]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _read_stream(
        self, response: ResponseStream, progress: CallProgress, base_url: str
    ) -> ChatResult:
        """Server-sent events added up to one completion, with the time to the first token and the decode rate."""
        decoder = EventDecoder()
        assembler = ChunkAssembler()
        progress.assembler = assembler
        progress.streamed = True
        async for chunk in self._capped(response, progress):
            events = decoder.feed(chunk)
            if not events:
                continue
            tokens = assembler.tokens
            for data in events:
                try:
                    assembler.add(data)
                except StreamError as error:
                    raise self._stream_error(error, response.status, progress) from None
                if assembler.done:
                    break
            if assembler.tokens != tokens:
                now = time.perf_counter()
                if progress.first_token_at is None:
                    progress.first_token_at = now
                progress.last_token_at = now
            if assembler.done:
                break
            # Once the answer is under way, let it gather between reads instead of waking for every network read:
            # a provider sends each token in a packet of its own, and a wake-up per packet cost a sweep most of
            # a core at 20,000 tokens/s (docs/performance.md). The pause grows with the stream, a tenth of its
            # time so far up to _GATHER_MAX_S, so the last token is late by that much at most; the bytes wait in
            # the kernel, and the silence deadline counts from the end of each pause.
            if progress.first_token_at is not None:
                pause = min(_GATHER_MAX_S, (time.perf_counter() - progress.first_token_at) * _GATHER_SHARE)
                if pause >= _GATHER_MIN_S:
                    await response.gather(pause)
        if not assembler.done and assembler.finish_reason is None:
            raise TransportError(
                f"{self.name}: {base_url}: the stream ended before the answer finished{_received(progress)}"
            )
        ended = time.perf_counter()
        completion = assembler.completion()
        result = completion_result(
            completion,
            render_completion(completion),
            response.status,
            response.headers,
            self._preset,
            ended - progress.sent_at,
            base_url,
            backbone=self.name,
            redact=self._redact,
        )
        return dataclasses.replace(
            result,
            streamed=True,
            ttft_s=progress.ttft_s(),
            decode_tokens_per_s=_decode_rate(result, progress),
        )

    def _capped(self, response: ResponseStream, progress: CallProgress) -> _Capped:
        return _Capped(response.chunks(), progress, self.settings.max_response_bytes, self.name)

    def _stream_error(self, error: StreamError, status: int, progress: CallProgress) -> CallError:
        """An event the stream cannot go on from: an error object (its own status, when it gives one), or
        something that is not a chunk."""
        payload = error.payload
        detail = provider_message(payload, error.data, redact=self._redact)
        if isinstance(payload, dict) and payload.get("error") is not None:
            inner = payload["error"]
            code = inner.get("code", inner.get("status")) if isinstance(inner, dict) else None
            if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
                return error_for_status(code, error.data, self._preset, self.name, redact=self._redact)
            return ServerError(
                f"{self.name}: HTTP {status}: the stream carried an error{_received(progress)}: {detail}",
                status=status,
            )
        return MalformedResponse(
            f"{self.name}: HTTP {status}: {error}{_received(progress)}: {detail}", status=status
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


class _Capped:
    """A body's pieces as they arrive, counted into ``progress``: past ``cap`` bytes, `ResponseTooLarge` (what
    arrived up to there is all that is ever held)."""

    __slots__ = ("_cap", "_chunks", "_name", "_progress")

    def __init__(self, chunks: AsyncIterator[bytes], progress: CallProgress, cap: int, name: str) -> None:
        self._chunks = chunks
        self._progress = progress
        self._cap = cap
        self._name = name

    def __aiter__(self) -> _Capped:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.__anext__()
        progress = self._progress
        progress.bytes_received += len(chunk)
        if progress.bytes_received > self._cap:
            raise ResponseTooLarge(
                f"{self._name}: the response passed max_response_mb = {self._cap / 2**20:g} MiB and was not read "
                f"further{_received(progress)}",
                status=progress.status,
            )
        return chunk


def _is_event_stream(response: ResponseStream) -> bool:
    headers = response.headers
    kind = headers.get("Content-Type") or headers.get("content-type") or ""
    return kind.lstrip().lower().startswith(_EVENT_STREAM)


def _received(progress: CallProgress) -> str:
    """What had arrived when a call ended early, for its error message."""
    if progress.streamed:
        return f" (after {progress.tokens:,} streamed tokens, {progress.bytes_received:,} bytes)"
    if progress.status is not None:
        return f" (HTTP {progress.status}, after {progress.bytes_received:,} bytes)"
    return ""


def _decode_rate(result: ChatResult, progress: CallProgress) -> float | None:
    """Tokens per second from the first token to the last: the completion tokens after the first (less thinking
    the server did not stream, which came before the first token), over that span; None when unknown."""
    first, last = progress.first_token_at, progress.last_token_at
    if first is None or last is None or last <= first:
        return None
    usage = result.usage
    if result.usage_problem is None and usage.completion_tokens > 0:
        tokens = usage.completion_tokens
        if usage.reasoning_tokens and not result.reasoning_text:
            tokens -= usage.reasoning_tokens
    else:
        tokens = progress.tokens
    if tokens < 2:
        return None
    return (tokens - 1) / (last - first)


def _scrub(error: CallError, api_key: Secret) -> None:
    """Remove the exact key from an error's message in place, wherever it stands (patterns would garble ours)."""
    error.args = tuple(api_key.redact(arg) if isinstance(arg, str) else arg for arg in error.args)
