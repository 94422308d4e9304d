"""RCTA stage schemas (enums, bounds, required fields; no forced phase count or proposal cap) and readers that
record, never repair (digit-string step ids are read as integers)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.rcta.readers import parse_attribution, parse_local_summary, parse_outline
from rcarun.methods.rcta.schemas import (
    CANDIDATE_TAGS,
    FAILURE_CATEGORIES,
    PHASE_RANGE,
    attribution_schema,
    fallback_outline,
    local_summary_schema,
    outline_schema,
)
from rcarun.mock.answers import generate_value

AGENTS = ("human", "DiagnostAgent (-> ActionAgent)", "ActionAgent", "Computer_terminal", "ENVIRONMENT")


def _trajectory() -> Trajectory:
    steps = tuple(Step(i, AGENTS[i % len(AGENTS)], "assistant", f"step {i}") for i in range(12))
    return Trajectory("t__001", "test", "task", steps, "0" * 64)


def _ordered_ranges(value: Any) -> Any:
    """A schema cannot say first <= last; a model's well-formed range is ordered, so order generated ones."""
    if isinstance(value, dict):
        return {
            k: sorted(v) if k == "step_range" and isinstance(v, list) else _ordered_ranges(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_ordered_ranges(v) for v in value]
    return value


# --- schemas ------------------------------------------------------------------------------------------------


def test_local_summary_schema_constrains_ids_to_the_segment_and_tags_to_the_enum() -> None:
    schema = local_summary_schema(3, [20, 21, 22, 23])
    props = schema["properties"]
    assert props["segment_id"]["enum"] == [3]
    assert props["step_range"]["items"] == {"type": "integer", "minimum": 20, "maximum": 23}
    proposal = props["proposed_steps"]["items"]["properties"]
    assert proposal["step_id"]["enum"] == [20, 21, 22, 23]
    assert proposal["tags"]["items"]["enum"] == list(CANDIDATE_TAGS)
    assert proposal["tags"]["minItems"] == 1
    assert props["key_events"]["items"]["properties"]["step_ids"]["items"]["enum"] == [20, 21, 22, 23]
    assert (props["key_events"]["minItems"], props["key_events"]["maxItems"]) == (3, 8)
    assert props["verifier_findings"]["items"]["properties"]["result"]["enum"] == ["PASS", "FAIL", "UNKNOWN"]
    assert set(schema["required"]) == {
        "segment_id",
        "step_range",
        "segment_goal",
        "key_events",
        "proposed_steps",
        "verifier_findings",
        "uncertainties",
    }


def test_local_summary_schema_needs_a_step() -> None:
    with pytest.raises(ValueError):
        local_summary_schema(0, [])


def test_outline_schema_does_not_force_the_phase_count() -> None:
    schema = outline_schema(_trajectory(), [0, 1])
    phases = schema["properties"]["phases"]
    # 3–8 is asked by the prompt only: the paper's implementation left 308/1,140 outlines outside it
    assert phases["minItems"] == 1 and "maxItems" not in phases
    phase = phases["items"]["properties"]
    assert phase["phase_id"] == {"type": "integer", "minimum": 1}
    assert phase["involved_agents"]["items"]["enum"] == list(AGENTS)
    assert phase["step_range"]["items"] == {"type": "integer", "minimum": 0, "maximum": 11}
    assert (phase["supporting_step_ids"]["minItems"], phase["supporting_step_ids"]["maxItems"]) == (3, 10)
    assert schema["properties"]["conflicts"]["items"]["properties"]["segment_ids"]["items"]["enum"] == [0, 1]
    assert set(phases["items"]["required"]) == {
        "phase_id",
        "step_range",
        "phase_goal",
        "involved_agents",
        "sub_phases",
        "failure_signals",
        "supporting_step_ids",
    }


def test_attribution_schema_role_enum_is_the_recorded_agents_without_environment() -> None:
    schema = attribution_schema(_trajectory())
    root = schema["properties"]["root_cause"]
    assert root["properties"]["agent"]["enum"] == [
        "human",
        "DiagnostAgent (-> ActionAgent)",
        "ActionAgent",
        "Computer_terminal",
    ]
    assert root["properties"]["step"] == {"type": "integer", "minimum": 0, "maximum": 11}
    assert root["required"] == ["agent", "step"]
    assert schema["properties"]["primary_category"]["enum"] == list(FAILURE_CATEGORIES)
    assert len(FAILURE_CATEGORIES) == 15
    assert set(schema["required"]) == {
        "root_cause",
        "reason",
        "evidence_step_ids",
        "abstain",
        "primary_category",
        "contributing_factors",
        "analysis",
    }
    analysis = schema["properties"]["analysis"]
    assert set(analysis["required"]) == {"delegation_trace", "failure_chain", "counterfactual", "confidence"}
    trace = analysis["properties"]["delegation_trace"]
    assert set(trace["required"]) == {
        "checked",
        "faithful_implementation",
        "prescribing_step",
        "quote",
        "defect_in_quote",
    }
    node = analysis["properties"]["failure_chain"]["items"]["properties"]
    assert node["role"]["enum"] == ["root_cause", "propagation", "exposure", "terminal"]


# --- schema-valid samples parse -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_a_schema_valid_local_summary_parses_without_errors(seed: int) -> None:
    ids = [20, 21, 22, 23, 24]
    answer = _ordered_ranges(generate_value(local_summary_schema(3, ids), random.Random(seed)))
    summary = parse_local_summary(answer, segment_id=3, valid_ids=ids)
    assert summary.errors == ()
    assert summary.valid
    assert len(summary.proposals) == len(answer["proposed_steps"])
    assert all(p.step_id in ids and set(p.tags) <= set(CANDIDATE_TAGS) for p in summary.proposals)


@pytest.mark.parametrize("seed", range(20))
def test_a_schema_valid_outline_parses_without_errors(seed: int) -> None:
    trajectory = _trajectory()
    answer = _ordered_ranges(generate_value(outline_schema(trajectory, [0, 1]), random.Random(seed)))
    outline = parse_outline(answer, trajectory=trajectory, segment_ids=[0, 1])
    assert outline.errors == ()
    assert outline.valid and not outline.fallback
    assert len(outline.phases) >= 1
    assert outline.phase_count_in_range == (PHASE_RANGE[0] <= len(outline.phases) <= PHASE_RANGE[1])


@pytest.mark.parametrize("seed", range(20))
def test_a_schema_valid_attribution_parses_without_errors(seed: int) -> None:
    trajectory = _trajectory()
    answer = generate_value(attribution_schema(trajectory), random.Random(seed))
    parsed = parse_attribution(answer)
    assert parsed.errors == ()
    assert parsed.agent == answer["root_cause"]["agent"]
    assert parsed.step == answer["root_cause"]["step"]
    assert parsed.delegation_trace is not None
    assert (
        parsed.delegation_trace.prescribing_step == answer["analysis"]["delegation_trace"]["prescribing_step"]
    )
    assert parsed.failure_chain is not None
    assert len(parsed.failure_chain) == len(answer["analysis"]["failure_chain"])


# --- readers record problems and never repair ----------------------------------------------------------------


def _attribution(**root: Any) -> dict[str, Any]:
    return {
        "root_cause": {"agent": "ActionAgent", "step": 2, **root},
        "reason": "r",
        "evidence_step_ids": [2],
        "abstain": False,
        "primary_category": "D1",
        "contributing_factors": [],
        "analysis": {
            "delegation_trace": {
                "checked": True,
                "faithful_implementation": False,
                "prescribing_step": None,
                "quote": "",
                "defect_in_quote": "",
            },
            "failure_chain": [
                {"step": 2, "agent": "ActionAgent", "role": "root_cause", "description": "d"},
                {"step": None, "agent": "system", "role": "terminal", "description": "evaluation failed"},
            ],
            "counterfactual": "c",
            "confidence": "medium",
        },
    }


@pytest.mark.parametrize(("given", "read"), [("2", 2), (" 7 ", 7), ("+3", 3), ("-1", -1), ("12", 12)])
def test_a_digit_string_step_is_read_as_its_integer(given: str, read: int) -> None:
    parsed = parse_attribution(_attribution(step=given))
    assert parsed.step == read
    assert parsed.agent == "ActionAgent"
    assert parsed.errors == ()


@pytest.mark.parametrize("given", ["2.0", "12a", "step 12", "", "two", 2.0, [2]])
def test_a_non_numeric_step_is_left_out_and_recorded(given: object) -> None:
    parsed = parse_attribution(_attribution(step=given))
    assert parsed.step is None
    assert [e.field for e in parsed.errors] == ["step"]


def test_digit_string_step_ids_are_read_in_every_step_field() -> None:
    answer = _attribution(step="2")
    answer["evidence_step_ids"] = ["2", 3, "x"]
    answer["analysis"]["delegation_trace"]["prescribing_step"] = "1"
    answer["analysis"]["failure_chain"][0]["step"] = "2"
    parsed = parse_attribution(answer)
    assert parsed.step == 2
    assert parsed.evidence_step_ids == (2, 3)  # "x" left out and recorded
    assert [e.field for e in parsed.errors] == ["evidence_step_ids"]
    assert parsed.delegation_trace is not None and parsed.delegation_trace.prescribing_step == 1
    assert parsed.failure_chain is not None and parsed.failure_chain[0].step == 2
    summary = parse_local_summary(
        {
            "segment_id": 0,
            "step_range": ["0", "3"],
            "segment_goal": "g",
            "key_events": [{"event": "e", "step_ids": ["1"]}] * 3,
            "proposed_steps": [{"step_id": "2", "tags": ["possible_root"], "note": ""}],
            "verifier_findings": [{"step_ids": ["3"], "result": "PASS", "note": ""}],
            "uncertainties": [],
        },
        segment_id=0,
        valid_ids=[0, 1, 2, 3],
    )
    assert summary.valid and summary.step_range == (0, 3)
    assert [p.step_id for p in summary.proposals] == [2] and summary.key_events[0].step_ids == (1,)
    phase = _phase(0, 5)
    phase["failure_signals"][0]["step_ids"] = ["4"]
    phase["supporting_step_ids"] = ["0", "1", "5"]
    outline = parse_outline({"phases": [phase], "conflicts": []}, trajectory=_trajectory(), segment_ids=[0])
    assert outline.valid
    assert outline.phases[0].failure_signals[0].step_ids == (4,)
    assert outline.phases[0].supporting_step_ids == (0, 1, 5)


def test_a_bool_is_not_an_integer_step() -> None:
    parsed = parse_attribution(_attribution(step=True))
    assert parsed.step is None
    assert [e.field for e in parsed.errors] == ["step"]


def test_a_null_chain_step_stands_for_the_system_evaluation() -> None:
    parsed = parse_attribution(_attribution())
    assert parsed.errors == ()
    assert parsed.failure_chain is not None
    assert [node.step for node in parsed.failure_chain] == [2, None]


def test_missing_analysis_marks_each_analysis_field() -> None:
    answer = _attribution()
    del answer["analysis"]
    parsed = parse_attribution(answer)
    assert (parsed.delegation_trace, parsed.failure_chain, parsed.counterfactual, parsed.confidence) == (
        None,
        None,
        None,
        None,
    )
    assert sorted(e.field for e in parsed.errors) == [
        "confidence",
        "counterfactual",
        "delegation_trace",
        "failure_chain",
    ]
    assert parsed.agent == "ActionAgent" and parsed.step == 2


def test_a_non_object_attribution_has_no_role_and_no_step() -> None:
    parsed = parse_attribution(["not", "an", "object"])
    assert (parsed.agent, parsed.step) == (None, None)
    assert {e.field for e in parsed.errors} == {"agent", "step"}


def test_local_summary_keeps_out_of_segment_ids_and_unknown_tags_as_errors() -> None:
    answer = {
        "segment_id": 1,
        "step_range": [5, 7],
        "segment_goal": "g",
        "key_events": [{"event": "e", "step_ids": [5]}] * 3,
        "proposed_steps": [
            {"step_id": 9, "tags": ["possible_root"], "note": "outside"},
            {"step_id": 6, "tags": ["suspicious", "other", "other"], "note": "unknown tag"},
            {"step_id": "six", "tags": ["other"], "note": "a non-numeric id is unusable"},
        ],
        "verifier_findings": [],
        "uncertainties": [],
    }
    summary = parse_local_summary(answer, segment_id=1, valid_ids=[5, 6, 7])
    assert [(p.step_id, p.tags) for p in summary.proposals] == [
        (9, ("possible_root",)),
        (6, ("suspicious", "other")),
    ]
    messages = [e.message for e in summary.errors]
    assert any("9 is not one of this segment's steps" in m for m in messages)
    assert any("unknown tags ['suspicious']" in m for m in messages)
    assert any("expected a step id (an integer), got 'six'" in m for m in messages)
    assert not summary.valid


def test_a_summary_may_propose_any_number_of_its_steps() -> None:
    ids = list(range(40))
    schema = local_summary_schema(0, ids)
    assert "maxItems" not in schema["properties"]["proposed_steps"]  # no invented per-segment cap
    answer = {
        "segment_id": 0,
        "step_range": [0, 39],
        "segment_goal": "g",
        "key_events": [{"event": "e", "step_ids": [0]}] * 3,
        "proposed_steps": [{"step_id": i, "tags": ["other"], "note": ""} for i in ids],
        "verifier_findings": [],
        "uncertainties": [],
    }
    summary = parse_local_summary(answer, segment_id=0, valid_ids=ids)
    assert summary.valid and len(summary.proposals) == 40


def test_an_unreadable_local_summary_is_empty_and_invalid() -> None:
    summary = parse_local_summary("garbage", segment_id=4, valid_ids=[1])
    assert (summary.segment_id, summary.proposals, summary.valid) == (4, (), False)


def _phase(first: int, last: int) -> dict[str, Any]:
    return {
        "phase_id": 1,
        "step_range": [first, last],
        "phase_goal": "goal",
        "involved_agents": ["ActionAgent"],
        "sub_phases": [{"step_range": [first, last], "description": "d"}],
        "failure_signals": [{"description": "s", "step_ids": [first], "severity": "high"}],
        "supporting_step_ids": [first, first, last],
    }


@pytest.mark.parametrize(("count", "in_range"), [(1, False), (2, False), (3, True), (8, True), (9, False)])
def test_an_outline_of_any_length_is_valid_and_its_range_recorded(count: int, in_range: bool) -> None:
    outline = parse_outline(
        {"phases": [_phase(i, i) for i in range(count)], "conflicts": []},
        trajectory=_trajectory(),
        segment_ids=[0],
    )
    assert outline.readable and outline.valid and outline.errors == ()
    assert len(outline.phases) == count
    assert outline.phase_count_in_range is in_range


def test_an_outline_with_a_bad_severity_and_reversed_range_is_flagged() -> None:
    bad = _phase(9, 3)
    bad["failure_signals"][0]["severity"] = "critical"
    outline = parse_outline(
        {"phases": [_phase(0, 2), bad, _phase(10, 11)], "conflicts": []},
        trajectory=_trajectory(),
        segment_ids=[0],
    )
    messages = [e.message for e in outline.errors]
    assert any("first 9 is after last 3" in m for m in messages)
    assert any("'critical' is not one of low, medium, high" in m for m in messages)
    assert outline.phases[1].failure_signals[0].severity == "critical"  # kept as answered


@pytest.mark.parametrize("answer", [None, "text", {"conflicts": []}, {"phases": []}, {"phases": ["x"]}])
def test_an_outline_without_phase_objects_is_unreadable(answer: object) -> None:
    outline = parse_outline(answer, trajectory=_trajectory(), segment_ids=[0])
    assert not outline.readable
    assert outline.phases == ()


def test_fallback_outline_has_one_flagged_phase_per_summary() -> None:
    summaries = [
        parse_local_summary(
            {
                "segment_id": sid,
                "step_range": rng,
                "segment_goal": goal,
                "key_events": [],
                "proposed_steps": [],
                "verifier_findings": [],
                "uncertainties": [],
            },
            segment_id=sid,
            valid_ids=list(range(rng[0], rng[1] + 1)),
        )
        for sid, rng, goal in ((0, [0, 5], "explore"), (1, [6, 11], ""))
    ]
    outline = fallback_outline(summaries)
    assert outline.fallback and outline.readable and outline.errors == ()
    assert [(p.phase_id, p.step_range) for p in outline.phases] == [(0, (0, 5)), (1, (6, 11))]
    assert outline.phases[0].phase_goal == "explore"
    assert outline.phases[1].phase_goal == "(segment 1: no goal recorded)"
    assert all(len(p.sub_phases) == 1 and p.sub_phases[0].step_range == p.step_range for p in outline.phases)
    assert all(p.failure_signals == () and p.supporting_step_ids == () for p in outline.phases)
    assert outline.conflicts == ()
