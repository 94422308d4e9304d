"""The ECHO method against a scripted LLM: options, the panel, the calls, the output, error and fallback.

The deterministic parts are tested alone in the other ``test_echo_*`` files; here what the analysts read is
checked through the prompts they receive and the ``context`` the output records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from helpers.scripted import numbered
from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import create_method, registered_methods
from rcarun.methods._options import MethodOptions
from rcarun.methods.echo import (
    Echo,
    EchoOptions,
    analyst_panel,
    answer_schema,
    spread_steps,
    target_context,
)

AGENTS = ("Planner", "Coder", "Computer_terminal")


def _replies(*texts: str) -> Callable[[int, Mapping[str, Any]], str]:
    return lambda index, _request: texts[index]


def _trajectory(contents: Sequence[str], ground_truth: str = "") -> Trajectory:
    steps = tuple(
        Step(index=i, agent=AGENTS[i % 3], role="assistant", content=text) for i, text in enumerate(contents)
    )
    return Trajectory(
        qid="demo/1",
        source="demo",
        task="Count the awnings.",
        steps=steps,
        sha256="0" * 64,
        ground_truth=ground_truth,
    )


def _plain(n: int) -> Trajectory:
    return _trajectory([f"Step {i} says hello." for i in range(n)])


def _long(n: int = 300, filler_words: int = 300) -> Trajectory:
    """``n`` steps of about 1,500 characters, each opening with a short sentence (its reduced line)."""
    return _trajectory([f"Step {i} ran the tool. " + "word " * filler_words for i in range(n)])


def _answer(
    kind: str = "single_agent",
    attribution: Sequence[Any] = ("Coder",),
    step: Any = 4,
    confidence: Any = 0.8,
    evaluations: Sequence[Mapping[str, Any]] = (),
    **extra: Any,
) -> str:
    answer: dict[str, Any] = {
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
    answer.update(extra)
    return json.dumps(answer)


def _log(request: Mapping[str, Any]) -> str:
    return str(request["user"]).split("=== LOG START ===\n", 1)[1].split("\n=== LOG END ===", 1)[0]


def _targets(log: str) -> list[int]:
    return [int(match) for match in re.findall(r"^\[step (\d+) \| target\]", log, flags=re.MULTILINE)]


# --- options -------------------------------------------------------------------------------------------------


def test_registered_and_options_from_config() -> None:
    assert "echo" in registered_methods()
    method = create_method("echo", label="echo/decoupled", options={"decoupled": True, "personas": None})
    assert method.label == "echo/decoupled"
    assert isinstance(method.options, MethodOptions)
    options = EchoOptions.from_mapping(
        {
            "analysts": 2,
            "personas": ["liberal", "general"],
            "temperatures": [0.1, 1],
            "context": "focal",
            "focal": [3, 4],
        }
    )
    assert options.personas == ("liberal", "general")
    assert options.temperatures == (0.1, 1.0)
    assert options.focal == (3, 4)
    defaults = EchoOptions()
    assert (defaults.context, defaults.focal, defaults.context_chars) == ("per-target", "errors", 100_000)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"analyst": 3}, "echo: unknown option(s) ['analyst']; known: ["),
        ({"analysts": 0}, "echo: analysts: Input should be greater than 0 (got 0)"),
        ({"analysts": 7}, "echo: analysts > 6 needs an explicit personas list (a sample has no repeats)"),
        ({"analysts": 2, "personas": ["liberal"]}, "echo: personas lists 1 names for 2 analysts"),
        ({"analysts": 1, "personas": ["optimist"]}, "echo: personas.0: Input should be 'conservative', "),
        ({"temperatures": [0.5]}, "echo: temperatures lists 1 values for 3 analysts"),
        ({"temperatures": [0.5, 0.5, 2.5]}, "echo: temperatures.2: Input should be less than or equal to 2"),
        (
            {"temperature_range": [0.9, 0.3]},
            "echo: temperature_range [0.9, 0.3] must be [low, high] with low <= high",
        ),
        ({"temperature_range": [0.3]}, "echo: temperature_range.1: Field required (got (0.3,))"),
        ({"min_confidence": 1.5}, "echo: min_confidence: Input should be less than or equal to 1 (got 1.5)"),
        ({"context_type": "vibes"}, "echo: context_type: Input should be 'decision-quality', 'handoff' or"),
        (
            {"context": "whole"},
            "echo: context: Input should be 'per-target', 'whole-log' or 'focal' (got 'whole')",
        ),
        ({"max_views": 2}, "echo: unknown option(s) ['max_views']; known: ["),
        (
            {"context": "focal", "focal": "middle"},
            "echo: focal.strategy: Input should be 'errors' or 'spread' (got 'middle')",
        ),
        ({"context": "focal", "focal": []}, "echo: focal.steps: Value should have at least 1 item"),
        ({"focal": [1]}, "echo: focal and max_focal apply only to context='focal'"),
        ({"max_focal": 2}, "echo: focal and max_focal apply only to context='focal'"),
        ({"context": "whole-log", "focal": [1]}, "echo: focal and max_focal apply only to context='focal'"),
        (
            {"context": "focal", "neighbour_targets": "referenced"},
            "echo: neighbour_targets applies only to context='per-target'",
        ),
        ({"neighbour_targets": "once"}, "echo: neighbour_targets: Input should be 'in-full' or 'referenced'"),
        (
            {"context_chars": 100},
            "echo: context_chars: Input should be greater than or equal to 2000 (got 100)",
        ),
        ({"decoupled": "yes"}, "echo: decoupled: Input should be a valid boolean (got 'yes')"),
        ({"max_tokens": 0}, "echo: max_tokens: Input should be greater than 0 (got 0)"),
        (
            {"reasoning": "max"},
            "echo: reasoning: Input should be 'off', 'low', 'medium' or 'high' (got 'max')",
        ),
    ],
)
def test_invalid_options_are_config_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        EchoOptions.from_mapping(options)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("analysts", "3", "Input should be a valid integer (got '3')"),
        ("analysts", True, "Input should be a valid integer (got True)"),
        ("max_focal", 2.0, "Input should be a valid integer (got 2.0)"),
        ("context_chars", 5000.5, "Input should be a valid integer (got 5000.5)"),
        ("context_chars", float("inf"), "Input should be a valid integer (got inf)"),
        ("max_tokens", "8000", "Input should be a valid integer (got '8000')"),
        ("seed", False, "Input should be a valid integer (got False)"),
        ("min_confidence", float("inf"), "Input should be a finite number (got inf)"),
        ("min_confidence", "0.3", "Input should be a valid number (got '0.3')"),
        ("temperatures", [0.5, float("nan"), 0.5], "Input should be a finite number (got nan)"),
        ("personas", "general", "Input should be a valid tuple (got 'general')"),
    ],
)
def test_mistyped_options_are_refused_naming_echo_and_the_option(name: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        create_method("echo", options={name: value})
    text = str(raised.value)
    assert text.startswith(f"echo: {name}") and message in text, text


# --- panel, calls, prompts -----------------------------------------------------------------------------------


def test_default_panel_is_a_seeded_sample() -> None:
    panel = analyst_panel(EchoOptions())
    assert [(s.persona, s.temperature) for s in panel] == [
        ("conservative", 0.83),
        ("detail-focused", 0.84),
        ("general", 0.67),
    ]
    other = analyst_panel(EchoOptions(seed=7, analysts=6))
    assert sorted(s.persona for s in other) == sorted(
        ["conservative", "liberal", "detail-focused", "pattern-focused", "skeptical", "general"]
    )
    assert all(0.3 <= s.temperature <= 0.9 for s in other)
    configured = analyst_panel(
        EchoOptions(analysts=2, personas=("skeptical", "skeptical"), temperatures=(0.0, 1.5))
    )
    assert [(s.persona, s.temperature) for s in configured] == [("skeptical", 0.0), ("skeptical", 1.5)]


async def test_a_short_log_gives_every_step_its_context_and_costs_k_calls() -> None:
    trajectory = _plain(8)
    llm = numbered(_replies(_answer(step=4), _answer(step=4), _answer(step=5, confidence=0.5)))
    attribution = await Echo("echo", EchoOptions()).attribute(trajectory, llm)

    assert len(llm.requests) == 3
    assert [r["stage"] for r in llm.requests] == ["analyst"] * 3
    assert [r["temperature"] for r in llm.requests] == [0.83, 0.84, 0.67]
    assert [r["max_tokens"] for r in llm.requests] == [8000] * 3
    assert "strong, direct evidence" in llm.requests[0]["system"]  # conservative
    assert "exact values" in llm.requests[1]["system"]  # detail-focused
    assert "balanced view" in llm.requests[2]["system"]  # general
    assert llm.requests[0]["schema"] == answer_schema(trajectory)
    user = llm.requests[0]["user"]
    assert "Count the awnings." in user
    assert "Decide both who is responsible" in user
    assert "The log has 8 steps, numbered from 0. It is shown as hierarchical contexts" in user
    assert "(every step is a target)" in user
    # The panel reads the per-target document, the same for every analyst.
    assert _log(llm.requests[0]) == target_context(trajectory, char_cap=100_000).text
    assert all(_log(r) == _log(llm.requests[0]) for r in llm.requests)
    assert _targets(_log(llm.requests[0])) == list(range(8))
    assert '"maximum": 7' in user
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 4)
    assert attribution.role_valid and attribution.step_valid and not attribution.abstained
    output = attribution.output
    assert output["n_calls"] == 3 and output["n_analysts"] == 3
    assert output["vote_table"]["type_sums"] == {"single_agent": pytest.approx(2.1), "multi_agent": 0.0}
    assert output["vote_table"]["step_scores"] == [
        {"step": 4, "score": pytest.approx(1.6)},
        {"step": 5, "score": 0.5},
    ]
    assert [v["analyst"] for v in output["vote_table"]["votes"]] == [0, 1, 2]
    assert output["consensus"]["confidence"] == pytest.approx(0.7)
    assert output["consensus"]["reasoning"].startswith(
        "single_agent conclusion backed by 3 of 3 votes (conservative, detail-focused, general)"
    )
    assert output["fallback"]["used"] is False
    context = output["context"]
    assert (context["mode"], context["char_cap"], context["targets"]) == (
        "per-target",
        100_000,
        list(range(8)),
    )
    assert (context["every_step_a_target"], context["fits"], context["full_char_cap"]) == (True, True, None)
    assert (context["omitted_steps"], context["chars"]) == (0, len(_log(llm.requests[0])))
    assert context["neighbour_targets"] == "in-full"
    # The cheaper reading names a neighbour that is a target instead of repeating it.
    llm = numbered(_replies(*[_answer(step=4)] * 3))
    options = EchoOptions(neighbour_targets="referenced")
    referenced = await Echo("echo", options).attribute(trajectory, llm)
    assert len(llm.requests) == 3 and referenced.output["context"]["neighbour_targets"] == "referenced"
    assert (
        _log(llm.requests[0])
        == target_context(trajectory, char_cap=100_000, neighbour_targets="referenced").text
    )


async def test_focal_context_reproduces_the_single_multi_focal_view() -> None:
    trajectory = _plain(8)
    llm = numbered(_replies(_answer(step=4), _answer(step=4), _answer(step=5, confidence=0.5)))
    attribution = await Echo("echo", EchoOptions(context="focal")).attribute(trajectory, llm)
    assert len(llm.requests) == 3
    user = llm.requests[0]["user"]
    assert "around the focal steps 0, 2, 4, 5, 7" in user
    assert "[step 0 | focal] Planner: Step 0 says hello." in user  # no error cue: spread focal steps
    assert "[step 1] Coder: Step 1 says hello." in user
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 4)
    context = attribution.output["context"]
    assert (context["mode"], context["focal_steps"], context["fits"]) == ("focal", [0, 2, 4, 5, 7], True)

    # The old view of the analysts, unchanged: FA4MAS's example view around step 1 on a longer log.
    long = _plain(20)
    llm = numbered(_replies(*[_answer(step=1)] * 3))
    await Echo("echo", EchoOptions(context="focal", focal=(1,))).attribute(long, llm)
    log = _log(llm.requests[0]).splitlines()
    assert log[:4] == [
        "[step 0] Planner: Step 0 says hello.",
        "[step 1 | focal] Coder: Step 1 says hello.",
        "[step 2] Computer_terminal: Step 2 says hello.",
        "[step 3 | L2 key decision] Planner: Step 3 says hello.",
    ]
    assert log[-1] == "[step 19 | L4 milestone] Coder: Step 19 says hello."


async def test_decoupled_mode_doubles_the_calls_and_pairs_the_halves() -> None:
    trajectory = _plain(8)
    replies = _replies(
        _answer(attribution=["Planner"], step=1, confidence=0.9),  # analyst 0, agent-focused
        _answer(attribution=["Coder"], step=6, confidence=0.4),  # analyst 0, step-focused
        _answer(attribution=["Planner"], step=2, confidence=0.7),  # analyst 1, agent-focused
        "not json",  # analyst 1, step-focused: no vote for analyst 1
        _answer(attribution=["Coder"], step=3, confidence=0.6),  # analyst 2, agent-focused
        _answer(attribution=["Planner"], step=3, confidence=0.8),  # analyst 2, step-focused
    )
    llm = numbered(replies)
    attribution = await Echo("echo", EchoOptions(decoupled=True)).attribute(trajectory, llm)

    assert len(llm.requests) == 6
    assert [r["temperature"] for r in llm.requests] == [0.83, 0.83, 0.84, 0.84, 0.67, 0.67]
    assert "Concentrate on WHO" in llm.requests[0]["user"]
    assert "Concentrate on WHERE" in llm.requests[1]["user"]
    votes = attribution.output["vote_table"]["votes"]
    assert [(v["analyst"], v["attribution"], v["mistake_step"], v["confidence"]) for v in votes] == [
        (0, ["Planner"], 6, 0.4),
        (2, ["Coder"], 3, 0.6),
    ]
    assert attribution.output["vote_table"]["no_vote"] == [{"analyst": 1}]
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 3)
    assert [c["focus"] for c in attribution.output["calls"]] == ["agent", "step"] * 3


# --- long logs, the whole-log option ------------------------------------------------------------------------


async def test_a_long_log_gets_the_most_evenly_spaced_targets_that_fit_and_still_k_calls() -> None:
    trajectory = _long()
    llm = numbered(lambda index, _request: _answer(step=index))
    attribution = await Echo("echo", EchoOptions()).attribute(trajectory, llm)

    assert len(llm.requests) == 3
    log = _log(llm.requests[0])
    assert all(_log(r) == log for r in llm.requests)
    context = attribution.output["context"]
    targets = context["targets"]
    assert 1 < len(targets) < 300 and not context["every_step_a_target"]
    assert targets == spread_steps(300, len(targets)) == _targets(log)
    assert context["fits"] and context["chars"] == len(log) <= 100_000 and context["full_char_cap"] is None
    listed = ", ".join(str(step) for step in targets)
    assert f"({len(targets)} evenly spaced target steps: {listed})" in llm.requests[0]["user"]
    assert attribution.output["n_calls"] == 3


async def test_decoupled_long_log_costs_two_calls_per_analyst() -> None:
    llm = numbered(lambda index, _request: _answer(step=index))
    attribution = await Echo("echo", EchoOptions(decoupled=True)).attribute(_long(), llm)
    assert len(llm.requests) == 6
    assert [(c["analyst"], c["focus"]) for c in attribution.output["calls"]] == [
        (analyst, focus) for analyst in range(3) for focus in ("agent", "step")
    ]
    assert [v["mistake_step"] for v in attribution.output["vote_table"]["votes"]] == [1, 3, 5]


async def test_a_small_context_window_lowers_the_cap() -> None:
    trajectory = _long(60)
    llm = numbered(lambda index, _request: _answer(step=1), context_window=12_000)
    attribution = await Echo("echo", EchoOptions(max_tokens=2000)).attribute(trajectory, llm)
    context = attribution.output["context"]
    cap = context["char_cap"]
    assert cap < 100_000 and context["context_window"] == 12_000
    assert len(llm.requests) == 3
    for request in llm.requests:
        assert llm.estimate_tokens(request["system"]) + llm.estimate_tokens(request["user"]) + 2000 <= 12_000
    assert context["chars"] == len(_log(llm.requests[0])) <= cap
    wide = await Echo("echo", EchoOptions()).attribute(trajectory, numbered(lambda i, r: _answer(step=1)))
    assert len(wide.output["context"]["targets"]) > len(context["targets"])  # a wider cap holds more targets


async def test_the_whole_log_option_shows_every_step_in_full_and_costs_k_calls() -> None:
    trajectory = _plain(8)
    llm = numbered(_replies(*[_answer(step=4)] * 3))
    attribution = await Echo("echo", EchoOptions(context="whole-log")).attribute(trajectory, llm)
    assert len(llm.requests) == 3
    assert "The log has 8 steps, numbered from 0. Every step is shown in full" in llm.requests[0]["user"]
    assert all(
        _log(r) == "\n".join(f"[step {s.index}] {s.agent}: {s.content}" for s in trajectory.steps)
        for r in llm.requests
    )
    assert attribution.output["context"] == {
        "mode": "whole-log",
        "char_cap": 100_000,
        "chars": len(_log(llm.requests[0])),
        "fits": True,
        "full_char_cap": None,
    }
    # A log longer than the cap is still one view of every step, its contents cut in the middle.
    llm = numbered(lambda index, _request: _answer(step=1))
    long = await Echo("echo", EchoOptions(context="whole-log")).attribute(_long(), llm)
    assert len(llm.requests) == 3
    log = _log(llm.requests[0])
    assert [int(line.split()[1].rstrip("]")) for line in log.splitlines()] == list(range(300))
    assert "characters cut" in log and long.output["context"]["full_char_cap"] is not None


@pytest.mark.parametrize(("include", "shown"), [(False, False), (True, True)])
async def test_ground_truth_only_when_asked(include: bool, shown: bool) -> None:
    trajectory = _trajectory([f"Step {i}." for i in range(5)], ground_truth="SEVENTEEN AWNINGS")
    llm = numbered(_replies(*[_answer(step=1)] * 3))
    await Echo("echo", EchoOptions(include_ground_truth=include)).attribute(trajectory, llm)
    assert all(("SEVENTEEN AWNINGS" in r["user"]) is shown for r in llm.requests)
    assert all(("The correct final answer" in r["user"]) is shown for r in llm.requests)


async def test_task_can_be_left_out() -> None:
    llm = numbered(_replies(*[_answer(step=1)] * 3))
    await Echo("echo", EchoOptions(include_task=False)).attribute(_plain(5), llm)
    assert "Count the awnings." not in llm.requests[0]["user"]
    assert "Task:\n(not recorded)" in llm.requests[0]["user"]


async def test_the_focal_view_is_shrunk_to_the_context_window() -> None:
    trajectory = _trajectory(["y" * 4000 for _ in range(60)])
    llm = numbered(_replies(*[_answer(step=1)] * 3), context_window=12_000)
    method = Echo("echo", EchoOptions(max_tokens=2000, context="focal", focal="spread"))
    attribution = await method.attribute(trajectory, llm)
    context = attribution.output["context"]
    assert context["char_cap"] < 100_000
    for request in llm.requests:
        assert llm.estimate_tokens(request["system"]) + llm.estimate_tokens(request["user"]) + 2000 <= 12_000
    assert "characters cut" in llm.requests[0]["user"]


async def test_digit_string_steps_decide_the_vote(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([_answer(step="3")] * 3)
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(9), llm)
    assert (attribution.pred_step, attribution.step_valid, attribution.error) == (3, True, None)
    assert attribution.output["vote_table"]["step_scores"][0]["step"] == 3


async def test_malformed_analysts_are_recorded_and_excluded() -> None:
    llm = numbered(
        _replies(
            "The Coder did it.",
            _answer(attribution=["Nobody"], step=2, confidence=0.99),
            _answer(attribution=["Computer_terminal"], step=6, confidence=0.5),
        )
    )
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert (attribution.pred_role, attribution.pred_step) == ("Computer_terminal", 6)
    calls = attribution.output["calls"]
    assert calls[0]["answer"] is None and calls[0]["raw_text"] == "The Coder did it."
    assert calls[0]["well_formed"] is False and "parse_error" in calls[0]
    assert calls[1]["answer"]["primary_conclusion"]["attribution"] == ["Nobody"]  # stored as answered
    assert any("Nobody" in p for p in calls[1]["problems"])
    assert attribution.output["vote_table"]["no_vote"] == [
        {"analyst": 0},
        {"analyst": 1},
    ]
    assert attribution.output["consensus"]["attribution"] == ["Computer_terminal"]


async def test_all_malformed_falls_back_on_evaluations_else_abstains() -> None:
    evaluations = [
        {"agent": "Planner", "step_index": 3, "error_likelihood": 0.7, "reasoning": "", "evidence": ""}
    ]
    llm = numbered(_replies("nope", _answer(step=42, evaluations=evaluations), "nope"))
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert (attribution.pred_role, attribution.pred_step) == ("Planner", 3)
    assert attribution.abstained is False
    assert attribution.output["fallback"] == {"used": True, "agent": "Planner", "step": 3}
    assert attribution.output["consensus"] is None

    llm = numbered(_replies("nope", "nope", "nope"))
    abstained = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert abstained.abstained is True
    assert (abstained.pred_role, abstained.pred_step, abstained.role_valid, abstained.step_valid) == (
        None,
        None,
        False,
        False,
    )
    assert abstained.output["fallback"]["used"] is False


async def test_alternative_hypotheses_are_reported_by_confidence() -> None:
    def alternative(confidence: float) -> dict[str, Any]:
        return {
            "type": "single_agent",
            "attribution": ["Planner"],
            "mistake_step": 1,
            "confidence": confidence,
            "reasoning": "",
        }

    replies = [
        _answer(alternative_hypotheses=[alternative(0.1), alternative(0.6), alternative(0.3)]),
        _answer(alternative_hypotheses=[alternative(0.5), alternative(0.2), alternative(0.4)]),
        _answer(),
    ]
    llm = numbered(_replies(*replies))
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    reported = attribution.output["alternative_hypotheses"]
    assert [(h["analyst"], h["confidence"]) for h in reported] == [
        (0, 0.6),
        (1, 0.5),
        (1, 0.4),
        (0, 0.3),
        (1, 0.2),
    ]


# --- unreadable answers and the design's rules: Attribution.error / fallback ----------------------------------


async def test_a_clear_vote_has_no_error_and_no_fallback() -> None:
    llm = numbered(
        _replies(_answer(confidence=0.9), _answer(confidence=0.6), _answer(attribution=["Planner"], step=1))
    )
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 4)
    assert attribution.error is None and attribution.fallback is None


async def test_no_usable_analyst_answer_is_an_error() -> None:
    llm = numbered(_replies("I don't know the answer to that.", "nope", "[]"))
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert attribution.abstained
    assert attribution.error == (
        "no analyst answer could be used (3 of 3 calls malformed); first: Expecting value: line 1 column 1 (char 0)"
    )
    assert attribution.fallback is None


async def test_the_mean_likelihood_fallback_is_named() -> None:
    evaluations = [
        {"agent": "Planner", "step_index": 3, "error_likelihood": 0.7, "reasoning": "", "evidence": ""}
    ]
    llm = numbered(_replies("nope", _answer(step=42, evaluations=evaluations), "nope"))
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert (attribution.pred_role, attribution.pred_step) == ("Planner", 3)
    assert attribution.error is None  # an evaluation was read
    assert attribution.fallback == (
        "echo: no vote kept (3 of 3 votes lost to malformed answers, 0 below min_confidence 0.3); agent with the "
        "highest mean error likelihood and its most likely step chosen (published fallback)"
    )
    assert attribution.output["fallback"] == {"used": True, "agent": "Planner", "step": 3}  # kept as it was


async def test_every_vote_below_the_confidence_floor_abstains_by_rule() -> None:
    llm = numbered(_replies(*[_answer(confidence=0.1)] * 3))
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert attribution.abstained and attribution.error is None
    assert attribution.fallback == (
        "echo: all 3 well-formed votes below min_confidence 0.3 and no valid agent evaluation: abstains "
        "(published rule)"
    )


async def test_tie_rules_that_decide_the_answer_are_named() -> None:
    llm = numbered(
        _replies(
            _answer(attribution=["Coder"], step=4, confidence=0.5),
            _answer(attribution=["Planner"], step=2, confidence=0.5),
            "nope",
        )
    )
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(8), llm)
    assert (attribution.pred_role, attribution.pred_step) == ("Planner", 2)
    assert attribution.error is None
    assert attribution.fallback == (
        "echo: top agents tied, first in recorded order taken; top steps tied, earliest taken (published tie rules)"
    )
