"""Step-by-step: the walk over growing prefixes, its stop rules, malformed answers, context policy and cost."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import create_method, registered_methods
from rcarun.methods.base import CostBound
from rcarun.methods.step_by_step import (
    ANSWER_SCHEMA,
    StepByStep,
    StepByStepOptions,
    estimate_calls_and_prompt_tokens,
)

_AGENTS = ["Planner", "Coder", "Computer_terminal"]
NO = json.dumps({"reason": "fine", "decisive_error": False})
YES = json.dumps({"reason": "wrong file", "decisive_error": True})


def _trajectory(n: int = 5, content_len: int = 20, ground_truth: str = "") -> Trajectory:
    steps = tuple(
        Step(index=i, agent=_AGENTS[i % 3], role="assistant", content=f"step {i} " + "x" * content_len)
        for i in range(n)
    )
    return Trajectory(
        qid="demo/1",
        source="demo",
        task="Count the awnings.",
        steps=steps,
        sha256="0" * 64,
        ground_truth=ground_truth,
    )


def _user(request: dict[str, Any]) -> str:
    return str(request["messages"][1].content)


def _shown_steps(request: dict[str, Any]) -> list[int]:
    log = _user(request).split("=== LOG START ===\n", 1)[1].split("\n=== LOG END ===", 1)[0]
    return [int(k) for k in re.findall(r"^\[step (\d+)\] ", log, flags=re.MULTILINE)]


def test_registered_and_options_validated() -> None:
    assert "step-by-step" in registered_methods()
    method = create_method(
        "step-by-step", label="sbs/gt", options={"include_ground_truth": True, "max_steps": 3}
    )
    assert method.label == "sbs/gt"
    assert isinstance(method, StepByStep)
    assert method.options == StepByStepOptions(include_ground_truth=True, max_steps=3)
    with pytest.raises(ConfigError, match=r"step-by-step: unknown option\(s\) \['max_step'\]"):
        create_method("step-by-step", options={"max_step": 3})
    for bad in (
        {"max_steps": 0},
        {"max_tokens": 0},
        {"truncation": "drop"},
        {"include_ground_truth": "yes"},
        {"reasoning": "max"},
        {"temperature": "hot"},
        {"stage": ""},
    ):
        with pytest.raises(ConfigError, match="step-by-step: "):
            create_method("step-by-step", options=bad)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_steps", "3"),
        ("max_steps", True),
        ("max_steps", 3.0),
        ("max_tokens", 1024.0),
        ("temperature", float("inf")),
        ("include_task", 1),
        ("max_step", 3),
    ],
)
def test_mistyped_options_are_refused_naming_the_option(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^step-by-step: .*{option}") as refused:
        create_method("step-by-step", options={option: value})
    assert "\n" not in str(refused.value)


def test_defaults() -> None:
    options = StepByStepOptions()
    assert (options.max_tokens, options.temperature, options.reasoning) == (1024, 0.0, None)
    assert (options.include_task, options.include_ground_truth) == (True, False)
    assert (options.truncation, options.max_steps, options.stage) == ("cap-steps", None, "step_check")


async def test_walk_shows_prefixes_and_stops_at_the_first_yes(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(6)
    llm = scripted([NO, NO, YES, NO])
    attribution = await StepByStep("sbs", StepByStepOptions()).attribute(trajectory, llm)

    assert [r["stage"] for r in llm.requests] == ["step_check"] * 3
    assert [_shown_steps(r) for r in llm.requests] == [[0], [0, 1], [0, 1, 2]]
    assert llm.replies == [NO]  # nothing asked after the first yes
    for i, request in enumerate(llm.requests):
        assert f"The newest step, step {i}, was taken by {_AGENTS[i % 3]}." in _user(request)
        assert f"[step {i}] {_AGENTS[i % 3]}: step {i} {'x' * 20}" in _user(request)
        assert request["schema"] == ANSWER_SCHEMA
        assert (request["max_tokens"], request["temperature"], request["reasoning"]) == (1024, 0.0, None)
    assert "Count the awnings." in _user(llm.requests[0])

    assert (attribution.pred_role, attribution.pred_step) == ("Computer_terminal", 2)  # the speaker of step 2
    assert attribution.role_valid and attribution.step_valid and not attribution.abstained
    output = attribution.output
    assert output["stopped"] == "decisive_error"
    assert output["steps_checked"] == 3
    assert [c["verdict"] for c in output["checks"]] == ["no", "no", "yes"]
    assert output["checks"][2]["reason"] == "wrong file"
    assert output["malformed_steps"] == []
    assert output["truncation"] == {"policy": "cap-steps", "prompts": 3, "prompts_cut": 0}
    assert "messages" not in json.dumps(output)  # compact: no prompts kept


async def test_no_yes_anywhere_abstains(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([NO] * 4)
    attribution = await StepByStep("sbs", StepByStepOptions()).attribute(_trajectory(4), llm)
    assert attribution.abstained is True
    assert (attribution.pred_role, attribution.pred_step) == (None, None)
    assert not attribution.role_valid and not attribution.step_valid
    assert attribution.output["stopped"] == "end_of_log"
    assert attribution.output["steps_checked"] == 4
    assert [_shown_steps(r)[-1] for r in llm.requests] == [0, 1, 2, 3]


async def test_max_steps_bounds_the_walk(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([NO] * 10)
    attribution = await StepByStep("sbs", StepByStepOptions(max_steps=3)).attribute(_trajectory(10), llm)
    assert len(llm.requests) == 3
    assert attribution.abstained is True
    assert attribution.output["stopped"] == "max_steps"
    assert attribution.output["steps_checked"] == 3


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Yes, step 1 is wrong.", "Expecting value"),
        (json.dumps({"reason": "bad"}), "decisive_error is missing or not a boolean"),
        (
            json.dumps({"reason": "bad", "decisive_error": "true"}),
            "decisive_error is missing or not a boolean",
        ),
        (json.dumps({"reason": "bad", "decisive_error": 1}), "decisive_error is missing or not a boolean"),
        (json.dumps(["decisive_error", True]), "the answer is not a JSON object"),
    ],
)
async def test_malformed_answer_counts_as_no_and_is_recorded(  # type: ignore[no-untyped-def]
    scripted, text, error
) -> None:
    llm = scripted([NO, text, YES])
    attribution = await StepByStep("sbs", StepByStepOptions()).attribute(_trajectory(5), llm)
    assert attribution.pred_step == 2 and attribution.pred_role == "Computer_terminal"
    checks = attribution.output["checks"]
    assert [c["verdict"] for c in checks] == ["no", "malformed", "yes"]
    assert error in checks[1]["error"]
    assert checks[1]["raw_text"] == text
    assert "error" not in checks[0] and "error" not in checks[2]
    assert attribution.output["malformed_steps"] == [1]


async def test_answer_without_reason_still_decides(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([json.dumps({"decisive_error": True})])
    attribution = await StepByStep("sbs", StepByStepOptions()).attribute(_trajectory(3), llm)
    assert attribution.pred_step == 0
    assert attribution.output["checks"] == [
        {"step": 0, "verdict": "yes", "reason": None, "finish_reason": "stop"}
    ]


@pytest.mark.parametrize(
    ("include", "ground_truth", "expected"),
    [(False, "42 awnings", False), (True, "42 awnings", True), (True, "", False)],
)
async def test_ground_truth_only_when_asked(scripted, include, ground_truth, expected) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([YES])
    method = StepByStep("sbs", StepByStepOptions(include_ground_truth=include))
    await method.attribute(_trajectory(3, ground_truth=ground_truth), llm)
    user = _user(llm.requests[0])
    assert ("Correct final answer: 42 awnings\n" in user) is expected
    assert ("Correct final answer" in user) is expected


async def test_task_can_be_hidden(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([YES])
    await StepByStep("sbs", StepByStepOptions(include_task=False)).attribute(_trajectory(3), llm)
    user = _user(llm.requests[0])
    assert "Count the awnings." not in user
    assert "Task:\n(not recorded)\n" in user


async def test_each_prefix_is_fitted_to_a_small_window(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(8, content_len=3000)  # prefix i holds ~3,000 * (i + 1) characters
    llm = scripted([NO] * 8, context_window=4000)
    options = StepByStepOptions(max_tokens=500)
    attribution = await StepByStep("sbs", options).attribute(trajectory, llm)

    assert len(llm.requests) == 8
    for i, request in enumerate(llm.requests):
        system, user = (m.content for m in request["messages"])
        assert llm.estimate_tokens(user) + llm.estimate_tokens(system) + 500 + 512 <= 4000
        assert _shown_steps(request) == list(range(i + 1))  # every step keeps its id
    checks = attribution.output["checks"]
    caps = [c.get("step_char_cap") for c in checks]
    assert caps[:3] == [None, None, None]  # up to ~9,000 characters fit the ~2,780-token budget
    assert all(isinstance(cap, int) for cap in caps[3:])
    assert caps[3:] == sorted(caps[3:], reverse=True)  # longer prefixes need tighter caps
    assert "characters elided" in _user(llm.requests[7]) and "characters elided" not in _user(llm.requests[2])
    assert attribution.output["truncation"] == {
        "policy": "cap-steps",
        "prompts": 8,
        "prompts_cut": 5,
        "min_step_char_cap": caps[7],
        "context_window": 4000,
        "all_fit": True,
    }


async def test_no_truncation_policy_sends_whole_prefixes(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([NO] * 8, context_window=4000)
    attribution = await StepByStep("sbs", StepByStepOptions(truncation="none")).attribute(
        _trajectory(8, content_len=3000), llm
    )
    assert attribution.output["truncation"] == {"policy": "none", "prompts": 8, "prompts_cut": 0}
    assert all("characters elided" not in _user(r) for r in llm.requests)


async def test_cost_estimate_matches_a_walk_without_early_stop(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(7, content_len=300)
    llm = scripted([NO] * 7)
    await StepByStep("sbs", StepByStepOptions()).attribute(trajectory, llm)
    sent = sum(llm.estimate_tokens(m.content) for r in llm.requests for m in r["messages"])
    assert estimate_calls_and_prompt_tokens(trajectory, llm) == CostBound(calls=7, prompt_tokens=sent)
    assert estimate_calls_and_prompt_tokens(trajectory, 4, StepByStepOptions(max_steps=2)).calls == 2


def test_cost_estimate_grows_quadratically() -> None:
    # Long steps make the fixed per-call prompt small beside the log, so tokens(n) ~ c * n^2 / 2.
    tokens = {
        n: estimate_calls_and_prompt_tokens(_trajectory(n, content_len=4000), 4.0) for n in (10, 20, 40)
    }
    assert [tokens[n].calls for n in (10, 20, 40)] == [10, 20, 40]
    assert 3.6 < tokens[20].prompt_tokens / tokens[10].prompt_tokens < 4.0
    assert 3.8 < tokens[40].prompt_tokens / tokens[20].prompt_tokens < 4.0
    # Adding step n adds one prompt holding n + 1 steps: the second difference is one step's ~1,008 tokens
    # (4,000 characters of padding plus "[step k] agent: step k " at 4 characters per token), give or take the
    # length of the agent named in the question and rounding; a linear cost would give 0.
    totals = [
        estimate_calls_and_prompt_tokens(_trajectory(n, content_len=4000), 4.0).prompt_tokens
        for n in range(1, 9)
    ]
    second = [totals[i + 1] - 2 * totals[i] + totals[i - 1] for i in range(1, len(totals) - 1)]
    assert all(990 <= d <= 1030 for d in second), second


# --- unreadable answers and the "malformed counts as no" rule: Attribution.error / fallback -----------------


async def test_a_clean_walk_has_no_error_and_no_fallback(scripted) -> None:  # type: ignore[no-untyped-def]
    for replies in ([NO, YES], [NO] * 4):
        attribution = await StepByStep("sbs", StepByStepOptions()).attribute(
            _trajectory(4), scripted(replies)
        )
        assert attribution.error is None and attribution.fallback is None


async def test_a_malformed_verdict_before_the_flag_is_a_fallback_not_an_error(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([NO, "Yes, step 1 is wrong.", YES])
    attribution = await StepByStep("sbs", StepByStepOptions()).attribute(_trajectory(5), llm)
    assert attribution.pred_step == 2
    assert attribution.error is None
    assert attribution.fallback == (
        "step-by-step: unreadable verdict at 1 of 3 checked steps, counted as 'no' (published rule)"
    )


async def test_a_walk_with_no_readable_verdict_abstains_with_the_error(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(["I am not sure."] * 4)
    attribution = await StepByStep("sbs", StepByStepOptions()).attribute(_trajectory(4), llm)
    assert attribution.abstained and attribution.pred_step is None
    assert attribution.error == (
        "no step_check answer could be read (4 of 4); first: Expecting value: line 1 column 1 (char 0)"
    )
    assert attribution.fallback == (
        "step-by-step: unreadable verdict at 4 of 4 checked steps, counted as 'no' (published rule)"
    )
    assert attribution.output["malformed_steps"] == [0, 1, 2, 3]  # the output keys stay as they were
