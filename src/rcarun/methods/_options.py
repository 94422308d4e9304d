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
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, PositiveInt, ValidationError

from rcarun.errors import ConfigError
from rcarun.methods.registry import create_method

__all__ = [
    "JudgeOptions",
    "MethodOptions",
    "ReasoningOption",
    "TupleOf",
    "as_tuple",
    "check_base_method",
    "parse_options",
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

    method_name: ClassVar[str] = ""
    """The registered method the table belongs to, named in every error."""

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> Self:
        """Parse and check a sweep config's table (`parse_options` under ``method_name``)."""
        return parse_options(cls.method_name, cls, options)


class JudgeOptions(MethodOptions):
    """The options every method that prompts a judge with the log shares; each subclass documents them."""

    max_tokens: PositiveInt = 1024
    temperature: float | None = 0.0
    reasoning: ReasoningOption = None
    include_task: bool = True
    include_ground_truth: bool = False


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
