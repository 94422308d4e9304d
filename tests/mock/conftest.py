"""Fixtures for the simulator's tests: a real HTTP client and a helper that posts one chat request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from rcarun.mock import MockServer


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One HTTP exchange as the client saw it."""

    status: int
    headers: Mapping[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)

    @property
    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = self.body["choices"][0]["message"]
        return message

    @property
    def content(self) -> str:
        return str(self.message["content"])


PostChat = Callable[..., Awaitable[ChatReply]]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def post_chat(http: aiohttp.ClientSession) -> PostChat:
    """``await post_chat(server, body, headers=None, timeout_s=10)`` → `ChatReply`."""

    async def post(
        server: MockServer,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> ChatReply:
        async with http.post(
            server.base_url + "/chat/completions",
            json=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            raw = await response.read()
            return ChatReply(response.status, dict(response.headers), raw)

    return post


def chat_body(
    user: str = "Which step went wrong?",
    *,
    schema: Mapping[str, Any] | None = None,
    system: str = "You attribute failures in agent trajectories.",
    **extra: Any,
) -> dict[str, Any]:
    """A chat request; ``schema`` goes into ``response_format`` as a json_schema."""
    body: dict[str, Any] = {
        "model": "sim-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    body.update(extra)
    return body


@pytest.fixture
def make_body() -> Callable[..., dict[str, Any]]:
    """`chat_body` as a fixture, so test modules need not import from conftest."""
    return chat_body
