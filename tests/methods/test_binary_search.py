"""Binary search: segments and split rule, stop rule, the seeded unclear-answer rule, rendering and context policy."""

from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import create_method, registered_methods
from rcarun.methods.binary_search import (
    ANSWER_SCHEMA,
    BinarySearch,
    BinarySearchOptions,
    decision_seed,
    split,
)

_AGENTS = ["Planner", "Coder", "Computer_terminal"]


def _answer(half: str) -> str:
    return json.dumps({"reason": f"go {half}", "half": half})


EARLIER, LATER = _answer("earlier"), _answer("later")


def _trajectory(
    n: int = 10, content_len: int = 20, qid: str = "demo/1", ground_truth: str = ""
) -> Trajectory:
    steps = tuple(
        Step(index=i, agent=_AGENTS[i % 3], role="assistant", content=f"step {i} " + "x" * content_len)
        for i in range(n)
    )
    return Trajectory(
        qid=qid,
        source="demo",
        task="Count the awnings.",
        steps=steps,
        sha256="0" * 64,
        ground_truth=ground_truth,
    )


def _user(request: dict[str, Any]) -> str:
    return str(request["messages"][1].content)


def _log(request: dict[str, Any]) -> str:
    return _user(request).split("=== LOG PART START ===\n", 1)[1].split("\n=== LOG PART END ===", 1)[0]


def _segment(request: dict[str, Any]) -> list[int]:
    return [int(k) for k in re.findall(r"^\[step (\d+)\] ", _log(request), flags=re.MULTILINE)]


def _ranges(attribution: Any) -> list[tuple[int, int]]:
    return [(d["start"], d["end"]) for d in attribution.output["decisions"]]


