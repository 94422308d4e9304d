"""What aiohttp costs a call, beside the least an asyncio HTTP client could: the price of the default transport.

Issue 17 asks for 0.6 ms of CPU per call in the bench's latency-bound scenario, and docs/performance.md finds
aiohttp's share of a call the largest single part left. This script posts the same JSON body to the bench's
simulator (its own process, 100 ms latency) with 64 requests in flight, in alternating rounds, two ways:

- **aiohttp**: rcarun's default transport itself (`rcarun.backends.transports.AiohttpTransport`, a pool of 64
  connections: the body rendered by `rcarun.jsonfast`, posted, read whole);
- **bare protocol**: 64 keep-alive connections, each an `asyncio.Protocol` that writes the request in one
  `transport.write` and reads a ``Content-Length`` response. It has no timeouts, redirects, chunked bodies,
  compression, TLS or error handling: a floor for what any HTTP client on asyncio could cost, not a client.

With ``--client NAME`` (repeatable) it adds other Python HTTP clients, each posting the same bytes with the same
headers, 64 in flight over its own pool, reading status, headers and body: ``pyreqwest``, ``rnet`` (both Rust
clients; their threads' CPU counts, as the process's does), ``aiosonic``, ``curl-cffi`` and ``httpx``. None is a
dependency of rcarun: a client whose package is not installed is skipped with a line saying so.

It prints the process's CPU per post for each round and the ratio of the medians. Usage:

    .venv/bin/python benchmarks/http_client_floor.py              # 3,200 posts a round, four rounds each
    .venv/bin/python benchmarks/http_client_floor.py --pin        # the simulator on CPU 0, the client on CPU 1
    .venv/bin/python benchmarks/http_client_floor.py --pin --client pyreqwest --client httpx --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

from rcarun.backends.settings import BackendSettings
from rcarun.backends.transports import AiohttpTransport
from rcarun.jsonfast import dumps_compact
from rcarun_bench.scenarios import get_scenario
from rcarun_bench.throughput import scenario_server

IN_FLIGHT = 64
BODY: dict[str, Any] = {
    "model": "sim-bench",
    "messages": [{"role": "system", "content": "x" * 300}, {"role": "user", "content": "y" * 800}],
    "max_tokens": 256,
    "temperature": 0,
    "response_format": {"type": "json_object"},
}


class BareConnection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, a response read by its Content-Length (its status,
    headers with lower-case names, and body). `benchmarks/ablations.py` runs rcarun's sweep over it too."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._answer: asyncio.Future[tuple[int, dict[str, str], bytes]] | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body_length: int | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            self._read_response()
        except (ValueError, KeyError, IndexError) as error:  # not the response this client can read
            self._fail(ConnectionError(f"unreadable response: {error!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection lost: {exc!r}"))

    def _read_response(self) -> None:
        if self._body_length is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self._buffer[:end]).split(b"\r\n")
            del self._buffer[: end + 4]
            self._status = int(lines[0].split(b" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
            self._headers = headers
            self._body_length = int(headers["content-length"])
        if len(self._buffer) >= self._body_length and self._answer is not None:
            body = bytes(self._buffer[: self._body_length])
            del self._buffer[: self._body_length]
            self._body_length = None
            self._answer.set_result((self._status, self._headers, body))

    def _fail(self, error: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)

    def post(self, request: bytes) -> asyncio.Future[tuple[int, dict[str, str], bytes]]:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        if self.transport.is_closing():  # the server hung up while the connection sat idle
            self._answer.set_exception(ConnectionError("connection lost: closed while idle"))
        else:
            self.transport.write(request)
        return self._answer


async def _bare(base_url: str, posts: int) -> float:
    url = urlsplit(base_url)
    assert url.hostname is not None and url.port is not None, base_url
    host, port = url.hostname, url.port
    head = (
        f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        "Content-Type: application/json\r\nAccept: application/json\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    remaining = iter(range(posts))
    # The bytes the transport renders for every post; the bare client renders them once.
    body = dumps_compact(BODY)
    request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def worker() -> None:
        _, connection = await loop.create_connection(BareConnection, host, port)
        try:
            for _ in remaining:
                status, _headers, _body = await connection.post(request)
                assert status == 200, status
        finally:
            assert connection.transport is not None
            connection.transport.close()

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return time.process_time() - started


async def _aiohttp(base_url: str, posts: int) -> float:
    settings = BackendSettings(
        name="floor", provider="simulated", model="sim-bench", base_urls=(base_url,), pool_size=IN_FLIGHT
    )
    transport = AiohttpTransport(settings, api_key=None)
    remaining = iter(range(posts))

    async def worker() -> None:
        for _ in remaining:
            async with transport.post_chat(base_url, BODY) as response:
                assert response.status == 200, response.status
                async for _ in response.chunks():
                    pass

    try:
        started = time.process_time()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return time.process_time() - started
    finally:
        await transport.aclose()


_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


async def _posting(post: Callable[[], Coroutine[Any, Any, int]], posts: int) -> float:
    """The process's CPU time for ``posts`` posts, 64 in flight; every answer must be a 200."""
    remaining = iter(range(posts))

    async def worker() -> None:
        for _ in remaining:
            status = await post()
            assert status == 200, status

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return time.process_time() - started


