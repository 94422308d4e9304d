"""Helpers for backend tests: canned provider servers on loopback and recorded-shape bodies.

The simulator (`rcarun.mock`) covers OpenAI-shaped behaviour; provider quirks it cannot produce (Moonshot
headers, a 503 from kimi, vLLM's ``reasoning`` field, keys echoed in error bodies) come from `CannedServer`, a
tiny aiohttp.web app on 127.0.0.1 port 0 that answers with recorded-shape bytes and records what it received.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from rcarun.backends import BackendSettings

PLANTED_KEY = "sk-" + "test-PLANTED-0123456789abcdef"  # split: no key-shaped literal in the tree
KEY_ENV = "RCARUN_TEST_PLANTED_KEY"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """One request as the server received it."""

    path: str
    headers: CIMultiDict[str]  # case-insensitive, as HTTP headers are
    body: dict[str, Any]


@dataclass
class CannedServer:
    """An aiohttp.web server on loopback whose chat endpoint runs `handler`; keeps every request it saw."""

    handler: Handler
    seen: list[Seen] = field(default_factory=list)
    runner: web.AppRunner | None = None
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append(Seen(request.path, CIMultiDict(request.headers), json.loads(raw)))
        return await self.handler(request)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def reply(
    body: bytes | Mapping[str, Any],
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Handler:
    """A handler answering every request with the same status, headers and body."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=status, body=payload, headers=dict(headers or {}), content_type="application/json"
        )

    return handle


def completion(
    *,
    content: str | None = '{"ok": true}',
    finish_reason: str = "stop",
    model: str = "canned-model",
    usage: Mapping[str, Any] | None = None,
    **message_fields: Any,
) -> dict[str, Any]:
    """A recorded-shape chat completion body."""
    return {
        "id": "chatcmpl-canned",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message_fields},
                "finish_reason": finish_reason,
            }
        ],
        "usage": dict(usage) if usage is not None else {"prompt_tokens": 11, "completion_tokens": 7},
    }


def settings_for(
    base_urls: str | tuple[str, ...],
    *,
    provider: str = "simulated",
    transport: str = "aiohttp",
    **overrides: Any,
) -> BackendSettings:
    urls = (base_urls,) if isinstance(base_urls, str) else base_urls
    values: dict[str, Any] = {
        "name": f"test-{provider}",
        "provider": provider,
        "model": "test-model",
        "base_urls": urls,
        "transport": transport,
        "timeout_s": 20.0,
        "connect_timeout_s": 5.0,
        "pool_size": 16,
    }
    values.update(overrides)
    return BackendSettings(**values)
