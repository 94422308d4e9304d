"""Schema → answer generation: every drawn value obeys the schema, and only the schema is read."""

from __future__ import annotations

import json
import random
from typing import Any

from rcarun.mock import generate_value, schema_from_prompt, schema_from_request
from rcarun.mock.answers import answer_seed, count_text_tokens, filler_text

ATTRIBUTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "agent": {"type": "string", "enum": ["Orchestrator", "WebSurfer", "Coder"]},
        "step": {"type": "integer", "minimum": 3, "maximum": 9},
        "confidence": {"type": "number", "minimum": 0.25, "maximum": 0.75},
        "mistake": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 30},
        "suspects": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 4},
            "minItems": 2,
            "maxItems": 4,
        },
        "note": {"type": ["string", "null"]},
        "evidence": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "step": {"type": "integer", "minimum": 0, "maximum": 1},
                    "quote": {"type": "string"},
                },
                "required": ["step", "quote"],
            },
        },
    },
    "required": ["agent", "step", "confidence", "mistake", "reason", "suspects", "note", "evidence"],
}


def assert_attribution_valid(value: Any) -> None:
    assert isinstance(value, dict)
    assert set(ATTRIBUTION_SCHEMA["required"]) <= set(value)
    assert value["agent"] in ("Orchestrator", "WebSurfer", "Coder")
    assert isinstance(value["step"], int) and 3 <= value["step"] <= 9
    assert isinstance(value["confidence"], float) and 0.25 <= value["confidence"] <= 0.75
    assert isinstance(value["mistake"], bool)
    assert isinstance(value["reason"], str) and 0 < len(value["reason"]) <= 30
    assert 2 <= len(value["suspects"]) <= 4
    assert all(isinstance(s, int) and 0 <= s <= 4 for s in value["suspects"])
    assert value["note"] is None or isinstance(value["note"], str)
    assert 1 <= len(value["evidence"]) <= 2
    for item in value["evidence"]:
        assert item["step"] in (0, 1) and isinstance(item["quote"], str)


def test_generated_values_obey_enum_types_bounds_and_array_lengths() -> None:
    values = [generate_value(ATTRIBUTION_SCHEMA, random.Random(seed)) for seed in range(300)]
    for value in values:
        assert_attribution_valid(value)
    # Draws cover the space rather than sticking to one corner.
    assert {v["agent"] for v in values} == {"Orchestrator", "WebSurfer", "Coder"}
    assert {v["step"] for v in values} == set(range(3, 10))
    assert {len(v["suspects"]) for v in values} == {2, 3, 4}
    assert any(v["note"] is None for v in values) and any(v["note"] is not None for v in values)


def test_refs_unions_exclusive_bounds_and_unique_enum_items() -> None:
    schema = {
        "$defs": {"Role": {"type": "string", "enum": ["a", "b", "c", "d"]}},
        "type": "object",
        "properties": {
            "role": {"$ref": "#/$defs/Role"},
            "maybe_step": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 2}, {"type": "null"}]},
            "open_int": {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 7},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "roles": {"type": "array", "items": {"$ref": "#/$defs/Role"}, "uniqueItems": True, "minItems": 3},
            "fixed": {"const": 42},
        },
        "required": ["role", "maybe_step", "open_int", "ratio", "roles", "fixed"],
    }
    for seed in range(200):
        value = generate_value(schema, random.Random(seed))
        assert value["role"] in "abcd"
        assert value["maybe_step"] in (1, 2, None)
        assert value["open_int"] in (5, 6)
        assert 0 < value["ratio"] < 1
        assert len(value["roles"]) >= 3 and len(set(value["roles"])) == len(value["roles"])
        assert set(value["roles"]) <= set("abcd")
        assert value["fixed"] == 42


def test_the_same_seed_gives_the_same_value() -> None:
    first = generate_value(ATTRIBUTION_SCHEMA, random.Random(7))
    again = generate_value(ATTRIBUTION_SCHEMA, random.Random(7))
    assert first == again


def test_prompt_schema_is_the_last_fenced_object_schema_of_the_last_user_message() -> None:
    early = {"type": "object", "properties": {"early": {"type": "string"}}}
    late = {"type": "object", "properties": {"late": {"type": "integer"}}}
    not_a_schema = {"answer": 3}
    prompt = (
        f"Example:\n```json\n{json.dumps(early)}\n```\n"
        f"Reply with this schema:\n```json\n{json.dumps(late)}\n```\n"
        f"An example answer:\n```json\n{json.dumps(not_a_schema)}\n```\n"
        "and a broken one:\n```json\n{oops\n```"
    )
    assert schema_from_prompt(prompt) == late
    assert schema_from_prompt("no blocks here") is None

    body = {
        "messages": [
            {"role": "user", "content": f"```json\n{json.dumps(early)}\n```"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": prompt}]},
        ]
    }
    assert schema_from_request(body) == late


def test_response_format_schema_wins_over_the_prompt_block() -> None:
    in_prompt = {"type": "object", "properties": {"x": {"type": "string"}}}
    declared = {"type": "object", "properties": {"y": {"type": "integer"}}}
    body = {
        "messages": [{"role": "user", "content": f"```json\n{json.dumps(in_prompt)}\n```"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": declared}},
    }
    assert schema_from_request(body) == declared
    assert schema_from_request({"messages": [{"role": "user", "content": "plain"}]}) is None


def test_answer_seed_depends_on_messages_model_and_seed_only() -> None:
    messages = [{"role": "user", "content": "hello"}]
    base = answer_seed(messages, "m", None)
    assert base == answer_seed([{"role": "user", "content": "hello"}], "m", None)
    assert base != answer_seed([{"role": "user", "content": "hello!"}], "m", None)
    assert base != answer_seed([{"role": "system", "content": "hello"}], "m", None)
    assert base != answer_seed(messages, "other", None)
    assert base != answer_seed(messages, "m", 1)


def test_filler_text_has_exactly_the_requested_tokens() -> None:
    for chars_per_token in (4.0, 3.5, 1.0):
        for tokens in (1, 7, 250, 5000):
            text = filler_text(tokens, chars_per_token)
            assert count_text_tokens(text, chars_per_token) == tokens
    assert filler_text(0, 4.0) == ""


def test_a_self_referencing_schema_still_yields_a_finite_answer() -> None:
    schema = {"type": "object", "properties": {"label": {"type": "string"}, "next": {"$ref": "#"}}}
    value = generate_value(schema, random.Random(0))
    depth = 0
    while isinstance(value, dict):
        depth, value = depth + 1, value["next"]
    assert value is None and depth > 1
