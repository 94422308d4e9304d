"""The answers of FALAT's two LLM stages: their JSON schemas and strict readers (stages 3 and 6).

Answers are read into frozen dataclasses without repair: an unusable locate answer is the documented last-step
fallback, a malformed verdict never counts as verified (``docs/methods/falat.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from rcarun.data import parse_step
from rcarun.methods.llm import Reply

__all__ = [
    "RAW_CHARS",
    "FailurePoint",
    "Verdict",
    "locate_schema",
    "parse_failure_point",
    "parse_verdict",
    "verify_schema",
]

_REASON_CHARS = 500  # reasons kept in the output: enough to read, small enough to keep output_json compact
RAW_CHARS = 300  # the head of an answer that is not JSON, kept in the output


@dataclass(frozen=True, slots=True)
class FailurePoint:
    """Where the failure becomes visible.

    Attributes:
        step: the step used by the walk.
        fallback: the answer was unusable and ``step`` is the last step.
        reason: the model's reason ("" on a fallback without one).
        answer: the parsed answer as given (None when it was not a JSON object).
        error: why the answer was unusable, when ``fallback``.
    """

    step: int
    fallback: bool
    reason: str = ""
    answer: Any = None
    error: str | None = None


def locate_schema(n_steps: int) -> dict[str, Any]:
    """The locate answer's schema: a reason, then the step where the failure is visible (inside the log)."""
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "failure_step": {"type": "integer", "minimum": 0, "maximum": n_steps - 1},
        },
        "required": ["reason", "failure_step"],
        "additionalProperties": False,
    }


def parse_failure_point(reply: Reply, n_steps: int) -> FailurePoint:
    """The locate answer, read strictly: an unusable ``failure_step`` gives the last step."""
    answer = reply.parsed if isinstance(reply.parsed, dict) else None
    last = n_steps - 1
    if answer is None:
        return FailurePoint(last, True, error=reply.parse_error or "the answer is not a JSON object")
    reason = answer.get("reason")
    reason_text = reason[:_REASON_CHARS] if isinstance(reason, str) else ""
    step = parse_step(answer.get("failure_step"))
    if step is None:
        return FailurePoint(last, True, reason_text, answer, "failure_step is missing or not an integer")
    if not 0 <= step < n_steps:
        return FailurePoint(last, True, reason_text, answer, f"failure_step {step} is outside [0, {last}]")
    return FailurePoint(step, False, reason_text, answer)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One verification answer.

    Attributes:
        step: the verified candidate.
        valid: the answer was a JSON object with a boolean ``is_source`` and a ``confidence`` in [0, 1].
        is_source: the answer's ``is_source`` (False when not ``valid``).
        confidence: the answer's ``confidence`` (None when not ``valid``).
        reason: the answer's reason, cut to 500 characters.
        error: why the answer is malformed, when not ``valid``.
        raw_text: the head of the answer's text, kept only when it was not JSON.
        finish_reason: the call's finish reason.
    """

    step: int
    valid: bool
    is_source: bool = False
    confidence: float | None = None
    reason: str = ""
    error: str | None = None
    raw_text: str | None = None
    finish_reason: str = "stop"


def verify_schema() -> dict[str, Any]:
    """The verify answer's schema: a reason, whether the candidate is the source, a confidence in [0, 1]."""
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "is_source": {"type": "boolean"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["reason", "is_source", "confidence"],
        "additionalProperties": False,
    }


def parse_verdict(step: int, reply: Reply) -> Verdict:
    """Read a verify answer strictly; a malformed one is a `Verdict` with ``valid=False`` (never repaired)."""
    answer = reply.parsed if isinstance(reply.parsed, dict) else None
    if answer is None:
        return Verdict(
            step,
            False,
            error=reply.parse_error or "the answer is not a JSON object",
            raw_text=reply.text[:RAW_CHARS],
            finish_reason=reply.finish_reason,
        )
    reason = answer.get("reason")
    reason_text = reason[:_REASON_CHARS] if isinstance(reason, str) else ""
    is_source = answer.get("is_source")
    confidence = answer.get("confidence")
    if not isinstance(is_source, bool):
        problem = "is_source is missing or not a boolean"
    elif not _is_number(confidence) or not 0 <= confidence <= 1:
        problem = "confidence is missing or not a number in [0, 1]"
    else:
        return Verdict(
            step, True, is_source, float(confidence), reason_text, finish_reason=reply.finish_reason
        )
    return Verdict(step, False, reason=reason_text, error=problem, finish_reason=reply.finish_reason)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
