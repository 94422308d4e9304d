"""ECHO: the deterministic hierarchical view, the analyst calls, the consensus vote and its fallback, validation."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from helpers.scripted import numbered
from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import create_method, registered_methods
from rcarun.methods.echo import (
    LEVEL_WORDS,
    Conclusion,
    Echo,
    EchoOptions,
    Evaluation,
    Vote,
    analyst_panel,
    answer_schema,
    build_context,
    choose_focal_steps,
    consensus_vote,
    context_level,
    context_lines,
    extract_cue,
    fit_context,
    hierarchical_context,
    key_decision,
    milestone,
    outcome_summary,
    pair_conclusion,
    read_answer,
    split_sentences,
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


def _rounded(scores: Sequence[tuple[Any, float]]) -> list[tuple[Any, float]]:
    return [(key, round(score, 9)) for key, score in scores]


def _vote(analyst: int, kind: str, agents: Sequence[str], step: int, confidence: float) -> Vote:
    return Vote(analyst, Conclusion(kind, tuple(agents), step, confidence))


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


def test_schema_carries_agent_enums_and_step_bounds() -> None:
    schema = answer_schema(_plain(7))
    conclusion = schema["properties"]["primary_conclusion"]
    assert conclusion["properties"]["attribution"]["items"]["enum"] == list(AGENTS)
    assert conclusion["properties"]["mistake_step"] == {"type": "integer", "minimum": 0, "maximum": 6}
    assert conclusion["properties"]["type"]["enum"] == ["single_agent", "multi_agent"]
    evaluation = schema["properties"]["agent_evaluations"]["items"]
    assert evaluation["properties"]["error_likelihood"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert evaluation["properties"]["step_index"]["maximum"] == 6
    assert set(schema["required"]) == {
        "summary",
        "agent_evaluations",
        "primary_conclusion",
        "alternative_hypotheses",
    }


async def test_k_analyst_calls_with_personas_and_temperatures() -> None:
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
    assert "[step 0 | focal] Planner: Step 0 says hello." in user  # no error cue: spread focal steps
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
    assert output["consensus"]["confidence"] == pytest.approx(0.7)
    assert output["consensus"]["reasoning"].startswith("single_agent conclusion backed by 3 of 3 analysts")
    assert output["fallback"]["used"] is False
    assert output["context"]["focal_steps"] == [0, 2, 4, 5, 7]


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
    assert attribution.output["vote_table"]["malformed_analysts"] == [1]
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 3)
    assert [c["focus"] for c in attribution.output["calls"]] == ["agent", "step"] * 3


def test_pair_weight_is_the_lower_confidence() -> None:
    paired = pair_conclusion(
        Conclusion("multi_agent", ("Planner", "Coder"), 1, 0.9, "who"),
        Conclusion("single_agent", ("Computer_terminal",), 5, 0.35, "where"),
    )
    assert paired == Conclusion("multi_agent", ("Planner", "Coder"), 5, 0.35, "who: who\nwhere: where")


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


async def test_view_is_shrunk_to_the_context_window() -> None:
    trajectory = _trajectory(["y" * 4000 for _ in range(60)])
    llm = numbered(_replies(*[_answer(step=1)] * 3), context_window=12_000)
    method = Echo("echo", EchoOptions(max_tokens=2000, focal="spread"))
    attribution = await method.attribute(trajectory, llm)
    context = attribution.output["context"]
    assert context["char_cap"] < 100_000
    for request in llm.requests:
        assert llm.estimate_tokens(request["system"]) + llm.estimate_tokens(request["user"]) + 2000 <= 12_000
    assert "characters cut" in llm.requests[0]["user"]


# --- answers and the vote ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("just text", "not a JSON object"),
        ([1, 2], "not a JSON object"),
        ({"agent_evaluations": [], "alternative_hypotheses": []}, "summary"),
        ({"summary": "", "alternative_hypotheses": [], "primary_conclusion": None}, "agent_evaluations"),
        ({"type": "single_agent", "attribution": ["Nobody"]}, "unrecorded agents ['Nobody']"),
        ({"type": "single_agent", "attribution": []}, "attribution is missing, empty"),
        ({"type": "everyone"}, "type 'everyone'"),
        ({"mistake_step": 9}, "mistake_step 9 is outside [0, 9)"),
        ({"mistake_step": -1}, "mistake_step -1 is outside"),
        ({"mistake_step": "four"}, "mistake_step 'four' is not an integer"),
        ({"mistake_step": "4.0"}, "mistake_step '4.0' is not an integer"),
        ({"mistake_step": "9"}, "mistake_step 9 is outside [0, 9)"),  # read as a step, then out of range
        ({"mistake_step": True}, "mistake_step True is not an integer"),
        ({"mistake_step": 4.0}, "mistake_step 4.0 is not an integer"),
        ({"confidence": 1.5}, "confidence 1.5 is not a number"),
        ({"confidence": "high"}, "confidence 'high'"),
        ({"reasoning": None}, "reasoning is missing"),
    ],
)
def test_malformed_answers_are_not_repaired(answer: Any, problem: str) -> None:
    if isinstance(answer, dict) and "summary" not in answer and "agent_evaluations" not in answer:
        base = json.loads(_answer())
        base["primary_conclusion"].update(answer)
        answer = base
    reading = read_answer(answer, AGENTS, 9)
    assert reading.conclusion is None
    assert any(problem in p for p in reading.problems), reading.problems


def test_well_formed_answer_and_skipped_evaluations() -> None:
    evaluations = [
        {"agent": "Coder", "step_index": 4, "error_likelihood": 0.9, "reasoning": "", "evidence": ""},
        {"agent": "Nobody", "step_index": 4, "error_likelihood": 0.9, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": 12, "error_likelihood": 0.2, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": 1, "error_likelihood": 2, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": 1, "error_likelihood": 0, "reasoning": "", "evidence": ""},
    ]
    reading = read_answer(
        json.loads(_answer(attribution=["Coder", "Coder"], evaluations=evaluations)), AGENTS, 9
    )
    assert reading.problems == ()
    assert reading.conclusion == Conclusion(
        "single_agent", ("Coder",), 4, 0.8, "single_agent ['Coder', 'Coder'] at 4"
    )
    assert reading.evaluations == (Evaluation("Coder", 4, 0.9), Evaluation("Planner", 1, 0.0))
    assert [s.split(":")[0] for s in reading.skipped] == [
        "agent_evaluations[1]",
        "agent_evaluations[2]",
        "agent_evaluations[3]",
    ]


def test_digit_string_steps_are_read_as_integers_as_the_scorer_reads_them() -> None:
    evaluations = [
        {"agent": "Coder", "step_index": "4", "error_likelihood": 0.9, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": " 1 ", "error_likelihood": 0.2, "reasoning": "", "evidence": ""},
        {"agent": "Planner", "step_index": "one", "error_likelihood": 0.2, "reasoning": "", "evidence": ""},
    ]
    reading = read_answer(json.loads(_answer(step="4", evaluations=evaluations)), AGENTS, 9)
    assert reading.problems == ()
    assert reading.conclusion is not None and reading.conclusion.mistake_step == 4
    assert reading.evaluations == (Evaluation("Coder", 4, 0.9), Evaluation("Planner", 1, 0.2))
    assert reading.skipped == ("agent_evaluations[2]: step_index 'one' is not a step of the log",)


async def test_digit_string_steps_decide_the_vote(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([_answer(step="3")] * 3)
    attribution = await Echo("echo", EchoOptions()).attribute(_plain(9), llm)
    assert (attribution.pred_step, attribution.step_valid, attribution.error) == (3, True, None)
    assert attribution.output["vote_table"]["step_scores"][0]["step"] == 3


def test_heaviest_type_wins_and_low_confidence_is_dropped() -> None:
    votes = [
        _vote(0, "single_agent", ["Coder"], 4, 0.4),
        _vote(1, "single_agent", ["Coder"], 4, 0.45),
        _vote(2, "multi_agent", ["Planner", "Coder"], 2, 0.8),
        _vote(3, "multi_agent", ["Planner"], 2, 0.29),  # below 0.3: dropped
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9)
    assert outcome.dropped == (3,)
    assert outcome.kept == (0, 1, 2)
    assert outcome.type_sums == {"single_agent": pytest.approx(0.85), "multi_agent": 0.8}
    assert outcome.winning_type == "single_agent"
    assert (outcome.role, outcome.mistake_step) == ("Coder", 4)
    assert outcome.confidence == pytest.approx(0.425)
    # With the low vote kept (threshold 0.2), multi_agent weighs 1.09 and wins.
    multi = consensus_vote(votes, agents=AGENTS, n_steps=9, min_confidence=0.2)
    assert multi.winning_type == "multi_agent"
    assert _rounded(multi.agent_scores) == [("Planner", 1.09), ("Coder", 0.8)]
    assert multi.attribution == ("Planner", "Coder")
    assert multi.mistake_step == 2


def test_agent_and_step_scores_are_summed_confidences() -> None:
    votes = [
        _vote(0, "single_agent", ["Planner"], 3, 0.5),
        _vote(1, "single_agent", ["Planner"], 6, 0.4),
        _vote(2, "single_agent", ["Coder"], 6, 0.8),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9)
    assert _rounded(outcome.agent_scores) == [("Planner", 0.9), ("Coder", 0.8)]
    assert _rounded(outcome.step_scores) == [(6, 1.2), (3, 0.5)]
    assert outcome.attribution == ("Planner",)
    assert outcome.mistake_step == 6  # the step is voted on its own, not the top agent's step


def test_multi_agent_attributes_every_agent_at_or_above_the_threshold() -> None:
    votes = [
        _vote(0, "multi_agent", ["Coder", "Planner"], 5, 0.6),
        _vote(1, "multi_agent", ["Computer_terminal", "Coder"], 5, 0.5),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9, min_confidence=0.5)
    assert _rounded(outcome.agent_scores) == [("Coder", 1.1), ("Planner", 0.6), ("Computer_terminal", 0.5)]
    assert outcome.attribution == ("Coder", "Planner", "Computer_terminal")
    assert outcome.role == "Coder"


def test_tie_rules() -> None:
    # Agents tie -> recorded order (Planner before Coder); steps tie -> earliest; 0.1 + 0.2 ties with 0.3.
    votes = [
        _vote(0, "single_agent", ["Coder"], 7, 0.1),
        _vote(1, "single_agent", ["Coder"], 7, 0.2),
        _vote(2, "single_agent", ["Planner"], 2, 0.3),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9, min_confidence=0.0)
    assert outcome.role == "Planner"
    assert outcome.mistake_step == 2
    # Types tie -> single_agent.
    tied = consensus_vote(
        [_vote(0, "multi_agent", ["Coder"], 1, 0.5), _vote(1, "single_agent", ["Planner"], 2, 0.5)],
        agents=AGENTS,
        n_steps=9,
    )
    assert tied.winning_type == "single_agent" and tied.role == "Planner"


def test_out_of_range_steps_are_tallied_but_never_chosen() -> None:
    votes = [
        _vote(0, "single_agent", ["Coder"], 99, 0.9),
        _vote(1, "single_agent", ["Coder"], -1, 0.8),
        _vote(2, "single_agent", ["Coder"], 3, 0.4),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9)
    assert [step for step, _ in outcome.step_scores] == [99, -1, 3]
    assert outcome.mistake_step == 3
    only_outside = consensus_vote(votes[:1], agents=AGENTS, n_steps=9)
    assert (only_outside.role, only_outside.mistake_step) == ("Coder", None)


def test_fallback_uses_the_highest_mean_error_likelihood() -> None:
    evaluations = [
        Evaluation("Planner", 1, 0.9),
        Evaluation("Planner", 2, 0.1),  # Planner mean 0.5
        Evaluation("Coder", 6, 0.6),
        Evaluation("Coder", 4, 0.6),  # Coder mean 0.6, its top likelihood ties at steps 4 and 6 -> 4
        Evaluation("Computer_terminal", 0, 0.2),
    ]
    low = [_vote(0, "single_agent", ["Planner"], 1, 0.2)]
    outcome = consensus_vote(low, evaluations, agents=AGENTS, n_steps=9)
    assert outcome.fallback_used is True
    assert outcome.winning_type is None and outcome.kept == () and outcome.dropped == (0,)
    assert (outcome.role, outcome.mistake_step) == ("Coder", 4)
    assert outcome.agent_mean_likelihood == {
        "Planner": pytest.approx(0.5),
        "Coder": pytest.approx(0.6),
        "Computer_terminal": 0.2,
    }
    nothing = consensus_vote(low, (), agents=AGENTS, n_steps=9)
    assert (nothing.attribution, nothing.mistake_step, nothing.fallback_used) == ((), None, False)


def test_disagreement_report() -> None:
    spread = [_vote(0, "single_agent", ["Coder"], 1, 0.95), _vote(1, "single_agent", ["Coder"], 1, 0.35)]
    outcome = consensus_vote(spread, agents=AGENTS, n_steps=9)
    assert outcome.requires_review is True
    assert outcome.confidence_spread == pytest.approx(0.6)
    assert outcome.review_reasons == ("confidence spread 0.60 > 0.5",)
    # The spread counts dropped votes too; exactly 0.5 is not above the limit.
    calm = [_vote(0, "single_agent", ["Coder"], 1, 0.7), _vote(1, "multi_agent", ["Coder"], 1, 0.2)]
    calm_outcome = consensus_vote(calm, agents=AGENTS, n_steps=9)
    assert calm_outcome.confidence_spread == pytest.approx(0.5)
    assert calm_outcome.requires_review is False
    # Both types among the kept votes is ordinary disagreement, not a review case (only > 2 types are).
    split = [
        _vote(0, "single_agent", ["Coder"], 1, 0.6),
        _vote(1, "multi_agent", ["Coder", "Planner"], 1, 0.5),
    ]
    split_outcome = consensus_vote(split, agents=AGENTS, n_steps=9)
    assert split_outcome.kept == (0, 1)
    assert split_outcome.review_reasons == ()


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
    assert attribution.output["vote_table"]["malformed_analysts"] == [0, 1]
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


# --- options -------------------------------------------------------------------------------------------------


def test_registered_and_options_from_config() -> None:
    assert "echo" in registered_methods()
    method = create_method("echo", label="echo/decoupled", options={"decoupled": True, "personas": None})
    assert method.label == "echo/decoupled"
    options = EchoOptions.from_mapping(
        {"analysts": 2, "personas": ["liberal", "general"], "temperatures": [0.1, 0.2], "focal": [3, 4]}
    )
    assert options.personas == ("liberal", "general")
    assert options.temperatures == (0.1, 0.2)
    assert options.focal == (3, 4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"analyst": 3}, "unknown option"),
        ({"analysts": 0}, "at least 1"),
        ({"analysts": 7}, "explicit personas"),
        ({"analysts": 2, "personas": ["liberal"]}, "1 names for 2 analysts"),
        ({"analysts": 1, "personas": ["optimist"]}, "unknown persona"),
        ({"temperatures": [0.5]}, "1 values for 3 analysts"),
        ({"temperature_range": [0.9, 0.3]}, "temperature_range"),
        ({"min_confidence": 1.5}, "min_confidence"),
        ({"context_type": "vibes"}, "context_type"),
        ({"focal": "middle"}, "focal"),
        ({"focal": []}, "focal"),
        ({"context_chars": 100}, "context_chars"),
        ({"decoupled": "yes"}, "decoupled"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"reasoning": "max"}, "reasoning"),
    ],
)
def test_invalid_options_are_config_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EchoOptions.from_mapping(options)


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
        "echo: no vote kept (3 of 3 analysts malformed, 0 below min_confidence 0.3); agent with the highest "
        "mean error likelihood and its most likely step chosen (published fallback)"
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
