"""The simulator's faults: which one a request meets, the error answers, and the hostile rewrites of an answer.

One draw per request walks the configured kinds in `FAULT_RATE_FIELDS` order, each taking a slice as wide as its
rate. Kinds at rate 0 are left out and later kinds come last, so for a given seed the same requests meet the
same earlier faults whatever the later rates are. docs/simulator.md describes each kind.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .config import FAULT_RATE_FIELDS, MockConfig
from .headers import retry_after_headers
from .http import JSON_CONTENT_TYPE, error_response

__all__ = [
    "ANSWER_FAULTS",
    "CUT_FAULTS",
    "DETAILED_OUTCOMES",
    "draw_fault",
    "fault_response",
    "fault_table",
    "hostile_answer",
    "spoiled_usage",
    "still_hostile",
]

# The step a "huge_step" answer states: past SQLite's 64-bit integers and float's exact integers alike.
_HUGE_STEP = 10**26
# A high surrogate with no low one after it, as when an answer is cut in the middle of an emoji.
_LONE_SURROGATE = "\ud800"
# What a "control" answer carries: sequences a terminal obeys instead of showing.
_CONTROL_SEQUENCES = (
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b]0;pwned\x07"  # set the window title
    "\x1b]52;c;cm0gLXJmIH4K\x07"  # write the clipboard (OSC 52)
    "\x1b]8;;https://example.invalid\x1b\\link\x1b]8;;\x1b\\"  # a hyperlink
    "\x9b31m"  # C1 CSI: red, where a terminal reads 8-bit controls
    "hidden\r\x08\x08"  # overwrite what came before
)

# Served as normal 200 answers (admitted, charged, timed like one) with something hostile inside.
ANSWER_FAULTS = frozenset(("huge_step", "surrogate", "bad_usage", "control"))
# Served as answers (admitted, charged) that the wire cuts off after about half of them.
CUT_FAULTS = frozenset(("stream_stall", "stream_drop"))
# Outcomes whose request-log entry carries a detail (which variant, which field).
DETAILED_OUTCOMES = ANSWER_FAULTS | {"long_pause"}
_BAD_USAGE_KINDS = ("missing", "huge", "infinity", "negative")
# What a "long_pause" 429 asks for: a day, a date 73 years away, and a number that parses to infinity.
_LONG_PAUSES = ("86400", "Wed, 21 Oct 2099 07:28:00 GMT", "1e400")
_HUGE_STEP_TEXT = str(_HUGE_STEP)
_MALFORMED_BODIES = (
    b'{"id": "chatcmpl-mock", "object": "chat.completion", "choices": [{"index": 0, "mess',
    b'{"object": "chat.completion", "choices": []}',
    b"<html><body><h1>502 Bad Gateway</h1></body></html>",
)
# Error answers: kind -> (status, message, type, code).
_ERRORS: dict[str, tuple[int, str, str, str | None]] = {
    "error_500": (
        500,
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    "error_503": (503, "The engine is currently overloaded, please try again later.", "server_error", None),
    "rate_limit": (
        429,
        "The server is currently overloaded with other requests. Please retry after a brief wait.",
        "requests",
        "rate_limit_exceeded",
    ),
    "bare_rate_limit": (429, "Too many requests. Please slow down.", "requests", "rate_limit_exceeded"),
}


def fault_table(config: MockConfig) -> tuple[tuple[str, float], ...]:
    """(kind, rate) of each fault ``config`` switches on, in draw order."""
    rates = ((name.removesuffix("_rate"), getattr(config, name)) for name in FAULT_RATE_FIELDS)
    return tuple((kind, rate) for kind, rate in rates if rate > 0)


def draw_fault(table: tuple[tuple[str, float], ...], rng: random.Random) -> str | None:
    """The fault this request meets (one draw), or None."""
    draw = rng.random()
    for kind, rate in table:
        if draw < rate:
            return kind
        draw -= rate
    return None


def fault_response(
    kind: str,
    config: MockConfig,
    limit_headers: Callable[[], dict[str, str]],
    fault_rng: random.Random,
    variant_rng: random.Random,
) -> tuple[web.Response, str | None]:
    """The answer to a fault served at once (not "timeout" or "reset"), with its request-log detail."""
    if kind == "long_pause":
        retry_after = variant_rng.choice(_LONG_PAUSES)
        headers = limit_headers()
        headers["Retry-After"] = retry_after
        if retry_after.isdigit():  # OpenAI's precise header agrees when the pause is a plain number
            headers["retry-after-ms"] = str(int(retry_after) * 1000)
        moonshot = config.headers == "moonshot"
        response = error_response(
            429,
            "The service is unavailable for scheduled maintenance. Please retry after the time given.",
            "engine_overloaded_error" if moonshot else "requests",
            None if moonshot else "rate_limit_exceeded",
            headers,
        )
        return response, retry_after
    if kind == "malformed":
        body = fault_rng.choice(_MALFORMED_BODIES)
        return web.Response(
            status=200, body=body, content_type=JSON_CONTENT_TYPE, headers=limit_headers()
        ), None
    status, message, error_type, code = _ERRORS[kind]
    headers = {} if kind == "bare_rate_limit" else limit_headers()
    if kind == "rate_limit":
        headers.update(retry_after_headers(config.rate_limit_retry_after_s))
    return error_response(status, message, error_type, code, headers), None


def hostile_answer(
    kind: str, answer: str | list[dict[str, Any]], variant_rng: random.Random
) -> tuple[str | list[dict[str, Any]], str | None]:
    """The answer made hostile for fault ``kind`` with its log detail; the detail is None when ``answer`` has
    nothing to spoil (tool calls; no step field for "huge_step")."""
    if kind == "bad_usage":
        return answer, variant_rng.choice(_BAD_USAGE_KINDS)
    if isinstance(answer, list):
        return answer, None
    if kind == "huge_step":
        spoiled = _with_huge_step(answer)
        return (answer, None) if spoiled is None else (spoiled[0], ",".join(spoiled[1]))
    if kind == "control":
        return _with_control_sequences(answer)
    return _with_lone_surrogate(answer)


def still_hostile(kind: str, content: str) -> bool:
    """Whether the content sent still holds what made the answer hostile (the budget may have cut it off)."""
    if kind == "huge_step":
        return _HUGE_STEP_TEXT in content
    if kind == "control":
        return _CONTROL_SEQUENCES in content
    return _LONE_SURROGATE in content


def spoiled_usage(usage: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """``usage`` made into the "bad_usage" variant ``kind`` (None for "missing")."""
    if kind == "missing":
        return None
    if kind == "huge":
        usage["prompt_tokens"] = 10**20
        usage["total_tokens"] = 10**20 + usage["completion_tokens"]
    elif kind == "infinity":
        usage["prompt_tokens"] = math.inf
        usage["total_tokens"] = math.inf
    else:  # "negative"
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            usage[name] = -max(1, usage[name])
    return usage


def _with_huge_step(answer: str) -> tuple[str, list[str]] | None:
    """``answer`` (JSON text) with every integer field named like a step set to `_HUGE_STEP`.

    A step is an integer field whose name contains "step" (``root_step``, ``step_id``, ``root_cause.step``);
    arrays of steps are left alone, so the answer is valid but for that number.

    Returns:
        The new text and the dotted paths of the fields changed, or None when the answer is not JSON or has no
        such field.
    """
    try:
        value = json.loads(answer)
    except ValueError:
        return None
    paths: list[str] = []
    _replace_steps(value, "", paths)
    if not paths:
        return None
    return json.dumps(value, ensure_ascii=False), paths


def _replace_steps(value: Any, prefix: str, paths: list[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}{key}"
            if isinstance(item, int) and not isinstance(item, bool) and "step" in str(key).casefold():
                value[key] = _HUGE_STEP
                paths.append(path)
            else:
                _replace_steps(item, path + ".", paths)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _replace_steps(item, f"{prefix}{index}.", paths)


def _with_lone_surrogate(answer: str) -> tuple[str, str]:
    """``answer`` with `_LONE_SURROGATE` at the end of its longest string field (the free text), or of the text
    itself when it is not JSON or holds no string; with the dotted path changed (``(text)`` for the text).

    The JSON is rewritten unescaped, so the content string itself holds the surrogate.
    """
    try:
        value = json.loads(answer)
    except ValueError:
        return answer + _LONE_SURROGATE, "(text)"
    strings: list[tuple[int, str, Any, Any]] = []  # (length, path, container, key)
    _collect_strings(value, "", strings)
    if not strings:
        return answer + _LONE_SURROGATE, "(text)"
    # The longest string, the first of equals: a free-text field rather than an enum value.
    _, path, container, key = max(strings, key=lambda found: found[0])
    container[key] += _LONE_SURROGATE
    return json.dumps(value, ensure_ascii=False), path


def _with_control_sequences(answer: str) -> tuple[str, str]:
    """``answer`` after a line of `_CONTROL_SEQUENCES` (raw: inside a JSON string they would arrive escaped), and
    the log detail."""
    return f"{_CONTROL_SEQUENCES}\n{answer}", "(prefix)"


def _collect_strings(value: Any, prefix: str, found: list[tuple[int, str, Any, Any]]) -> None:
    items: Any = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, item in items:
        path = f"{prefix}{key}"
        if isinstance(item, str):
            found.append((len(item), path, value, key))
        else:
            _collect_strings(item, path + ".", found)
