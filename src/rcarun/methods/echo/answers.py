"""What an ECHO analyst answers (the JSON schema it is asked for) and the strict reading of that answer.

Every call asks for the same object (summary, agent evaluations, primary conclusion, alternatives), bounded to
the recorded agents and the whole log's steps. Reading never repairs: an answer that breaks a rule casts no
vote and is recorded with its problems (``docs/methods/echo.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from rcarun.data import Trajectory, parse_step

__all__ = [
    "CONCLUSION_TYPES",
    "AnswerReading",
    "Conclusion",
    "Evaluation",
    "answer_schema",
    "is_unit",
    "read_answer",
]

CONCLUSION_TYPES: tuple[str, ...] = ("single_agent", "multi_agent")


@dataclass(frozen=True, slots=True)
class Conclusion:
    """An analyst's primary conclusion, validated (agents recorded, step inside the log when read from an answer)."""

    type: str
    attribution: tuple[str, ...]
    mistake_step: int
    confidence: float
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One valid per-agent evaluation."""

    agent: str
    step_index: int
    error_likelihood: float


@dataclass(frozen=True, slots=True)
class AnswerReading:
    """What one analyst answer yields.

    Attributes:
        conclusion: the primary conclusion, None when the answer is malformed.
        evaluations: its valid agent evaluations (they count for the fallback even when ``conclusion`` is None).
        problems: why the answer is malformed (empty when it is well-formed).
        skipped: why individual agent evaluations were skipped.
        alternatives: the alternative hypotheses as answered (objects only), reported, never voted.
    """

    conclusion: Conclusion | None
    evaluations: tuple[Evaluation, ...] = ()
    problems: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    alternatives: tuple[Mapping[str, Any], ...] = ()


def is_unit(value: object) -> TypeGuard[float]:
    """A finite number in [0, 1], never a bool (a confidence or an error likelihood)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0.0 <= value <= 1.0
    )


def read_answer(answer: object, agents: Sequence[str], n_steps: int) -> AnswerReading:
    """Validate one analyst answer strictly (never repaired); the rules are in docs/methods/echo.md."""
    if not isinstance(answer, dict):
        return AnswerReading(None, problems=("the answer is not a JSON object",))
    problems: list[str] = []
    if not isinstance(answer.get("summary"), str):
        problems.append("summary is missing or not a string")
    if not isinstance(answer.get("alternative_hypotheses"), list):
        problems.append("alternative_hypotheses is missing or not an array")
    evaluations: list[Evaluation] = []
    skipped: list[str] = []
    raw_evaluations = answer.get("agent_evaluations")
    if not isinstance(raw_evaluations, list):
        problems.append("agent_evaluations is missing or not an array")
        raw_evaluations = []
    for position, entry in enumerate(raw_evaluations):
        read = _read_evaluation(entry, agents, n_steps)
        if isinstance(read, Evaluation):
            evaluations.append(read)
        else:
            skipped.append(f"agent_evaluations[{position}]: {read}")
    conclusion_problems: list[str] = []
    conclusion = _read_conclusion(answer.get("primary_conclusion"), agents, n_steps, conclusion_problems)
    problems.extend(conclusion_problems)
    raw_alternatives = answer.get("alternative_hypotheses")
    alternatives = (
        tuple(a for a in raw_alternatives if isinstance(a, dict))
        if isinstance(raw_alternatives, list)
        else ()
    )
    return AnswerReading(
        conclusion if not problems else None,
        tuple(evaluations),
        tuple(problems),
        tuple(skipped),
        alternatives,
    )


def _read_evaluation(entry: object, agents: Sequence[str], n_steps: int) -> Evaluation | str:
    """One agent evaluation, or why it is skipped."""
    if not isinstance(entry, dict):
        return "not an object"
    agent, likelihood = entry.get("agent"), entry.get("error_likelihood")
    if not isinstance(agent, str) or agent not in agents:
        return f"unknown agent {agent!r}"
    if not is_unit(likelihood):
        return f"error_likelihood {likelihood!r} is not a number in [0, 1]"
    step = parse_step(entry.get("step_index"))
    if step is None or not 0 <= step < n_steps:
        return f"step_index {entry.get('step_index')!r} is not a step of the log"
    return Evaluation(agent, step, float(likelihood))


def _read_conclusion(
    raw: object, agents: Sequence[str], n_steps: int, problems: list[str]
) -> Conclusion | None:
    if not isinstance(raw, dict):
        problems.append("primary_conclusion is missing or not an object")
        return None
    kind = raw.get("type")
    if kind not in CONCLUSION_TYPES:
        problems.append(f"primary_conclusion.type {kind!r} is not single_agent or multi_agent")
    attribution = raw.get("attribution")
    if not isinstance(attribution, list) or not attribution:
        problems.append("primary_conclusion.attribution is missing, empty or not an array")
    else:
        unknown = [name for name in attribution if not isinstance(name, str) or name not in agents]
        if unknown:
            problems.append(f"primary_conclusion.attribution names unrecorded agents {unknown!r}")
    step = parse_step(raw.get("mistake_step"))
    if step is None:
        problems.append(f"primary_conclusion.mistake_step {raw.get('mistake_step')!r} is not an integer")
    elif not 0 <= step < n_steps:
        problems.append(f"primary_conclusion.mistake_step {step} is outside [0, {n_steps})")
    confidence = raw.get("confidence")
    if not is_unit(confidence):
        problems.append(f"primary_conclusion.confidence {confidence!r} is not a number in [0, 1]")
    reasoning = raw.get("reasoning")
    if not isinstance(reasoning, str):
        problems.append("primary_conclusion.reasoning is missing or not a string")
    if problems or not (  # once `problems` is empty, the second test only narrows the types for the checker
        isinstance(kind, str)
        and isinstance(attribution, list)
        and step is not None
        and is_unit(confidence)
        and isinstance(reasoning, str)
    ):
        return None
    return Conclusion(
        type=kind,
        attribution=tuple(dict.fromkeys(attribution)),
        mistake_step=step,
        confidence=float(confidence),
        reasoning=reasoning,
    )


def answer_schema(trajectory: Trajectory) -> dict[str, Any]:
    """The analysts' answer schema: recorded agents as enums, the step range as integer bounds."""
    agent = {"type": "string", "enum": list(trajectory.agents)}
    step = {"type": "integer", "minimum": 0, "maximum": trajectory.n_steps - 1}
    unit = {"type": "number", "minimum": 0, "maximum": 1}
    conclusion = {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": list(CONCLUSION_TYPES)},
            "attribution": {"type": "array", "items": agent, "minItems": 1},
            "mistake_step": step,
            "confidence": unit,
            "reasoning": {"type": "string"},
        },
        "required": ["type", "attribution", "mistake_step", "confidence", "reasoning"],
        "additionalProperties": False,
    }
    evaluation = {
        "type": "object",
        "properties": {
            "agent": agent,
            "step_index": step,
            "error_likelihood": unit,
            "reasoning": {"type": "string"},
            "evidence": {"type": "string"},
        },
        "required": ["agent", "step_index", "error_likelihood", "reasoning", "evidence"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "summary": {"type": "string"},
            "agent_evaluations": {"type": "array", "items": evaluation},
            "primary_conclusion": conclusion,
            "alternative_hypotheses": {"type": "array", "items": conclusion, "maxItems": 3},
        },
        "required": ["summary", "agent_evaluations", "primary_conclusion", "alternative_hypotheses"],
        "additionalProperties": False,
    }
