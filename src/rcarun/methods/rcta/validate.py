"""A4, output and evidence validation: check the attribution field by field, retry once, keep what was valid.

One bad field costs only itself: invalid fields trigger one retry with feedback, valid fields are kept per
field, and missing essential fields make the output abstain. No LLM call happens here. The checks, the merge
and coverage: ``docs/methods/rcta.md`` ("A4").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from rcarun.data import Trajectory, parse_handoff

from .roles import role_class, sender_name
from .schemas import (
    CHAIN_ROLES,
    CONFIDENCE_LEVELS,
    FAILURE_CATEGORIES,
    AttributionAnswer,
    ChainNode,
    DelegationTrace,
)

__all__ = [
    "CONSISTENCY",
    "COVERAGE_CHECKS",
    "COVERAGE_FIELDS",
    "ESSENTIAL_FIELDS",
    "FIELDS",
    "FieldCheck",
    "FinalFields",
    "Validation",
    "feedback_text",
    "merge_fields",
    "retry_feedback",
    "validate_attribution",
]

# The answer's fields in `AttributionAnswer`'s order, each checked on its own.
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(AttributionAnswer) if f.name != "errors")
CONSISTENCY = "consistency"
ESSENTIAL_FIELDS: tuple[str, ...] = ("agent", "step")
# App. L.1's four coverage checks, by name, and the field each reads.
COVERAGE_CHECKS: Mapping[str, str] = {
    "recorded_role": "agent",
    "root_step": "step",
    "chain_structure": "failure_chain",
    "handoff_evidence": "delegation_trace",
}
COVERAGE_FIELDS: tuple[str, ...] = tuple(COVERAGE_CHECKS.values())
_MAX_EVIDENCE = 10
_MAX_FEEDBACK = 30  # the release appends the first 30 errors to the root-cause retry
_FAITHFUL_CATEGORIES = ("C1", "A2")
_PLANNER_FORBIDDEN_PREFIXES = ("D", "E", "X")

QuoteGrounded = Callable[[str, str], bool]


@dataclass(frozen=True, slots=True)
class FieldCheck:
    """The verdict on one field (or on ``consistency``): valid when it has no errors."""

    name: str
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.errors


@dataclass(frozen=True, slots=True)
class Validation:
    """One attempt's answer with one `FieldCheck` per name in `FIELDS`, then one for ``consistency``."""

    answer: AttributionAnswer
    trajectory: Trajectory
    checks: tuple[FieldCheck, ...]
    release_consistency_rules: bool = False

    def check(self, name: str) -> FieldCheck:
        for item in self.checks:
            if item.name == name:
                return item
        raise KeyError(name)

    def is_valid(self, name: str) -> bool:
        return self.check(name).valid

    @property
    def valid(self) -> bool:
        """Every field passes (and the consistency rules, when applied): no retry is needed."""
        return all(item.valid for item in self.checks)

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(f"{item.name}: {message}" for item in self.checks for message in item.errors)


Source = Literal["first", "retry"]


@dataclass(frozen=True, slots=True)
class FinalFields:
    """The attribution after A4: the fields kept, the attempt each came from (``sources``), and the flags.

    A field no attempt had valid is None with source None. ``abstain``: the model abstained or agent or step
    is missing; ``covered``: not abstaining and each of App. L.1's four ``coverage_checks`` passed;
    ``errors``: the missing fields' last errors and the merged consistency errors.
    """

    agent: str | None
    step: int | None
    reason: str | None
    evidence_step_ids: tuple[int, ...] | None
    primary_category: str | None
    contributing_factors: tuple[str, ...] | None
    delegation_trace: DelegationTrace | None
    failure_chain: tuple[ChainNode, ...] | None
    counterfactual: str | None
    confidence: str | None
    sources: Mapping[str, Source | None]
    model_abstained: bool
    abstain: bool
    needs_review: bool
    coverage_checks: Mapping[str, bool]
    covered: bool
    errors: tuple[str, ...]


