"""Checks shared by methods' options tables: the Who&When search baselines (Step-by-step, Binary search), and
the methods that run another method inside them (Continual Search, self-consistency, the judge panel).

A sweep config is typed by hand, so a misspelt key or a wrong type must stop the run before any call is made
(`ConfigError` naming the method and the option) rather than silently fall back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from rcarun.errors import ConfigError
from rcarun.methods.base import is_int
from rcarun.methods.context import TRUNCATION_POLICIES
from rcarun.methods.registry import create_method

__all__ = ["check_base_method", "check_common_options", "reject_unknown_options"]

_REASONING = (None, "off", "low", "medium", "high")


def reject_unknown_options(method_name: str, cls: type[Any], options: Mapping[str, Any]) -> None:
    """Raise `ConfigError` when ``options`` has a key that is not a field of the dataclass ``cls``."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"{method_name}: unknown option(s) {unknown}; known: {sorted(known)}")


def check_base_method(
    method_name: str,
    base: str,
    base_options: object,
    *,
    excluded: tuple[str, ...],
    kind: str,
    create_with: Mapping[str, Any] | None = None,
) -> None:
    """The base method a wrapping method runs must be registered, not one of ``excluded`` (described as
    ``kind``), with a table of options it accepts; it is built once here (with ``create_with`` when the wrapper
    adds options of its own) so that a bad base option stops the config, naming the wrapper."""
    if base in excluded:
        raise ConfigError(f"{method_name}: base must be {kind}, not {base!r}")
    if not isinstance(base_options, dict):
        raise ConfigError(f"{method_name}: base_options must be a table")
    try:
        create_method(base, options=base_options if create_with is None else create_with)
    except ConfigError as exc:
        raise ConfigError(f"{method_name}: base: {exc}") from None


def check_common_options(method_name: str, parsed: Any) -> None:
    """Validate the options both baselines share (``parsed`` is the options dataclass)."""
    if not is_int(parsed.max_tokens) or parsed.max_tokens <= 0:
        raise ConfigError(f"{method_name}: max_tokens must be a positive integer")
    if parsed.temperature is not None and (
        isinstance(parsed.temperature, bool) or not isinstance(parsed.temperature, int | float)
    ):
        raise ConfigError(f"{method_name}: temperature must be a number or null")
    if parsed.reasoning not in _REASONING:
        raise ConfigError(f"{method_name}: reasoning must be one of off, low, medium, high")
    if parsed.truncation not in TRUNCATION_POLICIES:
        raise ConfigError(f"{method_name}: truncation must be 'cap-steps' or 'none'")
    for name in ("include_task", "include_ground_truth"):
        if not isinstance(getattr(parsed, name), bool):
            raise ConfigError(f"{method_name}: {name} must be true or false")
    max_steps = getattr(parsed, "max_steps", None)
    if max_steps is not None and (not is_int(max_steps) or max_steps <= 0):
        raise ConfigError(f"{method_name}: max_steps must be a positive integer or absent")
    if not isinstance(parsed.stage, str) or not parsed.stage:
        raise ConfigError(f"{method_name}: stage must be a non-empty string")
