"""RCTA A4: each validation rule both ways, the single-retry feedback, the field-preserving merge, coverage (App.
L.1's four checks) and the release-only cross-field rules (off by default: the paper keeps role and step
independent)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.rcta.readers import parse_attribution
from rcarun.methods.rcta.validate import (
    COVERAGE_CHECKS,
    Validation,
    feedback_text,
    merge_fields,
    validate_attribution,
)

INSTRUCTION = "Edit parse_config so that it reads the timeout from TIMEOUT_SECONDS, in minutes."
STEPS = (
    ("human", "user", "Fix the timeout bug."),
    ("DiagnostAgent (-> ActionAgent)", "assistant", INSTRUCTION),
    ("ActionAgent", "assistant", "Edited parse_config as planned."),
    ("Computer_terminal", "user", "exit code 1"),
    ("DiagnostAgent", "assistant", "Plan: rerun the tests."),
    ("JudgeAgent", "assistant", "FAIL"),
    ("ENVIRONMENT", "user", "sandbox restarted"),
)
TRAJECTORY = Trajectory(
    "swe__001",
    "test",
    "task",
    tuple(Step(i, agent, role, content) for i, (agent, role, content) in enumerate(STEPS)),
    "0" * 64,
)
HANDOFFS = {1: INSTRUCTION}


def _grounded(quote: str, source: str) -> bool:
    return quote.lower() in source.lower()


def _answer(**changes: Any) -> dict[str, Any]:
    """A valid answer (executor root at step 2), with top-level keys, ``agent``/``step`` or analysis keys changed."""
    answer: dict[str, Any] = {
        "root_cause": {"agent": "ActionAgent", "step": 2},
        "reason": "The executor broke the config parser.",
        "evidence_step_ids": [2, 3],
        "abstain": False,
        "primary_category": "D1",
        "contributing_factors": ["E1"],
        "analysis": {
            "delegation_trace": {
                "checked": True,
                "faithful_implementation": False,
                "prescribing_step": 1,
                "quote": "reads the timeout from TIMEOUT_SECONDS",
                "defect_in_quote": "",
            },
            "failure_chain": [
                {"step": 2, "agent": "ActionAgent", "role": "root_cause", "description": "bad edit"},
                {"step": 3, "agent": "Computer_terminal", "role": "exposure", "description": "tests fail"},
                {"step": None, "agent": "system", "role": "terminal", "description": "evaluation fails"},
            ],
            "counterfactual": "A correct edit passes.",
            "confidence": "medium",
        },
    }
    for key, value in changes.items():
        if key in ("agent", "step"):
            answer["root_cause"][key] = value
        elif key in ("delegation_trace", "failure_chain", "counterfactual", "confidence"):
            answer["analysis"][key] = value
        else:
            answer[key] = value
    return answer


def _trace(**changes: Any) -> dict[str, Any]:
    trace = copy.deepcopy(_answer()["analysis"]["delegation_trace"])
    trace.update(changes)
    return trace


def _validate(answer: object, *, release: bool = False) -> Validation:
    return validate_attribution(
        parse_attribution(answer),
        TRAJECTORY,
        handoff_texts_by_step=HANDOFFS,
        quote_grounded=_grounded,
        release_consistency_rules=release,
    )


def _invalid_fields(validation: Validation) -> set[str]:
    return {check.name for check in validation.checks if not check.valid}


def test_the_reference_answer_is_valid_and_covered() -> None:
    validation = _validate(_answer())
    assert validation.valid, validation.errors
    final = merge_fields(validation)
    assert (final.agent, final.step, final.abstain, final.needs_review, final.covered) == (
        "ActionAgent",
        2,
        False,
        False,
        True,
    )
    assert set(final.sources.values()) == {"first"}
    assert final.coverage_checks == {
        "recorded_role": True,
        "root_step": True,
        "chain_structure": True,
        "handoff_evidence": True,
    }


# --- role ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", ["ActionAgent", "DiagnostAgent (-> ActionAgent)", "human", "JudgeAgent"])
def test_recorded_roles_are_valid(agent: str) -> None:
    assert _validate(_answer(agent=agent)).is_valid("agent")


@pytest.mark.parametrize("agent", ["Coder", "actionagent", "ActionAgent ", "SYSTEM", ""])
def test_unrecorded_roles_are_invalid_and_nothing_else_is(agent: str) -> None:
    validation = _validate(_answer(agent=agent))
    assert _invalid_fields(validation) == {"agent"}
    assert "not a recorded agent" in validation.check("agent").errors[0]


@pytest.mark.parametrize("agent", ["ENVIRONMENT", "Environment"])
def test_environment_is_never_a_role_even_when_recorded(agent: str) -> None:
    validation = _validate(_answer(agent=agent))
    assert not validation.is_valid("agent")
    assert "ENVIRONMENT" in validation.check("agent").errors[0]


# --- step ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [0, 2, 6, "2", "6"])
def test_existing_steps_are_valid(step: object) -> None:
    validation = _validate(_answer(step=step, agent="human" if step == 0 else "ActionAgent"))
    assert validation.is_valid("step")
    assert validation.answer.step == int(str(step))  # a digit string is read as its integer


@pytest.mark.parametrize("step", [-1, 7, 100, "7", "2a", "system_evaluation", None, 2.0])
def test_steps_outside_the_trajectory_or_not_integers_are_invalid(step: object) -> None:
    validation = _validate(_answer(step=step))
    assert not validation.is_valid("step")
    assert validation.is_valid("agent")


# --- cited handoff evidence ---------------------------------------------------------------------------------


def test_the_grounding_callable_sees_the_quote_and_the_logged_instruction() -> None:
    calls: list[tuple[str, str]] = []

    def spy(quote: str, source: str) -> bool:
        calls.append((quote, source))
        return True

    validate_attribution(
        parse_attribution(_answer()), TRAJECTORY, handoff_texts_by_step=HANDOFFS, quote_grounded=spy
    )
    assert calls == [("reads the timeout from TIMEOUT_SECONDS", INSTRUCTION)]


def test_an_ungrounded_quote_invalidates_the_trace_only() -> None:
    validation = _validate(_answer(delegation_trace=_trace(quote="reads the timeout in seconds")))
    assert _invalid_fields(validation) == {"delegation_trace"}
    assert (
        "not found in the logged instruction of handoff step 1"
        in validation.check("delegation_trace").errors[0]
    )


def test_a_prescribing_step_that_is_not_a_handoff_is_invalid() -> None:
    validation = _validate(_answer(delegation_trace=_trace(prescribing_step=4)))
    assert _invalid_fields(validation) == {"delegation_trace"}
    assert "step 4 is not a handoff step" in validation.check("delegation_trace").errors[0]


def test_no_cited_handoff_means_nothing_to_ground() -> None:
    validation = _validate(_answer(delegation_trace=_trace(prescribing_step=None, quote="anything at all")))
    assert validation.valid


# --- faithful implementation --------------------------------------------------------------------------------

FAITHFUL = {
    "agent": "DiagnostAgent (-> ActionAgent)",
    "step": 1,
    "primary_category": "C1",
    "contributing_factors": [],
    "delegation_trace": _trace(faithful_implementation=True, defect_in_quote="minutes, not seconds"),
}


def test_a_faithful_claim_rooted_at_its_grounded_handoff_is_valid() -> None:
    validation = _validate(_answer(**FAITHFUL))
    assert validation.valid, validation.errors
    assert merge_fields(validation).covered


def test_a_faithful_claim_may_name_the_sender_of_the_handoff() -> None:
    assert _validate(_answer(**{**FAITHFUL, "agent": "DiagnostAgent"})).valid


def test_a_faithful_claim_elsewhere_than_its_prescribing_step_is_valid_by_default() -> None:
    # The paper keeps role and step independent: no cross-field rule, so no retry and the output is covered.
    validation = _validate(
        _answer(**{**FAITHFUL, "step": 2, "agent": "ActionAgent", "primary_category": "D1"})
    )
    assert validation.valid, validation.errors
    assert validation.check("consistency").errors == ()
    final = merge_fields(validation)
    assert final.covered and not final.needs_review


def test_release_rules_a_faithful_claim_must_put_the_root_at_the_prescribing_step() -> None:
    validation = _validate(_answer(**{**FAITHFUL, "step": 2, "agent": "ActionAgent"}), release=True)
    assert _invalid_fields(validation) == {"consistency"}
    errors = " ".join(validation.check("consistency").errors)
    assert "prescribing handoff step 1, but root_cause.step is 2" in errors
    assert "must be a handoff form or the sender 'DiagnostAgent'" in errors


def test_a_faithful_claim_must_point_at_a_handoff_step() -> None:
    trace = _trace(faithful_implementation=True, prescribing_step=4)
    validation = _validate(
        _answer(**{**FAITHFUL, "step": 4, "agent": "DiagnostAgent", "delegation_trace": trace})
    )
    assert "delegation_trace" in _invalid_fields(validation)
    assert "step 4 is not a handoff step" in validation.check("delegation_trace").errors[0]


@pytest.mark.parametrize(
    ("trace_changes", "message"),
    [
        ({"prescribing_step": None}, "must cite its prescribing handoff step"),
        ({"quote": "  "}, "must quote the handoff instruction"),
    ],
)
def test_a_faithful_claim_needs_a_cited_step_and_a_quote(trace_changes: dict[str, Any], message: str) -> None:
    trace = _trace(faithful_implementation=True, **trace_changes)
    validation = _validate(_answer(**{**FAITHFUL, "delegation_trace": trace}))
    assert not validation.is_valid("delegation_trace")
    assert any(message in error for error in validation.check("delegation_trace").errors)


def test_release_rules_a_faithful_claim_needs_category_c1_or_a2() -> None:
    assert _validate(_answer(**{**FAITHFUL, "primary_category": "A2"}), release=True).valid
    validation = _validate(_answer(**{**FAITHFUL, "primary_category": "B1"}), release=True)
    assert _invalid_fields(validation) == {"consistency"}
    assert _validate(_answer(**{**FAITHFUL, "primary_category": "B1"})).valid  # not a rule of the paper


# --- planner-class agents -----------------------------------------------------------------------------------


def test_a_planner_agent_on_a_planner_step_is_valid() -> None:
    validation = _validate(
        _answer(agent="DiagnostAgent", step=4, primary_category="C2", delegation_trace=_trace(checked=False))
    )
    assert validation.valid, validation.errors


def test_a_planner_agent_on_an_executor_step_is_valid_and_covered_by_default() -> None:
    validation = _validate(_answer(agent="DiagnostAgent", step=2, primary_category="D1"))
    assert validation.valid, validation.errors
    final = merge_fields(validation)
    assert (final.agent, final.step, final.covered, final.needs_review) == ("DiagnostAgent", 2, True, False)


def test_release_rules_a_planner_agent_on_an_executor_step_is_inconsistent() -> None:
    validation = _validate(_answer(agent="DiagnostAgent", step=2, primary_category="C2"), release=True)
    assert _invalid_fields(validation) == {"consistency"}
    assert "step 2 is spoken by 'ActionAgent' (executor)" in validation.check("consistency").errors[0]
    # Neither field is invalid on its own.
    assert validation.is_valid("agent") and validation.is_valid("step")


def test_release_rules_a_handoff_form_agent_is_planner_class_by_its_sender() -> None:
    validation = _validate(
        _answer(agent="DiagnostAgent (-> ActionAgent)", step=3, primary_category="C2"), release=True
    )
    assert "planner-class step" in validation.check("consistency").errors[0]


def test_an_executor_agent_may_point_at_a_planner_step() -> None:
    assert _validate(_answer(agent="ActionAgent", step=4)).valid
    assert _validate(_answer(agent="ActionAgent", step=4), release=True).valid


def test_release_rules_a_planner_agent_cannot_have_an_execution_category() -> None:
    assert _validate(_answer(agent="DiagnostAgent", step=4, primary_category="D1")).valid
    validation = _validate(_answer(agent="DiagnostAgent", step=4, primary_category="D1"), release=True)
    assert _invalid_fields(validation) == {"consistency"}
    assert "D*/E*/X*" in validation.check("consistency").errors[0]


# --- the other fields ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"evidence_step_ids": [2, 9]}, "evidence_step_ids"),
        ({"evidence_step_ids": []}, "evidence_step_ids"),
        ({"evidence_step_ids": list(range(7)) * 2}, "evidence_step_ids"),
        ({"primary_category": "Z9"}, "primary_category"),
        ({"contributing_factors": ["D1"]}, "contributing_factors"),
        ({"contributing_factors": ["E1", "E1"]}, "contributing_factors"),
        ({"confidence": "certain"}, "confidence"),
        ({"abstain": "no"}, "abstain"),
        ({"reason": 3}, "reason"),
    ],
)
def test_other_field_rules(changes: dict[str, Any], field: str) -> None:
    assert _invalid_fields(_validate(_answer(**changes))) == {field}


@pytest.mark.parametrize(
    ("chain", "message"),
    [
        ([{"step": 2, "agent": "a", "role": "root_cause", "description": ""}], "no terminal node"),
        ([{"step": None, "agent": "a", "role": "terminal", "description": ""}], "no root_cause node"),
        (
            [
                {"step": None, "agent": "a", "role": "root_cause", "description": ""},
                {"step": 5, "agent": "a", "role": "terminal", "description": ""},
            ],
            "only a terminal node may stand for the system evaluation",
        ),
        (
            [
                {"step": 2, "agent": "a", "role": "cause", "description": ""},
                {"step": 50, "agent": "a", "role": "terminal", "description": ""},
            ],
            "is not one of root_cause",
        ),
    ],
)
def test_failure_chain_structure(chain: list[dict[str, Any]], message: str) -> None:
    validation = _validate(_answer(failure_chain=chain))
    assert _invalid_fields(validation) == {"failure_chain"}
    assert any(message in error for error in validation.check("failure_chain").errors)


def test_abstaining_needs_low_confidence_and_may_cite_no_evidence() -> None:
    assert _invalid_fields(_validate(_answer(abstain=True, evidence_step_ids=[]))) == {"confidence"}
    assert _validate(_answer(abstain=True, evidence_step_ids=[], confidence="low")).valid


# --- feedback -----------------------------------------------------------------------------------------------


def test_feedback_lists_each_error_with_its_field() -> None:
    validation = _validate(_answer(agent="Coder", step=99))
    text = feedback_text(validation)
    assert text.startswith("Your previous answer did not pass validation.")
    lines = text.splitlines()[1:]
    assert lines == [
        "- agent: root_cause.agent: 'Coder' is not a recorded agent of this trajectory",
        "- step: root_cause.step: 99 is not a step of this trajectory (0..6)",
    ]


def test_feedback_is_empty_for_a_valid_answer_and_capped_at_thirty_errors() -> None:
    assert feedback_text(_validate(_answer())) == ""
    chain = [{"step": 100 + i, "agent": "a", "role": "exposure", "description": ""} for i in range(40)]
    text = feedback_text(_validate(_answer(failure_chain=chain)))
    lines = text.splitlines()
    assert len(lines) == 1 + 30 + 1
    assert lines[-1] == "- ... and 12 more"


# --- field-preserving merge ---------------------------------------------------------------------------------


def test_a_valid_first_role_survives_an_invalid_retry_role() -> None:
    first = _validate(_answer(agent="ActionAgent", step=99))
    retry = _validate(_answer(agent="Nobody", step=3))
    final = merge_fields(first, retry)
    assert (final.agent, final.step) == ("ActionAgent", 3)
    assert (final.sources["agent"], final.sources["step"]) == ("first", "retry")
    assert not final.abstain and final.covered and not final.needs_review


def test_an_invalid_retry_step_never_overwrites_a_valid_first_step() -> None:
    first = _validate(_answer(agent="Nobody", step=2))
    retry = _validate(_answer(agent="JudgeAgent", step="five"))
    final = merge_fields(first, retry)
    assert (final.agent, final.step) == ("JudgeAgent", 2)
    assert (final.sources["agent"], final.sources["step"]) == ("retry", "first")


def test_when_both_attempts_are_valid_the_retry_wins() -> None:
    first = _validate(_answer(agent="ActionAgent", step=2, reason="first"))
    retry = _validate(_answer(agent="JudgeAgent", step=5, reason="second"))
    final = merge_fields(first, retry)
    assert (final.agent, final.step, final.reason) == ("JudgeAgent", 5, "second")
    assert set(final.sources.values()) == {"retry"}


def test_essentials_missing_in_both_attempts_abstain_and_flag() -> None:
    first = _validate(_answer(agent="Nobody"))
    retry = _validate(_answer(agent="ENVIRONMENT"))
    final = merge_fields(first, retry)
    assert final.agent is None and final.step == 2
    assert final.abstain and final.needs_review and not final.covered and not final.model_abstained
    assert final.sources["agent"] is None
    assert any(error.startswith("agent: ") and "ENVIRONMENT" in error for error in final.errors)


def test_two_unreadable_answers_abstain() -> None:
    final = merge_fields(_validate("not json"), _validate(None))
    assert (final.agent, final.step, final.abstain, final.needs_review, final.covered) == (
        None,
        None,
        True,
        True,
        False,
    )


def test_a_missing_step_alone_abstains_even_with_a_valid_role() -> None:
    final = merge_fields(_validate(_answer(step=-3)))
    assert (final.agent, final.step, final.abstain, final.covered) == ("ActionAgent", None, True, False)


def test_a_model_abstention_keeps_its_fields_but_is_not_covered() -> None:
    final = merge_fields(_validate(_answer(abstain=True, confidence="low")))
    assert (final.agent, final.step) == ("ActionAgent", 2)
    assert final.abstain and final.model_abstained and not final.covered and not final.needs_review
    assert all(final.coverage_checks.values())  # the four checks pass; abstaining alone loses coverage


def test_an_invalid_secondary_field_flags_review_but_keeps_coverage() -> None:
    final = merge_fields(_validate(_answer(primary_category="Z9")), _validate(_answer(primary_category="Q1")))
    assert final.primary_category is None
    assert final.needs_review and final.covered and not final.abstain


def test_cited_evidence_invalid_in_both_attempts_loses_coverage() -> None:
    bad = _trace(quote="nowhere in the instruction")
    final = merge_fields(_validate(_answer(delegation_trace=bad)), _validate(_answer(delegation_trace=bad)))
    assert (final.agent, final.step) == ("ActionAgent", 2)
    assert final.delegation_trace is None and not final.covered and final.needs_review and not final.abstain


def test_a_retry_that_fixes_the_chain_restores_coverage() -> None:
    broken = [{"step": 2, "agent": "a", "role": "root_cause", "description": ""}]
    first = _validate(_answer(failure_chain=broken))
    assert not merge_fields(first).covered
    final = merge_fields(first, _validate(_answer()))
    assert final.covered and final.sources["failure_chain"] == "retry"


def test_release_rules_recheck_fields_merged_from_different_attempts_but_never_touch_coverage() -> None:
    # First: valid executor step 2, invalid role. Retry: valid planner role, invalid step. The merged pair
    # (planner role, executor step) breaks the release's planner rule: kept as is, flagged; coverage is App.
    # L.1's four checks, which it passes.
    first = _validate(_answer(agent="Nobody", step=2, primary_category="C2"), release=True)
    retry = _validate(_answer(agent="DiagnostAgent", step=999, primary_category="C2"), release=True)
    final = merge_fields(first, retry)
    assert (final.agent, final.step) == ("DiagnostAgent", 2)
    assert final.needs_review and final.covered and not final.abstain
    assert any(error.startswith("consistency: ") for error in final.errors)


def test_without_release_rules_merged_fields_are_not_checked_across() -> None:
    first = _validate(_answer(agent="Nobody", step=2, primary_category="C2"))
    retry = _validate(_answer(agent="DiagnostAgent", step=999, primary_category="C2"))
    final = merge_fields(first, retry)
    assert (final.agent, final.step) == ("DiagnostAgent", 2)
    assert final.covered and not any(error.startswith("consistency: ") for error in final.errors)
    assert not final.needs_review  # each field is valid in the attempt it was kept from


def test_release_rules_an_inconsistent_single_attempt_is_flagged_and_still_covered() -> None:
    validation = _validate(_answer(agent="DiagnostAgent", step=2, primary_category="C2"), release=True)
    assert not validation.valid  # so the method retries
    final = merge_fields(validation)
    assert (final.agent, final.step) == ("DiagnostAgent", 2)
    assert final.covered and final.needs_review


# --- coverage: exactly App. L.1's four checks ----------------------------------------------------------------


def test_coverage_checks_are_the_papers_four() -> None:
    assert dict(COVERAGE_CHECKS) == {
        "recorded_role": "agent",
        "root_step": "step",
        "chain_structure": "failure_chain",
        "handoff_evidence": "delegation_trace",
    }


@pytest.mark.parametrize(
    ("changes", "failed"),
    [
        ({"agent": "Nobody"}, "recorded_role"),
        ({"step": 70}, "root_step"),
        (
            {"failure_chain": [{"step": 2, "agent": "a", "role": "root_cause", "description": ""}]},
            "chain_structure",
        ),
        ({"delegation_trace": _trace(quote="never said")}, "handoff_evidence"),
    ],
)
def test_each_of_the_four_checks_alone_decides_coverage(changes: dict[str, Any], failed: str) -> None:
    final = merge_fields(_validate(_answer(**changes)))
    assert not final.covered
    assert {name for name, passed in final.coverage_checks.items() if not passed} == {failed}


@pytest.mark.parametrize(
    "changes",
    [
        {"primary_category": "Z9"},
        {"contributing_factors": ["D1"]},
        {"evidence_step_ids": [2, 99]},
        {"confidence": "sure"},
        {"reason": 7},
        {"counterfactual": None},
    ],
)
def test_fields_outside_the_four_checks_never_decide_coverage(changes: dict[str, Any]) -> None:
    final = merge_fields(_validate(_answer(**changes)))
    assert final.covered and final.needs_review
