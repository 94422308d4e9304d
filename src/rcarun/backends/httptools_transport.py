"""The ``httptools`` transport: HTTP/1.1 of rcarun's own over asyncio, responses parsed by httptools (llhttp).

Why it exists: in the bench's latency-bound sweep aiohttp is the largest single part of rcarun's CPU per call
(issue 17, goal 2; docs/performance.md, "CPU per call"). A sweep needs one exchange from HTTP — a JSON POST and
its whole answer on a kept-alive connection — and this transport does that exchange and nothing else, for about
0.13-0.15 ms less CPU a call than aiohttp (a quarter of the call). aiohttp stays the default; a backbone chooses
this one with ``transport = "httptools"`` (``pip install 'rcarun[httptools]'``).

What it handles, as aiohttp does for rcarun:
- A body ended by ``Content-Length``, sent in chunks, or ended by the server closing the connection; interim
  ``1xx`` responses are skipped. A response httptools cannot parse fails the post and closes the connection.
- Connections kept alive per base URL and reused while the server allows it (``Connection: close`` or HTTP/1.0
  retires one). An idle connection is dropped before anything is sent on it when the server has closed it or it
  has been idle longer than `KEEPALIVE_S` (as aiohttp's connector, shorter than the usual servers' timeouts, so
  that a request does not meet a server just closing it). At most ``pool_size`` connections are kept idle.
- A total deadline a post (``timeout_s``, one timer, as aiohttp keeps) and a connect deadline
  (``connect_timeout_s``); ``https`` through asyncio's TLS with the host's certificate and name checked.
- Failures as rcarun's errors, worded as `AiohttpTransport` words them: `ConnectionFailed` when no connection
  could be made, `TransportError` for a timeout, a lost connection or an unreadable answer; messages scrubbed of
  the key (`describe_failure`). A post cancelled midway closes its connection, whose state is then unknown.

What it does not do, and why that is safe for rcarun: no proxies (the aiohttp transport ignores the proxy
environment too, ``trust_env=False``), no redirects (a chat endpoint that redirects a POST is misconfigured; the
3xx is returned and reported like any other status), no compressed answers (none is asked for: no
``Accept-Encoding``), no cookies.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httptools

from rcarun.backends.settings import BackendSettings, Secret
from rcarun.backends.transports import RawResponse, describe_failure
from rcarun.errors import ConfigError, ConnectionFailed, TransportError
from rcarun.jsonfast import dumps_compact

__all__ = ["KEEPALIVE_S", "HttptoolsConnection", "HttptoolsTransport"]

# How long an idle connection is reused: aiohttp's connector default, under nginx's 75 s and most providers'.
KEEPALIVE_S = 60.0

_Answer = tuple[int, dict[str, str], bytes]


class HttptoolsConnection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time, its responses parsed by httptools."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = True
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[_Answer] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._length_known = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.abort(ConnectionError(f"unreadable response: {error}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._answer is not None and self._headers_done and not self._length_known:
            self._complete()  # a body delimited by the server closing the connection
        else:
            self.abort(ConnectionError(f"connection lost: {exc or 'closed by the server'}"))

    # httptools' callbacks, in the order it makes them for each response.
    def on_message_begin(self) -> None:
        self._headers = {}
        self._body = []
        self._headers_done = False
        self._length_known = False

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key == "content-length" or (key == "transfer-encoding" and "chunked" in text.lower()):
            self._length_known = True
        previous = self._headers.get(key)
        self._headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the answer follows it
        self.reusable = self._parser.should_keep_alive()
        self._complete()

    def _take_answer(self) -> asyncio.Future[_Answer] | None:
        """The request's future, now no longer this connection's, its deadline cancelled."""
        answer, self._answer = self._answer, None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        return answer

    def _complete(self) -> None:
        answer = self._take_answer()
        if answer is not None and not answer.done():
            answer.set_result((self._parser.get_status_code(), self._headers, b"".join(self._body)))

    def abort(self, error: Exception) -> None:
        """Close the connection; the request on it, if any, fails with ``error``."""
        self.reusable = False
        if self.transport is not None:
            self.transport.close()
        answer = self._take_answer()
        if answer is not None and not answer.done():
            answer.set_exception(error)

    def post(self, request: bytes, timeout_s: float) -> asyncio.Future[_Answer]:
        """Send ``request`` (head and body, whole) and return the future of its answer; the deadline fails it."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_Answer] = loop.create_future()
        self._answer = answer
        self._headers_done = False
        # Cancelled where the answer is settled (`_take_answer`), not from a done callback: that would cost every
        # post one more turn of the loop. A cancelled post reaches `abort` through the transport's `post_chat`.
        self._deadline = loop.call_later(timeout_s, self._time_out, answer)
        self.transport.write(request)
        return answer

    def _time_out(self, answer: asyncio.Future[_Answer]) -> None:
        if self._answer is answer:
            self.abort(TimeoutError())


