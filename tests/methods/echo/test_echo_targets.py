"""ECHO's per-target document without any model: each target's C_i, the shared milestones, fitting to the cap."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.echo import extract_cue, spread_steps, target_context
from rcarun.methods.echo.targets import GLOBAL_HEADER

AGENTS = ("Planner", "Coder", "Computer_terminal")


def _trajectory(contents: Sequence[str]) -> Trajectory:
    steps = tuple(
        Step(index=i, agent=AGENTS[i % 3], role="assistant", content=text) for i, text in enumerate(contents)
    )
    return Trajectory(qid="demo/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def _blocks(text: str) -> dict[int, str]:
    parts = re.split(r"\n\n(?==== Context of target step)", text)
    return {int(part.split()[5]): part for part in parts[1:]}


def _uniform(n: int, chars: int) -> Trajectory:
    return _trajectory([f"Step {i} ran the tool. " + "w" * (chars - 25) for i in range(n)])


def test_a_short_log_makes_every_step_a_target_with_its_own_c_i() -> None:
    contents = [f"Step {i} says hello. Therefore we go on with {i}." for i in range(18)]
    trajectory = _trajectory(contents)
    context = target_context(trajectory, char_cap=100_000)
    assert context.every_step and context.fits and context.targets == tuple(range(18))
    assert (context.full_char_cap, context.omitted) == (None, ())
    global_part, *_ = context.text.split("\n\n")
    assert global_part.splitlines() == [GLOBAL_HEADER] + [
        f"[step {i} | L4 milestone] {AGENTS[i % 3]}: {extract_cue(contents[i], 4).text}" for i in range(18)
    ]

    def reduced(index: int, level: int, tag: str) -> str:
        return f"[step {index} | {tag}] {AGENTS[index % 3]}: {extract_cue(contents[index], level).text}"

    blocks = _blocks(context.text)
    assert sorted(blocks) == list(range(18))
    assert blocks[8].splitlines() == [
        "=== Context of target step 8 (Computer_terminal) ===",
        "L1 immediate (the target and its neighbours, in full):",
        f"[step 7] Coder: {contents[7]}",
        f"[step 8 | target] Computer_terminal: {contents[8]}",
        f"[step 9] Planner: {contents[9]}",
        "L2 local (two or three steps away, key decisions):",
        *(reduced(i, 2, "L2 key decision") for i in (5, 6, 10, 11)),
        "L3 distant (four to six steps away, outcomes):",
        *(reduced(i, 3, "L3 outcome") for i in (2, 3, 4, 12, 13, 14)),
        "L4 global (the other steps): steps 0-1 and steps 15-17, as milestones in the global context",
    ]
    # At the edges the levels hold what exists.
    assert blocks[0].splitlines()[2:4] == [
        f"[step 0 | target] Planner: {contents[0]}",
        f"[step 1] Coder: {contents[1]}",
    ]
    assert blocks[0].endswith("L4 global (the other steps): steps 7-17, as milestones in the global context")
    assert blocks[10].endswith("steps 0-3 and step 17, as milestones in the global context")
    short = target_context(_trajectory(contents[:3]))
    assert _blocks(short.text)[1].splitlines()[-3:] == [
        "L2 local (two or three steps away, key decisions): none",
        "L3 distant (four to six steps away, outcomes): none",
        "L4 global (the other steps): none",
    ]


def test_a_long_log_gets_the_largest_count_of_evenly_spaced_targets_that_fits() -> None:
    trajectory = _uniform(300, 1500)
    cap = 100_000
    context = target_context(trajectory, char_cap=cap)
    count = len(context.targets)
    assert not context.every_step and context.fits and len(context.text) <= cap
    assert context.targets == tuple(spread_steps(300, count)) and 1 < count < 300
    assert (context.full_char_cap, context.omitted) == (None, ())  # nothing cut: fewer targets instead
    assert len(target_context(trajectory, char_cap=None).text) > cap  # every step a target would not fit
    larger = target_context(trajectory, char_cap=len(context.text) + 1)
    assert larger.targets == context.targets
    more = _blocks(target_context(trajectory).text)  # no cap: every step
    assert len(more) == 300
    # One more target would not fit: a block away from the edges is longer than the room left.
    assert len(context.text) + len(more[150]) > cap


def test_one_target_with_contents_cut_when_no_whole_target_fits() -> None:
    contents = [f"Step {i} is short." for i in range(30)]
    contents[14] = "z" * 20_000  # the middle step: the single target is step 14
    context = target_context(_trajectory(contents), char_cap=6000)
    assert context.targets == (14,) and context.fits and len(context.text) <= 6000
    assert context.full_char_cap is not None and context.full_char_cap >= 1000
    assert "characters cut" in context.text and context.omitted == ()


def test_milestones_are_left_out_last_those_without_a_cue_and_far_from_the_target_first() -> None:
    contents = ["Nothing here at all " + str(i) for i in range(200)]
    contents[3] = "Saved the report."  # a cue milestone, far from the middle target
    context = target_context(_trajectory(contents), char_cap=4000)
    assert context.targets == (99,) and context.fits and len(context.text) <= 4000
    assert context.omitted and 3 not in context.omitted
    assert "[step 3 | L4 milestone] Planner: Saved the report." in context.text
    kept = [i for i in range(200) if i not in context.omitted]
    assert set(range(92, 107)) <= set(kept)  # the target's own neighbourhood stays longest
    assert re.search(r"^\[steps \d+-\d+ omitted\]$", context.text, flags=re.MULTILINE)
    impossible = target_context(_trajectory(["x" * 3000] * 5), char_cap=2000)
    assert not impossible.fits and impossible.full_char_cap == 1000


def test_the_cue_fallbacks_are_counted_and_an_empty_log_is_refused() -> None:
    context = target_context(_trajectory(["plain words", "Therefore done."]))
    # Milestones: step 0 has no cue; step 1 ("done") neither at level 4. The L2/L3 levels hold nothing here.
    assert context.cue_fallbacks == sum(
        not extract_cue(text, 4).cue_matched for text in ("plain words", "Therefore done.")
    )
    with pytest.raises(ValueError, match="at least one step"):
        target_context(_trajectory([]))


def test_referenced_neighbour_targets_show_every_step_in_full_once() -> None:
    contents = [f"Step {i} says hello. Therefore we go on with {i}." for i in range(18)]
    trajectory = _trajectory(contents)
    literal = target_context(trajectory, char_cap=100_000)
    referenced = target_context(trajectory, char_cap=100_000, neighbour_targets="referenced")
    assert referenced.every_step and referenced.targets == tuple(range(18))
    for index, content in enumerate(contents):
        assert literal.text.count(f"{AGENTS[index % 3]}: {content}") == (2 if index in (0, 17) else 3)
        assert referenced.text.count(f"{AGENTS[index % 3]}: {content}") == 1  # as a target, in its own block
    assert _blocks(referenced.text)[8].splitlines()[2:5] == [
        "[step 7] Coder: (a target: shown in full in its own context)",
        f"[step 8 | target] Computer_terminal: {contents[8]}",
        "[step 9] Planner: (a target: shown in full in its own context)",
    ]
    # Targets three or more steps apart have no target as a neighbour: both readings are the same document.
    long = _uniform(300, 1500)
    spread = target_context(long, char_cap=100_000)
    assert target_context(long, char_cap=100_000, neighbour_targets="referenced").text == spread.text
    with pytest.raises(ValueError, match="neighbour_targets"):
        target_context(trajectory, neighbour_targets="twice")
