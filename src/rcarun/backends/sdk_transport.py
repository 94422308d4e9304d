"""The ``openai-sdk`` transport: the official `AsyncOpenAI` client carrying rcarun's own request body.

For users who want the SDK's HTTP stack; several times the CPU of aiohttp, so not the default. The SDK is only a
pipe (no retries, streamed bytes, errors mapped back to the raw response), so both transports give identical
results. Details: docs/reliability.md ("The openai-sdk transport").
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any

import httpx2
import openai

from rcarun.backends.exchange import WholeResponse, describe_failure, note_lost_send, silence_message
from rcarun.backends.settings import BackendSettings, Secret
from rcarun.errors import ConnectionFailed, ResponseTooLarge, SilenceTimeout, TransportError

__all__ = ["OpenAISDKTransport"]

# The exchange being entered in this task: ``SimpleNamespace(new_connection=...)``, which its request learns.
_SENDING: ContextVar[SimpleNamespace | None] = ContextVar("rcarun_sdk_sending", default=None)

# Fields `chat.completions.create` accepts as keyword arguments; everything else travels in ``extra_body``.
_SDK_KEYWORDS = frozenset(
    {
        "frequency_penalty",
        "max_completion_tokens",
        "max_tokens",
        "n",
        "presence_penalty",
        "reasoning_effort",
        "response_format",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_p",
    }
)


class OpenAISDKTransport:
    """One `AsyncOpenAI` client per replica, all sharing one httpx2 pool sized to ``pool_size``."""

    __slots__ = ("_api_key", "_clients", "_fresh_clients", "_fresh_http", "_http", "_settings", "_timeout")

    def __init__(self, settings: BackendSettings, api_key: Secret | None) -> None:
        self._settings = settings
        self._api_key = api_key
        self._timeout = httpx2.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        self._http: httpx2.AsyncClient | None = None
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        # Second sends: a pool that keeps no connection, so each is new.
        self._fresh_http: httpx2.AsyncClient | None = None
        self._fresh_clients: dict[str, openai.AsyncOpenAI] = {}

    def __repr__(self) -> str:
        return f"OpenAISDKTransport(backbone={self._settings.name!r}, pool_size={self._settings.pool_size})"

    def _client(self, base_url: str, *, fresh: bool = False) -> openai.AsyncOpenAI:
        clients = self._fresh_clients if fresh else self._clients
        client = clients.get(base_url)
        if client is not None:
            return client
        pool = self._settings.pool_size
        if fresh and self._fresh_http is None:
            self._fresh_http = openai.DefaultAsyncHttpxClient(
                limits=httpx2.Limits(max_connections=pool, max_keepalive_connections=0),
                timeout=self._timeout,
                event_hooks={"response": [self._cap_body]},
            )
        if not fresh and self._http is None:
            self._http = openai.DefaultAsyncHttpxClient(
                limits=httpx2.Limits(max_connections=pool, max_keepalive_connections=pool),
                timeout=self._timeout,
                event_hooks={"request": [_watch_connection], "response": [self._cap_body]},
            )
        client = openai.AsyncOpenAI(
            # "" with admin_api_key="" stops the SDK from falling back to OPENAI_API_KEY / OPENAI_ADMIN_KEY.
            api_key=self._api_key.reveal() if self._api_key is not None else "",
            admin_api_key="",
            organization="",
            project="",
            base_url=base_url,
            max_retries=0,
            timeout=self._timeout,
            default_headers=dict(self._settings.extra_headers),
            http_client=self._fresh_http if fresh else self._http,
        )
        clients[base_url] = client
        return client

    async def _cap_body(self, response: httpx2.Response) -> None:
        """Runs before any body is read: whoever reads it (the SDK for an error, the backend) meets the cap."""
        response.stream = _CappedStream(response.stream, self._settings)

    def post_chat(self, base_url: str, body: Mapping[str, Any]) -> _SDKExchange:
        return _SDKExchange(self, base_url, body)

    def _failure(self, url: str, error: BaseException, *, answering: bool) -> TransportError:
        """An httpx or SDK failure as rcarun's error (scrubbed of the key)."""
        cause = error.__cause__ if isinstance(error, openai.APIError) and error.__cause__ else error
        name = self._settings.name
        if isinstance(cause, httpx2.ConnectError | httpx2.ConnectTimeout) and not answering:
            return ConnectionFailed(f"{name}: {url}: {describe_failure(cause, self._api_key)}")
        if isinstance(cause, httpx2.TimeoutException) or isinstance(error, openai.APITimeoutError):
            return SilenceTimeout(silence_message(self._settings, url, answering))
        return TransportError(f"{name}: {url}: {describe_failure(cause, self._api_key)}")

    async def aclose(self) -> None:
        pools = (self._http, self._fresh_http)
        self._http = self._fresh_http = None
        self._clients.clear()
        self._fresh_clients.clear()
        for http in pools:
            if http is not None:
                await http.aclose()


async def _watch_connection(request: httpx2.Request) -> None:
    """Have httpx say, for the exchange being entered, whether it opened a connection for this request."""
    sending = _SENDING.get()
    if sending is None:
        return

    async def trace(event: str, info: Mapping[str, Any]) -> None:
        if event.startswith("connection.connect_tcp"):
            sending.new_connection = True

    request.extensions["trace"] = trace


