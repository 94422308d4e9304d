"""The transports: how a request body reaches a base URL and how the raw answer comes back.

A transport only moves bytes. It returns the status, headers and body of whatever the server answered (errors
included) and raises `rcarun.errors.TransportError` only when there is no answer at all (timeout, reset,
refused). Translating the answer is `rcarun.backends.wire`'s job, so every transport yields the same
`ChatResult`.

Two are registered: ``aiohttp`` (the default: about 0.3 ms of CPU per call against 2.4-4.3 ms for the SDK on
this machine, raw headers and bodies visible) and ``openai-sdk`` (the official client, for those who want it;
imported only when chosen because the SDK takes a noticeable time to import).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from rcarun.backends.settings import BackendSettings, Secret, redact_secrets
from rcarun.errors import ConfigError, ConnectionFailed, TransportError
from rcarun.jsonfast import dumps_compact
from rcarun.text import repair_surrogates

__all__ = [
    "AiohttpTransport",
    "RawResponse",
    "Transport",
    "TransportFactory",
    "create_transport",
    "transport",
    "transport_names",
]


@dataclass(frozen=True, slots=True)
class RawResponse:
    """What a server answered, untouched: the shared parser reads it."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Transport(Protocol):
    """Posts one chat-completions body to one base URL."""

    async def post_chat(self, base_url: str, body: Mapping[str, Any]) -> RawResponse:
        """Send `body` to ``{base_url}/chat/completions``.

        Raises:
            TransportError: no HTTP answer (timeout, connection refused or reset mid-answer).
        """
        ...

    async def aclose(self) -> None: ...


TransportFactory = Callable[[BackendSettings, Secret | None], Transport]

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
    """The transport named by ``settings.transport``.

    Raises:
        ConfigError: unknown transport name.
    """
    try:
        factory = _TRANSPORTS[settings.transport]
    except KeyError:
        raise ConfigError(
            f"backbone {settings.name!r}: unknown transport {settings.transport!r}; "
            f"known: {', '.join(transport_names())}"
        ) from None
    return factory(settings, api_key)


def describe_failure(error: BaseException, api_key: Secret | None) -> str:
    """A short, secret-free, storable description of a low-level failure for a TransportError message.

    The whole text is scrubbed (`redact_secrets`) before it is cut to 300 characters, so no part of a key
    survives the cut; lone surrogates (aiohttp decodes headers with ``surrogateescape``) become U+FFFD.
    """
    detail = repair_surrogates(redact_secrets(str(error) or type(error).__name__, api_key))
    return f"{type(error).__name__}: {detail[:300]}"


@transport("aiohttp")
class AiohttpTransport:
    """One aiohttp session per backend, created inside the running loop on first use.

    The connector holds at most ``pool_size`` connections (all to the same host or replicas), kept alive
    between calls. Bodies are read whole as bytes and never decoded here.
    """

    __slots__ = ("_api_key", "_headers", "_session", "_settings", "_timeout")

    def __init__(self, settings: BackendSettings, api_key: Secret | None) -> None:
        self._settings = settings
        self._api_key = api_key
        self._headers: dict[str, str] = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **settings.extra_headers,
        }
        self._timeout = aiohttp.ClientTimeout(
            total=settings.timeout_s, sock_connect=settings.connect_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"AiohttpTransport(backbone={self._settings.name!r}, pool_size={self._settings.pool_size})"

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
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

    def _request_headers(self) -> dict[str, str]:
        if self._api_key is None:
            return self._headers
        # Built per call so that the key lives only inside the Secret between calls.
        return {**self._headers, "Authorization": f"Bearer {self._api_key.reveal()}"}

    async def post_chat(self, base_url: str, body: Mapping[str, Any]) -> RawResponse:
        session = self._session_for_loop()
        url = f"{base_url}/chat/completions"
        data = dumps_compact(body)
        name = self._settings.name
        try:
            async with session.post(url, data=data, headers=self._request_headers()) as response:
                payload = await response.read()
                return RawResponse(status=response.status, headers=response.headers, body=payload)
        except TimeoutError:
            raise TransportError(
                f"{name}: no complete answer from {url} within {self._settings.timeout_s:g} s"
            ) from None
        except (aiohttp.ClientConnectorError, ConnectionRefusedError, socket.gaierror) as error:
            raise ConnectionFailed(f"{name}: {url}: {describe_failure(error, self._api_key)}") from None
        except (aiohttp.ClientError, OSError) as error:
            raise TransportError(f"{name}: {url}: {describe_failure(error, self._api_key)}") from None

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()


@transport("openai-sdk")
def _openai_sdk_transport(settings: BackendSettings, api_key: Secret | None) -> Transport:
    # Imported here: the SDK is only loaded by backbones that choose it.
    from rcarun.backends.sdk_transport import OpenAISDKTransport

    return OpenAISDKTransport(settings, api_key)
