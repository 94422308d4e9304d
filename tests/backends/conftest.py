"""Fixtures for backend tests: both transports, canned servers, a planted API key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from .helpers import KEY_ENV, PLANTED_KEY, CannedServer, Handler


@pytest.fixture(params=["aiohttp", "openai-sdk"])
def transport_name(request: pytest.FixtureRequest) -> str:
    """Every HTTP test runs once per transport: both must give identical results."""
    name: str = request.param
    return name


@pytest.fixture
async def canned() -> AsyncIterator[Callable[[Handler], Awaitable[CannedServer]]]:
    servers: list[CannedServer] = []

    async def start(handler: Handler) -> CannedServer:
        server = CannedServer(handler)
        await server.start()
        servers.append(server)
        return server

    yield start
    await asyncio.gather(*(server.stop() for server in servers))


@pytest.fixture
def planted_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, PLANTED_KEY)
    return PLANTED_KEY
