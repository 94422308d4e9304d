"""Methods are found by their registered kebab-case name, so a sweep config can name them without code changes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rcarun.errors import ConfigError
from rcarun.methods.base import Method

__all__ = ["MethodFactory", "create_method", "method", "registered_methods"]

MethodFactory = Callable[[str, Mapping[str, Any]], Method]
"""Builds a method from its label and its options table (unknown options must raise ConfigError)."""

_FactoryT = TypeVar("_FactoryT", bound=MethodFactory)
_REGISTRY: dict[str, MethodFactory] = {}


def method(name: str) -> Callable[[_FactoryT], _FactoryT]:
    """Register a method factory under ``name`` (kebab-case, as written in sweep configs)."""

    def register(factory: _FactoryT) -> _FactoryT:
        if name in _REGISTRY:
            raise ValueError(f"method {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return register


def registered_methods() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def create_method(name: str, *, label: str | None = None, options: Mapping[str, Any] | None = None) -> Method:
    """Instantiate the method registered as ``name``; ``label`` tells conditions of one method apart in results.db."""
    factory = _REGISTRY.get(name)
    if factory is None:
        known = ", ".join(registered_methods()) or "none"
        raise ConfigError(f"unknown method {name!r} (known: {known})")
    return factory(label or name, dict(options or {}))