async def _pyreqwest(base_url: str, posts: int) -> float:
    from pyreqwest.client import ClientBuilder

    body = dumps_compact(BODY)
    async with ClientBuilder().max_connections(IN_FLIGHT).build() as client:

        async def post() -> int:
            request = client.post(f"{base_url}/chat/completions").body_bytes(body).headers(_HEADERS).build()
            response = await request.send()
            await response.bytes()
            dict(response.headers.items())
            return int(response.status)

        return await _posting(post, posts)


async def _rnet(base_url: str, posts: int) -> float:
    import rnet

    body = dumps_compact(BODY)
    client = rnet.Client()

    async def post() -> int:
        response = await client.post(f"{base_url}/chat/completions", body=body, headers=_HEADERS)
        await response.bytes()
        dict(response.headers.items())
        status = response.status
        return status if isinstance(status, int) else int(status.as_int())

    return await _posting(post, posts)


async def _aiosonic(base_url: str, posts: int) -> float:
    import aiosonic
    from aiosonic.pools import PoolConfig

    body = dumps_compact(BODY)
    client = aiosonic.HTTPClient(
        connector=aiosonic.TCPConnector(pool_configs={":default": PoolConfig(size=IN_FLIGHT)})
    )

    async def post() -> int:
        response = await client.post(f"{base_url}/chat/completions", data=body, headers=_HEADERS)
        await response.content()
        dict(response.headers)
        return int(response.status_code)

    return await _posting(post, posts)


async def _curl_cffi(base_url: str, posts: int) -> float:
    from curl_cffi.requests import AsyncSession

    body = dumps_compact(BODY)
    async with AsyncSession(max_clients=IN_FLIGHT) as session:

        async def post() -> int:
            response = await session.post(f"{base_url}/chat/completions", data=body, headers=_HEADERS)
            dict(response.headers)
            return int(response.status_code)

        return await _posting(post, posts)


async def _httpx(base_url: str, posts: int) -> float:
    import httpx

    body = dumps_compact(BODY)
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    async with httpx.AsyncClient(limits=limits) as client:

        async def post() -> int:
            response = await client.post(f"{base_url}/chat/completions", content=body, headers=_HEADERS)
            dict(response.headers)
            return response.status_code

        return await _posting(post, posts)


# Each optional client: its function and the module that must be importable.
OTHER_CLIENTS: dict[str, tuple[Callable[[str, int], Coroutine[Any, Any, float]], str]] = {
    "pyreqwest": (_pyreqwest, "pyreqwest"),
    "rnet": (_rnet, "rnet"),
    "aiosonic": (_aiosonic, "aiosonic"),
    "curl-cffi": (_curl_cffi, "curl_cffi"),
    "httpx": (_httpx, "httpx"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=3200, help="posts a round (default 3,200)")
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds of each client, alternating (default 4)"
    )
    parser.add_argument("--pin", action="store_true", help="the simulator on CPU 0, this process on CPU 1")
    parser.add_argument(
        "--client",
        action="append",
        choices=sorted(OTHER_CLIENTS),
        default=[],
        help="another client (repeatable)",
    )
    args = parser.parse_args()
    scenario = dataclasses.replace(get_scenario("latency-bound", quick=False), calls=args.posts)
    clients: dict[str, Callable[[str, int], Coroutine[Any, Any, float]]] = {
        "aiohttp": _aiohttp,
        "bare protocol": _bare,
    }
    for name in args.client:
        client, module = OTHER_CLIENTS[name]
        if importlib.util.find_spec(module) is None:
            print(f"skipped: {name}: {module} is not installed")
        else:
            clients[name] = client
    per_post: dict[str, list[float]] = {name: [] for name in clients}
    with scenario_server(scenario) as server:
        if args.pin:
            os.sched_setaffinity(server.pid, {0})
            os.sched_setaffinity(0, {1})
        for round_number in range(1, args.rounds + 1):
            for name, client in clients.items():
                server.reset()
                cpu_s = asyncio.run(client(server.base_url, args.posts))
                per_post[name].append(cpu_s * 1000 / args.posts)
                print(
                    f"round {round_number}  {name:<14} {per_post[name][-1]:.3f} ms of CPU a post", flush=True
                )
    medians = {name: statistics.median(values) for name, values in per_post.items()}
    for name in clients:
        if name not in ("aiohttp", "bare protocol"):
            print(
                f"median: {name} {medians[name]:.3f} ms a post "
                f"({medians[name] / medians['aiohttp']:.2f} x aiohttp's)"
            )
    print(
        f"medians: aiohttp {medians['aiohttp']:.3f}, bare protocol {medians['bare protocol']:.3f} ms a post; "
        f"aiohttp costs {medians['aiohttp'] - medians['bare protocol']:.3f} ms a post more "
        f"({medians['aiohttp'] / medians['bare protocol']:.1f} x)"
    )


if __name__ == "__main__":
    main()
