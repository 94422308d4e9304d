"""The task a record states: its question, else the opening step(s) of its history, by each source's profile."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcarun.data import (
    MAX_TASK_STEPS,
    Step,
    Trajectory,
    check_dataset,
    derive_task,
    iter_dataset,
    load_trajectory_file,
    parse_step,
    task_key,
    task_profile,
)

RecordWriter = Callable[..., Path]
SHAPES = Path(__file__).parent / "longrca_shapes"


def _raw(source: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SHAPES / source / f"{source}__900.json").read_text())
    return loaded


def _steps(*speakers: tuple[str, str], role: str = "user") -> tuple[Step, ...]:
    return tuple(Step(i, agent, role, content) for i, (agent, content) in enumerate(speakers))


# --- each LongRCA source's step-0 shape, through the loader -----------------------------------------------


@pytest.mark.parametrize(
    ("source", "rule", "task_steps"),
    [
        ("swe_bench_pro", "history[0]", [0]),  # OpenHands: the human states the issue
        ("terminal_bench_2", "history[0]", [0]),  # OpenHands: the human states the task
        ("travelplanner", "history[0]", [0]),  # the terminal loads the query and the workflow rules
        ("vitabench", "history[0..1]", [0, 1]),  # the platform's policies, then the user's request
        ("webarena_verified", "history[0]", [0]),  # the planner quotes the task, then plans: not a task giver
    ],
)
def test_each_source_shape_gives_its_task_and_keeps_the_steps(
    source: str, rule: str, task_steps: list[int]
) -> None:
    raw = _raw(source)
    assert "question" not in raw
    record = load_trajectory_file(SHAPES / source / f"{source}__900.json", source)
    trajectory = record.trajectory

    expected = "\n\n".join(raw["history"][i]["content"].strip() for i in task_steps)
    assert (trajectory.task, trajectory.task_source) == (expected, rule)
    # The history is as recorded: the task step is still step 0, ids, agents and contents unchanged.
    assert [(s.index, s.agent, s.role, s.content) for s in trajectory.steps] == [
        (item["step"], item["name"], item["role"], item["content"]) for item in raw["history"]
    ]
    assert record.reference is not None and record.reference.step == raw["mistake_step"]


def test_the_shapes_dataset_loads_and_checks_without_a_task_warning() -> None:
    report = check_dataset(SHAPES)
    assert report.ok and report.loaded == 5
    assert [p.kind for p in report.problems] == []
    sources = {name: dict(summary.task_sources) for name, summary in report.sources.items()}
    assert sources == {
        "swe_bench_pro": {"history[0]": 1},
        "terminal_bench_2": {"history[0]": 1},
        "travelplanner": {"history[0]": 1},
        "vitabench": {"history[0..1]": 1},
        "webarena_verified": {"history[0]": 1},
    }


# --- the rule, step by step -------------------------------------------------------------------------------


def test_openhands_task_is_the_opening_run_of_human_steps() -> None:
    steps = _steps(("human", " Fix the bug. "), ("human", "Tests live in tests/."), ("DiagnostAgent", "plan"))
    derived = derive_task(steps, "swe_bench_pro")
    assert (derived.text, derived.source, derived.steps) == (
        "Fix the bug.\n\nTests live in tests/.",
        "history[0..1]",
        (0, 1),
    )
    # The environment is not a task giver in OpenHands logs: an opening terminal step stands alone.
    steps = _steps(("Computer_terminal", "Fix the bug."), ("Computer_terminal", "exit code 0"))
    assert derive_task(steps, "terminal_bench_2").source == "history[0]"


def test_magentic_sources_take_the_opening_run_of_the_terminal_or_user() -> None:
    steps = _steps(
        ("Computer_terminal", "policy"), ("computer_terminal", "request"), ("Action_Expert", "act")
    )
    assert derive_task(steps, "vitabench").text == "policy\n\nrequest"  # names compared as the scorer does
    steps = _steps(("user", "plan a trip"), ("Task_Planner", "fact sheet"))
    assert derive_task(steps, "travelplanner").source == "history[0]"


def test_an_opening_workflow_agent_gives_step_0_alone() -> None:
    # A Who&When CaptainAgent expert quotes "# General Task" and then works on it in its next steps.
    steps = _steps(("Excel_Expert", "# General Task\nCount the awnings."), ("Excel_Expert", "```python\n```"))
    for source in ("algorithm_generated", "webarena_verified", "somewhere_else"):
        derived = derive_task(steps, source)
        assert (derived.text, derived.source) == ("# General Task\nCount the awnings.", "history[0]")


def test_the_opening_run_stops_at_max_task_steps() -> None:
    steps = _steps(*[("human", f"part {i}") for i in range(6)], ("Planner", "plan"))
    derived = derive_task(steps, "hand_crafted")
    assert derived.steps == tuple(range(MAX_TASK_STEPS)) == (0, 1, 2)
    assert (derived.text, derived.source) == ("part 0\n\npart 1\n\npart 2", "history[0..2]")


def test_no_task_when_the_opening_steps_hold_nothing() -> None:
    assert derive_task(_steps(("human", "  \n"), ("Planner", "plan")), "swe_bench_pro") == derive_task(
        (), "x"
    )
    assert derive_task((), "x").source == "none" and derive_task((), "x").text == ""
    # An empty first step of a giver's run does not hide the request that follows it.
    derived = derive_task(_steps(("user", ""), ("user", "the request"), ("Agent", "a")), "vitabench")
    assert (derived.text, derived.source, derived.steps) == ("the request", "history[0..1]", (0, 1))
    # Empty steps closing the run are not named as where the task came from.
    derived = derive_task(_steps(("human", "the task"), ("human", " "), ("Agent", "a")), "swe_bench_pro")
    assert (derived.source, derived.steps) == ("history[0]", (0,))


def test_profiles_by_source_name() -> None:
    assert task_profile("swe_bench_pro").name == task_profile(" SWE_Bench_Pro ").name == "openhands"
    assert task_profile("terminal_bench_2").is_giver("Human")
    assert not task_profile("terminal_bench_2").is_giver("Computer_terminal")
    assert {task_profile(s).name for s in ("travelplanner", "vitabench", "webarena_verified")} == {"magentic"}
    assert task_profile("vitabench").is_giver("ComputerTerminal")
    assert task_profile("unknown").name == task_profile("algorithm_generated").name == "default"


# --- what the loader records --------------------------------------------------------------------------------


def test_a_question_is_the_task_and_a_blank_one_is_not(
    write_record: RecordWriter, good_record: dict[str, Any]
) -> None:
    trajectory = load_trajectory_file(write_record(good_record), "src").trajectory
    assert (trajectory.task, trajectory.task_source) == ("How many?", "question")

    good_record["question"] = "   "
    good_record["history"][0]["content"] = "How many awnings?"
    trajectory = load_trajectory_file(write_record(good_record, name="2"), "src").trajectory
    assert (trajectory.task, trajectory.task_source) == ("How many awnings?", "history[0]")
    assert trajectory.steps[0].content == "How many awnings?"


def test_a_record_with_no_task_is_a_warning(write_record: RecordWriter) -> None:
    record = {
        "question_ID": "vitabench__001",
        "history": [
            {"step": 0, "name": "Computer_terminal", "role": "user", "content": ""},
            {"step": 1, "name": "Action_Expert", "role": "assistant", "content": "act"},
        ],
        "mistake_agent": "Action_Expert",
        "mistake_step": 1,
        "mistake_reason": "why",
    }
    file = write_record(record, source="vitabench", name="vitabench__001")
    trajectory = load_trajectory_file(file, "vitabench").trajectory
    assert (trajectory.task, trajectory.task_source) == ("", "none")

    report = check_dataset(file.parent.parent)
    assert report.ok  # usable: a warning, not an error
    no_task = [p for p in report.problems if p.kind == "no_task"]
    assert [(p.severity, p.record, p.field) for p in no_task] == [
        ("warning", "vitabench__001", "history[0].content")
    ]
    assert "Task: (not recorded)" in no_task[0].message
    assert dict(report.sources["vitabench"].task_sources) == {"none": 1}


def test_trajectories_built_in_memory_name_their_task_source() -> None:
    steps = _steps(("human", "t"))
    assert Trajectory("q", "s", "a task", steps, "0" * 64).task_source == "question"
    assert Trajectory("q", "s", "", steps, "0" * 64).task_source == "none"
    assert Trajectory("q", "s", "t", steps, "0" * 64, task_source="history[0]").task_source == "history[0]"


def test_who_and_when_tasks_are_their_questions_and_step_0_states_them(who_and_when: Path) -> None:
    records = list(iter_dataset(who_and_when))
    assert {r.trajectory.task_source for r in records} == {"question"}
    # A copy without the question field: hand_crafted's human step 0 opens with the question (19 of 20 are
    # exactly it; hand_crafted/14 appends the attached file's 13,675 characters); an algorithm_generated
    # expert's step 0 quotes it (all but 10 of 126 verbatim).
    states_it = {"algorithm_generated": 0, "hand_crafted": 0}
    for record in records:
        trajectory = record.trajectory
        derived = derive_task(trajectory.steps, trajectory.source)
        assert derived.source == "history[0]"
        if trajectory.source == "hand_crafted":
            assert derived.text.startswith(trajectory.task.strip())
        states_it[trajectory.source] += trajectory.task.strip()[:60] in derived.text
    assert states_it == {"algorithm_generated": 116, "hand_crafted": 20}


# --- step numbers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "step"),
    [
        (12, 12),
        ("12", 12),
        (" 12\n", 12),
        ("+3", 3),
        ("-1", -1),
        ("007", 7),
        (0, 0),
        (True, None),
        (False, None),
        (3.0, None),
        ("3.5", None),
        ("twelve", None),
        ("", None),
        ("1 2", None),
        ("１２", None),  # full-width digits: not ASCII, as the scorer
        (None, None),
        ([1], None),
    ],
)
def test_parse_step_reads_integers_and_digit_strings_as_the_scorer_does(
    value: object, step: int | None
) -> None:
    from rcarun.analysis.scoring import parse_step as scorer_parse_step

    assert parse_step(value) == step == scorer_parse_step(value)


def test_task_key_joins_reformatted_copies_of_one_task_and_parts_others() -> None:
    key = task_key("Book a trip\nto Rome for 2 people.")
    assert key == hashlib.sha256(b"Book a trip to Rome for 2 people.").hexdigest()
    assert task_key("  Book a trip to   Rome\tfor 2 people. \n") == key
    assert task_key("Book a trip to Rome for 3 people.") != key
    assert task_key(" \n\t") is None
