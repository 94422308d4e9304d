"""The ``httptools`` transport's own HTTP/1.1 against loopback servers written for each case: the three ways a
body ends, interim responses, keep-alive and its end, a server that never answers, one that answers nonsense, one
that hangs up, no server at all, and header lines a config could break. (The suites that every transport runs,
`test_backend_http.py` and the secrets tests, run it too.)"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from rcarun.backends import httptools_transport
from rcarun.backends.httptools_transport import HttptoolsTransport
from rcarun.backends.settings import BackendSettings, Secret
from rcarun.backends.transports import create_transport
from rcarun.errors import ConfigError, ConnectionFailed, TransportError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BODY = {"model": "m", "messages": [{"role": "user", "content": "héllo"}]}


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


class _Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


def _settings(base_url: str, timeout_s: float = 10.0, **overrides: object) -> BackendSettings:
    return BackendSettings(
        name="own",
        provider="simulated",
        model="m",
        base_urls=(base_url,),
        timeout_s=timeout_s,
        transport="httptools",
        **overrides,  # type: ignore[arg-type]
    )


def _transport(base_url: str, timeout_s: float = 10.0, key: str | None = None) -> HttptoolsTransport:
    transport = create_transport(_settings(base_url, timeout_s), Secret(key) if key is not None else None)
    assert isinstance(transport, HttptoolsTransport)
    return transport


async def test_bodies_by_length_and_by_chunks_over_one_kept_connection_past_interim_answers() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.requests.append(await _read_request(reader))
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-RateLimit-Remaining: 7\r\n\r\n{"a": 1}\n')
        server.requests.append(await _read_request(reader))
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
        await writer.drain()
        writer.write(b"HTTP/1.1 429 Too Many\r\nTransfer-Encoding: chunked\r\nRetry-After: 2\r\n\r\n")
        for piece in (b'{"err', b'or": "slow"}'):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await reader.read()

    server = _Server(answer)
    async with server as url:
        transport = _transport(url, key="sk-test-key")
        first = await transport.post_chat(url, BODY)
        second = await transport.post_chat(url, BODY)
        await transport.aclose()
    assert (first.status, first.body, first.headers["x-ratelimit-remaining"]) == (200, b'{"a": 1}\n', "7")
    assert (second.status, second.body, second.headers["retry-after"]) == (429, b'{"error": "slow"}', "2")
    assert server.connections == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer sk-test-key\r\n" in head
    assert body == '{"model":"m","messages":[{"role":"user","content":"héllo"}]}'.encode()


async def test_a_body_ended_by_the_server_closing_and_a_connection_not_kept() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}")
        await writer.drain()

    server = _Server(answer)
    async with server as url:
        transport = _transport(url)
        answers = [await transport.post_chat(url, BODY) for _ in range(2)]
        await transport.aclose()
    assert [(answer.status, answer.body) for answer in answers] == [(200, b"{}"), (200, b"{}")]
    assert server.connections == 2  # the first connection ended with its body: the second post opened another


async def test_an_idle_connection_the_server_closed_is_replaced_before_sending() -> None:
    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()  # then the server hangs up on a kept-alive connection

    server = _Server(answer_once)
    async with server as url:
        transport = _transport(url)
        assert (await transport.post_chat(url, BODY)).status == 200
        await asyncio.sleep(0.2)
        assert (await transport.post_chat(url, BODY)).status == 200
        await transport.aclose()
    assert server.connections == 2


async def test_a_connection_idle_past_the_keepalive_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    server = _Server(answer)
    async with server as url:
        transport = _transport(url)
        for _ in range(2):
            assert (await transport.post_chat(url, BODY)).status == 200
        assert server.connections == 1
        monkeypatch.setattr(httptools_transport, "KEEPALIVE_S", 0.05)
        await asyncio.sleep(0.1)
        assert (await transport.post_chat(url, BODY)).status == 200
        await transport.aclose()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ("silent", "no complete answer from {url}/chat/completions within 0.3 s"),
        ("nonsense", "ConnectionError: unreadable response"),
        ("cut off", "ConnectionError: connection lost"),
    ],
)
async def test_a_server_that_fails_the_exchange_is_a_transport_error(behaviour: str, expected: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if behaviour == "silent":
            await reader.read()
        elif behaviour == "nonsense":
            writer.write(b"SMTP ready\r\n\r\n")
            await reader.read()
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")

    async with _Server(answer) as url:
        transport = _transport(url, timeout_s=0.3, key="sk-secret-value")
        with pytest.raises(TransportError) as raised:
            await asyncio.wait_for(transport.post_chat(url, BODY), 10)
        await transport.aclose()
    assert type(raised.value) is TransportError
    assert str(raised.value).startswith("own: ")
    assert expected.format(url=url) in str(raised.value)
    assert "sk-secret" not in str(raised.value)


async def test_no_server_listening_is_a_failed_connection() -> None:
    async with _Server(lambda reader, writer: asyncio.sleep(0)) as url:
        pass  # closed: nothing listens on its port any more
    transport = _transport(url)
    with pytest.raises(ConnectionFailed, match=r"^own: http://127\.0\.0\.1:\d+/v1/chat/completions: "):
        await transport.post_chat(url, BODY)
    await transport.aclose()


@pytest.mark.parametrize(
    ("headers", "key", "expected"),
    [
        ({"X-Run": "r1\r\nX-Injected: 1"}, None, r"extra_headers\['X-Run'\] holds a line break"),
        ({"X-Run": "r\u0101"}, None, r"extra_headers\['X-Run'\] holds .* non-Latin-1"),
        ({}, "sk-abc\ndef", r"the key in \$OWN_KEY holds a line break"),
    ],
)
def test_a_header_line_a_config_would_break_is_refused_at_the_start(
    headers: dict[str, str], key: str | None, expected: str
) -> None:
    settings = _settings("http://127.0.0.1:9/v1", extra_headers=headers, api_key_env="OWN_KEY")
    with pytest.raises(ConfigError, match=rf"^backbone 'own': {expected}") as raised:
        create_transport(settings, Secret(key) if key is not None else None)
    assert "sk-abc" not in str(raised.value)


def test_without_httptools_installed_the_choice_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httptools", None)  # import httptools now fails
    monkeypatch.delitem(sys.modules, "rcarun.backends.httptools_transport")
    with pytest.raises(
        ConfigError, match=r"^backbone 'own': transport 'httptools' needs the httptools package"
    ):
        create_transport(_settings("http://127.0.0.1:9/v1"), None)


async def test_credentials_written_into_a_base_url_are_never_sent_as_the_host() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.requests.append(await _read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await reader.read()

    server = _Server(answer)
    async with server as url:
        with_credentials = url.replace("http://", "http://user:pass-word@")
        transport = _transport(with_credentials)
        assert (await transport.post_chat(with_credentials, BODY)).status == 200
        await transport.aclose()
    head = server.requests[0][0]
    assert f"\r\nHost: {url.split('/')[2]}\r\n".encode() in head
    assert b"pass-word" not in head