def _closed_before_answering(error: BaseException) -> bool:
    """The way a server's close of an idle kept-alive connection meets a request sent on it (see
    `rcarun.backends.transports`): the connection ended before any byte of an answer."""
    cause = error.__cause__ if isinstance(error, openai.APIError) and error.__cause__ else error
    if isinstance(cause, httpx2.RemoteProtocolError):
        return str(cause) == "Server disconnected without sending a response."
    if isinstance(cause, httpx2.ReadError | httpx2.WriteError):
        # httpx wraps httpcore's error, which wraps the socket's: look down the chain for the reset.
        reason: BaseException | None = cause
        for _ in range(4):
            reason = reason.__cause__ or reason.__context__ if reason is not None else None
            if isinstance(reason, ConnectionResetError | BrokenPipeError):
                return True
    return False


class _SDKExchange:
    """One request through the SDK: the block sends it and waits for the headers; `chunks` reads the body."""

    __slots__ = (
        "_base_url",
        "_body",
        "_context",
        "_error_body",
        "_response",
        "_transport",
        "headers",
        "status",
    )

    def __init__(self, transport: OpenAISDKTransport, base_url: str, body: Mapping[str, Any]) -> None:
        self._transport = transport
        self._base_url = base_url
        self._body = body
        self._context: Any = None
        self._response: Any = None
        self._error_body: bytes | None = None
        self.status = 0
        self.headers: Mapping[str, str] = {}

    async def __aenter__(self) -> _SDKExchange:
        transport = self._transport
        body = self._body
        client = transport._client(self._base_url)
        keywords = {key: value for key, value in body.items() if key in _SDK_KEYWORDS}
        extra_body = {
            key: value
            for key, value in body.items()
            if key not in _SDK_KEYWORDS and key not in ("model", "messages")
        }
        extra_headers: dict[str, Any] = (
            {} if transport._api_key is not None else {"Authorization": openai.omit}
        )
        url = f"{self._base_url}/chat/completions"

        def exchange(chosen: openai.AsyncOpenAI) -> Any:
            create: Any = chosen.chat.completions.with_streaming_response.create
            return create(
                model=body["model"],
                messages=body["messages"],
                extra_body=extra_body or None,
                extra_headers=extra_headers or None,
                **keywords,
            )

        sending = SimpleNamespace(new_connection=False)
        token = _SENDING.set(sending)
        sent_at = time.perf_counter()
        try:
            self._context = exchange(client)
            try:
                self._response = await self._context.__aenter__()
            except (openai.APIConnectionError, httpx2.HTTPError) as error:
                # Sent again only where the server cannot have acted on it (rcarun.backends.transports).
                if sending.new_connection or not _closed_before_answering(error):
                    raise
                note_lost_send(
                    sent_at,
                    f"{transport._settings.name}: {url}: {describe_failure(error, transport._api_key)}",
                )
                self._context = exchange(transport._client(self._base_url, fresh=True))
                self._response = await self._context.__aenter__()
        except openai.APIStatusError as error:
            # The SDK read the (capped) body of the error answer itself: hand it on as the answer.
            self._context = None
            self.status = error.status_code
            self.headers = error.response.headers
            self._error_body = _read_body(error.response)
            return self
        except ResponseTooLarge:
            raise
        except (openai.APIError, httpx2.HTTPError, OSError) as error:
            if isinstance(error.__cause__, ResponseTooLarge):
                raise error.__cause__ from None
            raise transport._failure(url, error, answering=False) from None
        finally:
            _SENDING.reset(token)
        self.status = self._response.status_code
        self.headers = self._response.headers
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        context, self._context = self._context, None
        if context is not None:
            await context.__aexit__(*exc_info)

    async def gather(self, seconds: float) -> None:
        # No pause: httpx hands on one HTTP chunk (one token of a stream) per read, so a pause between reads would
        # slow the stream to a token a pause. Each chunk wakes the reader, at the SDK's CPU cost.
        return None

    def chunks(self) -> AsyncIterator[bytes]:
        if self._error_body is not None:
            return WholeResponse(self.status, self.headers, self._error_body).chunks()
        return _SDKChunks(self, self._response.iter_bytes())


class _SDKChunks:
    """The body's decoded pieces as httpx receives them, its failures as rcarun's."""

    __slots__ = ("_exchange", "_pieces")

    def __init__(self, exchange: _SDKExchange, pieces: AsyncIterator[bytes]) -> None:
        self._exchange = exchange
        self._pieces = pieces

    def __aiter__(self) -> _SDKChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._pieces.__anext__()
        except (StopAsyncIteration, ResponseTooLarge):
            raise
        except (httpx2.HTTPError, openai.APIError, OSError) as error:
            exchange = self._exchange
            url = f"{exchange._base_url}/chat/completions"
            raise exchange._transport._failure(url, error, answering=True) from None


class _CappedStream(httpx2.AsyncByteStream):
    """A response's raw bytes, refused past ``max_response_bytes`` (`ResponseTooLarge`)."""

    def __init__(self, stream: Any, settings: BackendSettings) -> None:
        self._stream = stream
        self._settings = settings

    async def __aiter__(self) -> AsyncIterator[bytes]:
        cap = self._settings.max_response_bytes
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > cap:
                raise ResponseTooLarge(
                    f"{self._settings.name}: the response passed max_response_mb = {cap / 2**20:g} MiB and was "
                    "not read further"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def _read_body(response: httpx2.Response) -> bytes:
    try:
        return response.content
    except httpx2.ResponseNotRead:
        return b""
