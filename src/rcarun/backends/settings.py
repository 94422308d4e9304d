"""How one backbone is reached: the typed settings the runner builds from TOML and hands to `create_backend`.

Settings are per backbone, presets per provider. Only the NAME of the key's environment variable is kept, so a
settings value can be logged, hashed or shown safely; `redact_secrets` scrubs every foreign text in an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rcarun.errors import ConfigError

__all__ = ["BackendSettings", "Secret", "redact_secrets"]


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """Everything a backend needs to reach one backbone.

    ``base_urls`` end in ``/v1`` (several are balanced); ``api_key_env`` None sends no Authorization header;
    ``timeout_s`` is a silence deadline (to the first byte and between two), ``max_call_s`` a whole call's;
    past ``max_response_bytes`` an answer is `rcarun.errors.ResponseTooLarge`; ``pool_size`` must be at least
    the runner's concurrency; ``extra_body`` is merged deeply into every body; ``stream`` None is the preset's.
    """

    name: str
    provider: str
    model: str
    base_urls: tuple[str, ...]
    api_key_env: str | None = None
    transport: str = "aiohttp"
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_call_s: float | None = 10_800.0
    max_response_bytes: int = 32 * 2**20
    stream: bool | None = None
    pool_size: int = 64
    thinking: bool | None = None
    reasoning_effort: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    supports_response_format: bool = True
    backend: str = "openai-compat"

    def __post_init__(self) -> None:
        if isinstance(self.base_urls, str):
            # A bare string would silently become a tuple of characters.
            object.__setattr__(self, "base_urls", (self.base_urls,))
        object.__setattr__(self, "base_urls", tuple(url.rstrip("/") for url in self.base_urls))
        object.__setattr__(self, "extra_body", _frozen_mapping(self.extra_body))
        object.__setattr__(self, "extra_headers", _frozen_mapping(self.extra_headers))
        where = f"backbone {self.name!r}"
        if not self.name:
            raise ConfigError("a backbone needs a non-empty name")
        if not self.model:
            raise ConfigError(f"{where}: model is empty")
        if not self.base_urls or any(not url for url in self.base_urls):
            raise ConfigError(f"{where}: base_urls needs at least one non-empty URL")
        if self.pool_size < 1:
            raise ConfigError(f"{where}: pool_size must be >= 1, got {self.pool_size}")
        if not (self.timeout_s > 0 and self.connect_timeout_s > 0):
            raise ConfigError(f"{where}: timeout_s and connect_timeout_s must be > 0")
        if self.max_call_s is not None and not self.max_call_s > 0:
            raise ConfigError(f"{where}: max_call_s must be > 0, got {self.max_call_s}")
        if self.max_response_bytes < 1:
            raise ConfigError(f"{where}: max_response_bytes must be >= 1, got {self.max_response_bytes}")

    def read_api_key(self) -> Secret | None:
        """The key from the variable named by ``api_key_env``, wrapped so it never prints (`ConfigError` if unset)."""
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ConfigError(
                f"backbone {self.name!r}: environment variable {self.api_key_env} (api_key_env) is not set"
            )
        return Secret(value)


class Secret:
    """A string that does not show itself in repr, str, f-strings or logs; `reveal()` is the only way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def redact(self, text: str) -> str:
        """`text` with every whole occurrence of the secret replaced (see `redact_secrets` for the full scrub)."""
        return text.replace(self._value, "***") if self._value and self._value in text else text

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, format_spec: str) -> str:
        return "***"

    def __reduce__(self) -> Any:
        raise TypeError("a Secret cannot be pickled")


# Credentials in the shapes providers and proxies echo, whoever's they are: a bearer token (up to the next space or
# quote, so JSON around it survives) and an OpenAI-style key. The key pattern does not start inside a word, so that
# names such as "task-classifier-v2" stay readable; a key rcarun holds is replaced wherever it stands.
_BEARER_TOKEN = re.compile(r"\b(bearer)\s+[^\s\"'\\]+", re.IGNORECASE)
_SK_TOKEN = re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{8,}")


def redact_secrets(text: str, secret: Secret | None = None) -> str:
    """``text`` with ``secret`` and every secret-shaped token (``Bearer <token>``, ``sk-…``) replaced. Run it on
    the whole text before shortening it: a key cut in two no longer matches anything."""
    if secret is not None:
        text = secret.redact(text)
    text = _BEARER_TOKEN.sub(r"\1 ***", text)
    if "sk-" in text:
        text = _SK_TOKEN.sub("sk-***", text)
    return text