def _is_environment(agent: str) -> bool:
    return agent.strip().casefold() == "environment"


def _in_trajectory(step: int, trajectory: Trajectory) -> bool:
    return 0 <= step < trajectory.n_steps


def _check_agent(answer: AttributionAnswer, trajectory: Trajectory) -> list[str]:
    agent = answer.agent
    if agent is None:
        return []  # the reader's error says why
    if _is_environment(agent):
        return [
            f"root_cause.agent: {agent!r} is not a scorable role (ENVIRONMENT is never a responsible role)"
        ]
    if agent not in trajectory.agents:
        return [f"root_cause.agent: {agent!r} is not a recorded agent of this trajectory"]
    return []


def _check_step(answer: AttributionAnswer, trajectory: Trajectory) -> list[str]:
    if answer.step is None or _in_trajectory(answer.step, trajectory):
        return []
    return [f"root_cause.step: {answer.step} is not a step of this trajectory (0..{trajectory.n_steps - 1})"]


def _check_evidence(answer: AttributionAnswer, trajectory: Trajectory) -> list[str]:
    ids = answer.evidence_step_ids
    if ids is None:
        return []
    errors = []
    outside = sorted({i for i in ids if not _in_trajectory(i, trajectory)})
    if outside:
        errors.append(f"evidence_step_ids: {outside[:10]} are not steps of this trajectory")
    if len(ids) > _MAX_EVIDENCE:
        errors.append(f"evidence_step_ids: at most {_MAX_EVIDENCE} ids, got {len(ids)}")
    if not ids and answer.abstain is not True:
        errors.append("evidence_step_ids: empty, but the answer does not abstain")
    return errors


def _check_categories(answer: AttributionAnswer) -> tuple[list[str], list[str]]:
    primary_errors = []
    if answer.primary_category is not None and answer.primary_category not in FAILURE_CATEGORIES:
        primary_errors.append(f"primary_category: {answer.primary_category!r} is not a taxonomy code")
    factor_errors = []
    factors = answer.contributing_factors
    if factors is not None:
        unknown = [f for f in factors if f not in FAILURE_CATEGORIES]
        if unknown:
            factor_errors.append(f"contributing_factors: {unknown!r} are not taxonomy codes")
        if len(set(factors)) != len(factors):
            factor_errors.append("contributing_factors: codes repeat")
        if answer.primary_category is not None and answer.primary_category in factors:
            factor_errors.append("contributing_factors: repeats the primary category")
    return primary_errors, factor_errors


def _check_trace(
    trace: DelegationTrace | None,
    trajectory: Trajectory,
    handoff_texts_by_step: Mapping[int, str],
    quote_grounded: QuoteGrounded,
) -> list[str]:
    if trace is None:
        return []
    path = "analysis.delegation_trace"
    errors = []
    cited = trace.prescribing_step
    handoff_text: str | None = None
    if cited is not None:
        if not _in_trajectory(cited, trajectory):
            errors.append(f"{path}.prescribing_step: {cited} is not a step of this trajectory")
        elif cited not in handoff_texts_by_step:
            errors.append(f"{path}.prescribing_step: step {cited} is not a handoff step")
        else:
            handoff_text = handoff_texts_by_step[cited]
    if handoff_text is not None and trace.quote.strip() and not quote_grounded(trace.quote, handoff_text):
        errors.append(f"{path}.quote: not found in the logged instruction of handoff step {cited}")
    if trace.faithful_implementation:
        if cited is None:
            errors.append(f"{path}: a faithful-implementation claim must cite its prescribing handoff step")
        if not trace.quote.strip():
            errors.append(f"{path}.quote: a faithful-implementation claim must quote the handoff instruction")
    return errors


