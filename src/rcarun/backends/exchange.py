"""What every transport shares: the exchange it opens (`Transport`, `ResponseStream`), an answer read whole
(`WholeResponse`), the wording of its failures, and where a send lost to a stale connection is noted.

Its own module so that each transport (`rcarun.backends.transports`' aiohttp, `rcarun.backends.sdk_transport`)
imports it and none imports another.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from typing import Any, Protocol

from rcarun.backends.settings import BackendSettings, Secret, redact_secrets
from rcarun.text import repair_surrogates

__all__ = [
    "LOST_SENDS",
    "ResponseStream",
    "Transport",
    "TransportFactory",
    "WholeResponse",
    "describe_failure",
    "note_lost_send",
    "silence_message",
]


class ResponseStream(Protocol):
    """One answer as it arrives: its status and headers, then its body in pieces."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Looked up case-insensitively."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (decompressed); `SilenceTimeout` or `TransportError` when they stop."""
        ...

    async def gather(self, seconds: float) -> None:
        """Let the body's bytes gather unread for ``seconds`` where the next chunk then brings all of them at once
        (read in one go rather than packet by packet; the silence deadline is not counted meanwhile); return at
        once where it would not."""
        ...


class Transport(Protocol):
    """Posts one chat-completions body to one base URL."""

    def post_chat(
        self, base_url: str, body: Mapping[str, Any]
    ) -> AbstractAsyncContextManager[ResponseStream]:
        """Send `body` to ``{base_url}/chat/completions``; the block holds the answer until it is read. Raises
        `ConnectionFailed` (nothing sent), `SilenceTimeout` or `TransportError` when no answer comes."""
        ...

    async def aclose(self) -> None: ...


TransportFactory = Callable[[BackendSettings, Secret | None], Transport]


class WholeResponse:
    """An answer already read whole, as a `ResponseStream` and the block that holds it: what a transport that
    gets its body at once (an error answer the SDK read, a test's or a benchmark's client) hands on."""

    __slots__ = ("_body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self._body = body

    async def __aenter__(self) -> WholeResponse:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def chunks(self) -> AsyncIterator[bytes]:
        return _Once(self._body)

    async def gather(self, seconds: float) -> None:
        return None  # the whole body is here


class _Once:
    """A body that came whole, as its one piece."""

    __slots__ = ("_body",)

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        body, self._body = self._body, None
        if not body:
            raise StopAsyncIteration
        return body


def describe_failure(error: BaseException, api_key: Secret | None) -> str:
    """A short, secret-free (scrubbed before it is cut), storable description of a low-level failure."""
    detail = repair_surrogates(redact_secrets(str(error) or type(error).__name__, api_key))
    return f"{type(error).__name__}: {detail[:300]}"


def silence_message(settings: BackendSettings, url: str, answering: bool) -> str:
    """The message of a `SilenceTimeout`: where, how long, and whether the answer had begun."""
    where = "within the answer" if answering else "before an answer"
    return f"{settings.name}: {url}: nothing arrived for timeout_s = {settings.timeout_s:g} s {where}"


# Where the exchange being entered in this task notes a send it lost to a stale connection and sent again:
# the call's `CallProgress.lost_sends`, set by the backend (None: nobody records them).
LOST_SENDS: ContextVar[list[tuple[float, str]] | None] = ContextVar("rcarun_lost_sends", default=None)


def note_lost_send(sent_at: float, why: str) -> None:
    """Record a send lost to a stale kept-alive connection for the call being made, which stores it as a row."""
    lost = LOST_SENDS.get()
    if lost is not None:
        lost.append((time.perf_counter() - sent_at, why))
