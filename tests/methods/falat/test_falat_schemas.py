"""FALAT's answers: the locate and verify schemas, and their strict readers (stages 3 and 6, no LLM)."""

from __future__ import annotations

import json

import pytest

from rcarun.methods import Reply
from rcarun.methods.falat import locate_schema, parse_failure_point, parse_verdict, verify_schema


def _reply(text: str, finish_reason: str = "stop") -> Reply:
    try:
        parsed, error = json.loads(text), None
    except json.JSONDecodeError as exc:
        parsed, error = None, str(exc)
    return Reply(text=text, parsed=parsed, parse_error=error, finish_reason=finish_reason)


def test_the_schemas_bound_what_may_be_answered() -> None:
    assert locate_schema(5) == {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "failure_step": {"type": "integer", "minimum": 0, "maximum": 4},
        },
        "required": ["reason", "failure_step"],
        "additionalProperties": False,
    }
    schema = verify_schema()
    assert schema["properties"] == {
        "reason": {"type": "string"},
        "is_source": {"type": "boolean"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    }
    assert schema["required"] == ["reason", "is_source", "confidence"]
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("text", "valid", "error"),
    [
        ('{"reason": "r", "is_source": true, "confidence": 1}', True, None),
        (
            '{"reason": "r", "is_source": "yes", "confidence": 0.9}',
            False,
            "is_source is missing or not a boolean",
        ),
        ('{"reason": "r", "is_source": true}', False, "confidence is missing or not a number in [0, 1]"),
        (
            '{"reason": "r", "is_source": true, "confidence": 1.5}',
            False,
            "confidence is missing or not a number in [0, 1]",
        ),
        (
            '{"reason": "r", "is_source": true, "confidence": true}',
            False,
            "confidence is missing or not a number in [0, 1]",
        ),
        ("[true, 0.9]", False, "the answer is not a JSON object"),
    ],
)
def test_verdicts_are_parsed_strictly(text: str, valid: bool, error: str | None) -> None:
    verdict = parse_verdict(3, _reply(text))
    assert (verdict.step, verdict.valid, verdict.error) == (3, valid, error)
    assert verdict.is_source is valid  # a malformed verdict never counts as a source
    assert verdict.confidence == (1.0 if valid else None)


def test_a_verdict_that_is_not_json_keeps_its_text() -> None:
    verdict = parse_verdict(2, _reply("Yes, step 2 is the source."))
    assert not verdict.valid and verdict.raw_text == "Yes, step 2 is the source."
    assert verdict.error is not None and "Expecting value" in verdict.error


def test_a_verdict_keeps_its_reason_cut_and_its_finish_reason() -> None:
    text = json.dumps({"reason": "w" * 600, "is_source": False, "confidence": 0})
    verdict = parse_verdict(1, _reply(text, finish_reason="length"))
    assert (verdict.valid, verdict.is_source, verdict.confidence) == (True, False, 0.0)
    assert verdict.reason == "w" * 500 and verdict.raw_text is None
    assert verdict.finish_reason == "length"
    # a malformed verdict keeps the reason it gave; a long non-JSON text is kept to its first 300 characters
    malformed = parse_verdict(1, _reply(json.dumps({"reason": "no", "is_source": None, "confidence": 0.5})))
    assert (malformed.valid, malformed.reason, malformed.raw_text) == (False, "no", None)
    assert parse_verdict(1, _reply("z" * 400)).raw_text == "z" * 300


@pytest.mark.parametrize(
    ("text", "step", "fallback", "error"),
    [
        ('{"reason": "total wrong", "failure_step": 2}', 2, False, None),
        ('{"reason": "r", "failure_step": 5}', 4, True, "failure_step 5 is outside [0, 4]"),
        ('{"reason": "r", "failure_step": -1}', 4, True, "failure_step -1 is outside [0, 4]"),
        ('{"reason": "r", "failure_step": "2"}', 2, False, None),  # a digit string, read as the scorer does
        ('{"reason": "r", "failure_step": "two"}', 4, True, "failure_step is missing or not an integer"),
        ('{"reason": "r", "failure_step": "2.0"}', 4, True, "failure_step is missing or not an integer"),
        ('{"reason": "r", "failure_step": true}', 4, True, "failure_step is missing or not an integer"),
        ('{"reason": "r"}', 4, True, "failure_step is missing or not an integer"),
        ('"step 2"', 4, True, "the answer is not a JSON object"),
    ],
)
def test_failure_point_falls_back_to_the_last_step(
    text: str, step: int, fallback: bool, error: str | None
) -> None:
    point = parse_failure_point(_reply(text), n_steps=5)
    assert (point.step, point.fallback, point.error) == (step, fallback, error)


def test_a_failure_point_keeps_the_answer_and_its_reason() -> None:
    point = parse_failure_point(_reply(json.dumps({"reason": "r" * 600, "failure_step": 9})), n_steps=5)
    assert (point.reason, point.answer) == ("r" * 500, {"reason": "r" * 600, "failure_step": 9})
    unreadable = parse_failure_point(_reply("step 3"), n_steps=5)
    assert (unreadable.reason, unreadable.answer) == ("", None)
    assert unreadable.error is not None and unreadable.error.startswith("Expecting value")
