"""What every method's options table is built on, and checks shared by the methods that run another method.

A sweep config is typed by hand, so a misspelt key or a wrong type must stop the run before any call is made
(`ConfigError` naming the method and the option) rather than silently fall back to a default. Each method's
options are a `MethodOptions` model: pydantic in strict mode (no ``"3"`` for 3, no ``true`` for 1, no
``inf``), unknown keys refused, frozen. Rules that tie several options together are ``model_validator``s that
raise ``ValueError`` with the sentence to show; `parse_options` turns every failure into one `ConfigError` line
that names the method.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from rcarun.errors import ConfigError
from rcarun.methods.base import is_int
from rcarun.methods.context import TRUNCATION_POLICIES
from rcarun.methods.registry import create_method

__all__ = [
    "MethodOptions",
    "ReasoningOption",
    "TupleOf",
    "as_tuple",
    "check_base_method",
    "check_common_options",
    "parse_options",
    "reject_unknown_options",
]

_Item = TypeVar("_Item")
_OptionsT = TypeVar("_OptionsT", bound="MethodOptions")


def as_tuple(value: object) -> object:
    """TOML and JSON give arrays as lists; the frozen options keep them as tuples (validated item by item)."""
    return tuple(value) if isinstance(value, list) else value


TupleOf = Annotated[tuple[_Item, ...], BeforeValidator(as_tuple)]
"""``TupleOf[str]``: an array option, given as a list, kept as a tuple."""

ReasoningOption = Literal["off", "low", "medium", "high"] | None
"""The reasoning effort a method asks of its backbone (None: the backbone's own setting)."""


class MethodOptions(BaseModel):
    """Base of every method's options: strict types, no unknown key, no infinity or NaN, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def parse_options(method_name: str, model: type[_OptionsT], options: Mapping[str, Any]) -> _OptionsT:
    """``options`` read as ``model``; every problem in one `ConfigError` that starts with ``method_name``."""
    known = list(model.model_fields)
    unknown = sorted(str(key) for key in options if key not in model.model_fields)
    if unknown:
        raise ConfigError(f"{method_name}: unknown option(s) {unknown}; known: {sorted(known)}")
    try:
        return model.model_validate(dict(options))
    except ValidationError as error:
        raise ConfigError(f"{method_name}: {_explain(error)}") from None


def _explain(error: ValidationError) -> str:
    problems = []
    for entry in error.errors(include_url=False):
        location = ".".join(str(part) for part in entry["loc"])
        if entry["type"] == "value_error":
            # A model validator's own sentence, without pydantic's "Value error, " prefix.
            problems.append(str(entry.get("ctx", {}).get("error", entry["msg"])))
        elif location:
            given = repr(entry["input"])
            given = given if len(given) <= 60 else given[:57] + "..."
            problems.append(f"{location}: {entry['msg']} (got {given})")
        else:
            problems.append(entry["msg"])
    return "; ".join(problems)


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
