"""SOAP's input plan (A.2): segment text, prefix and windowed passes, template accounting, oversize rules."""

from __future__ import annotations

import pytest

from rcarun.data import Step, Trajectory
from rcarun.errors import DataError
from rcarun.methods.soap.inputs import (
    PlannedPass,
    plan_passes,
    prepare_segments,
    step_segment,
    task_segment,
    window_starts,
)


def _words(text: str) -> int:
    return len(text.split())


def _trajectory(*contents: str, task: str = "Fix the bug") -> Trajectory:
    steps = tuple(
        Step(index=i, agent=f"Agent{i % 2}", role="assistant", content=text)
        for i, text in enumerate(contents)
    )
    return Trajectory(qid="traj-7", source="test", task=task, steps=steps, sha256="0" * 64)


def test_segments_carry_agent_and_step_number_and_the_task_comes_first() -> None:
    trajectory = _trajectory("look at it", "done")
    assert task_segment(trajectory) == "Task: Fix the bug\n\nSteps:\n"
    assert step_segment(trajectory.steps[1]) == "[step 1] Agent1: done\n"
    segments = prepare_segments(trajectory, _words, context_tokens=100, template_tokens=3)
    assert segments.texts == (
        "Task: Fix the bug\n\nSteps:\n",
        "[step 0] Agent0: look at it\n",
        "[step 1] Agent1: done\n",
    )
    assert segments.tokens == (5, 6, 4)
    assert not segments.task_cut and segments.steps_cut == ()


def test_a_trajectory_without_a_task_says_so() -> None:
    assert task_segment(_trajectory("x", task="")) == "Task: (not recorded)\n\nSteps:\n"


def test_everything_fits_one_pass_scores_every_step() -> None:
    plan = plan_passes(10, [5, 5, 5], context_tokens=30, template_tokens=5)
    assert plan.passes == (PlannedPass(start=0, stop=3, first_target=0, tokens=30),)
    assert plan.starts == (0, 0, 0)
    assert not plan.windowed
    assert plan.tokens == 30


def test_a_long_trajectory_gets_the_longest_prefix_then_windows_that_drop_the_oldest_steps() -> None:
    # room for steps beside task and template: 30 - 5 - 10 = 15
    plan = plan_passes(10, [5, 5, 5, 5, 5], context_tokens=30, template_tokens=5)
    assert plan.starts == (0, 0, 0, 1, 2)
    assert plan.passes == (
        PlannedPass(0, 3, 0, 30),
        PlannedPass(1, 4, 3, 30),
        PlannedPass(2, 5, 4, 30),
    )
    assert plan.windowed
    assert plan.pass_of(3).segment_of(3) == 3  # task, step 1, step 2, step 3


def test_targets_with_the_same_window_start_share_one_pass_only_when_grouping() -> None:
    # starts: 0,0,0 | steps 1..3 (11) and 1..4 (12) both start at 1 | step 5 must drop step 1 -> start 2
    tokens = [5, 5, 5, 1, 1, 5]
    grouped = plan_passes(10, tokens, context_tokens=30, template_tokens=5)
    assert grouped.starts == (0, 0, 0, 1, 1, 2)
    assert grouped.passes == (PlannedPass(0, 3, 0, 30), PlannedPass(1, 5, 3, 27), PlannedPass(2, 6, 5, 27))
    prefix = plan_passes(10, tokens, context_tokens=30, template_tokens=5, sharing="prefix")
    assert prefix.passes == (
        PlannedPass(0, 3, 0, 30),
        PlannedPass(1, 4, 3, 26),
        PlannedPass(1, 5, 4, 27),
        PlannedPass(2, 6, 5, 27),
    )
    literal = plan_passes(10, tokens, context_tokens=30, template_tokens=5, sharing="none")
    assert [(p.start, p.stop) for p in literal.passes] == [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (2, 6)]
    for plan in (grouped, prefix, literal):
        assert sorted(t for p in plan.passes for t in p.targets) == list(range(6))
        assert all(p.tokens <= 30 for p in plan.passes)


def test_template_tokens_count_against_the_limit() -> None:
    # one more template token and step 2 no longer fits beside steps 0 and 1
    plan = plan_passes(10, [5, 5, 5], context_tokens=30, template_tokens=6)
    assert plan.starts == (0, 0, 1)
    assert plan.passes == (PlannedPass(0, 2, 0, 26), PlannedPass(1, 3, 2, 26))


def test_window_starts_refuses_a_step_that_cannot_fit_beside_the_task() -> None:
    with pytest.raises(ValueError, match="step 1"):
        window_starts(10, [2, 20], room=25)


def test_an_oversized_step_is_cut_in_the_middle_to_fit_beside_the_task() -> None:
    long = " ".join(f"w{i}" for i in range(40))
    trajectory = _trajectory("short one", long)
    segments = prepare_segments(trajectory, _words, context_tokens=30, template_tokens=3)
    assert segments.steps_cut == (1,)
    cut = segments.texts[2]
    assert cut.startswith("[step 1] Agent1: w0 ")
    assert "characters elided" in cut and cut.endswith("w39\n")
    assert segments.tokens[2] == _words(cut)
    assert segments.task_tokens + segments.tokens[2] <= 30 - 3
    plan = plan_passes(segments.task_tokens, segments.step_tokens, context_tokens=30, template_tokens=3)
    assert all(p.tokens <= 30 for p in plan.passes)


def test_a_long_task_is_cut_only_as_far_as_the_longest_step_needs() -> None:
    task = " ".join(f"t{i}" for i in range(60))
    trajectory = _trajectory("a b c d e f g h", task=task)  # step: 11 tokens
    segments = prepare_segments(trajectory, _words, context_tokens=50, template_tokens=2)
    # room 48; the task may keep max(48 // 2, 48 - 11) = 37 tokens
    assert segments.task_cut
    assert 30 < segments.task_tokens <= 37
    assert segments.texts[0].startswith("Task: t0 ") and "elided" in segments.texts[0]
    assert segments.steps_cut == ()


def test_oversize_error_names_the_trajectory_and_the_step() -> None:
    long = " ".join(["w"] * 40)
    with pytest.raises(DataError, match=r"traj-7.*history\[1\].*step 1 takes 43 tokens"):
        prepare_segments(
            _trajectory("ok", long), _words, context_tokens=30, template_tokens=3, oversize="error"
        )
    with pytest.raises(DataError, match=r"traj-7.*task"):
        prepare_segments(
            _trajectory("ok", task=long), _words, context_tokens=30, template_tokens=3, oversize="error"
        )


def test_a_limit_without_room_beside_the_template_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        prepare_segments(_trajectory("x"), _words, context_tokens=3, template_tokens=3)
