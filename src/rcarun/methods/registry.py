"""Methods are found by their registered kebab-case name, so a sweep config can name them without code changes.

`describe_method` reads back what a registered method is (its class's docstring), the options table it takes (its
options model: names, annotated types, defaults) and the stages it records calls under, for `rcarun methods`.
It only looks: nothing is registered or changed, and the methods need declare nothing beyond what they already
have (a factory annotated with the class it returns, whose ``__init__`` takes ``options: SomeOptions``).

The built-in methods are imported on first use, not with the package: most of the import cost of a run is method
modules it never calls (a sweep of ``all-at-once`` has no use for RCTA's or ECHO's). `BUILT_IN_METHODS` names the
module that registers each, so their names are known (listed, refused as duplicates) before any is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from rcarun.errors import ConfigError
from rcarun.methods.base import Method

__all__ = [
    "BUILT_IN_METHODS",
    "MethodDescription",
    "MethodFactory",
    "MethodOption",
    "create_method",
    "describe_method",
    "method",
    "registered_methods",
]

MethodFactory = Callable[[str, Mapping[str, Any]], Method]
"""Builds a method from its label and its options table (unknown options must raise ConfigError)."""

_FactoryT = TypeVar("_FactoryT", bound=MethodFactory)
_REGISTRY: dict[str, MethodFactory] = {}

_RCTA = "rcarun.methods.rcta.method"
BUILT_IN_METHODS: Mapping[str, str] = MappingProxyType(
    {
        "all-at-once": "rcarun.methods.all_at_once",
        "binary-search": "rcarun.methods.binary_search",
        "continual-search": "rcarun.methods.continual_search",
        "echo": "rcarun.methods.echo.method",
        "falat": "rcarun.methods.falat.method",
        "judge-panel": "rcarun.methods.ensembles",
        "passive-continuation": "rcarun.methods.continual_search",
        "rcta": _RCTA,
        "rcta/no-a1": _RCTA,
        "rcta/no-a2": _RCTA,
        "rcta/no-a3": _RCTA,
        "rcta/no-a4": _RCTA,
        "self-consistency": "rcarun.methods.ensembles",
        "soap": "rcarun.methods.soap.method",
        "step-by-step": "rcarun.methods.step_by_step",
    }
)
"""Built-in method name -> the module whose ``@method`` registers it, imported when the name is first needed."""


def method(name: str) -> Callable[[_FactoryT], _FactoryT]:
    """Register a method factory under ``name`` (kebab-case, as written in sweep configs)."""

    def register(factory: _FactoryT) -> _FactoryT:
        # A built-in name is taken even before its module is imported: only that module may register it.
        owner = BUILT_IN_METHODS.get(name)
        if name in _REGISTRY or (owner is not None and getattr(factory, "__module__", None) != owner):
            raise ValueError(f"method {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return register


def registered_methods() -> tuple[str, ...]:
    """Every registered method name, sorted (the built-in ones whether or not their modules are imported yet)."""
    return tuple(sorted(_REGISTRY.keys() | BUILT_IN_METHODS.keys()))


def _factory(name: str) -> MethodFactory | None:
    """The factory registered as ``name``, importing the built-in module that registers it on first use."""
    factory = _REGISTRY.get(name)
    if factory is None and name in BUILT_IN_METHODS:
        importlib.import_module(BUILT_IN_METHODS[name])
        factory = _REGISTRY.get(name)
    return factory


def create_method(name: str, *, label: str | None = None, options: Mapping[str, Any] | None = None) -> Method:
    """Instantiate the method registered as ``name``; ``label`` tells conditions of one method apart in results.db."""
    factory = _factory(name)
    if factory is None:
        known = ", ".join(registered_methods()) or "none"
        raise ConfigError(f"unknown method {name!r} (known: {known})")
    return factory(label or name, dict(options or {}))


# -- description ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MethodOption:
    """One key of a method's options table.

    Attributes:
        name: the key, as written in a sweep config's ``options``.
        type: its annotation, as written in the code (``"float | None"``).
        default: the value used when the table leaves the key out (what the method's name fixes, for a name that
            fixes one); None with ``required``.
        required: the key has no default.
        fixed: the method's name fixes the key (``rcta/no-a1``'s ``ablation``): another value is refused.
        doc: its line in the options class's ``Attributes:`` docstring section, when there is one.
    """

    name: str
    type: str
    default: Any
    required: bool = False
    fixed: bool = False
    doc: str | None = None


@dataclass(frozen=True, slots=True)
class MethodDescription:
    """What `describe_method` can tell about a registered method.

    Attributes:
        name: the registered name.
        description: the first line of the method class's docstring ("" when it has none).
        options: its options table, in declaration order; None when the factory does not say which class it
            builds or that class's options are not a dataclass.
        stages: the stage names its calls are recorded under with default options (its base method's first, for
            a method that runs another), None when nothing declares them.
        shareable_stages: stages whose requests every condition of the method shares (paid once).
        requires: why it cannot run with an empty options table (``judge-panel`` needs ``judges``), else None.
    """

    name: str
    description: str
    options: tuple[MethodOption, ...] | None
    stages: tuple[str, ...] | None
    shareable_stages: tuple[str, ...] = ()
    requires: str | None = None


def describe_method(name: str) -> MethodDescription:
    """Describe the method registered as ``name`` (see `MethodDescription`).

    Raises:
        ConfigError: no method is registered under ``name``.
    """
    return _describe(name, frozenset())


def _describe(name: str, seen: frozenset[str]) -> MethodDescription:
    factory = _factory(name)
    if factory is None:
        known = ", ".join(registered_methods()) or "none"
        raise ConfigError(f"unknown method {name!r} (known: {known})")
    instance: Any = None
    requires = None
    try:
        instance = factory(name, {})
    except ConfigError as error:
        requires = str(error)
    cls = _annotated(factory, "return")
    if not isinstance(cls, type):
        cls = type(instance) if instance is not None else None
    options_cls = _annotated(cls.__init__, "options") if cls is not None else None
    current = getattr(instance, "options", None)
    if not _is_options_class(options_cls):
        options_cls = type(current) if _is_options_class(type(current)) else None
    if current is not None and not isinstance(current, options_cls or ()):
        current = None
    options = None if options_cls is None else _options(options_cls, current)
    values = {option.name: option.default for option in options or ()}
    return MethodDescription(
        name=name,
        description=_first_line(inspect.getdoc(cls) if cls is not None else None),
        options=options,
        stages=_stages(values, cls, seen | {name}),
        shareable_stages=tuple(
            sorted(getattr(instance if instance is not None else cls, "shareable_stages", ()))
        ),
        requires=requires,
    )


def _annotated(function: Any, name: str) -> Any:
    """The resolved annotation ``name`` of ``function``, None when it has none or it cannot be resolved."""
    try:
        return typing.get_type_hints(function).get(name)
    except Exception:  # an annotation naming what only type checkers import: nothing to read
        return None


def _is_options_class(candidate: object) -> bool:
    """An options table's class: a pydantic model (`rcarun.methods._options.MethodOptions`) or a dataclass."""
    if not isinstance(candidate, type):
        return False
    return dataclasses.is_dataclass(candidate) or isinstance(getattr(candidate, "model_fields", None), dict)


