"""Schema-valid answers out of nothing but the request, so methods can be exercised without a real model.

The simulator draws a value satisfying the JSON schema a request carries (``response_format``, else the last
```json block of the last user message). It reads nothing else of the prompt, so any accuracy it reaches is
chance. A request that offers tools may get tool calls instead (`simulate_tool_calls`), a pure function of the
request and a seed that the dry-run estimator shares. Token counting lives here because the answer's size
decides ``finish_reason`` and usage.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DEFAULT_TOOL_ROUNDS_MAX",
    "answer_seed",
    "count_text_tokens",
    "filler_sentence",
    "filler_text",
    "generate_arguments",
    "generate_value",
    "schema_from_prompt",
    "schema_from_request",
    "simulate_tool_calls",
    "tool_calls_text",
    "tool_prompt_chars",
]

DEFAULT_TOOL_ROUNDS_MAX = 3
"""Most tool rounds a simulated conversation makes before it answers (the draw is uniform in 0..max)."""

# The filler vocabulary, in the order filler text cycles through it.
_FILLER_SOURCE = (
    "the agent reviewed each step and found that the plan drifted after an early tool result was read without "
    "checking its source so later steps inherited a wrong assumption about the task state while the "
    "orchestrator kept delegating work that depended on it"
)
_WORDS = _FILLER_SOURCE.split()

# Long enough for tens of thousands of reasoning tokens; sliced, never rebuilt per request.
_FILLER_CORPUS = " ".join(_WORDS[i % len(_WORDS)] for i in range(40_000))

_FENCED_JSON = re.compile(r"```json[ \t]*\r?\n(.*?)```", re.DOTALL)

# Probability of choosing null in a nullable union, and defaults when a schema leaves sizes open.
_NULL_PROBABILITY = 0.1
_DEFAULT_MAX_ITEMS = 3
_DEFAULT_INT_SPAN = 10
_MAX_DEPTH = 12
_MAX_RECURSION = 48
# Probability that an optional (not required) function argument is given.
_OPTIONAL_ARGUMENT_PROBABILITY = 0.5
_MAX_CALLS_PER_ROUND = 2


def count_text_tokens(text: str, chars_per_token: float) -> int:
    """Tokens of ``text`` under the simulator's rule: ceil(characters / chars_per_token)."""
    return math.ceil(len(text) / chars_per_token)


