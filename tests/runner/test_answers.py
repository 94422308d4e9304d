"""Reading the JSON answer out of what a model wrote: prose, thinking and fences around it are read, never repaired."""

from __future__ import annotations

import pytest

from rcarun.runner import parse_json_answer

SCHEMA = {
    "type": "object",
    "properties": {"responsible_role": {"type": "string"}, "root_step": {"type": "integer"}},
    "required": ["responsible_role", "root_step"],
}
ANSWER = {"responsible_role": "Planner", "root_step": 3}


@pytest.mark.parametrize(
    "text",
    [
        '{"responsible_role": "Planner", "root_step": 3}',
        'Here is my answer: {"responsible_role": "Planner", "root_step": 3}',
        '<think>the planner misread step {2}; maybe {"root_step": 1}?</think>\n'
        '{"responsible_role": "Planner", "root_step": 3}',
        'Sure.\n```json\n{"responsible_role": "Planner", "root_step": 3}\n```\nHope it helps {x}.',
        '{"draft": true} then, on reflection: {"responsible_role": "Planner", "root_step": 3} (final)',
    ],
    ids=["bare", "prose-before", "thinking-before", "fenced-among-prose", "last-of-two"],
)
def test_the_answer_is_read_wherever_the_model_put_it(text: str) -> None:
    assert parse_json_answer(text, SCHEMA) == (ANSWER, None)


def test_the_outermost_object_is_read_when_objects_nest() -> None:
    text = 'Answer: {"responsible_role": "Planner", "root_step": 3, "evidence": {"step": 3, "quote": "x"}}'
    parsed, error = parse_json_answer(text, SCHEMA)
    assert error is None and parsed["evidence"] == {"step": 3, "quote": "x"}


def test_an_object_with_the_fields_but_a_wrong_type_is_read_as_written_not_coerced() -> None:
    parsed, error = parse_json_answer('My answer: {"responsible_role": "Planner", "root_step": "3"}', SCHEMA)
    assert error is None and parsed["root_step"] == "3"  # the method marks the step invalid, as for bare JSON


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("I don't know the answer to that.", "not JSON"),
        ('Partial: {"responsible_role": "Planner"}', "no JSON object in the text has the requested fields"),
        (
            '<think>{"responsible_role": "Planner", "root_step": 3} but let me check',
            "no answer after the thinking",
        ),
        ("", "empty answer"),
    ],
    ids=["prose-only", "fields-missing", "cut-in-thinking", "empty"],
)
def test_no_answer_is_made_up(text: str, why: str) -> None:
    parsed, error = parse_json_answer(text, SCHEMA)
    assert parsed is None and error is not None and why in error


def test_an_escaped_lone_surrogate_becomes_a_replacement_character() -> None:
    parsed, error = parse_json_answer('{"responsible_role": "Plan\\ud800", "root_step": 3}', SCHEMA)
    assert error is None and parsed["responsible_role"] == "Plan\ufffd"
    parsed["responsible_role"].encode("utf-8")  # storable
