"""`rcarun methods`: what can go in a sweep's ``[[methods]]`` tables, without reading the code.

Each registered method with the first line of its docstring, the stages its calls are recorded under (what
``[stages.NAME]`` budgets and `rcarun cost` rows name) and every key of its ``options`` table with the default
used when the key is left out. All of it is read from the method registry (`describe_method`), so a new method or
option shows up here without an edit.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Set
from typing import Any

from rcarun.cli.output import survives_closed_stdout
from rcarun.methods.registry import MethodDescription, MethodOption, describe_method, registered_methods

__all__ = ["add_methods_command", "cmd_methods"]


def add_methods_command(commands: Any) -> None:
    """Register ``methods`` on the top-level subparsers."""
    methods = commands.add_parser(
        "methods",
        help="list the attribution methods: what each does, its stages, its options and their defaults",
        description="Every method a sweep config can name, with its stages and the keys of its options table.",
    )
    methods.add_argument("names", nargs="*", metavar="NAME", help="only these methods (default: every one)")
    methods.add_argument("--json", action="store_true", help="print them as one JSON document")


@survives_closed_stdout
def cmd_methods(args: argparse.Namespace) -> int:
    """Print the methods ``args.names`` asks for (all by default).

    Raises:
        ConfigError: a name no method is registered under (the known ones are listed).
    """
    import rcarun.methods  # noqa: F401  (importing the package registers every method)

    names = list(dict.fromkeys(args.names)) or list(registered_methods())
    described = [describe_method(name) for name in names]
    if args.json:
        print(json.dumps({"methods": [_method_json(d) for d in described]}, indent=2, ensure_ascii=False))
        return 0
    print(
        "methods a sweep config can name ([[methods]] name = ...), with the keys of their options table "
        "(name = default  type):"
    )
    for description in described:
        print()
        print("\n".join(_method_lines(description)))
    return 0


def _method_lines(method: MethodDescription) -> list[str]:
    head = f"{method.name} — {method.description}" if method.description else method.name
    lines = [head]
    stages = ", ".join(method.stages) if method.stages else "not declared"
    shared = (
        f" (shared by every condition: {', '.join(method.shareable_stages)})"
        if method.shareable_stages
        else ""
    )
    lines.append(f"  stages: {stages}{shared}")
    if method.requires:
        lines.append(f"  needs options: {method.requires}")
    if method.options is None:
        lines.append("  options: not declared")
        return lines
    if not method.options:
        lines.append("  options: none")
        return lines
    lines.append("  options:")
    cells = [(option, f"{option.name} = {_value_text(option)}") for option in method.options]
    width = max(len(cell) for _, cell in cells)
    for option, cell in cells:
        notes = [option.type]
        if option.fixed:
            notes.append("fixed by the name")
        line = f"    {cell:<{width}}  {'; '.join(notes)}"
        if option.doc:
            line += f" — {option.doc}"
        lines.append(line)
    return lines


def _value_text(option: MethodOption) -> str:
    """A default as it would be written in TOML (None has no TOML spelling: it is the key left out)."""
    if option.required:
        return "(required)"
    if option.default is None:
        return "unset"
    return json.dumps(_jsonable(option.default), ensure_ascii=False)


def _method_json(method: MethodDescription) -> dict[str, Any]:
    return {
        "name": method.name,
        "description": method.description,
        "stages": list(method.stages) if method.stages is not None else None,
        "shareable_stages": list(method.shareable_stages),
        "requires": method.requires,
        "options": None
        if method.options is None
        else [
            {
                "name": option.name,
                "type": option.type,
                "default": _jsonable(option.default),
                "required": option.required,
                "fixed": option.fixed,
                "doc": option.doc,
            }
            for option in method.options
        ],
    }


def _jsonable(value: Any) -> Any:
    """Tuples as lists, mappings as objects, sets sorted; anything else JSON cannot hold as its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, Set):
        return sorted((_jsonable(item) for item in value), key=repr)
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return repr(value)
