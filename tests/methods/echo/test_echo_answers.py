"""ECHO's answer schema and the strict reading of an analyst's answer (never repaired)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.echo import Conclusion, Evaluation, answer_schema, read_answer

AGENTS = ("Planner", "Coder", "Computer_terminal")


def _plain(n: int) -> Trajectory:
    steps = tuple(
        Step(index=i, agent=AGENTS[i % 3], role="assistant", content=f"Step {i} says hello.")
        for i in range(n)
    )
    return Trajectory(qid="demo/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def _answer(
    kind: str = "single_agent",
    attribution: Sequence[Any] = ("Coder",),
    step: Any = 4,
    confidence: Any = 0.8,
    evaluations: Sequence[dict[str, Any]] = (),
) -> str:
    return json.dumps(
        {
            "summary": "it failed",
            "agent_evaluations": list(evaluations),
            "primary_conclusion": {
                "type": kind,
                "attribution": list(attribution),
                "mistake_step": step,
                "confidence": confidence,
                "reasoning": f"{kind} {list(attribution)} at {step}",
            },
            "alternative_hypotheses": [],
        }
    )


def test_schema_carries_agent_enums_and_step_bounds() -> None:
    schema = answer_schema(_plain(7))
    conclusion = schema["properties"]["primary_conclusion"]
    assert conclusion["properties"]["attribution"]["items"]["enum"] == list(AGENTS)
    assert conclusion["properties"]["mistake_step"] == {"type": "integer", "minimum": 0, "maximum": 6}
    assert conclusion["properties"]["type"]["enum"] == ["single_agent", "multi_agent"]
    evaluation = schema["properties"]["agent_evaluations"]["items"]
    assert evaluation["properties"]["error_likelihood"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert evaluation["properties"]["step_index"]["maximum"] == 6
    assert set(schema["required"]) == {
        "summary",
        "agent_evaluations",
        "primary_conclusion",
        "alternative_hypotheses",
    }


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("just text", "not a JSON object"),
        ([1, 2], "not a JSON object"),
        ({"agent_evaluations": [], "alternative_hypotheses": []}, "summary"),
        ({"summary": "", "alternative_hypotheses": [], "primary_conclusion": None}, "agent_evaluations"),
        ({"type": "single_agent", "attribution": ["Nobody"]}, "unrecorded agents ['Nobody']"),
        ({"type": "single_agent", "attribution": []}, "attribution is missing, empty"),
        ({"type": "everyone"}, "type 'everyone'"),
        ({"mistake_step": 9}, "mistake_step 9 is outside [0, 9)"),
        ({"mistake_step": -1}, "mistake_step -1 is outside"),
        ({"mistake_step": "four"}, "mistake_step 'four' is not an integer"),
        ({"mistake_step": "4.0"}, "mistake_step '4.0' is not an integer"),
        ({"mistake_step": "9"}, "mistake_step 9 is outside [0, 9)"),  # read as a step, then out of range
        ({"mistake_step": True}, "mistake_step True is not an integer"),
        ({"mistake_step": 4.0}, "mistake_step 4.0 is not an integer"),
        ({"confidence": 1.5}, "confidence 1.5 is not a number"),
        ({"confidence": "high"}, "confidence 'high'"),
        ({"reasoning": None}, "reasoning is missing"),
    ],
)
def test_malformed_answers_are_not_repaired(answer: Any, problem: str) -> None:
    if isinstance(answer, dict) and "summary" not in answer and "agent_evaluations" not in answer:
        base = json.loads(_answer())
        base["primary_conclusion"].update(answer)
        answer = base
    reading = read_answer(answer, AGENTS, 9)
    assert reading.conclusion is None
    assert any(problem in p for p in reading.problems), reading.problems


def test_well_formed_answer_and_skipped_evaluations() -> None:
    evaluations = [
        {"agent": "Coder", "step_index": 4, "error_likelihood": 0.9, "reasoning": "", "evidence": ""},
        {"agent": "Nobody", "step_index": 4, "error_likelihood": 0.9, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": 12, "error_likelihood": 0.2, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": 1, "error_likelihood": 2, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": 1, "error_likelihood": 0, "reasoning": "", "evidence": ""},
    ]
    reading = read_answer(
        json.loads(_answer(attribution=["Coder", "Coder"], evaluations=evaluations)), AGENTS, 9
    )
    assert reading.problems == ()
    assert reading.conclusion == Conclusion(
        "single_agent", ("Coder",), 4, 0.8, "single_agent ['Coder', 'Coder'] at 4"
    )
    assert reading.evaluations == (Evaluation("Coder", 4, 0.9), Evaluation("Planner", 1, 0.0))
    assert [s.split(":")[0] for s in reading.skipped] == [
        "agent_evaluations[1]",
        "agent_evaluations[2]",
        "agent_evaluations[3]",
    ]


def test_digit_string_steps_are_read_as_integers_as_the_scorer_reads_them() -> None:
    evaluations = [
        {"agent": "Coder", "step_index": "4", "error_likelihood": 0.9, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": " 1 ", "error_likelihood": 0.2, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": "one", "error_likelihood": 0.2, "reasoning": "", "evidence": ""},
    ]
    reading = read_answer(json.loads(_answer(step="4", evaluations=evaluations)), AGENTS, 9)
    assert reading.problems == ()
    assert reading.conclusion is not None and reading.conclusion.mistake_step == 4
    assert reading.evaluations == (Evaluation("Coder", 4, 0.9), Evaluation("Planner", 1, 0.2))
    assert reading.skipped == ("agent_evaluations[2]: step_index 'one' is not a step of the log",)
