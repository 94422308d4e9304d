"""FALAT as a method: registration, the options table, and the control flow against a routed scripted LLM."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from helpers.scripted import ScriptedLLM
from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import create_method, registered_methods
from rcarun.methods._options import MethodOptions
from rcarun.methods.falat import Falat, FalatOptions, verify_schema


def _routed(answer: Callable[[str, str], str], context_window: int | None = None) -> ScriptedLLM:
    """A scripted LLM whose reply is picked by a callable of (stage, user prompt): scripts need no order."""
    return ScriptedLLM(
        lambda request: answer(request["stage"], request["user"]), context_window=context_window
    )


def _step(index: int, agent: str, role: str, content: str) -> Step:
    return Step(index=index, agent=agent, role=role, content=content)


def _shown_steps(user_prompt: str) -> list[int]:
    return [int(k) for k in re.findall(r"\[step (\d+)\]", user_prompt)]


def _candidate_of(user_prompt: str) -> int:
    match = re.search(r"Candidate: step (\d+)", user_prompt)
    assert match is not None
    return int(match.group(1))


def _router(failure: str, verdicts: Mapping[int, str]) -> Callable[[str, str], str]:
    def answer(stage: str, user: str) -> str:
        return failure if stage == "locate" else verdicts[_candidate_of(user)]

    return answer


def _verdict_json(is_source: bool, confidence: float) -> str:
    return json.dumps({"reason": "because", "is_source": is_source, "confidence": confidence})


# ------------------------------------------------------------ registry/options


def test_registered_under_its_name_with_options() -> None:
    assert "falat" in registered_methods()
    created = create_method(
        "falat", label="falat/gt", options={"include_ground_truth": True, "max_candidates": 5}
    )
    assert isinstance(created, Falat)
    assert created.label == "falat/gt"
    assert created.options.include_ground_truth is True and created.options.max_candidates == 5
    defaults = FalatOptions()
    assert isinstance(defaults, MethodOptions)
    assert (defaults.max_candidates, defaults.max_verify_calls, defaults.link_window) == (8, 8, 20)
    assert (defaults.locate_stage, defaults.verify_stage, defaults.include_ground_truth) == (
        "locate",
        "verify",
        False,
    )
    assert defaults.temperature == 0.0 and defaults.min_confidence == 0.5


def test_unknown_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^falat: unknown option\(s\) \['max_candidate'\]; known: \["):
        create_method("falat", options={"max_candidate": 3})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_tokens": 0}, "max_tokens: Input should be greater than 0 (got 0)"),
        ({"max_tokens": True}, "max_tokens: Input should be a valid integer (got True)"),
        ({"max_candidates": 0}, "max_candidates: Input should be greater than 0 (got 0)"),
        ({"link_window": 2.5}, "link_window: Input should be a valid integer (got 2.5)"),
        ({"max_verify_calls": -1}, "max_verify_calls: Input should be greater than or equal to 0 (got -1)"),
        ({"max_context_parents": "3"}, "max_context_parents: Input should be a valid integer (got '3')"),
        ({"min_confidence": 1.5}, "min_confidence: Input should be less than or equal to 1 (got 1.5)"),
        ({"boilerplate_share": 0}, "boilerplate_share: Input should be greater than 0 (got 0)"),
        ({"truncation": "drop"}, "truncation: Input should be 'cap-steps' or 'none' (got 'drop')"),
        ({"reasoning": "max"}, "reasoning: Input should be 'off', 'low', 'medium' or 'high' (got 'max')"),
        ({"temperature": "hot"}, "temperature: Input should be a valid number (got 'hot')"),
        (
            {"include_ground_truth": "yes"},
            "include_ground_truth: Input should be a valid boolean (got 'yes')",
        ),
        ({"reinstate_carriers": 1}, "reinstate_carriers: Input should be a valid boolean (got 1)"),
        ({"verify_stage": ""}, "verify_stage: String should have at least 1 character (got '')"),
    ],
)
def test_invalid_option_values_are_config_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        FalatOptions.from_mapping(options)
    assert str(raised.value) == f"falat: {message}"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_tokens": "8"}, "max_tokens: Input should be a valid integer (got '8')"),
        ({"link_window": True}, "link_window: Input should be a valid integer (got True)"),
        ({"min_shared_tokens": 2.5}, "min_shared_tokens: Input should be a valid integer (got 2.5)"),
        (
            {"verify_context_chars": 16000.0},
            "verify_context_chars: Input should be a valid integer (got 16000.0)",
        ),
        ({"min_confidence": math.inf}, "min_confidence: Input should be a finite number (got inf)"),
        ({"boilerplate_share": math.nan}, "boilerplate_share: Input should be a finite number (got nan)"),
        ({"temperature": math.inf}, "temperature: Input should be a finite number (got inf)"),
        ({"min_confidence": True}, "min_confidence: Input should be a valid number (got True)"),
        ({"locate_stage": 3}, "locate_stage: Input should be a valid string (got 3)"),
    ],
)
def test_mistyped_options_are_refused_naming_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        create_method("falat", options=options)
    assert str(raised.value) == f"falat: {message}"


def test_an_unknown_key_among_valid_ones_is_refused_before_any_value_is_read() -> None:
    with pytest.raises(ConfigError) as raised:
        create_method("falat", options={"max_tokens": 100, "verify_calls": 2})
    message = str(raised.value)
    assert message.startswith("falat: unknown option(s) ['verify_calls']; known: ")
    assert "'max_verify_calls'" in message


def test_zero_verify_calls_is_allowed() -> None:
    assert FalatOptions.from_mapping({"max_verify_calls": 0}).max_verify_calls == 0


def test_options_at_their_bounds_are_accepted() -> None:
    options = FalatOptions.from_mapping(
        {
            "boilerplate_share": 1,
            "min_confidence": 0,
            "max_context_parents": 0,
            "temperature": None,
            "reasoning": "high",
        }
    )
    assert (options.boilerplate_share, options.min_confidence, options.max_context_parents) == (1.0, 0.0, 0)
    assert (options.temperature, options.reasoning) == (None, "high")


def test_options_are_frozen() -> None:
    options = FalatOptions()
    with pytest.raises(ValueError, match="frozen"):
        options.max_candidates = 3  # type: ignore[misc]


def test_every_option_has_a_line_in_the_docstring() -> None:
    doc = FalatOptions.__doc__ or ""
    attributes = doc[doc.index("Attributes:") :]
    for name in FalatOptions.model_fields:
        assert f"\n        {name}: " in attributes, name


# ------------------------------------------------------------ control flow


async def test_full_control_flow(orders: Trajectory) -> None:
    verdicts = {0: _verdict_json(False, 0.05), 1: _verdict_json(False, 0.2), 2: _verdict_json(True, 0.9)}
    llm = _routed(_router(json.dumps({"reason": "the total is reported", "failure_step": 4}), verdicts))
    attribution = await Falat("falat", FalatOptions(reinstate_carriers=True)).attribute(orders, llm)

    assert [r["stage"] for r in llm.requests] == ["locate", "verify", "verify", "verify"]
    locate = llm.requests[0]
    assert locate["schema"]["properties"]["failure_step"] == {"type": "integer", "minimum": 0, "maximum": 5}
    assert (locate["max_tokens"], locate["temperature"]) == (8000, 0.0)
    assert _shown_steps(locate["user"]) == [0, 1, 2, 3, 4, 5]
    assert "[step 1] (decision) Planner (-> Coder): Load orders.csv" in locate["user"]
    assert "[step 3] (tool_output) Computer_terminal: exitcode: 0" in locate["user"]

    # candidates 0 and 1 are source-most; 2 carries from 1 and comes back when 1 is cleared
    verify_prompts = [r["user"] for r in llm.requests[1:]]
    assert [_candidate_of(u) for u in verify_prompts] == [0, 1, 2]
    assert [_shown_steps(u) for u in verify_prompts] == [[0, 4], [0, 1, 4], [1, 2, 4]]
    assert all(r["schema"] == verify_schema() for r in llm.requests[1:])
    assert "Dependency path from the candidate to the failure: 2 -> 3 -> 4." in verify_prompts[2]
    assert "-- step 2 depends on it by: instruction, reference (shared: amount_usd)" in verify_prompts[2]
    assert "The failure first becomes visible at step 4: the total is reported" in verify_prompts[2]

    assert (attribution.pred_step, attribution.pred_role) == (2, "Coder")
    assert attribution.role_valid and attribution.step_valid and not attribution.abstained
    output = attribution.output
    assert output["types"] == {"decision": 1, "tool_call": 1, "tool_output": 1, "message": 3}
    assert output["graph"]["nodes"] == 6 and output["graph"]["edges"] == 7
    assert output["failure"]["step"] == 4 and output["failure"]["fallback"] is False
    assert output["candidates"]["walk"] == [
        {"step": 4, "hops": 0},
        {"step": 3, "hops": 1},
        {"step": 1, "hops": 1},
        {"step": 2, "hops": 2},
        {"step": 0, "hops": 2},
    ]
    assert output["candidates"]["kept"] == [0, 1]
    assert output["candidates"]["pruned"] == [
        {"step": 2, "carries_from": [1], "reasons": ["reuses 1 token(s) of step 1: amount_usd"]},
        {"step": 3, "carries_from": [2], "reasons": ["tool output of step 2"]},
        {"step": 4, "carries_from": [3], "reasons": ["reuses 1 token(s) of step 3: 15230.5"]},
    ]
    assert [
        (v["step"], v["is_source"], v["confidence"], v["reinstated"]) for v in output["verifications"]
    ] == [
        (0, False, 0.05, False),
        (1, False, 0.2, False),
        (2, True, 0.9, True),
    ]
    assert output["search"] == {"stop": "source-found", "reinstated": [2], "unverified": []}
    assert output["decision"] == {"step": 2, "rule": "earliest-verified", "fallback": False, "role": "Coder"}
    assert output["verify_truncation"] == {"policy": "cap-steps", "prompts": 3, "prompts_cut": 0}
    json.dumps(output)  # the output is stored as JSON


async def test_default_control_flow_verifies_only_the_source_most_candidates(orders: Trajectory) -> None:
    verdicts = {0: _verdict_json(False, 0.05), 1: _verdict_json(False, 0.2), 2: _verdict_json(True, 0.9)}
    llm = _routed(_router(json.dumps({"reason": "the total is reported", "failure_step": "4"}), verdicts))
    attribution = await Falat("falat", FalatOptions()).attribute(orders, llm)
    # Steps 2-4 carry step 1's error and are pruned for good: 0 and 1 are verified, neither is a source.
    assert [_candidate_of(r["user"]) for r in llm.requests[1:]] == [0, 1]
    assert attribution.output["failure"] == {
        "step": 4,
        "fallback": False,
        "reason": "the total is reported",
        "finish_reason": "stop",
        "truncation": attribution.output["failure"]["truncation"],
    }
    assert attribution.output["search"] == {"stop": "exhausted", "reinstated": [], "unverified": []}
    assert attribution.output["decision"]["rule"] == "highest-confidence"
    assert (attribution.pred_step, attribution.error) == (1, None)


async def test_no_verified_source_falls_back_to_the_highest_confidence(orders: Trajectory) -> None:
    verdicts = {
        step: _verdict_json(False, c) for step, c in {0: 0.1, 1: 0.3, 2: 0.45, 3: 0.2, 4: 0.3}.items()
    }
    llm = _routed(_router(json.dumps({"reason": "r", "failure_step": 4}), verdicts))
    attribution = await Falat("falat", FalatOptions(reinstate_carriers=True)).attribute(orders, llm)
    assert [_candidate_of(r["user"]) for r in llm.requests[1:]] == [0, 1, 2, 3, 4]
    assert (attribution.pred_step, attribution.pred_role) == (2, "Coder")
    assert attribution.output["decision"]["rule"] == "highest-confidence"
    assert attribution.output["decision"]["fallback"] is True
    assert attribution.output["search"]["stop"] == "exhausted"


async def test_malformed_answers_are_recorded_and_fall_back(orders: Trajectory) -> None:
    llm = _routed(
        lambda stage, user: (
            json.dumps({"reason": "r", "failure_step": 99}) if stage == "locate" else "it is step 1"
        )
    )
    options = FalatOptions(max_verify_calls=2, reinstate_carriers=True)
    attribution = await Falat("falat", options).attribute(orders, llm)

    output = attribution.output
    assert output["failure"]["fallback"] is True
    assert output["failure"]["step"] == 5
    assert output["failure"]["error"] == "failure_step 99 is outside [0, 5]"
    assert output["failure"]["answer"] == {"reason": "r", "failure_step": 99}
    assert [r["stage"] for r in llm.requests] == ["locate", "verify", "verify"]
    assert "The failure is taken to be visible at the last step, step 5." in llm.requests[1]["user"]
    assert [(v["step"], v["valid"], v["raw_text"]) for v in output["verifications"]] == [
        (0, False, "it is step 1"),
        (1, False, "it is step 1"),
    ]
    assert output["search"] == {"stop": "budget", "reinstated": [2], "unverified": [2]}
    assert output["decision"] == {"step": 5, "rule": "failure-step", "fallback": True, "role": "Reviewer"}
    assert (attribution.pred_step, attribution.pred_role, attribution.step_valid) == (5, "Reviewer", True)


async def test_a_locate_answer_that_is_not_json_keeps_its_text(orders: Trajectory) -> None:
    llm = _routed(
        lambda stage, user: "The failure is at step 3." if stage == "locate" else _verdict_json(True, 1)
    )
    attribution = await Falat("falat", FalatOptions()).attribute(orders, llm)
    failure = attribution.output["failure"]
    assert (failure["step"], failure["fallback"], failure["raw_text"]) == (
        5,
        True,
        "The failure is at step 3.",
    )
    assert failure["answer"] is None


@pytest.mark.parametrize("include", [False, True])
async def test_ground_truth_is_shown_only_when_asked(include: bool, orders: Trajectory) -> None:
    verdicts = {0: _verdict_json(True, 0.9)}
    llm = _routed(_router(json.dumps({"reason": "r", "failure_step": 4}), verdicts))
    falat = Falat("falat", FalatOptions(include_ground_truth=include))
    await falat.attribute(dataclasses.replace(orders, ground_truth="15000.25"), llm)
    assert len(llm.requests) == 2
    for request in llm.requests:
        assert ("Correct final answer: 15000.25" in request["user"]) is include
        assert ("15000.25" in request["user"]) is include


async def test_task_can_be_hidden(orders: Trajectory) -> None:
    llm = _routed(_router(json.dumps({"reason": "r", "failure_step": 0}), {0: _verdict_json(True, 0.9)}))
    await Falat("falat", FalatOptions(include_task=False)).attribute(orders, llm)
    assert all("Task:\n(not recorded)\n" in r["user"] for r in llm.requests)
    assert (
        "Candidate: step 0" in llm.requests[1]["user"] and "(the candidate itself)" in llm.requests[1]["user"]
    )


async def test_stage_names_and_call_settings_reach_every_call(orders: Trajectory) -> None:
    options = FalatOptions.from_mapping(
        {
            "locate_stage": "find",
            "verify_stage": "check",
            "max_tokens": 1234,
            "temperature": 0.7,
            "reasoning": "low",
            "max_verify_calls": 1,
        }
    )
    llm = _routed(
        lambda stage, user: (
            json.dumps({"reason": "r", "failure_step": 4}) if stage == "find" else _verdict_json(False, 0.2)
        )
    )
    attribution = await Falat("falat", options).attribute(orders, llm)
    assert [r["stage"] for r in llm.requests] == ["find", "check"]
    assert {(r["max_tokens"], r["temperature"], r["reasoning"]) for r in llm.requests} == {(1234, 0.7, "low")}
    assert attribution.output["search"] == {"stop": "budget", "reinstated": [], "unverified": [1]}


async def test_locate_prompt_is_fitted_to_the_context_window() -> None:
    steps = tuple(_step(i, "A" if i % 2 else "B", "assistant", f"step {i} " + "y" * 4000) for i in range(20))
    trajectory = Trajectory(qid="d/5", source="d", task="t", steps=steps, sha256="0" * 64)
    llm = _routed(
        _router(json.dumps({"reason": "r", "failure_step": 0}), {0: _verdict_json(True, 0.9)}), 12_000
    )
    attribution = await Falat("falat", FalatOptions(max_tokens=2000)).attribute(trajectory, llm)
    truncation = attribution.output["failure"]["truncation"]
    assert truncation["applied"] is True and truncation["fits"] is True and truncation["steps_cut"] == 20
    assert llm.estimate_tokens(llm.requests[0]["user"]) <= 12_000 - 2000
    assert _shown_steps(llm.requests[0]["user"]) == list(range(20))


async def test_an_empty_trajectory_is_an_abstention() -> None:
    trajectory = Trajectory(qid="d/6", source="d", task="t", steps=(), sha256="0" * 64)
    llm = _routed(lambda stage, user: "")
    attribution = await Falat("falat", FalatOptions()).attribute(trajectory, llm)
    assert attribution.abstained and attribution.pred_step is None and llm.requests == []


# --- unreadable answers and the documented fallbacks: Attribution.error / fallback ---------------------------


async def test_a_verified_source_has_no_error_and_no_fallback(orders: Trajectory) -> None:
    verdicts = {step: _verdict_json(True, 0.9) for step in range(6)}
    llm = _routed(_router(json.dumps({"reason": "r", "failure_step": 4}), verdicts))
    attribution = await Falat("falat", FalatOptions()).attribute(orders, llm)
    assert attribution.output["decision"]["rule"] == "earliest-verified"
    assert attribution.error is None and attribution.fallback is None


async def test_the_highest_confidence_fallback_is_named(orders: Trajectory) -> None:
    verdicts = {
        step: _verdict_json(False, c) for step, c in {0: 0.1, 1: 0.3, 2: 0.45, 3: 0.2, 4: 0.3}.items()
    }
    llm = _routed(_router(json.dumps({"reason": "r", "failure_step": 4}), verdicts))
    attribution = await Falat("falat", FalatOptions(reinstate_carriers=True)).attribute(orders, llm)
    assert attribution.error is None
    assert attribution.fallback == (
        "falat: no verified source (0 of 5 verdicts malformed), highest-confidence candidate chosen "
        "(the method's documented fallback)"
    )


async def test_an_out_of_range_locate_answer_was_read_so_only_the_fallbacks_are_named(
    orders: Trajectory,
) -> None:
    llm = _routed(
        lambda stage, user: (
            json.dumps({"reason": "r", "failure_step": 99}) if stage == "locate" else "it is step 1"
        )
    )
    attribution = await Falat("falat", FalatOptions(max_verify_calls=2)).attribute(orders, llm)
    assert attribution.pred_step == 5
    assert attribution.error is None
    assert attribution.fallback == (
        "falat: locate answer unusable (failure_step 99 is outside [0, 5]), walk started at the last step; "
        "no verified source (2 of 2 verdicts malformed), failure step chosen (the method's documented fallback)"
    )


async def test_no_readable_answer_at_all_is_an_error(orders: Trajectory) -> None:
    llm = _routed(lambda stage, user: "I don't know the answer to that.")
    attribution = await Falat("falat", FalatOptions(max_verify_calls=2)).attribute(orders, llm)
    assert (attribution.pred_step, attribution.step_valid) == (5, True)  # the last step, by rule
    assert attribution.error == (
        "locate answer unreadable: Expecting value: line 1 column 1 (char 0); no verification readable "
        "(2 of 2, first: Expecting value: line 1 column 1 (char 0))"
    )
    assert attribution.fallback is not None and "failure step chosen" in attribution.fallback


async def test_an_unreadable_locate_answer_with_a_verified_source_is_no_error(orders: Trajectory) -> None:
    llm = _routed(
        lambda stage, user: "The failure is at step 3." if stage == "locate" else _verdict_json(True, 1)
    )
    attribution = await Falat("falat", FalatOptions()).attribute(orders, llm)
    assert attribution.error is None
    assert attribution.fallback == (
        "falat: locate answer unusable (Expecting value: line 1 column 1 (char 0)), walk started at the last "
        "step (the method's documented fallback)"
    )
