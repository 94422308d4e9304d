"""ECHO's hierarchical context without any model: levels, cue extraction, fitting, focal steps, target windows."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.echo import (
    LEVEL_WORDS,
    StepLevels,
    build_context,
    choose_focal_steps,
    context_level,
    context_lines,
    equal_windows,
    extract_cue,
    fit_context,
    hierarchical_context,
    key_decision,
    milestone,
    outcome_summary,
    plan_windows,
    split_sentences,
    target_windows,
)

AGENTS = ("Planner", "Coder", "Computer_terminal")


def _trajectory(contents: Sequence[str]) -> Trajectory:
    steps = tuple(
        Step(index=i, agent=AGENTS[i % 3], role="assistant", content=text) for i, text in enumerate(contents)
    )
    return Trajectory(qid="demo/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def _plain(n: int) -> Trajectory:
    return _trajectory([f"Step {i} says hello." for i in range(n)])


# --- hierarchical context ------------------------------------------------------------------------------------

# 18 steps around focal step 8: L1 = 7-9, L2 = 5-6 and 10-11, L3 = 2-4 and 12-14, L4 = 0-1 and 15-17.
CONTENTS = [
    "We start the job. The plan is completed soon.",  # 0: L4, cue "completed"
    "Hello there. Nothing to report",  # 1: L4, no cue -> first sentence
    "Loading the data. The result was 12 rows.",  # 2: L3, cue "result"
    "Just chatting",  # 3: L3, no cue
    "Reading files. Warning: column X is empty!",  # 4: L3, cue "warning"
    "I looked at it. Therefore we drop column X. Then more.",  # 5: L2, cue "Therefore"
    "Some words here.\nLet me compute the mean.",  # 6: L2, cue "Let me" on the second line
    "Full seven. Keep all of this text.",  # 7: L1
    "Full eight, the focal step.",  # 8: L1 (focal)
    "Full nine.",  # 9: L1
    "Plain sentence. Another plain one.",  # 10: L2, no cue
    "The answer is 42. I conclude here.",  # 11: L2, cue "The answer is"
    "",  # 12: L3, empty
    "It returned nothing useful.",  # 13: L3, cue "returned"
    "ok",  # 14: L3
    "Saved the report.",  # 15: L4, cue "saved"
    "The task is finished now.",  # 16: L4, cue "finished"
    "TERMINATE",  # 17: L4, cue
]


def test_levels_by_distance() -> None:
    assert [context_level(d) for d in range(10)] == [1, 1, 2, 2, 3, 3, 3, 4, 4, 4]
    assert dict(LEVEL_WORDS) == {2: 50, 3: 20, 4: 15}


def test_hierarchical_view_around_one_focal_step() -> None:
    view = hierarchical_context(_trajectory(CONTENTS), 8)
    assert view.splitlines() == [
        "[step 0 | L4 milestone] Planner: The plan is completed soon.",
        "[step 1 | L4 milestone] Coder: Hello there.",
        "[step 2 | L3 outcome] Computer_terminal: The result was 12 rows.",
        "[step 3 | L3 outcome] Planner: Just chatting",
        "[step 4 | L3 outcome] Coder: Warning: column X is empty!",
        "[step 5 | L2 key decision] Computer_terminal: Therefore we drop column X.",
        "[step 6 | L2 key decision] Planner: Let me compute the mean.",
        "[step 7] Coder: Full seven. Keep all of this text.",
        "[step 8 | focal] Computer_terminal: Full eight, the focal step.",
        "[step 9] Planner: Full nine.",
        "[step 10 | L2 key decision] Coder: Plain sentence.",
        "[step 11 | L2 key decision] Computer_terminal: The answer is 42.",
        "[step 12 | L3 outcome] Planner: (empty)",
        "[step 13 | L3 outcome] Coder: It returned nothing useful.",
        "[step 14 | L3 outcome] Computer_terminal: ok",
        "[step 15 | L4 milestone] Planner: Saved the report.",
        "[step 16 | L4 milestone] Coder: The task is finished now.",
        "[step 17 | L4 milestone] Computer_terminal: TERMINATE",
    ]


def test_lines_record_level_distance_and_cue_fallback() -> None:
    lines = context_lines(_trajectory(CONTENTS), 8)
    assert [line.level for line in lines] == [4, 4, 3, 3, 3, 2, 2, 1, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4]
    assert [line.distance for line in lines][:3] == [8, 7, 6]
    no_cue = [line.index for line in lines if not line.cue_matched]
    assert no_cue == [1, 3, 10, 12, 14]
    assert [line.index for line in lines if line.focal] == [8]


def test_several_focal_steps_use_the_nearest() -> None:
    lines = context_lines(_plain(20), [2, 15])
    assert [line.level for line in lines] == [2, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3, 2, 2, 1, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="outside"):
        context_lines(_plain(5), [5])


def test_word_caps_per_level() -> None:
    sentence = "Therefore " + " ".join(f"w{i}" for i in range(79)) + "."  # 80 words with an L2 cue
    text = "Intro line.\n" + sentence
    l2 = key_decision(text)
    assert l2.split()[:2] == ["Therefore", "w0"]
    assert len(l2.split()) == 50 + 1 and l2.endswith(" ...")
    # "Therefore" is no L3/L4 cue under decision-quality: both fall back to the first sentence.
    assert outcome_summary(text) == "Intro line."
    long_outcome = "The result " + " ".join(f"r{i}" for i in range(40))
    assert outcome_summary(long_outcome).split() == ["The", "result", *[f"r{i}" for i in range(18)], "..."]
    long_milestone = "Completed " + " ".join(f"m{i}" for i in range(40))
    assert milestone(long_milestone).split() == ["Completed", *[f"m{i}" for i in range(14)], "..."]
    exactly = " ".join(["done"] * 15)
    assert milestone(exactly) == exactly  # at the cap: no ellipsis
    blob = "Completed " + "z" * 500  # two words, but 120 characters at most for L4
    assert milestone(blob) == "Completed " + "z" * 110 + " ..."


def test_cue_extraction_takes_the_first_matching_sentence_else_the_first_sentence() -> None:
    text = "Looking around. Thus I pick B. Therefore C is out."
    assert extract_cue(text, 2).text == "Thus I pick B."
    assert extract_cue(text, 2).cue_matched is True
    fallback = extract_cue("No signal here. Nor here.", 2)
    assert (fallback.text, fallback.cue_matched) == ("No signal here.", False)
    assert extract_cue("  \n ", 3).text == "(empty)"
    assert split_sentences("A b. C d!\n\nE f? g") == ["A b.", "C d!", "E f?", "g"]
    with pytest.raises(ValueError, match="level"):
        extract_cue("x", 1)


def test_context_types_are_alternative_cue_sets() -> None:
    text = "Looks fine so far. Please run the tests next. An error occurred in step 3."
    assert key_decision(text, "decision-quality") == "Looks fine so far."  # no decision cue -> first sentence
    assert key_decision(text, "handoff") == "Please run the tests next."
    assert key_decision(text, "error-propagation") == "An error occurred in step 3."
    with pytest.raises(ValueError, match="context type"):
        key_decision(text, "vibes")


def _long_trajectory() -> Trajectory:
    # 20 steps around focal 10: L1 = 9-11 (3,000 chars each); L4 = 0-3 and 17-19.
    contents = [f"Step {i} filler." for i in range(20)]
    for i in (9, 10, 11):
        contents[i] = "x" * 3000
    contents[1] = "Completed part one."
    contents[3] = "Created the file."
    contents[17] = "Saved it."
    contents[19] = "TERMINATE"
    return _trajectory(contents)


def test_fit_cuts_full_contents_first_to_the_largest_cap_that_fits() -> None:
    lines = context_lines(_long_trajectory(), 10)
    full = fit_context(lines).text
    assert fit_context(lines, len(full)).full_char_cap is None
    cap = len(full) - 3000  # 1,000 characters per full step have to go
    view = fit_context(lines, cap)
    assert view.fits and view.omitted == ()
    assert view.full_char_cap is not None and 1000 <= view.full_char_cap < 3000
    # The largest cap: one more character on each of the three full steps would not fit.
    assert cap - 3 < len(view.text) <= cap
    assert view.text.count("characters cut ...]") == 3
    assert "[step 0 | L4 milestone] Planner: Step 0 filler." in view.text


def test_fit_then_omits_reduced_steps_in_the_documented_order() -> None:
    lines = context_lines(_long_trajectory(), 10)
    cut = " [... 2000 characters cut ...] "
    at_floor = len(fit_context(lines).text) - 3 * (2000 - len(cut))  # full steps at 1,000 characters
    view = fit_context(lines, at_floor - 1)
    # L4 lines without a cue go first, farthest first: step 0 (distance 10).
    assert view.omitted == (0,)
    assert view.full_char_cap == 1000
    assert view.text.startswith("[step 0 omitted]\n[step 1 | L4 milestone]")
    # Shrinking further: 0, then 18 and 2 (distance 8, later step first), then cue lines 19, 1 (distance 9).
    step_18 = "[step 18 | L4 milestone] Planner: Step 18 filler.\n"
    view = fit_context(lines, at_floor - 1 - len(step_18) + len("[step 18 omitted]\n"))
    assert view.omitted == (0, 18)
    tiny = fit_context(lines, 2000)
    assert tiny.fits is False
    assert tiny.omitted == tuple(i for i in range(20) if i not in (9, 10, 11))
    assert tiny.text.splitlines()[0] == "[steps 0-8 omitted]"
    assert tiny.text.splitlines()[-1] == "[steps 12-19 omitted]"


def test_build_context_reports_what_was_done() -> None:
    view = build_context(_long_trajectory(), 10, char_cap=None)
    assert view.fits and view.full_char_cap is None and view.omitted == ()
    assert "x" * 3000 in view.text


def test_focal_steps_errors_then_spread() -> None:
    contents = [f"Step {i} fine." for i in range(30)]
    contents[12] = "Traceback: an error occurred."
    contents[20] = "Warning: the file was not found."
    contents[25] = "It failed again."
    trajectory = _trajectory(contents)
    assert choose_focal_steps(trajectory, "errors", 3) == (12, 20, 25)
    assert choose_focal_steps(trajectory, "errors", 2) == (12, 20)  # the earliest error cues
    assert choose_focal_steps(trajectory, "errors", 5) == (
        0,
        7,
        12,
        20,
        25,
    )  # topped up from the spread 0, 7, 15, 22, 29
    assert choose_focal_steps(trajectory, "spread", 3) == (0, 15, 29)
    assert choose_focal_steps(trajectory, "spread", 1) == (14,)
    assert choose_focal_steps(trajectory, [1], 5) == (1,)
    assert choose_focal_steps(trajectory, [40, -1], 2) == (0, 29)  # none inside -> spread


# --- target windows ------------------------------------------------------------------------------------------

_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
_CUE_SENTENCES = ("Therefore we go on.", "The result was fine.", "Saved the output.", "Let me check it.")


def _long_log(n_steps: int, chars: int, seed: int = 0) -> Trajectory:
    """``n_steps`` steps of exactly ``chars`` characters: a short opening sentence, then filler sentences, some
    of them cue sentences, so that the reduced lines differ in length from step to step."""
    rng = random.Random(seed)
    contents = []
    for index in range(n_steps):
        text = f"Step {index} ran the tool."
        while len(text) < chars:
            if rng.random() < 0.1:
                text += " " + rng.choice(_CUE_SENTENCES)
            else:
                text += " " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) + "."
        contents.append(text[:chars])
    return _trajectory(contents)


def _target_lines(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.split("]")[0].endswith("| target")]


def test_window_sizes_are_the_rendered_lengths_and_lines_are_the_union_of_the_targets_views() -> None:
    trajectory = _long_log(40, 300)
    levels = StepLevels(trajectory)
    rng = random.Random(1)
    spans = [
        (0, 39),
        (0, 0),
        (39, 39),
        (5, 5),
        (3, 17),
        *((a, a + rng.randint(0, 10)) for a in range(0, 29, 4)),
    ]
    for first, last in spans:
        lines = levels.window_lines(first, last)
        assert lines == context_lines(trajectory, range(first, last + 1))
        rendered = fit_context(lines, None, target_tag="target").text
        assert levels.full_chars(first, last) == len(rendered), (first, last)
        assert levels.least_chars(first, last) <= levels.full_chars(first, last)
        assert _target_lines(rendered) == list(range(first, last + 1))


def test_a_log_that_fits_is_one_window_showing_every_step_in_full() -> None:
    trajectory = _long_log(18, 200)
    levels = StepLevels(trajectory)
    plan, windows = target_windows(levels, 100_000, 8)
    assert plan.spans == ((0, 17),) and plan.tiling == "greedy"
    (window,) = windows
    assert window.view.whole and window.view.fits
    # Every step a target, so no tag is needed: the view reads exactly as the log.
    assert window.view.text == "\n".join(f"[step {s.index}] {s.agent}: {s.content}" for s in trajectory.steps)
    assert window.levels == {1: 18, 2: 0, 3: 0, 4: 0}
    assert plan_windows(levels, None, 8).spans == ((0, 17),)  # no cap: one window


def _tiles(spans: Sequence[tuple[int, int]], n_steps: int) -> bool:
    return [step for first, last in spans for step in range(first, last + 1)] == list(range(n_steps))


def test_a_long_log_is_tiled_into_the_longest_windows_that_fit_whole() -> None:
    trajectory = _long_log(300, 1500)
    cap = 100_000
    levels = StepLevels(trajectory)
    plan, windows = target_windows(levels, cap, 8)
    assert plan.tiling == "greedy" and 3 <= len(windows) <= 8
    assert _tiles(plan.spans, 300)
    for window in windows:
        assert window.view.whole and window.view.fits and len(window.view.text) <= cap
        # Greedy: no longer window from the same first target would fit whole.
        assert all(levels.full_chars(window.first, last) > cap for last in range(window.last + 1, 300))
        # The targets and their two neighbours in full, the next two steps on each side as key decisions.
        assert _target_lines(window.view.text) == list(window.targets)
        for neighbour in (window.first - 1, window.last + 1):
            if 0 <= neighbour < 300:
                step = trajectory.steps[neighbour]
                assert f"[step {neighbour}] {step.agent}: {step.content}\n" in window.view.text + "\n"
        if window.first >= 2:
            assert f"[step {window.first - 2} | L2 key decision]" in window.view.text
    # Every step is shown in full as a target in exactly one window.
    for step in trajectory.steps:
        shown = [
            w for w in windows if f"[step {step.index} | target] {step.agent}: {step.content}" in w.view.text
        ]
        assert len(shown) == 1


def test_more_windows_than_max_views_become_equal_windows_fitted_to_the_cap() -> None:
    trajectory = _long_log(301, 1500)
    levels = StepLevels(trajectory)
    assert len(plan_windows(levels, 100_000, 8).spans) == 6  # greedy: 55 targets of 1,500 characters a window
    plan, windows = target_windows(levels, 100_000, 5)
    assert plan.tiling == "equal"
    assert plan.spans == ((0, 60), (61, 120), (121, 180), (181, 240), (241, 300))
    for window in windows:
        assert window.view.fits and len(window.view.text) <= 100_000
        assert not window.view.whole  # 61 targets of 1,500 characters cannot be shown whole
        assert _target_lines(window.view.text) == list(window.targets)  # cut, never left out
    assert equal_windows(10, 3) == ((0, 3), (4, 6), (7, 9))
    assert equal_windows(2, 5) == ((0, 0), (1, 1))
    with pytest.raises(ValueError, match="max_views"):
        plan_windows(levels, 100_000, 0)


def test_a_target_whose_view_cannot_fit_whole_is_a_window_of_its_own_fitted_by_the_rules() -> None:
    contents = [f"Step {i} is short." for i in range(30)]
    contents[12] = "z" * 6000
    trajectory = _trajectory(contents)
    plan, windows = target_windows(StepLevels(trajectory), 3000, 8)
    assert plan.tiling == "greedy" and _tiles(plan.spans, 30)
    lone = [w for w in windows if w.first == 12]
    assert len(lone) == 1 and lone[0].last == 12
    view = lone[0].view
    assert view.fits and len(view.text) <= 3000
    assert view.full_char_cap is not None and "characters cut" in view.text
    # The windows next to it show step 12 as a full neighbour, so they are cut too; the others are whole.
    touching = {w.first for w in windows if w.last == 11 or w.first in (12, 13)}
    assert all(w.view.full_char_cap is not None for w in windows if w.first in touching)
    assert all(w.view.whole for w in windows if w.first not in touching)


def test_planning_a_700_step_log_renders_only_the_chosen_windows() -> None:
    trajectory = _long_log(700, 2000, seed=7)
    start = time.perf_counter()
    levels = StepLevels(trajectory)
    plan, windows = target_windows(levels, 100_000, 8)
    elapsed = time.perf_counter() - start
    print(f"700 steps x 2,000 characters: {len(windows)} windows ({plan.tiling}) in {elapsed:.3f} s")
    assert plan.tiling == "equal" and len(windows) == 8
    assert _tiles(plan.spans, 700)
    assert all(w.view.fits and len(w.view.text) <= 100_000 for w in windows)