def _check_chain(answer: AttributionAnswer, trajectory: Trajectory) -> list[str]:
    chain = answer.failure_chain
    if chain is None:
        return []
    errors = []
    for position, node in enumerate(chain):
        path = f"analysis.failure_chain[{position}]"
        if node.role not in CHAIN_ROLES:
            errors.append(f"{path}.role: {node.role!r} is not one of {', '.join(CHAIN_ROLES)}")
        if node.step is None:
            if node.role != "terminal":
                errors.append(f"{path}.step: only a terminal node may stand for the system evaluation (null)")
        elif not _in_trajectory(node.step, trajectory):
            errors.append(f"{path}.step: {node.step} is not a step of this trajectory")
    roles = {node.role for node in chain}
    for needed in ("root_cause", "terminal"):
        if needed not in roles:
            errors.append(f"analysis.failure_chain: no {needed} node")
    return errors


def _check_confidence(answer: AttributionAnswer) -> list[str]:
    confidence = answer.confidence
    if confidence is None:
        return []
    if confidence not in CONFIDENCE_LEVELS:
        return [f"analysis.confidence: {confidence!r} is not one of {', '.join(CONFIDENCE_LEVELS)}"]
    if answer.abstain is True and confidence != "low":
        return ["analysis.confidence: must be low when abstaining"]
    return []


def _consistency_errors(
    *,
    agent: str | None,
    step: int | None,
    category: str | None,
    trace: DelegationTrace | None,
    trajectory: Trajectory,
) -> list[str]:
    """The release's cross-field rules over values that each passed their own check (None = not available)."""
    errors = []
    planner_agent = agent is not None and role_class(agent) == "planner"
    if planner_agent and step is not None:
        speaker = trajectory.steps[step].agent
        if role_class(speaker) != "planner":
            errors.append(
                f"the planner-class agent {agent!r} must point at a planner-class step; "
                f"step {step} is spoken by {speaker!r} ({role_class(speaker)})"
            )
    if planner_agent and category is not None and category.startswith(_PLANNER_FORBIDDEN_PREFIXES):
        errors.append(
            f"the planner-class agent {agent!r} cannot have a D*/E*/X* primary category ({category})"
        )
    if trace is not None and trace.faithful_implementation and trace.prescribing_step is not None:
        prescribing = trace.prescribing_step
        if step is not None and step != prescribing:
            errors.append(
                f"a faithful-implementation claim puts the root at its prescribing handoff step {prescribing}, "
                f"but root_cause.step is {step}"
            )
        if agent is not None and _in_trajectory(prescribing, trajectory):
            delegate_sender = sender_name(trajectory.steps[prescribing].agent)
            if parse_handoff(agent) is None and agent != delegate_sender:
                errors.append(
                    f"a faithful-implementation claim blames the instruction: root_cause.agent must be a handoff "
                    f"form or the sender {delegate_sender!r} of step {prescribing}, not {agent!r}"
                )
        if category is not None and category not in _FAITHFUL_CATEGORIES:
            errors.append(f"a faithful-implementation claim needs primary category C1 or A2, not {category}")
    return errors


