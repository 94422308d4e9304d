"""The transports: how a request body reaches a base URL and how the answer's bytes come back as they arrive.

A transport only moves bytes: `Transport.post_chat` sends and waits for the headers, `ResponseStream.chunks`
yields the body; it raises `rcarun.errors.TransportError` only when no answer comes or it stops coming
(``timeout_s`` is a silence deadline). Registered: ``aiohttp`` (default) and ``openai-sdk``. Details:
docs/reliability.md ("Transports").
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
import weakref
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from types import SimpleNamespace, TracebackType
from typing import Any

import aiohttp

from rcarun.backends.exchange import (
    LOST_SENDS,
    ResponseStream,
    Transport,
    TransportFactory,
    WholeResponse,
    describe_failure,
    note_lost_send,
    silence_message,
)
from rcarun.backends.settings import BackendSettings, Secret
from rcarun.errors import ConfigError, ConnectionFailed, SilenceTimeout, TransportError
from rcarun.jsonfast import dumps_compact

__all__ = [
    "LOST_SENDS",
    "AiohttpTransport",
    "ResponseStream",
    "Transport",
    "TransportFactory",
    "WholeResponse",
    "create_transport",
    "describe_failure",
    "silence_message",
    "transport",
    "transport_names",
]


_TRANSPORTS: dict[str, TransportFactory] = {}


def transport(name: str) -> Callable[[TransportFactory], TransportFactory]:
    """Register a transport factory under a short kebab-case name (the ``transport`` setting)."""

    def register(factory: TransportFactory) -> TransportFactory:
        if name in _TRANSPORTS:
            raise ValueError(f"transport {name!r} is already registered")
        _TRANSPORTS[name] = factory
        return factory

    return register


def transport_names() -> tuple[str, ...]:
    return tuple(sorted(_TRANSPORTS))


def create_transport(settings: BackendSettings, api_key: Secret | None) -> Transport:
    """The transport named by ``settings.transport`` (`ConfigError` for an unknown one)."""
    try:
        factory = _TRANSPORTS[settings.transport]
    except KeyError:
        raise ConfigError(
            f"backbone {settings.name!r}: unknown transport {settings.transport!r}; "
            f"known: {', '.join(transport_names())}"
        ) from None
    return factory(settings, api_key)


def _closed_before_answering(error: BaseException) -> bool:
    """The way a server's close of an idle kept-alive connection meets a request sent on it: the connection ended
    (EOF, or a reset or broken pipe on the write) before any byte of an answer."""
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return error.message == "Server disconnected"  # else it carries the part of an answer that came
    return isinstance(error, aiohttp.ClientOSError) and error.errno in (errno.ECONNRESET, errno.EPIPE)


# The exchange being sent in this task: ``SimpleNamespace(reused=...)``, which the connector fills in.
_SENDING: ContextVar[SimpleNamespace | None] = ContextVar("rcarun_aiohttp_sending", default=None)


class _PoolConnector(aiohttp.TCPConnector):
    """A TCPConnector that tells the exchange whether its connection served a request before (aiohttp's tracing
    says the same at 7 to 13 % more CPU a post, benchmarks/http_client_floor.py)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        connection = await super().connect(req, traces, timeout)
        sending = _SENDING.get()
        protocol = connection.protocol
        if sending is not None and protocol is not None:
            sending.reused = protocol in self._used
            self._used.add(protocol)
        return connection


@transport("aiohttp")
class AiohttpTransport:
    """One aiohttp session per backend, created in the running loop on first use, of at most ``pool_size`` kept
    connections. ``timeout_s`` is ``sock_read`` and there is no total. A request lost to a kept-alive connection's
    close is sent once more through a session that never reuses connections (docs/reliability.md, "Transports")."""

    __slots__ = ("_api_key", "_fresh", "_headers", "_session", "_settings", "_timeout")

    def __init__(self, settings: BackendSettings, api_key: Secret | None) -> None:
        self._settings = settings
        self._api_key = api_key
        self._headers: dict[str, str] = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **settings.extra_headers,
        }
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.timeout_s
        )
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"AiohttpTransport(backbone={self._settings.name!r}, pool_size={self._settings.pool_size})"

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = _PoolConnector(
                limit=self._settings.pool_size,
                limit_per_host=self._settings.pool_size,
                keepalive_timeout=60.0,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                raise_for_status=False,
                trust_env=False,
            )
        return self._session

    def _fresh_session(self) -> aiohttp.ClientSession:
        """The session of second sends: a new connection each, closed after its answer."""
        if self._fresh is None or self._fresh.closed:
            connector = aiohttp.TCPConnector(
                limit=self._settings.pool_size, limit_per_host=self._settings.pool_size, force_close=True
            )
            self._fresh = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, raise_for_status=False, trust_env=False
            )
        return self._fresh

    def _request_headers(self) -> dict[str, str]:
        if self._api_key is None:
            return self._headers
        # Built per call so that the key lives only inside the Secret between calls.
        return {**self._headers, "Authorization": f"Bearer {self._api_key.reveal()}"}

    def post_chat(self, base_url: str, body: Mapping[str, Any]) -> _AiohttpExchange:
        return _AiohttpExchange(self, f"{base_url}/chat/completions", dumps_compact(body))

    def _failure(self, url: str, error: BaseException, *, answering: bool) -> TransportError:
        """An aiohttp or socket failure as rcarun's error (scrubbed of the key)."""
        if not answering and isinstance(
            error,
            aiohttp.ClientConnectorError
            | aiohttp.ConnectionTimeoutError
            | ConnectionRefusedError
            | socket.gaierror,
        ):
            return ConnectionFailed(f"{self._settings.name}: {url}: {describe_failure(error, self._api_key)}")
        if isinstance(error, TimeoutError):  # sock_read: aiohttp's SocketTimeoutError is a TimeoutError
            return SilenceTimeout(silence_message(self._settings, url, answering))
        return TransportError(f"{self._settings.name}: {url}: {describe_failure(error, self._api_key)}")

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None and not session.closed:
                await session.close()
        self._session = self._fresh = None


