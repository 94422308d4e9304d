"""ECHO's hierarchical context without any model: levels, cue extraction, fitting, focal steps."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.echo import (
    LEVEL_WORDS,
    build_context,
    choose_focal_steps,
    context_level,
    context_lines,
    extract_cue,
    fit_context,
    hierarchical_context,
    key_decision,
    milestone,
    outcome_summary,
    split_sentences,
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