def validate_attribution(
    answer: AttributionAnswer,
    trajectory: Trajectory,
    *,
    handoff_texts_by_step: Mapping[int, str],
    quote_grounded: QuoteGrounded,
    release_consistency_rules: bool = False,
) -> Validation:
    """Check every field of one attribution answer (docs/methods/rcta.md).

    Args:
        handoff_texts_by_step: the logged instruction text of every handoff step, by step id.
        quote_grounded: ``quote_grounded(quote, source)`` decides whether a quote is grounded in a text.
        release_consistency_rules: also apply the release's cross-field rules (off: the paper has none).
    """
    found: dict[str, list[str]] = {name: [] for name in (*FIELDS, CONSISTENCY)}
    for error in answer.errors:
        found.setdefault(error.field, []).append(error.message)
    found["agent"] += _check_agent(answer, trajectory)
    found["step"] += _check_step(answer, trajectory)
    found["evidence_step_ids"] += _check_evidence(answer, trajectory)
    primary_errors, factor_errors = _check_categories(answer)
    found["primary_category"] += primary_errors
    found["contributing_factors"] += factor_errors
    found["delegation_trace"] += _check_trace(
        answer.delegation_trace, trajectory, handoff_texts_by_step, quote_grounded
    )
    found["failure_chain"] += _check_chain(answer, trajectory)
    found["confidence"] += _check_confidence(answer)

    def usable(name: str) -> bool:
        return not found[name]

    if release_consistency_rules:
        found[CONSISTENCY] += _consistency_errors(
            agent=answer.agent if usable("agent") else None,
            step=answer.step if usable("step") else None,
            category=answer.primary_category if usable("primary_category") else None,
            trace=answer.delegation_trace if usable("delegation_trace") else None,
            trajectory=trajectory,
        )
    # Reader errors filed under a name outside FIELDS (none today) still block validity, as consistency.
    extra = [m for name, messages in found.items() if name not in (*FIELDS, CONSISTENCY) for m in messages]
    found[CONSISTENCY] += extra
    checks = tuple(FieldCheck(name, tuple(found[name])) for name in (*FIELDS, CONSISTENCY))
    return Validation(
        answer=answer,
        trajectory=trajectory,
        checks=checks,
        release_consistency_rules=release_consistency_rules,
    )


def retry_feedback(errors: Sequence[str], *, limit: int, note: str = "") -> str:
    """The note appended to any stage's validation retry: the first ``limit`` errors, one a line (release)."""
    lines = [
        "Your previous answer did not pass validation. Answer again with the complete JSON object, "
        f"correcting these problems{note}:"
    ]
    lines += [f"- {error}" for error in errors[:limit]]
    if len(errors) > limit:
        lines.append(f"- ... and {len(errors) - limit} more")
    return "\n".join(lines)


def feedback_text(validation: Validation) -> str:
    """The note appended to the attribution's single retry: what failed, field by field (first 30 errors)."""
    errors = validation.errors
    return (
        retry_feedback(errors, limit=_MAX_FEEDBACK, note=" (fields not listed were valid)") if errors else ""
    )


def merge_fields(first: Validation, retry: Validation | None = None) -> FinalFields:
    """Keep each field from the attempt where it is valid, the retry first; ``retry`` None: none was sent."""
    values: dict[str, Any] = {}
    sources: dict[str, Source | None] = {}
    missing_errors: list[str] = []
    for name in FIELDS:
        if retry is not None and retry.is_valid(name):
            values[name], sources[name] = getattr(retry.answer, name), "retry"
        elif first.is_valid(name):
            values[name], sources[name] = getattr(first.answer, name), "first"
        else:
            values[name], sources[name] = None, None
            last = retry if retry is not None else first
            missing_errors += [f"{name}: {message}" for message in last.check(name).errors]
    consistency = (
        _consistency_errors(
            agent=values["agent"],
            step=values["step"],
            category=values["primary_category"],
            trace=values["delegation_trace"],
            trajectory=first.trajectory,
        )
        if first.release_consistency_rules
        else []
    )
    essentials_missing = any(values[name] is None for name in ESSENTIAL_FIELDS)
    model_abstained = values["abstain"] is True
    abstain = model_abstained or essentials_missing
    coverage_checks = {check: sources[name] is not None for check, name in COVERAGE_CHECKS.items()}
    covered = not abstain and all(coverage_checks.values())
    del values["abstain"]  # kept as model_abstained
    return FinalFields(
        **values,
        sources=sources,
        model_abstained=model_abstained,
        abstain=abstain,
        needs_review=essentials_missing or bool(missing_errors) or bool(consistency),
        coverage_checks=coverage_checks,
        covered=covered,
        errors=(*missing_errors, *(f"{CONSISTENCY}: {message}" for message in consistency)),
    )
