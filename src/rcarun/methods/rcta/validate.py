"""A4, output and evidence validation: check the attribution field by field, retry once, keep what was valid.

RCTA's final answer names the responsible role and the root step in separate fields, with an explanatory chain
and cited handoff evidence beside them. A4 (LongRCA paper Sec. 4.2, App. H, App. L.1/L.3; summary App. E–F;
release notes 3.10) checks each field on its own so that one bad field costs only itself: invalid fields trigger
one retry carrying the validation feedback, valid fields are kept independently, and when the essential fields
stay missing the output abstains and is flagged. No LLM call happens here; the method module sends the retry.

Field checks (`validate_attribution`); every error names its field. Each check looks at its own field only (the
paper keeps role and step independent: Sec. 3.1, summary App. D "the selected step's emitter does not determine
the predicted role"), except where a rule below names the other field it reads:

- ``agent``: a string that is one of the trajectory's recorded agents, and never ENVIRONMENT (compared after
  trimming, case-insensitively, so a recorded agent literally called "environment" is not scorable either)
  (paper: summary App. E). The release also accepts SYSTEM/TOOL/PLATFORM/ENVIRONMENT/USER_INTENT_UNDERSPECIFIED;
  the paper does not, and wins.
- ``step``: an integer that is a step of the trajectory (paper: summary App. E). The reader reads a digit string
  as its integer and leaves out anything else (`rcarun.methods.rcta.schemas`). The release also accepts
  ``"system_evaluation"``; the paper allows the system evaluation only as an unscored terminal chain node.
- ``reason``, ``counterfactual``: strings.
- ``evidence_step_ids``: steps of the trajectory, at most 10, non-empty unless the answer abstains (release).
- ``abstain``: a boolean.
- ``primary_category``: one code of the failure taxonomy. ``contributing_factors``: valid codes, unique, not
  repeating the primary (release).
- ``delegation_trace`` (cited handoff evidence, textual provenance only): a cited ``prescribing_step`` must be a
  step of the trajectory that is a handoff step (a key of ``handoff_texts_by_step``), and a non-empty ``quote``
  cited from it must be grounded in that step's logged instruction text (``quote_grounded(quote, text)``). The
  paper checks "the provenance of cited handoff evidence" (Sec. 4.2; summary App. F); the release checks the
  quote only under a faithful claim — we check any quote that cites a handoff step. A faithful-implementation
  claim must cite a prescribing handoff step and a non-empty quote (release).
- ``failure_chain`` (explanatory-chain structure; the rules are the release's): at least one ``root_cause`` and
  one ``terminal`` node, roles from the enum, node steps inside the trajectory; a node without a step (the
  system evaluation) only in the ``terminal`` role (paper: summary App. E).
- ``confidence``: high/medium/low, and ``low`` when abstaining (release).
- ``consistency``: empty by default. The paper has no cross-field rule. The release's ones are available as a
  release-only option (``release_consistency_rules=True``, method option ``release_consistency_rules``), and
  then take part in validity (so in the retry) and in ``needs_review``, never in coverage: a
  faithful-implementation claim puts the root at the prescribing step (``step == prescribing_step``), names as
  agent a handoff form or the prescribing step's sender, and has primary category C1 or A2; a planner-class
  agent (`role_class`, handoff forms by their sender) points at a step whose speaker is planner-class and has no
  D*/E*/X* primary category (all release notes 3.10). Only fields that passed their own check take part.

Merging the two attempts (`merge_fields`), field-preserving (paper: summary App. E–F, "an invalid field does not
overwrite a valid one"): for every field the retry's value is used when it is valid, otherwise the first
attempt's when that is valid, otherwise the field is missing. When both are valid the retry wins: the release
replaces the first answer by the retry as a whole (release 3.10) and the paper only adds that an invalid field
never overwrites a valid one. So an invalid step in the retry never replaces a valid first step, and a valid
first role survives an invalid retry role. Under the release-only option the consistency rules are checked again
on the merged values (they may come from different attempts); a violation is flagged for review but, as in the
release's coercion ("the step is left as it is"), changes no value. If ``agent`` or ``step`` is still missing
the output abstains and is flagged (``needs_review``). Abstention is also whatever the model answered in the
field kept for ``abstain``; a model that abstains keeps the valid role and step it gave (release 3.12:
"abstaining outputs still carry whatever agent and step they have"), so scoring can count them or not. The
release's coercion (unknown agent → SYSTEM, clearing categories) is not used: the paper keeps invalid fields
invalid (release 3.13 item 8).

Coverage (paper App. L.1, L.3: "non-abstaining outputs that pass the validation checks for their condition.
These checks cover recorded role names, root-step validity, explanatory-chain structure, and cited handoff
evidence"): ``covered`` is exactly those four checks on the merged output — not abstaining, and ``agent``,
``step``, ``failure_chain`` and ``delegation_trace`` each valid in the attempt it was kept from
(`COVERAGE_CHECKS`; the method drops the ``delegation_trace`` check for the A3 control, as App. H says). The
other fields and the release-only consistency rules do not enter it. For the A4 control (no retry) call
``merge_fields(first)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    "validate_attribution",
]

FIELDS: tuple[str, ...] = (
    "agent",
    "step",
    "reason",
    "evidence_step_ids",
    "abstain",
    "primary_category",
    "contributing_factors",
    "delegation_trace",
    "failure_chain",
    "counterfactual",
    "confidence",
)
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
    """One attempt's answer with the verdict on each field.

    Attributes:
        answer: the answer as read.
        trajectory: the trajectory it was checked against (the merge re-checks consistency on it).
        checks: one `FieldCheck` per name in `FIELDS`, then one for ``consistency``.
        release_consistency_rules: the release-only cross-field rules were applied (module docstring).
    """

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
    """The attribution after A4: the fields kept, where each came from, and the flags.

    Attributes:
        agent: the responsible role (the prediction reads the role from here, never from the step's speaker).
        step: the root step.
        sources: for each name in `FIELDS`, ``"first"``/``"retry"`` for the attempt it came from, or None when
            no attempt had it valid (then the value is None).
        model_abstained: the kept ``abstain`` field said so.
        abstain: the model abstained or an essential field (agent, step) is missing.
        needs_review: an essential field is missing, a field stayed invalid, or (release-only rules) the merged
            fields are inconsistent.
        coverage_checks: each of App. L.1's four checks (`COVERAGE_CHECKS`) by name: whether it passed.
        covered: counts toward coverage: not abstaining and every check in ``coverage_checks`` passed.
        errors: what is still wrong: the missing fields' last errors and the merged consistency errors.
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
    """Check every field of one attribution answer (rules in the module docstring).

    Args:
        answer: the answer as read by `rcarun.methods.rcta.schemas.parse_attribution`.
        trajectory: the trajectory attributed.
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


def feedback_text(validation: Validation) -> str:
    """The note appended to the single retry: what failed, field by field (first 30 errors, as released)."""
    errors = validation.errors
    if not errors:
        return ""
    lines = [
        "Your previous answer did not pass validation. Answer again with the complete JSON object, "
        "correcting these problems (fields not listed were valid):"
    ]
    lines += [f"- {error}" for error in errors[:_MAX_FEEDBACK]]
    if len(errors) > _MAX_FEEDBACK:
        lines.append(f"- ... and {len(errors) - _MAX_FEEDBACK} more")
    return "\n".join(lines)


def merge_fields(first: Validation, retry: Validation | None = None) -> FinalFields:
    """Keep each field from the attempt where it is valid, the retry first (rules in the module docstring).

    Args:
        first: the validated first answer.
        retry: the validated retry, or None when no retry was made (first valid, or the A4 control).
    """
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
    return FinalFields(
        agent=values["agent"],
        step=values["step"],
        reason=values["reason"],
        evidence_step_ids=values["evidence_step_ids"],
        primary_category=values["primary_category"],
        contributing_factors=values["contributing_factors"],
        delegation_trace=values["delegation_trace"],
        failure_chain=values["failure_chain"],
        counterfactual=values["counterfactual"],
        confidence=values["confidence"],
        sources=sources,
        model_abstained=model_abstained,
        abstain=abstain,
        needs_review=essentials_missing or bool(missing_errors) or bool(consistency),
        coverage_checks=coverage_checks,
        covered=covered,
        errors=(*missing_errors, *(f"{CONSISTENCY}: {message}" for message in consistency)),
    )
