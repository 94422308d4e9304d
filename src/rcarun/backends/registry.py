"""Backends found by name from config, so that adding one (an in-process vLLM engine, say) touches no caller.

`create_backend` reads ``settings.backend`` (``openai-compat`` by default).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rcarun.backends.settings import BackendSettings
from rcarun.backends.types import Backend
from rcarun.errors import ConfigError

__all__ = ["BackendFactory", "backend", "backend_names", "create_backend"]

BackendFactory = Callable[[BackendSettings], Backend]

_FactoryT = TypeVar("_FactoryT", bound=BackendFactory)

_BACKENDS: dict[str, BackendFactory] = {}


def backend(name: str) -> Callable[[_FactoryT], _FactoryT]:
    """Class decorator registering a backend under a short kebab-case name."""

    def register(cls: _FactoryT) -> _FactoryT:
        if name in _BACKENDS:
            raise ValueError(f"backend {name!r} is already registered")
        _BACKENDS[name] = cls
        return cls

    return register


def backend_names() -> tuple[str, ...]:
    return tuple(sorted(_BACKENDS))


def create_backend(settings: BackendSettings) -> Backend:
    """The backend registered under ``settings.backend``, built from `settings` (`ConfigError` if it cannot be)."""
    factory = _BACKENDS.get(settings.backend)
    if factory is None:
        known = ", ".join(backend_names())
        raise ConfigError(f"backbone {settings.name!r}: unknown backend {settings.backend!r}; known: {known}")
    return factory(settings)
