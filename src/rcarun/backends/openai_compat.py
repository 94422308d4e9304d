"""The backend for every OpenAI-compatible chat API: DeepSeek, OpenAI, Kimi, vLLM servers, the mock.

It does one thing per call: pick a replica, build the body (`wire.build_body`), hand it to the transport,
and turn the answer into a `ChatResult` or an rcarun error (`wire.parse_completion`). It never sleeps, loops
or retries: the runner wraps it in limiter -> retry -> record, and needs every failure as a typed error.

The API key is read once from the environment variable the settings name, kept in a `Secret`, and scrubbed
from any error message on the way out (a provider may echo the key in a 401 body): the parser scrubs the
provider's whole text with `redact_secrets` before shortening it, and every message is checked once more here.
"""

from __future__ import annotations

import functools
import time

from rcarun.backends.presets import Preset, get_preset
from rcarun.backends.registry import backend
from rcarun.backends.replicas import ReplicaBalancer, prefix_key
from rcarun.backends.settings import BackendSettings, Secret, redact_secrets
from rcarun.backends.transports import create_transport
from rcarun.backends.types import ChatRequest, ChatResult
from rcarun.backends.wire import Redactor, build_body, parse_completion
from rcarun.errors import CallError

__all__ = ["OpenAICompatBackend"]


@backend("openai-compat")
class OpenAICompatBackend:
    """`Backend` over HTTP for any OpenAI-compatible provider, shaped by the provider's `Preset`.

    Args:
        settings: the backbone's settings; ``provider`` picks the preset, ``transport`` the transport.

    Raises:
        ConfigError: unknown preset or transport, or the key's environment variable is not set.
    """

    __slots__ = ("_api_key", "_preset", "_redact", "_replicas", "_transport", "name", "settings")

    def __init__(self, settings: BackendSettings) -> None:
        self.name = settings.name
        self.settings = settings
        self._preset = get_preset(settings.provider)
        self._api_key: Secret | None = settings.read_api_key()
        self._redact: Redactor = functools.partial(redact_secrets, secret=self._api_key)
        self._transport = create_transport(settings, self._api_key)
        self._replicas = ReplicaBalancer(settings.base_urls)

    @property
    def preset(self) -> Preset:
        return self._preset

    @property
    def replicas(self) -> ReplicaBalancer:
        return self._replicas

    def __repr__(self) -> str:
        settings = self.settings
        return (
            f"OpenAICompatBackend(name={settings.name!r}, provider={settings.provider!r}, "
            f"model={settings.model!r}, transport={settings.transport!r}, replicas={len(settings.base_urls)})"
        )

    async def chat(self, request: ChatRequest) -> ChatResult:
        """Send one request and translate the answer.

        Raises:
            rcarun.errors.CallError: the subclass says whether to retry, pause the backbone or give up.
        """
        body = build_body(request, self.settings, self._preset)
        replicas = self._replicas
        # The affinity key is hashed only when it is used: a long first message costs a digest per call.
        key = None
        if replicas.affinity and len(replicas.urls) > 1 and request.messages:
            first = request.messages[0]
            key = prefix_key(first.role, first.content)
        try:
            with replicas.lease(key) as base_url:
                started = time.perf_counter()
                raw = await self._transport.post_chat(base_url, body)
                latency_s = time.perf_counter() - started
            return parse_completion(
                raw.status,
                raw.headers,
                raw.body,
                self._preset,
                latency_s,
                base_url,
                backbone=self.name,
                redact=self._redact,
            )
        except CallError as error:
            if self._api_key is not None:
                _scrub(error, self._api_key)
            raise

    async def aclose(self) -> None:
        await self._transport.aclose()


def _scrub(error: CallError, api_key: Secret) -> None:
    """Remove the whole key from an error's message in place, wherever it stands (cheap: error path only).

    Provider text was scrubbed whole before it was shortened; this catches the key in any other part of the
    message. Only the exact key: secret-shaped patterns would garble our own labels and URLs.
    """
    error.args = tuple(api_key.redact(arg) if isinstance(arg, str) else arg for arg in error.args)