class _AiohttpExchange:
    """One request and its answer: the block sends it and waits for the headers; `chunks` reads the body.
    Leaving hands the connection back (closed when the body was not read to its end)."""

    __slots__ = ("_data", "_response", "_transport", "_url")

    def __init__(self, transport: AiohttpTransport, url: str, data: bytes) -> None:
        self._transport = transport
        self._url = url
        self._data = data
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> _AiohttpExchange:
        transport = self._transport
        connection = SimpleNamespace(reused=False)
        token = _SENDING.set(connection)
        sent_at = time.perf_counter()
        try:
            self._response = await transport._session_for_loop().post(
                self._url, data=self._data, headers=transport._request_headers()
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            # RFC 9112 9.3.1 lets a client resend a request it knows the server did not act on; aiohttp's own
            # retry of this case covers idempotent methods only. A POST is sent again where the connection had
            # lain idle in the pool since its last answer and ended before a byte of a new one: the server closed
            # an idle connection, so it never read the request. (A server that read it and died silently looks
            # the same; the second send then costs what the retry policy's next attempt would have.) A new
            # connection that fails so is an attempt like any other: no request goes out twice unrecorded.
            if not (connection.reused and _closed_before_answering(error)):
                raise transport._failure(self._url, error, answering=False) from None
            note_lost_send(sent_at, str(transport._failure(self._url, error, answering=False)))
            try:
                self._response = await transport._fresh_session().post(
                    self._url, data=self._data, headers=transport._request_headers()
                )
            except (aiohttp.ClientError, OSError, TimeoutError) as again:
                raise transport._failure(self._url, again, answering=False) from None
        finally:
            _SENDING.reset(token)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        response, self._response = self._response, None
        if response is not None:
            if exc_type is None:
                response.release()
            else:
                response.close()

    @property
    def status(self) -> int:
        assert self._response is not None, "the exchange was not entered"
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        assert self._response is not None, "the exchange was not entered"
        return self._response.headers

    def chunks(self) -> _AiohttpChunks:
        assert self._response is not None, "the exchange was not entered"
        return _AiohttpChunks(self, self._response.content)

    async def gather(self, seconds: float) -> None:
        # The connection's protocol stops reading the socket (aiohttp's own flow control, which stops its read
        # timeout too), so the kernel holds the packets and the next read takes them in one system call. Where
        # aiohttp paused reading itself (its buffer is full) there is enough to read now.
        assert self._response is not None, "the exchange was not entered"
        connection = self._response.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is None or protocol.transport is None or getattr(protocol, "_reading_paused", True):
            return
        protocol.pause_reading()
        try:
            await asyncio.sleep(seconds)
        finally:
            if protocol.transport is not None and protocol._reading_paused:
                protocol.resume_reading()


class _AiohttpChunks:
    """The body's pieces as aiohttp receives them (an iterator object: nothing to close when abandoned)."""

    __slots__ = ("_content", "_exchange")

    def __init__(self, exchange: _AiohttpExchange, content: aiohttp.StreamReader) -> None:
        self._exchange = exchange
        self._content = content

    def __aiter__(self) -> _AiohttpChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._content.readany()
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            exchange = self._exchange
            raise exchange._transport._failure(exchange._url, error, answering=True) from None
        if not chunk:
            raise StopAsyncIteration
        return chunk


@transport("openai-sdk")
def _openai_sdk_transport(settings: BackendSettings, api_key: Secret | None) -> Transport:
    # Imported here: the SDK is only loaded by backbones that choose it.
    from rcarun.backends.sdk_transport import OpenAISDKTransport

    return OpenAISDKTransport(settings, api_key)
