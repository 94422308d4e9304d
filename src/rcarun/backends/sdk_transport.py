"""The ``openai-sdk`` transport: the official `AsyncOpenAI` client carrying rcarun's own request body.

Offered for users who want the SDK's HTTP stack (httpx2) rather than aiohttp. It costs several times more CPU
per call, so aiohttp stays the default. The SDK is used only as a pipe: ``max_retries=0`` (the runner is the
only retry loop), ``with_raw_response`` so that status, headers and the exact body bytes reach the shared
parser, and errors mapped back to the raw response whenever there is one. Both transports therefore produce
identical results.

The SDK reads several OPENAI_* environment variables when arguments are left out; every one that could leak an
OpenAI credential or organisation into another provider's requests is passed explicitly instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx2
import openai

from rcarun.backends.settings import BackendSettings, Secret
from rcarun.backends.transports import RawResponse, describe_failure
from rcarun.errors import ConnectionFailed, TransportError

__all__ = ["OpenAISDKTransport"]

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
        "temperature",
        "tool_choice",
        "tools",
        "top_p",
    }
)


class OpenAISDKTransport:
    """One `AsyncOpenAI` client per replica, all sharing one httpx2 pool sized to ``pool_size``."""

    __slots__ = ("_api_key", "_clients", "_http", "_settings", "_timeout")

    def __init__(self, settings: BackendSettings, api_key: Secret | None) -> None:
        self._settings = settings
        self._api_key = api_key
        self._timeout = httpx2.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        self._http: httpx2.AsyncClient | None = None
        self._clients: dict[str, openai.AsyncOpenAI] = {}

    def __repr__(self) -> str:
        return f"OpenAISDKTransport(backbone={self._settings.name!r}, pool_size={self._settings.pool_size})"

    def _client(self, base_url: str) -> openai.AsyncOpenAI:
        client = self._clients.get(base_url)
        if client is not None:
            return client
        if self._http is None:
            pool = self._settings.pool_size
            self._http = openai.DefaultAsyncHttpxClient(
                limits=httpx2.Limits(max_connections=pool, max_keepalive_connections=pool),
                timeout=self._timeout,
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
            http_client=self._http,
        )
        self._clients[base_url] = client
        return client

    async def post_chat(self, base_url: str, body: Mapping[str, Any]) -> RawResponse:
        client = self._client(base_url)
        keywords = {key: value for key, value in body.items() if key in _SDK_KEYWORDS}
        extra_body = {
            key: value
            for key, value in body.items()
            if key not in _SDK_KEYWORDS and key not in ("model", "messages")
        }
        extra_headers: dict[str, Any] = {} if self._api_key is not None else {"Authorization": openai.omit}
        create: Any = client.chat.completions.with_raw_response.create
        name = self._settings.name
        url = f"{base_url}/chat/completions"
        try:
            raw = await create(
                model=body["model"],
                messages=body["messages"],
                extra_body=extra_body or None,
                extra_headers=extra_headers or None,
                **keywords,
            )
        except openai.APIStatusError as error:
            return RawResponse(
                status=error.status_code, headers=error.response.headers, body=_read_body(error.response)
            )
        except openai.APITimeoutError:
            raise TransportError(
                f"{name}: no complete answer from {url} within {self._settings.timeout_s:g} s"
            ) from None
        except openai.APIConnectionError as error:
            cause = error.__cause__ if error.__cause__ is not None else error
            failure = ConnectionFailed if isinstance(cause, httpx2.ConnectError) else TransportError
            raise failure(f"{name}: {url}: {describe_failure(cause, self._api_key)}") from None
        return RawResponse(status=raw.status_code, headers=raw.headers, body=raw.content)

    async def aclose(self) -> None:
        http, self._http = self._http, None
        self._clients.clear()
        if http is not None:
            await http.aclose()


def _read_body(response: httpx2.Response) -> bytes:
    try:
        return response.content
    except httpx2.ResponseNotRead:
        return b""
