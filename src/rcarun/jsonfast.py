"""Rendering and parsing JSON on the per-call path through orjson, with exactly the standard library's results.

Every call renders its request twice (the canonical JSON hashed and stored, and the body sent): 18.6 us with the
standard library for a bench request, 7.5 us here (`benchmarks/per_call_parts.py`). The results must not change:
the canonical JSON's SHA-256 is the call cache's key. orjson and ``json`` (compact, ``ensure_ascii=False``)
render strings, integers, booleans and null alike; they differ on floats with an exponent, numbers beyond 64
bits, NaN, non-string keys and unpaired surrogates, so a value holding any of those (or anything but dicts,
lists, tuples and those scalars) is rendered by ``json`` instead. `tests/test_jsonfast.py` checks the agreement
on random values.

Parsing (`loads`) goes the same way: what orjson refuses (NaN, 1e400, an unpaired surrogate escape, a BOM,
UTF-16) the standard library parses, raising its own errors; the one thing orjson reads differently without
refusing it, an integer beyond 64 bits, is screened for (19 digits in a row anywhere) and parsed by ``json``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

__all__ = ["dumps_canonical", "dumps_compact", "loads"]

_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1


def dumps_canonical(value: Any) -> bytes:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()``, faster.

    Raises:
        UnicodeEncodeError: a string holds an unpaired surrogate (as the standard library's ``.encode()``).
        TypeError, ValueError: ``value`` is not JSON, as ``json.dumps`` raises.
    """
    if _orjson_renders_as_json(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # an unpaired surrogate: the standard library says so in its own words
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_compact(value: Any) -> bytes:
    """``json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()``, faster (keys in given order)."""
    if _orjson_renders_as_json(value):
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def loads(document: str | bytes) -> Any:
    """``json.loads(document)``, faster: the same value, or the same error (see the module docstring)."""
    screened = document.encode("utf-8", "surrogatepass") if type(document) is str else document
    if _LONG_DIGIT_RUN not in screened.translate(_DIGITS_AS_ZERO):
        try:
            return orjson.loads(document)
        except orjson.JSONDecodeError:
            pass  # NaN, an unpaired surrogate, UTF-16, or not JSON: the standard library decides, in its words
    return json.loads(document)


# Every byte to a space but the ASCII digits, which become "0": a run of 19 of them may be an integer beyond
# 64 bits (2**63 has 19 digits), which orjson would read as a float.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19


def _orjson_renders_as_json(value: Any) -> bool:
    """Whether orjson renders ``value`` byte for byte as the standard library does (see the module docstring).

    A loop over a stack rather than recursion: it runs twice a call, over every message and schema node.
    """
    stack = [value]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is str or node is None or kind is bool:
            continue
        if kind is dict:
            for key, item in node.items():
                if type(key) is not str:
                    return False
                if type(item) is not str and item is not None:
                    stack.append(item)
        elif kind is list or kind is tuple:
            stack.extend(node)
        elif kind is int:
            if not _INT64_MIN <= node <= _UINT64_MAX:
                return False
        elif kind is float:
            # repr is the standard library's rendering: orjson agrees wherever it has no exponent.
            if not math.isfinite(node) or "e" in repr(node):
                return False
        else:
            return False
    return True
