"""The answers of RCTA's three LLM stages: the JSON schema each call is constrained by, and the typed values.

A schema allows what the stage may legally answer (the segment's own step ids, the recorded agents, the step
range); `readers` turns an answer into the values below. Fields and choices: ``docs/methods/rcta.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcarun.data import Trajectory

__all__ = [
    "CANDIDATE_TAGS",
    "CHAIN_ROLES",
    "CONFIDENCE_LEVELS",
    "FAILURE_CATEGORIES",
    "PHASE_RANGE",
    "SEVERITIES",
    "VERIFIER_RESULTS",
    "AttributionAnswer",
    "ChainNode",
    "Conflict",
    "DelegationTrace",
    "FailureSignal",
    "FieldError",
    "KeyEvent",
    "LocalSummary",
    "Outline",
    "Phase",
    "StepProposal",
    "SubPhase",
    "VerifierFinding",
    "attribution_schema",
    "fallback_outline",
    "local_summary_schema",
    "outline_schema",
    "scorable_agents",
]

# Candidate tags in the paper's priority order (App. H "Candidate ordering"); recovered_noise is a modifier.
CANDIDATE_TAGS: tuple[str, ...] = (
    "possible_manifestation",
    "possible_root",
    "terminal_context",
    "other",
    "recovered_noise",
)
VERIFIER_RESULTS: tuple[str, ...] = ("PASS", "FAIL", "UNKNOWN")
SEVERITIES: tuple[str, ...] = ("low", "medium", "high")
CHAIN_ROLES: tuple[str, ...] = ("root_cause", "propagation", "exposure", "terminal")
CONFIDENCE_LEVELS: tuple[str, ...] = ("high", "medium", "low")

# The release's 15-code failure taxonomy (release notes 3.9), with the group each code belongs to.
FAILURE_CATEGORIES: Mapping[str, str] = {
    **dict.fromkeys(("A1", "A2", "A3"), "task understanding"),
    **dict.fromkeys(("B1", "B2"), "reasoning"),
    **dict.fromkeys(("C1", "C2", "C3"), "planning / coordination"),
    **dict.fromkeys(("D1", "D2", "D3"), "execution / tool use"),
    **dict.fromkeys(("E1", "E2"), "verification / completion"),
    "X1": "under-specified or contradictory input",
    "X2": "unrecoverable environment",
}

_ENVIRONMENT = "environment"
_MAX_EVIDENCE = 10
PHASE_RANGE: tuple[int, int] = (3, 8)  # the phase count the outline prompt asks for (never enforced)


@dataclass(frozen=True, slots=True)
class FieldError:
    """A problem in an answer: its top-level field (``"agent"``, ``"phases"``), a message naming the path."""

    field: str
    message: str


# --- values -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyEvent:
    event: str
    step_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepProposal:
    """A step a local summary proposes as failure-relevant, as answered (tags deduplicated, unknown kept)."""

    step_id: int
    tags: tuple[str, ...]
    note: str


@dataclass(frozen=True, slots=True)
class VerifierFinding:
    step_ids: tuple[int, ...]
    result: str
    note: str


@dataclass(frozen=True, slots=True)
class LocalSummary:
    """One segment's local summary as answered; ``segment_id`` is the one asked for, not the answer's echo."""

    segment_id: int
    step_range: tuple[int, int] | None
    segment_goal: str
    key_events: tuple[KeyEvent, ...]
    proposals: tuple[StepProposal, ...]
    verifier_findings: tuple[VerifierFinding, ...]
    uncertainties: tuple[str, ...]
    errors: tuple[FieldError, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True)
class SubPhase:
    step_range: tuple[int, int] | None
    description: str


@dataclass(frozen=True, slots=True)
class FailureSignal:
    description: str
    step_ids: tuple[int, ...]
    severity: str


@dataclass(frozen=True, slots=True)
class Phase:
    phase_id: int | None
    step_range: tuple[int, int] | None
    phase_goal: str
    involved_agents: tuple[str, ...]
    sub_phases: tuple[SubPhase, ...]
    failure_signals: tuple[FailureSignal, ...]
    supporting_step_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Conflict:
    description: str
    segment_ids: tuple[int, ...]
    step_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Outline:
    """The trajectory outline; unless ``readable`` (phase objects found) `fallback_outline` replaces it.

    A phase count outside 3–8 is no error: `phase_count_in_range` records it.
    """

    phases: tuple[Phase, ...]
    conflicts: tuple[Conflict, ...]
    readable: bool
    fallback: bool = False
    errors: tuple[FieldError, ...] = ()

    @property
    def valid(self) -> bool:
        return self.readable and not self.errors

    @property
    def phase_count_in_range(self) -> bool:
        """The outline has the 3–8 phases its prompt asks for (recorded, never enforced)."""
        low, high = PHASE_RANGE
        return low <= len(self.phases) <= high


@dataclass(frozen=True, slots=True)
class DelegationTrace:
    """The model's check of the instruction behind its root (A3), as answered.

    ``faithful_implementation`` claims that the root's recipient faithfully carried out a flawed instruction,
    given by the handoff at ``prescribing_step``, from which ``quote`` is cited.
    """

    checked: bool
    faithful_implementation: bool
    prescribing_step: int | None
    quote: str
    defect_in_quote: str


@dataclass(frozen=True, slots=True)
class ChainNode:
    """One node of the explanatory failure chain; ``step`` None stands for the system evaluation."""

    step: int | None
    agent: str
    role: str
    description: str


@dataclass(frozen=True, slots=True)
class AttributionAnswer:
    """The final attribution as answered; a field is None when it is missing or of the wrong type.

    ``errors`` lists the structural problems found while reading (missing field, wrong type); range and
    consistency checks are A4's (`rcarun.methods.rcta.validate`).
    """

    agent: str | None
    step: int | None
    reason: str | None
    evidence_step_ids: tuple[int, ...] | None
    abstain: bool | None
    primary_category: str | None
    contributing_factors: tuple[str, ...] | None
    delegation_trace: DelegationTrace | None
    failure_chain: tuple[ChainNode, ...] | None
    counterfactual: str | None
    confidence: str | None
    errors: tuple[FieldError, ...] = ()


def fallback_outline(summaries: Sequence[LocalSummary]) -> Outline:
    """The outline used when the model's cannot be read: one phase per local summary, flagged ``fallback``.

    Each phase has the summary's id, range and goal, one sub-phase, no signals or supporting ids (release).
    """
    phases = tuple(
        Phase(
            phase_id=summary.segment_id,
            step_range=summary.step_range,
            phase_goal=summary.segment_goal or f"(segment {summary.segment_id}: no goal recorded)",
            involved_agents=(),
            sub_phases=(SubPhase(summary.step_range, summary.segment_goal),),
            failure_signals=(),
            supporting_step_ids=(),
        )
        for summary in summaries
    )
    return Outline(phases, (), readable=True, fallback=True)


# --- schemas ------------------------------------------------------------------------------------------------


def scorable_agents(trajectory: Trajectory) -> tuple[str, ...]:
    """The recorded agents an attribution may name: all of them except one literally called ENVIRONMENT."""
    return tuple(a for a in trajectory.agents if a.strip().casefold() != _ENVIRONMENT)


def _string(enum: Iterable[str] | None = None) -> dict[str, Any]:
    return {"type": "string"} if enum is None else {"type": "string", "enum": list(enum)}


def _ids(valid_ids: Sequence[int]) -> dict[str, Any]:
    return {"type": "integer", "enum": list(valid_ids)}


def _array(
    items: dict[str, Any], low: int | None = None, high: int | None = None, *, unique: bool = False
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": items}
    if low is not None:
        schema["minItems"] = low
    if high is not None:
        schema["maxItems"] = high
    if unique:
        schema["uniqueItems"] = True
    return schema


def _step(n_steps: int, *, nullable: bool = False) -> dict[str, Any]:
    return {"type": ["integer", "null"] if nullable else "integer", "minimum": 0, "maximum": n_steps - 1}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _range(low: int, high: int) -> dict[str, Any]:
    return _array({"type": "integer", "minimum": low, "maximum": high}, 2, 2)


def local_summary_schema(segment_id: int, valid_ids: Sequence[int]) -> dict[str, Any]:
    """The schema of one segment's local summary; ``valid_ids``: the segment's own steps, overlap excluded."""
    if not valid_ids:
        raise ValueError("a segment has at least one own step")
    tags = _array(_string(CANDIDATE_TAGS), 1, len(CANDIDATE_TAGS), unique=True)
    proposal = _object({"step_id": _ids(valid_ids), "tags": tags, "note": _string()})
    finding = _object(
        {"step_ids": _array(_ids(valid_ids), 1), "result": _string(VERIFIER_RESULTS), "note": _string()}
    )
    return _object(
        {
            "segment_id": {"type": "integer", "enum": [segment_id]},
            "step_range": _range(min(valid_ids), max(valid_ids)),
            "segment_goal": _string(),
            "key_events": _array(_object({"event": _string(), "step_ids": _array(_ids(valid_ids), 1)}), 3, 8),
            "proposed_steps": _array(proposal, 0),
            "verifier_findings": _array(finding, 0),
            "uncertainties": _array(_string(), 0),
        }
    )


def outline_schema(trajectory: Trajectory, segment_ids: Sequence[int]) -> dict[str, Any]:
    """The schema of the trajectory outline: at least one phase, no cap (the prompt asks for 3–8)."""
    last = trajectory.n_steps - 1
    step = _step(trajectory.n_steps)
    signal = _object({"description": _string(), "step_ids": _array(step, 1), "severity": _string(SEVERITIES)})
    phase = _object(
        {
            "phase_id": {"type": "integer", "minimum": 1},
            "step_range": _range(0, last),
            "phase_goal": _string(),
            "involved_agents": _array(_string(trajectory.agents), 1, unique=True),
            "sub_phases": _array(_object({"step_range": _range(0, last), "description": _string()}), 1),
            "failure_signals": _array(signal, 0),
            "supporting_step_ids": _array(step, 3, 10),
        }
    )
    conflict = _object(
        {
            "description": _string(),
            "segment_ids": _array({"type": "integer", "enum": list(segment_ids)}),
            "step_ids": _array(step),
        }
    )
    return _object({"phases": _array(phase, 1), "conflicts": _array(conflict, 0)})


def attribution_schema(trajectory: Trajectory) -> dict[str, Any]:
    """The schema of the final attribution: explicit role and step fields, evidence, and the analysis."""
    step = _step(trajectory.n_steps)
    trace = _object(
        {
            "checked": {"type": "boolean"},
            "faithful_implementation": {"type": "boolean"},
            "prescribing_step": _step(trajectory.n_steps, nullable=True),
            "quote": _string(),
            "defect_in_quote": _string(),
        }
    )
    node = _object(
        {
            "step": _step(trajectory.n_steps, nullable=True),
            "agent": _string(),
            "role": _string(CHAIN_ROLES),
            "description": _string(),
        }
    )
    return _object(
        {
            "root_cause": _object({"agent": _string(scorable_agents(trajectory)), "step": step}),
            "reason": _string(),
            "evidence_step_ids": _array(step, 0, _MAX_EVIDENCE),
            "abstain": {"type": "boolean"},
            "primary_category": _string(FAILURE_CATEGORIES),
            "contributing_factors": _array(_string(FAILURE_CATEGORIES), 0, unique=True),
            "analysis": _object(
                {
                    "delegation_trace": trace,
                    "failure_chain": _array(node, 2),
                    "counterfactual": _string(),
                    "confidence": _string(CONFIDENCE_LEVELS),
                }
            ),
        }
    )