def _fits_a_header(text: str) -> bool:
    """Whether ``text`` can stand in a header line: no line break, nothing beyond Latin-1."""
    if "\r" in text or "\n" in text:
        return False
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


class HttptoolsTransport:
    """rcarun's `Transport` over `HttptoolsConnection`s kept alive per base URL (see the module docstring)."""

    __slots__ = ("_api_key", "_closed", "_heads", "_idle", "_settings", "_tls")

    def __init__(self, settings: BackendSettings, api_key: Secret | None) -> None:
        """Raises:
        ConfigError: a header from ``extra_headers`` or the key holds what no HTTP/1.1 header line can carry (a
            line break, which would start a header of its own, or a character beyond Latin-1).
        """
        where = f"backbone {settings.name!r}"
        for name, value in settings.extra_headers.items():
            if not (_fits_a_header(name) and _fits_a_header(value)):
                raise ConfigError(
                    f"{where}: extra_headers[{name!r}] holds a line break or a non-Latin-1 character"
                )
        if api_key is not None and not _fits_a_header(api_key.reveal()):
            raise ConfigError(
                f"{where}: the key in ${settings.api_key_env} holds a line break or a non-Latin-1 character"
            )
        self._settings = settings
        self._api_key = api_key
        self._idle: dict[str, list[HttptoolsConnection]] = {}
        self._heads: dict[str, bytes] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"HttptoolsTransport(backbone={self._settings.name!r}, pool_size={self._settings.pool_size})"

    def _head(self, base_url: str) -> bytes:
        """The request line and the headers every post to ``base_url`` sends, rendered once (no key in it)."""
        head = self._heads.get(base_url)
        if head is None:
            url = urlsplit(base_url)
            lines = [
                f"POST {url.path}/chat/completions HTTP/1.1",
                f"Host: {url.netloc.rpartition('@')[2]}",  # never credentials written into a base URL
                "Content-Type: application/json",
                "Accept: application/json",
                "User-Agent: rcarun",
                *(f"{name}: {value}" for name, value in self._settings.extra_headers.items()),
            ]
            head = self._heads[base_url] = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        return head

    async def _connection(self, base_url: str) -> HttptoolsConnection:
        loop = asyncio.get_running_loop()
        idle = self._idle.get(base_url)
        while idle:
            connection = idle.pop()
            assert connection.transport is not None
            if connection.transport.is_closing():
                continue
            if loop.time() - connection.idle_since > KEEPALIVE_S:
                connection.transport.close()
                continue
            return connection
        url = urlsplit(base_url)
        if url.hostname is None:
            raise OSError(f"no host in the base URL {base_url!r}")
        secure = url.scheme == "https"
        if secure and self._tls is None:
            self._tls = ssl.create_default_context()
        async with asyncio.timeout(self._settings.connect_timeout_s):
            _, connection = await loop.create_connection(
                HttptoolsConnection,
                url.hostname,
                url.port or (443 if secure else 80),
                ssl=self._tls if secure else None,
                server_hostname=url.hostname if secure else None,
            )
        return connection

    def _keep(self, base_url: str, connection: HttptoolsConnection) -> None:
        assert connection.transport is not None
        idle = self._idle.setdefault(base_url, [])
        if connection.reusable and not self._closed and len(idle) < self._settings.pool_size:
            connection.idle_since = asyncio.get_running_loop().time()
            idle.append(connection)
        else:
            connection.transport.close()

    async def post_chat(self, base_url: str, body: Mapping[str, Any]) -> RawResponse:
        name = self._settings.name
        url = f"{base_url}/chat/completions"
        try:
            connection = await self._connection(base_url)
        except TimeoutError:
            raise ConnectionFailed(
                f"{name}: {url}: no connection within {self._settings.connect_timeout_s:g} s"
            ) from None
        except OSError as error:
            raise ConnectionFailed(f"{name}: {url}: {describe_failure(error, self._api_key)}") from None
        payload = dumps_compact(body)
        head = self._head(base_url)
        if self._api_key is not None:
            # Added per call, not kept in the rendered head: the key lives only inside the Secret between calls.
            head += f"Authorization: Bearer {self._api_key.reveal()}\r\n".encode("latin-1")
        try:
            status, headers, answer = await connection.post(
                head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload, self._settings.timeout_s
            )
        except TimeoutError:
            raise TransportError(
                f"{name}: no complete answer from {url} within {self._settings.timeout_s:g} s"
            ) from None
        except OSError as error:  # ConnectionError among them: lost, reset, unreadable
            raise TransportError(f"{name}: {url}: {describe_failure(error, self._api_key)}") from None
        except asyncio.CancelledError:
            connection.abort(ConnectionError("cancelled"))
            raise
        self._keep(base_url, connection)
        return RawResponse(status=status, headers=headers, body=answer)

    async def aclose(self) -> None:
        self._closed = True  # a post still in flight closes its connection when it ends
        for connections in self._idle.values():
            for connection in connections:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()