def filler_text(tokens: int, chars_per_token: float) -> str:
    """Filler words that count as exactly ``tokens`` tokens (for reasoning text)."""
    if tokens <= 0:
        return ""
    length = math.floor(tokens * chars_per_token)
    if length > len(_FILLER_CORPUS):  # only for budgets beyond ~60k tokens
        return ((_FILLER_CORPUS + " ") * (length // len(_FILLER_CORPUS) + 1))[:length]
    return _FILLER_CORPUS[:length]


def filler_sentence(rng: random.Random) -> str:
    """A short sentence of filler words."""
    start = rng.randrange(len(_WORDS))
    count = rng.randint(5, 11)
    words = [_WORDS[(start + i) % len(_WORDS)] for i in range(count)]
    return " ".join(words).capitalize() + "."


def answer_seed(messages: Sequence[Mapping[str, Any]], model: str, seed: object) -> int:
    """A stable 64-bit seed from the request's messages, model and seed parameter."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(model.encode())
    digest.update(b"\x00")
    digest.update(repr(seed).encode())
    for message in messages:
        digest.update(b"\x01")
        digest.update(str(message.get("role", "")).encode())
        digest.update(b"\x00")
        digest.update(message_text(message).encode())
    return int.from_bytes(digest.digest(), "big")


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message whose content is a string or a list of content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def schema_from_request(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The answer schema a chat request carries (``response_format`` of type ``json_schema``, else the last
    qualifying ```json block of the last user message), or None."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        wrapper = response_format.get("json_schema")
        if isinstance(wrapper, dict) and isinstance(wrapper.get("schema"), dict):
            schema: Mapping[str, Any] = wrapper["schema"]
            return schema
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return schema_from_prompt(message_text(message))
    return None


def schema_from_prompt(text: str) -> Mapping[str, Any] | None:
    """The last ```json fenced block in ``text`` that is an object schema with properties, or None."""
    if "```json" not in text:
        return None
    for block in reversed(_FENCED_JSON.findall(text)):
        schema = _parse_schema_block(block)
        if schema is not None:
            return schema
    return None


@functools.lru_cache(maxsize=512)
def _parse_schema_block(block: str) -> Mapping[str, Any] | None:
    # Methods repeat the same schema block in every prompt; parsing it once per distinct text is enough.
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if (
        isinstance(value, dict)
        and value.get("type") == "object"
        and isinstance(value.get("properties"), dict)
    ):
        return value
    return None


def simulate_tool_calls(
    body: Mapping[str, Any], *, model: str, rounds_max: int, rng: random.Random
) -> list[dict[str, Any]] | None:
    """The tool calls a simulated model makes in answer to ``body``, in OpenAI wire shape, or None to answer.

    None when no tools are offered, ``tool_choice`` is "none" or ``rounds_max`` is 0. Otherwise the conversation
    plans a draw in [0, rounds_max] of rounds (seeded by the conversation up to its last user message, the model
    and ``seed``, so every round sees the same plan); while fewer assistant tool-call messages follow that user
    message (always, under "required" or a named function), 1–2 calls of the offered (or named) functions with
    arguments from `generate_arguments` and ids drawn from ``rng``.
    """
    choice = body.get("tool_choice")
    functions = _offered_functions(body.get("tools"))
    if isinstance(choice, dict):
        wanted = choice.get("function", {}).get("name") if isinstance(choice.get("function"), dict) else None
        functions = [f for f in functions if f["name"] == wanted]
    if not functions or choice == "none":
        return None
    forced = choice == "required" or isinstance(choice, dict)
    if not forced:
        if rounds_max <= 0:
            return None
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        last_user = max((i for i, m in enumerate(messages) if _role(m) == "user"), default=-1)
        rounds_done = sum(
            1 for m in messages[last_user + 1 :] if _role(m) == "assistant" and m.get("tool_calls")
        )
        plan_seed = answer_seed(messages[: last_user + 1], model, body.get("seed"))
        if rounds_done >= random.Random(plan_seed).randint(0, rounds_max):
            return None
    calls: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, _MAX_CALLS_PER_ROUND)):
        function = rng.choice(functions)
        arguments = generate_arguments(function.get("parameters"), rng)
        calls.append(
            {
                "id": f"call_{rng.getrandbits(64):016x}",
                "type": "function",
                "function": {
                    "name": function["name"],
                    "arguments": json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    return calls


def generate_arguments(parameters: Any, rng: random.Random) -> dict[str, Any]:
    """Arguments for a function whose ``parameters`` is an object schema: every required property, each optional
    one with probability 1/2, values by `generate_value`."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return {}
    required = parameters.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    generator = _Generator(parameters, rng)
    arguments: dict[str, Any] = {}
    for name, schema in properties.items():
        if name in required_names or rng.random() < _OPTIONAL_ARGUMENT_PROBABILITY:
            arguments[name] = generator.value(schema if isinstance(schema, dict) else {}, 1)
    return arguments


def tool_calls_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """The text a model generates for ``calls`` (names and arguments), whose tokens are its completion tokens."""
    return "".join(str(call["function"]["name"]) + str(call["function"]["arguments"]) for call in calls)


def tool_prompt_chars(body: Mapping[str, Any]) -> int:
    """Prompt characters beyond message texts: the offered tools' compact JSON and earlier tool calls' names and
    arguments (providers bill both as prompt tokens)."""
    chars = 0
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        chars += len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    chars += len(str(function.get("name", ""))) + len(str(function.get("arguments", "")))
    return chars


def _offered_functions(tools: Any) -> list[Mapping[str, Any]]:
    if not isinstance(tools, list):
        return []
    functions: list[Mapping[str, Any]] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            functions.append(function)
    return functions


def _role(message: Any) -> str:
    return str(message.get("role", "")) if isinstance(message, dict) else ""


def generate_value(schema: Mapping[str, Any], rng: random.Random) -> Any:
    """A value that satisfies ``schema``: the subset of JSON Schema that structured outputs use (enum, const,
    type lists, anyOf/oneOf/allOf, local $ref, bounds, lengths, item counts, uniqueItems over enums, nesting)."""
    return _Generator(schema, rng).value(schema, 0)


class _Generator:
    __slots__ = ("_rng", "_root")

    def __init__(self, root: Mapping[str, Any], rng: random.Random) -> None:
        self._root = root
        self._rng = rng

    def value(self, schema: Mapping[str, Any], depth: int) -> Any:
        if depth > _MAX_RECURSION:
            return (
                None  # a schema that refers to itself without end; a model would have to stop somewhere too
            )
        schema = self._resolve(schema)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return self._rng.choice(enum)
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                return self.value(self._pick_branch(branches), depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in all_of:
                if isinstance(part, dict):
                    merged.update(self._resolve(part))
            return self.value(merged, depth + 1)
        return self._typed(schema, self._pick_type(schema), depth)

    def _resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        seen = 0
        while isinstance(schema.get("$ref"), str) and seen < _MAX_DEPTH:
            target: Any = self._root
            for part in schema["$ref"].lstrip("#").strip("/").split("/"):
                if not part:
                    continue
                target = target.get(part) if isinstance(target, dict) else None
            if not isinstance(target, dict):
                return {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema

    def _pick_branch(self, branches: list[Any]) -> Mapping[str, Any]:
        candidates = [b for b in branches if isinstance(b, dict)]
        if not candidates:
            return {}
        non_null = [b for b in candidates if b.get("type") != "null"]
        if non_null and (len(non_null) == len(candidates) or self._rng.random() >= _NULL_PROBABILITY):
            return self._rng.choice(non_null)
        return self._rng.choice(candidates)

    def _pick_type(self, schema: Mapping[str, Any]) -> str:
        declared = schema.get("type")
        if isinstance(declared, str):
            return declared
        if isinstance(declared, list) and declared:
            non_null = [t for t in declared if t != "null"]
            if non_null and (len(non_null) == len(declared) or self._rng.random() >= _NULL_PROBABILITY):
                return str(self._rng.choice(non_null))
            return str(self._rng.choice(declared))
        if "properties" in schema:
            return "object"
        if "items" in schema:
            return "array"
        return "string"

    def _typed(self, schema: Mapping[str, Any], kind: str, depth: int) -> Any:
        if kind == "null":
            return None
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "object":
            return self._object(schema, depth)
        return self._string(schema)

    def _integer(self, schema: Mapping[str, Any]) -> int:
        low, high = _integer_bounds(schema)
        if low is None and high is None:
            low, high = 0, _DEFAULT_INT_SPAN
        elif low is None:
            assert high is not None
            low = min(0, high - _DEFAULT_INT_SPAN)
        elif high is None:
            high = low + _DEFAULT_INT_SPAN
        if high < low:  # an unsatisfiable range: stay at the lower bound rather than fail
            return low
        return self._rng.randint(low, high)

    def _number(self, schema: Mapping[str, Any]) -> float:
        low, high = _bounds(schema)
        if low is None and high is None:
            low, high = 0.0, 1.0
        elif low is None:
            assert high is not None
            low = high - 1.0
        elif high is None:
            high = low + 1.0
        value = round(self._rng.uniform(low, high), 3)
        # Rounding can land on an exclusive bound or just past an inclusive one; the midpoint is always valid.
        if not (low < value < high) and low < high:
            value = (low + high) / 2
        return value

    def _string(self, schema: Mapping[str, Any]) -> str:
        text = filler_sentence(self._rng)
        min_length = schema.get("minLength")
        max_length = schema.get("maxLength")
        if isinstance(min_length, int):
            while len(text) < min_length:
                text += " " + filler_sentence(self._rng)
        if isinstance(max_length, int) and len(text) > max_length:
            text = text[:max_length]
        return text

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        min_items = schema.get("minItems")
        max_items = schema.get("maxItems")
        low = min_items if isinstance(min_items, int) else 0
        high = max_items if isinstance(max_items, int) else max(low, _DEFAULT_MAX_ITEMS)
        if depth >= _MAX_DEPTH:
            high = low
        if not isinstance(min_items, int) and high >= 1 and low == 0:
            low = 1  # an open array gets at least one item, as a model answering the question would give
        items = schema.get("items")
        item_schema: Mapping[str, Any] = self._resolve(items) if isinstance(items, dict) else {}
        count = self._rng.randint(low, max(low, high))
        enum = item_schema.get("enum")
        if schema.get("uniqueItems") and isinstance(enum, list) and enum:
            return self._rng.sample(enum, min(len(enum), count))
        return [self.value(item_schema, depth + 1) for _ in range(count)]

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        result: dict[str, Any] = {}
        for name, sub_schema in properties.items():
            result[name] = self.value(sub_schema if isinstance(sub_schema, dict) else {}, depth + 1)
        return result


def _bounds(schema: Mapping[str, Any]) -> tuple[float | None, float | None]:
    low: float | None = None
    high: float | None = None
    for key in ("minimum", "exclusiveMinimum"):
        value = _number_field(schema, key)
        if value is not None:
            low = value if low is None else max(low, value)
    for key in ("maximum", "exclusiveMaximum"):
        value = _number_field(schema, key)
        if value is not None:
            high = value if high is None else min(high, value)
    return low, high


def _integer_bounds(schema: Mapping[str, Any]) -> tuple[int | None, int | None]:
    lows: list[int] = []
    highs: list[int] = []
    minimum, exclusive_minimum = _number_field(schema, "minimum"), _number_field(schema, "exclusiveMinimum")
    maximum, exclusive_maximum = _number_field(schema, "maximum"), _number_field(schema, "exclusiveMaximum")
    if minimum is not None:
        lows.append(math.ceil(minimum))
    if exclusive_minimum is not None:
        lows.append(math.floor(exclusive_minimum) + 1)
    if maximum is not None:
        highs.append(math.floor(maximum))
    if exclusive_maximum is not None:
        highs.append(math.ceil(exclusive_maximum) - 1)
    return (max(lows) if lows else None), (min(highs) if highs else None)


def _number_field(schema: Mapping[str, Any], key: str) -> float | None:
    # Draft-4 boolean exclusiveMinimum/Maximum are not numbers and are ignored.
    value = schema.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None
