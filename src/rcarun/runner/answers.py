"""Reading a model's JSON answer out of what it actually wrote (a sentence first, ``<think>`` blocks, fences).

Rejecting those would score a right answer as an error; guessing would score a wrong one. So the rule reads,
never repairs: the whole text when it is JSON; otherwise, thinking set aside, the last well-formed JSON object
that fits the requested schema (required fields present, declared types right), the outermost when objects
nest. Strings are made storable (a lone surrogate becomes U+FFFD, `rcarun.text`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from rcarun import jsonfast
from rcarun.text import repair_surrogates

__all__ = ["parse_json_answer"]

_FENCED_JSON: Final = re.compile(r"```(?:json)?\s*(\{.*\}|\[.*\])\s*```", re.DOTALL)
_THINKING: Final = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
# An opening tag never closed: an answer cut inside its thinking has no answer after it.
_OPEN_THINKING: Final = re.compile(r"<think(?:ing)?>.*\Z", re.DOTALL | re.IGNORECASE)
# How far back, and at how many opening braces, to look for the object: answers are short, prose can be long.
_SCAN_CHARS: Final = 200_000
_SCAN_OBJECTS: Final = 400
_JSON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def parse_json_answer(text: str, schema: Mapping[str, Any] | None = None) -> tuple[Any, str | None]:
    """The JSON answer in ``text`` and None, or None and why there is none (module docstring for the rule)."""
    stripped = text.strip()
    if not stripped:
        return None, "empty answer"
    try:
        return _storable(jsonfast.loads(stripped)), None
    except json.JSONDecodeError as exc:
        whole_error = f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    body = _OPEN_THINKING.sub("", _THINKING.sub(" ", stripped)).strip()
    if not body:
        return None, "no answer after the thinking"
    fenced = _FENCED_JSON.search(body)
    if fenced is not None:
        try:
            value = json.loads(fenced.group(1))
        except json.JSONDecodeError:
            pass
        else:
            if not isinstance(value, dict) or schema is None or _fits(value, schema, types=False):
                return _storable(value), None
    # Fields and types first; an object with the fields but a wrongly typed value next (the method then marks
    # that field invalid, as it would for the same object answered alone).
    for types in (True, False):
        found = _last_object(body, schema, types=types)
        if found is not None:
            return _storable(found), None
    if schema is not None and _last_object(body, None, types=False) is not None:
        return None, f"{whole_error}; no JSON object in the text has the requested fields"
    return None, whole_error


def _last_object(text: str, schema: Mapping[str, Any] | None, *, types: bool) -> dict[str, Any] | None:
    """The last (then outermost) JSON object in ``text`` that fits ``schema``, or None."""
    decoder = json.JSONDecoder()
    offset = max(0, len(text) - _SCAN_CHARS)
    best: tuple[int, int, dict[str, Any]] | None = None  # (end, -start, object)
    tried = 0
    position = len(text)
    while tried < _SCAN_OBJECTS:
        position = text.rfind("{", offset, position)
        if position < 0:
            break
        tried += 1
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            continue
        if not isinstance(value, dict) or (schema is not None and not _fits(value, schema, types=types)):
            continue
        candidate = (end, -position, value)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    return best[2] if best is not None else None


def _fits(value: dict[str, Any], schema: Mapping[str, Any], *, types: bool) -> bool:
    """Required fields present and (``types``) every declared property of the right JSON type (a shallow check)."""
    required = schema.get("required") or ()
    if any(name not in value for name in required):
        return False
    if not types:
        return True
    properties = schema.get("properties") or {}
    for name, spec in properties.items():
        if name not in value or not isinstance(spec, Mapping):
            continue
        declared = spec.get("type")
        kinds = [declared] if isinstance(declared, str) else list(declared or ())
        if not kinds:
            continue
        item = value[name]
        matches = False
        for kind in kinds:
            accepted = _JSON_TYPES.get(kind)
            if accepted is None:
                matches = True
                break
            if isinstance(item, bool) and kind != "boolean":
                continue  # JSON's true is no number
            if isinstance(item, accepted):
                matches = True
                break
        if not matches:
            return False
    return True


def _storable(value: Any) -> Any:
    """``value`` with every string (keys included) free of unpaired surrogates."""
    if isinstance(value, str):
        return repair_surrogates(value)
    if isinstance(value, list):
        return [_storable(item) for item in value]
    if isinstance(value, dict):
        return {repair_surrogates(key): _storable(item) for key, item in value.items()}
    return value