def _declared_options(options_cls: type[Any]) -> list[tuple[str, Any, Any]]:
    """(name, default or MISSING, annotation) of each option, in declaration order."""
    model_fields = getattr(options_cls, "model_fields", None)
    if isinstance(model_fields, dict):
        declared = []
        for name, info in model_fields.items():
            value = info.get_default(call_default_factory=True)
            declared.append((name, dataclasses.MISSING if info.is_required() else value, info.annotation))
        return declared
    out = []
    for option in dataclasses.fields(options_cls):
        if option.default is not dataclasses.MISSING:
            default: Any = option.default
        elif option.default_factory is not dataclasses.MISSING:
            default = option.default_factory()
        else:
            default = dataclasses.MISSING
        out.append((option.name, default, option.type))
    return out


def _options(options_cls: type[Any], current: Any) -> tuple[MethodOption, ...]:
    docs = _attribute_docs(inspect.getdoc(options_cls))
    try:
        hints = typing.get_type_hints(options_cls)
    except Exception:  # as in `_annotated`: fall back to the annotations as written
        hints = {}
    described = []
    for name, declared, annotation in _declared_options(options_cls):
        value = getattr(current, name) if current is not None else declared
        described.append(
            MethodOption(
                name=name,
                type=_type_text(hints[name]) if name in hints else _type_text(annotation),
                default=None if value is dataclasses.MISSING else value,
                required=value is dataclasses.MISSING,
                fixed=declared is not dataclasses.MISSING and value != declared,
                doc=docs.get(name),
            )
        )
    return tuple(described)


def _type_text(annotation: Any) -> str:
    """An annotation with its aliases resolved, a Literal as its values: ``'off' | 'low' | None``."""
    if isinstance(annotation, str):  # as written, when it cannot be resolved
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(value) for value in typing.get_args(annotation))
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_type_text(member) for member in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    return inspect.formatannotation(annotation).replace("typing.", "").replace("collections.abc.", "")


def _stages(values: Mapping[str, Any], cls: type[Any] | None, seen: frozenset[str]) -> tuple[str, ...] | None:
    """A base method's stages, the module's ``STAGES``, then every ``stage`` / ``*_stage`` option's value."""
    found: list[str] = []
    base = values.get("base")
    if isinstance(base, str) and base in registered_methods() and base not in seen:
        found.extend(_describe(base, seen).stages or ())
    module = sys.modules.get(cls.__module__) if cls is not None else None
    declared = getattr(module, "STAGES", None)
    if isinstance(declared, tuple) and all(isinstance(stage, str) for stage in declared):
        found.extend(declared)
    found.extend(
        value
        for key, value in values.items()
        if (key == "stage" or key.endswith("_stage")) and isinstance(value, str) and value
    )
    return tuple(dict.fromkeys(found)) or None


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""


def _attribute_docs(doc: str | None) -> dict[str, str]:
    """``name: text`` entries of a Google-style ``Attributes:`` section (continuation lines joined)."""
    docs: dict[str, str] = {}
    inside = False
    indent: int | None = None
    current: str | None = None
    for line in (doc or "").splitlines():
        text = line.strip()
        if text == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if not text:
            if docs:
                break
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            break
        if indent is None:
            indent = depth
        key, colon, rest = text.partition(":")
        if depth == indent and colon and key.isidentifier():
            current = key
            docs[current] = rest.strip()
        elif current is not None and depth > indent:
            docs[current] = f"{docs[current]} {text}".strip()
    return docs
