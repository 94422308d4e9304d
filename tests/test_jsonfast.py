"""orjson where it agrees with the standard library, the standard library where it does not: the same bytes or
the same error. The canonical JSON is the call cache's key, so a single differing byte would be a miss."""

from __future__ import annotations

import contextlib
import json
import random
from typing import Any

import pytest

from rcarun import jsonfast


def _random_text(rng: random.Random) -> str:
    pools = [(0, 0x80), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x110000), (0x2028, 0x202A), (0, 0x20)]
    return "".join(chr(rng.randrange(*rng.choice(pools))) for _ in range(rng.randrange(0, 14)))


def _random_float(rng: random.Random) -> float:
    return rng.choice(
        [
            rng.random(),
            rng.random() * 1e-7,
            rng.random() * 1e20,
            float(rng.randrange(-100, 100)),
            1e16,
            9999999999999998.0,
            1e-4,
            1e-5,
            0.1,
            -0.0,
            1.5e300,
            float("nan"),
            float("inf"),
            rng.uniform(-1e4, 1e4),
        ]
    )


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return _random_text(rng)
    if kind == 1:
        return _random_float(rng)
    if kind == 2:
        return rng.choice(
            [rng.randrange(-(2**70), 2**70), rng.randrange(-1000, 1000), 2**63, 2**64, -(2**63) - 1]
        )
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "\ud800 lone" if rng.random() < 0.1 else _random_text(rng)
    if kind == 5:
        return rng.randrange(10)
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    keys: list[Any] = [_random_text(rng) for _ in range(rng.randrange(5))]
    if rng.random() < 0.1:
        keys.append(rng.randrange(5))  # json.dumps turns it into a string; orjson refuses it
    return {key: _random_value(rng, depth + 1) for key in keys}


def _outcome(function: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "value", function(*args, **kwargs)
    except (TypeError, ValueError) as error:  # UnicodeEncodeError and JSONDecodeError are ValueErrors
        return type(error).__name__, str(error)


@pytest.mark.parametrize("seed", range(4))
def test_renderings_are_the_standard_librarys_bytes_for_random_values(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(3_000):
        value = _random_value(rng)
        assert _outcome(jsonfast.dumps_canonical, value) == _outcome(
            lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(), value
        )
        assert _outcome(jsonfast.dumps_compact, value) == _outcome(
            lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode(), value
        )


def _parsed(function: Any, document: str | bytes) -> tuple[str, str]:
    """What parsing gave, told apart where ``==`` would not: 1 from 1.0, -0.0 from 0.0, nan from nan."""
    try:
        return "value", repr(function(document))
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return type(error).__name__, str(error)


def _random_document(rng: random.Random) -> str:
    value = _random_value(rng)
    try:
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
    except (TypeError, ValueError):
        text = "{}"
    damage = rng.randrange(8)
    if damage == 0 and text:
        position = rng.randrange(len(text))
        text = text[:position] + rng.choice([",", "}", "\x01", "\\", '"', "1" * 25, "]"]) + text[position:]
    elif damage == 1:
        text = "\ufeff" + text
    elif damage == 2:
        text = f"  {text}\n\n"
    return text


@pytest.mark.parametrize("seed", range(4))
def test_parsing_gives_the_standard_librarys_value_or_error_for_random_documents(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(3_000):
        text = _random_document(rng)
        documents: list[str | bytes] = [text, text.encode("utf-8", "surrogatepass")]
        with contextlib.suppress(UnicodeEncodeError):  # an unpaired surrogate: no UTF-16 can carry it
            documents.append(text.encode("utf-16"))
        for document in documents:
            assert _parsed(jsonfast.loads, document) == _parsed(json.loads, document), document


@pytest.mark.parametrize(
    "document",
    [
        "18446744073709551616",  # 2**64: orjson alone would read a float
        "-9223372036854775809",  # -(2**63) - 1
        '{"step": 123456789012345678901234567890}',
        "[1e400, -1e400]",
        "NaN",
        '"\\ud800"',
        "\ufeff[1]",
        '{"a": 1, "a": 2}',
        "[1,]",
        "[" * 5_000 + "]" * 5_000,
    ],
)
def test_parsing_what_orjson_reads_otherwise_or_refuses(document: str) -> None:
    for given in (document, document.encode("utf-8", "surrogatepass")):
        assert _parsed(jsonfast.loads, given) == _parsed(json.loads, given)
