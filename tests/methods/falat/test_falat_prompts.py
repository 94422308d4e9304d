"""FALAT's locate and verify prompts: how a step is shown, what a verify prompt holds, its character caps."""

from __future__ import annotations

import re

import pytest

from helpers.scripted import ScriptedLLM
from rcarun.data import Step, Trajectory
from rcarun.methods.falat import (
    FailurePoint,
    Falat,
    FalatOptions,
    Templates,
    link_steps,
    locate_messages,
    type_steps,
    verify_messages,
    walk_back,
    weighted_caps,
)
from rcarun.methods.falat.prompts import render_step


def _step(index: int, agent: str, role: str, content: str) -> Step:
    return Step(index=index, agent=agent, role=role, content=content)


def _shown_steps(user_prompt: str) -> list[int]:
    return [int(k) for k in re.findall(r"\[step (\d+)\]", user_prompt)]


@pytest.mark.parametrize(
    ("lengths", "weights", "total", "caps"),
    [
        ([100, 200], [1, 2], 300, [None, None]),  # everything fits: nothing is cut
        ([5000, 5000, 5000], [1, 2, 1], 2000, [500, 1000, 500]),
        ([100, 5000, 5000], [1, 2, 1], 2000, [None, 1266, 633]),  # a short step gives its share to the others
        ([10, 20], [1, 2], 0, [0, 0]),
        ([], [], 0, []),
    ],
)
def test_weighted_caps(lengths: list[int], weights: list[int], total: int, caps: list[int | None]) -> None:
    assert weighted_caps(lengths, weights, total) == caps
    capped = [length if cap is None else min(length, cap) for length, cap in zip(lengths, caps, strict=True)]
    assert sum(capped) <= total


def test_a_step_is_shown_with_its_number_type_and_speaker() -> None:
    handoff = _step(3, "Orchestrator", "Orchestrator (-> WebSurfer)", "Search for dojos.")
    assert (
        render_step(handoff, "decision", None)
        == "[step 3] (decision) Orchestrator (-> WebSurfer): Search for dojos."
    )
    named = _step(4, "DiagnostAgent (-> ActionAgent)", "assistant", "Restart the pod.")
    assert (
        render_step(named, "decision", None)
        == "[step 4] (decision) DiagnostAgent (-> ActionAgent): Restart the pod."
    )
    long = _step(5, "Coder", "assistant", "a" * 100 + "b" * 100)
    shown = render_step(long, "message", 60)
    assert shown.startswith("[step 5] (message) Coder: a") and shown.endswith("b")
    assert "characters elided" in shown
    assert render_step(long, "message", 200) == f"[step 5] (message) Coder: {'a' * 100}{'b' * 100}"


def test_the_locate_prompt_shows_the_whole_typed_log(orders: Trajectory) -> None:
    types = type_steps(orders)
    templates = Templates.load()
    messages, truncation = locate_messages(
        orders,
        types,
        ScriptedLLM([]),
        templates=templates,
        task="What is the total of orders.csv?",
        ground_truth="",
        max_tokens=8000,
        policy="cap-steps",
    )
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == templates.system
    user = messages[1].content
    assert _shown_steps(user) == [0, 1, 2, 3, 4, 5]
    assert "[step 3] (tool_output) Computer_terminal: exitcode: 0" in user
    assert "Agents recorded in the log: human, Planner, Coder, Computer_terminal, Reviewer" in user
    assert '"maximum": 5' in user and "Some long steps were cut" not in user
    assert truncation.applied is False


def test_a_verify_prompt_holds_the_nearest_dependencies_the_candidate_and_the_failure(
    orders: Trajectory,
) -> None:
    types = type_steps(orders)
    graph = link_steps(orders, types)
    walk = {c.step: c for c in walk_back(graph, 5, 8)}

    def prompt(step: int, failure: FailurePoint, max_parents: int) -> str:
        messages, _ = verify_messages(
            orders,
            types,
            graph,
            failure,
            walk,
            step,
            ScriptedLLM([]),
            templates=Templates.load(),
            task="the task",
            ground_truth="",
            max_parents=max_parents,
            max_chars=16_000,
            max_tokens=8000,
            policy="cap-steps",
        )
        return messages[1].content

    located = FailurePoint(5, False, "the review accepts a wrong total")
    # step 5 depends on 4 (reply, reference) and 2 (reference); one parent shown: the nearest
    nearest = prompt(5, located, max_parents=1)
    assert _shown_steps(nearest) == [4, 5]
    assert "-- step 5 depends on it by: reply, reference (shared: 15230.5)" in nearest
    assert "(the candidate itself)" in nearest
    assert "Dependency path from the candidate to the failure: 5." in nearest
    assert "The failure first becomes visible at step 5: the review accepts a wrong total" in nearest
    both = prompt(5, located, max_parents=4)
    assert _shown_steps(both) == [2, 4, 5]  # parents in step order
    # the first step depends on nothing; the failure was a fallback to the last step
    first = prompt(0, FailurePoint(5, True, error="unreadable"), max_parents=4)
    assert "(none: the candidate depends on no earlier step)" in first
    assert "The failure is taken to be visible at the last step, step 5." in first
    assert _shown_steps(first) == [0, 5]
    assert "Candidate: step 0, a message step by human." in first


def test_verify_prompt_caps_step_text_with_the_candidate_getting_twice_the_share() -> None:
    steps = tuple(_step(i, "A" if i % 2 else "B", "assistant", str(i) * 5000) for i in range(3))
    trajectory = Trajectory(qid="d/4", source="d", task="t", steps=steps, sha256="0" * 64)
    types = type_steps(trajectory)
    graph = link_steps(trajectory, types)
    falat = Falat("falat", FalatOptions(verify_context_chars=2000))
    walk = walk_back(graph, 2, 8)
    messages, truncation = falat.verify_messages(
        trajectory,
        types,
        graph,
        FailurePoint(2, False, "r"),
        {c.step: c for c in walk},
        1,
        ScriptedLLM([]),
    )
    user = messages[1].content
    assert _shown_steps(user) == [0, 1, 2]
    assert user.count("[... 4000 characters elided ...]") == 1  # the candidate keeps 1000 characters
    assert (
        user.count("[... 4500 characters elided ...]") == 2
    )  # its parent and the failure step keep 500 each
    assert "Some long steps were cut in the middle" in user
    assert truncation.applied is False  # the context window is unknown: only the configured cap applied