def test_registered_and_options_validated() -> None:
    assert "binary-search" in registered_methods()
    method = create_method("binary-search", label="bs/earlier", options={"unclear": "earlier", "seed": 7})
    assert method.label == "bs/earlier"
    assert isinstance(method, BinarySearch)
    assert method.options == BinarySearchOptions(unclear="earlier", seed=7)
    with pytest.raises(ConfigError, match=r"binary-search: unknown option\(s\) \['max_steps'\]"):
        create_method("binary-search", options={"max_steps": 3})
    for bad in (
        {"unclear": "upper"},
        {"seed": True},
        {"seed": "0"},
        {"step_numbers": "no"},
        {"max_tokens": -1},
        {"truncation": "drop"},
        {"include_ground_truth": 1},
    ):
        with pytest.raises(ConfigError, match="binary-search: "):
            create_method("binary-search", options=bad)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_tokens", "1024"),
        ("max_tokens", True),
        ("max_tokens", 1024.0),
        ("seed", 7.0),
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("stage", ""),
        ("max_step", 3),
    ],
)
def test_mistyped_options_are_refused_naming_the_option(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^binary-search: .*{option}") as refused:
        create_method("binary-search", options={option: value})
    assert "\n" not in str(refused.value)


def test_defaults_and_split_rule() -> None:
    options = BinarySearchOptions()
    assert (options.max_tokens, options.temperature, options.unclear, options.seed) == (
        1024,
        0.0,
        "random",
        0,
    )
    assert (options.step_numbers, options.include_ground_truth, options.stage) == (True, False, "bisect")
    assert [split(0, 9), split(0, 4), split(3, 4), split(5, 9), split(8, 9)] == [4, 2, 3, 7, 8]


async def test_segments_narrow_to_one_step(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(10)
    llm = scripted([EARLIER, LATER, LATER])
    attribution = await BinarySearch("bs", BinarySearchOptions()).attribute(trajectory, llm)

    assert [r["stage"] for r in llm.requests] == ["bisect"] * 3
    assert [_segment(r) for r in llm.requests] == [
        list(range(10)),
        [0, 1, 2, 3, 4],
        [3, 4],
    ]  # then [4, 4]: stop
    assert llm.replies == []
    first = _user(llm.requests[0])
    assert "from step 0 to step 9" in first
    assert "- earlier: steps 0 to 4\n- later: steps 5 to 9\n" in first
    assert "- earlier: steps 3 to 3\n- later: steps 4 to 4\n" in _user(llm.requests[2])
    assert "Count the awnings." in first and "The log has" not in first
    for request in llm.requests:
        assert request["schema"] == ANSWER_SCHEMA
        assert (request["max_tokens"], request["temperature"]) == (1024, 0.0)

    assert (attribution.pred_step, attribution.pred_role) == (4, "Coder")  # the speaker of step 4
    assert attribution.role_valid and attribution.step_valid and not attribution.abstained
    output = attribution.output
    assert _ranges(attribution) == [(0, 9), (0, 4), (3, 4)]
    assert [d["half"] for d in output["decisions"]] == ["earlier", "later", "later"]
    assert [d["mid"] for d in output["decisions"]] == [4, 2, 3]
    assert output["calls"] == 3 and output["unclear_decisions"] == 0
    assert output["decisions"][0]["reason"] == "go earlier"
    assert output["truncation"] == {"policy": "cap-steps", "prompts": 3, "prompts_cut": 0}


@pytest.mark.parametrize(
    ("answer", "ranges", "step"),
    [
        (LATER, [(0, 9), (5, 9), (8, 9)], 9),
        (EARLIER, [(0, 9), (0, 4), (0, 2), (0, 1)], 0),
    ],
)
async def test_calls_are_about_log2_n(scripted, answer, ranges, step) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(lambda request: answer)
    attribution = await BinarySearch("bs", BinarySearchOptions()).attribute(_trajectory(10), llm)
    assert _ranges(attribution) == ranges
    assert attribution.pred_step == step
    assert len(llm.requests) in (3, 4)  # ceil(log2 10) = 4, or one fewer


async def test_one_step_log_needs_no_call(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([])
    attribution = await BinarySearch("bs", BinarySearchOptions()).attribute(_trajectory(1), llm)
    assert llm.requests == []
    assert (attribution.pred_step, attribution.pred_role, attribution.step_valid) == (0, "Planner", True)
    assert attribution.output["calls"] == 0


def _expected_draw(seed: int, qid: str, start: int, end: int) -> str:
    digest = hashlib.sha256(f"{seed}|{qid}|{start}|{end}".encode()).digest()
    return "earlier" if random.Random(int.from_bytes(digest[:8], "big")).random() < 0.5 else "later"


async def test_unclear_answers_draw_a_seeded_half(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(10)
    method = BinarySearch("bs", BinarySearchOptions(seed=3))
    first = await method.attribute(trajectory, scripted(lambda request: "no idea"))
    again = await method.attribute(trajectory, scripted(lambda request: "no idea"))

    decisions = first.output["decisions"]
    assert first.output == again.output  # a rerun makes the same draws
    assert all(d["unclear"] for d in decisions)
    assert first.output["unclear_decisions"] == len(decisions)
    assert first.output["unclear_rule"] == "random"
    assert [d["half"] for d in decisions] == [
        _expected_draw(3, "demo/1", d["start"], d["end"]) for d in decisions
    ]
    assert decision_seed(3, "demo/1", 0, 9) == int.from_bytes(
        hashlib.sha256(b"3|demo/1|0|9").digest()[:8], "big"
    )
    assert decisions[0]["raw_text"] == "no idea" and "Expecting value" in decisions[0]["error"]
    assert first.pred_step is not None and first.step_valid


async def test_seed_and_qid_change_the_draw(scripted) -> None:  # type: ignore[no-untyped-def]
    steps = set()
    for seed in range(12):
        attribution = await BinarySearch("bs", BinarySearchOptions(seed=seed)).attribute(
            _trajectory(16), scripted(lambda request: "?")
        )
        steps.add(attribution.pred_step)
    assert len(steps) > 3  # 12 seeds land on several of the 16 steps
    halves = {_expected_draw(0, f"demo/{k}", 0, 15) for k in range(12)}
    assert halves == {"earlier", "later"}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (json.dumps({"reason": "", "half": "Earlier"}), "half is missing or not 'earlier' or 'later'"),
        (json.dumps({"reason": "", "half": "upper"}), "half is missing or not 'earlier' or 'later'"),
        (json.dumps({"reason": "the later half"}), "half is missing or not 'earlier' or 'later'"),
        ("The later half.", "Expecting value"),
        (json.dumps("later"), "the answer is not a JSON object"),
    ],
)
async def test_unclear_rule_earlier(scripted, text, error) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([LATER, text, LATER])
    attribution = await BinarySearch("bs", BinarySearchOptions(unclear="earlier")).attribute(
        _trajectory(10), llm
    )
    decisions = attribution.output["decisions"]
    assert _ranges(attribution) == [(0, 9), (5, 9), (5, 7)]
    assert [(d["half"], d["unclear"]) for d in decisions] == [
        ("later", False),
        ("earlier", True),
        ("later", False),
    ]
    assert error in decisions[1]["error"]
    assert decisions[1]["raw_text"] == text
    assert "error" not in decisions[0]
    assert attribution.pred_step == 7 and attribution.output["unclear_decisions"] == 1


async def test_original_rendering_without_step_numbers(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([LATER, EARLIER, EARLIER, EARLIER])
    await BinarySearch("bs", BinarySearchOptions(step_numbers=False)).attribute(_trajectory(10), llm)
    second = llm.requests[1]
    assert "[step" not in _log(second)
    assert _log(second).splitlines() == [f"{_AGENTS[i % 3]}: step {i} {'x' * 20}" for i in range(5, 10)]
    assert "the first one is step 5." in _user(second)
    assert "- earlier: steps 5 to 7\n- later: steps 8 to 9\n" in _user(second)


@pytest.mark.parametrize(
    ("include", "ground_truth", "expected"),
    [(False, "42 awnings", False), (True, "42 awnings", True), (True, "", False)],
)
async def test_ground_truth_only_when_asked(scripted, include, ground_truth, expected) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(lambda request: LATER)
    method = BinarySearch("bs", BinarySearchOptions(include_ground_truth=include))
    await method.attribute(_trajectory(4, ground_truth=ground_truth), llm)
    assert all(("Correct final answer: 42 awnings\n" in _user(r)) is expected for r in llm.requests)
    assert all(("Correct final answer" in _user(r)) is expected for r in llm.requests)


async def test_wide_segments_are_fitted_to_a_small_window(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(16, content_len=2000)  # ~32,000 characters, ~8,000 tokens
    llm = scripted(lambda request: EARLIER, context_window=4000)
    attribution = await BinarySearch("bs", BinarySearchOptions(max_tokens=500)).attribute(trajectory, llm)

    assert _ranges(attribution) == [(0, 15), (0, 7), (0, 3), (0, 1)]
    for request, (start, end) in zip(llm.requests, _ranges(attribution), strict=True):
        system, user = (m.content for m in request["messages"])
        assert llm.estimate_tokens(user) + llm.estimate_tokens(system) + 500 + 512 <= 4000
        assert _segment(request) == list(range(start, end + 1))
    caps = [d.get("step_char_cap") for d in attribution.output["decisions"]]
    assert isinstance(caps[0], int) and isinstance(caps[1], int) and caps[0] < caps[1] < 2000
    assert caps[2:] == [None, None]  # 4 steps of ~2,000 characters fit
    assert "characters elided" in _user(llm.requests[0]) and "characters elided" not in _user(llm.requests[2])
    assert attribution.output["truncation"] == {
        "policy": "cap-steps",
        "prompts": 4,
        "prompts_cut": 2,
        "min_step_char_cap": caps[0],
        "context_window": 4000,
        "all_fit": True,
    }


# --- unclear answers: Attribution.error / fallback -----------------------------------------------------------


async def test_clear_answers_have_no_error_and_no_fallback(scripted) -> None:  # type: ignore[no-untyped-def]
    attribution = await BinarySearch("bs", BinarySearchOptions()).attribute(
        _trajectory(8), scripted([EARLIER] * 3)
    )
    assert attribution.pred_step == 0
    assert attribution.error is None and attribution.fallback is None


async def test_prose_everywhere_is_an_error_and_the_random_rule_is_named(scripted) -> None:  # type: ignore[no-untyped-def]
    """The walkthrough's text-only server: every halving unclear, yet a valid step; the prediction says so."""
    llm = scripted(["I don't know the answer to that."] * 3)
    attribution = await BinarySearch("bs", BinarySearchOptions()).attribute(_trajectory(8), llm)
    assert attribution.step_valid and attribution.role_valid  # the rule still chose a step
    assert attribution.error == (
        "no bisect answer was clear (3 of 3); first: Expecting value: line 1 column 1 (char 0)"
    )
    assert attribution.fallback == (
        "binary search: unclear verdict at 3 of 3 halvings, half chosen at random (published rule)"
    )
    assert attribution.output["unclear_decisions"] == 3


async def test_one_unclear_halving_is_a_fallback_without_an_error(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([EARLIER, json.dumps({"reason": "r", "half": "upper"}), LATER])
    options = BinarySearchOptions(unclear="earlier")
    attribution = await BinarySearch("bs", options).attribute(_trajectory(8), llm)
    assert attribution.error is None
    assert attribution.fallback == (
        "binary search: unclear verdict at 1 of 3 halvings, earlier half taken (published rule)"
    )


async def test_a_one_step_log_needs_no_answer(scripted) -> None:  # type: ignore[no-untyped-def]
    attribution = await BinarySearch("bs", BinarySearchOptions()).attribute(_trajectory(1), scripted([]))
    assert attribution.pred_step == 0 and attribution.error is None and attribution.fallback is None
