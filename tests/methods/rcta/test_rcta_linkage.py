"""RCTA faithful-implementation linkage hints: plan citations, identifier overlap at its thresholds, scope."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcarun.data import Step, Trajectory, iter_dataset
from rcarun.methods.rcta.handoffs import augment_with_handoffs, handoffs_of
from rcarun.methods.rcta.linkage import LinkageHint, code_identifiers, linkage_hints, plan_citation


def _trajectory(*steps: tuple[str, str]) -> Trajectory:
    """A LongRCA-style trajectory from ``(name, content)`` pairs."""
    built = tuple(
        Step(index=i, agent=name, role="assistant", content=text) for i, (name, text) in enumerate(steps)
    )
    return Trajectory(qid="t__001", source="swe_bench_pro", task="", steps=built, sha256="0" * 64)


def _ids(prefix: str, n: int) -> list[str]:
    """``n`` distinct identifiers that qualify (underscore, 6+ characters)."""
    return [f"{prefix}_{i:03d}" for i in range(n)]


def _overlap_case(executor_ids: int, shared: int) -> tuple[LinkageHint, ...]:
    plan = " ".join(_ids("shared", shared))
    action = " ".join(_ids("shared", shared) + _ids("own", executor_ids - shared))
    trajectory = _trajectory(("DiagnostAgent (-> ActionAgent)", plan), ("ActionAgent", action))
    return linkage_hints([0, 1], trajectory)


def test_code_identifiers() -> None:
    text = (
        "parse_config fetchData HTTPError utf8text README Python return abc_d x_y_z1 9abc_def camelC naïve_x"
    )
    assert code_identifiers(text) == frozenset(
        {"parse_config", "fetchData", "HTTPError", "utf8text", "README", "x_y_z1", "abc_def", "camelC"}
    )
    assert code_identifiers("snake_case snake_case Snake_case") == frozenset({"snake_case", "Snake_case"})


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("As instructed, I edited the parser.", "As instructed"),
        ("I did it per the plan above", "per the plan"),
        ("Done, AS THE PLAN REQUIRES.", "AS THE PLAN REQUIRES"),
        ("as plan says, skip it", "as plan says"),
        ("Following the instructions I ran pytest", "Following the instructions"),
        ("according to the plan: step 2", "according to the plan"),
        ("The user has specified a port", "as specified"),  # no word boundaries, as in the release
        ("我按照计划修改了解析器", "按照计划"),
        ("按委派完成", "按委派"),
        ("I planned this myself", None),
        ("as the planner said", None),
    ],
)
def test_plan_citation(text: str, phrase: str | None) -> None:
    assert plan_citation(text) == phrase


def test_cites_plan_hint_fields() -> None:
    trajectory = _trajectory(
        ("human", "Fix the bug."),
        ("DiagnostAgent (-> ActionAgent)", "Change load_config to read utf8 files."),
        ("ActionAgent", "As instructed, I changed load_config."),
    )
    assert linkage_hints([2], trajectory) == (
        LinkageHint(
            executor_step=2,
            executor_agent="ActionAgent",
            handoff_step=1,
            handoff_agent="DiagnostAgent (-> ActionAgent)",
            handoff_recipient="ActionAgent",
            kind="cites_plan",
            cites_plan="As instructed",
            overlap=1.0,
            shared_count=1,
            shared_identifiers=("load_config",),
        ),
    )
    assert linkage_hints([2], trajectory)[0].strength == "strong"


@pytest.mark.parametrize(
    ("executor_ids", "shared", "fires", "overlap"),
    [
        (5, 3, True, 0.6),  # the minimum executor identifiers and shared count
        (4, 3, False, None),  # fewer than 5 executor identifiers, although overlap is 0.75
        (5, 2, False, None),  # fewer than 3 shared, although overlap is 0.4
        (8, 3, True, 0.38),  # 0.375 >= 0.34
        (9, 3, False, None),  # 0.333 < 0.34
        (50, 17, True, 0.34),  # exactly 0.34
        (51, 17, False, None),  # 0.3333
    ],
)
def test_identifier_overlap_thresholds(
    executor_ids: int, shared: int, fires: bool, overlap: float | None
) -> None:
    hints = _overlap_case(executor_ids, shared)
    if not fires:
        assert hints == ()
        return
    (hint,) = hints
    assert (hint.kind, hint.strength, hint.cites_plan) == ("identifier_overlap", "weak", None)
    assert (hint.executor_step, hint.handoff_step, hint.overlap, hint.shared_count) == (1, 0, overlap, shared)
    assert hint.shared_identifiers == tuple(_ids("shared", shared)[:10])


def test_both_rules_fire_gives_cites_plan_with_overlap_recorded() -> None:
    plan = " ".join(_ids("shared", 4))
    action = "Per the plan: " + " ".join(_ids("shared", 4) + _ids("own", 1))
    (hint,) = linkage_hints(
        [1], _trajectory(("DiagnostAgent (-> ActionAgent)", plan), ("ActionAgent", action))
    )
    assert (hint.kind, hint.cites_plan, hint.overlap, hint.shared_count) == (
        "cites_plan",
        "Per the plan",
        0.8,
        4,
    )


def test_no_hint_without_a_handoff_addressed_to_the_executor() -> None:
    plan = " ".join(_ids("shared", 6))
    action = "As instructed: " + " ".join(_ids("shared", 6))
    # Addressed to the verifier, not the executor: no cross-recipient linkage.
    assert (
        linkage_hints([1], _trajectory(("DiagnostAgent (-> JudgeAgent)", plan), ("ActionAgent", action)))
        == ()
    )
    # Case-sensitive recipient.
    assert (
        linkage_hints([1], _trajectory(("DiagnostAgent (-> actionagent)", plan), ("ActionAgent", action)))
        == ()
    )
    # The handoff comes after the executor.
    assert (
        linkage_hints([0], _trajectory(("ActionAgent", action), ("DiagnostAgent (-> ActionAgent)", plan)))
        == ()
    )
    # The nearest handoff to the executor is used, even when an older one would share more.
    trajectory = _trajectory(
        ("DiagnostAgent (-> ActionAgent)", plan),
        ("DiagnostAgent (-> ActionAgent)", "Try something else."),
        ("ActionAgent", " ".join(_ids("shared", 6))),
    )
    assert linkage_hints([2], trajectory) == ()


def test_only_executor_candidates_are_examined() -> None:
    plan = " ".join(_ids("shared", 6))
    text = "As instructed: " + " ".join(_ids("shared", 6))
    for name in (
        "JudgeAgent",
        "Computer_terminal",
        "DiagnostAgent",
        "mystery_agent",
        "ActionAgent (-> JudgeAgent)",
    ):
        trajectory = _trajectory(("DiagnostAgent (-> " + name + ")", plan), (name, text))
        assert linkage_hints([1], trajectory) == (), name
    # Other executor names of the paper's lists do get hints.
    for name in ("Action_Expert", "WebSurfer", "transport_agent", "Python_Expert"):
        trajectory = _trajectory(("Task_Planner (-> " + name + ")", plan), (name, text))
        assert [h.executor_agent for h in linkage_hints([1], trajectory)] == [name]


def test_examined_ids_are_deduplicated_sorted_and_in_range() -> None:
    plan = " ".join(_ids("shared", 3))
    trajectory = _trajectory(
        ("DiagnostAgent (-> ActionAgent)", plan),
        ("ActionAgent", "as planned"),
        ("ActionAgent", "nothing in common"),
        ("ActionAgent", " ".join(_ids("shared", 3) + _ids("own", 2))),
    )
    hints = linkage_hints([3, 1, 3, 2, 99, -1], trajectory)
    assert [(h.executor_step, h.kind) for h in hints] == [(1, "cites_plan"), (3, "identifier_overlap")]
    # Precomputed handoffs give the same hints; an empty handoff list gives none.
    assert linkage_hints([1, 3], trajectory, handoffs_of(trajectory)) == hints
    assert linkage_hints([1, 3], trajectory, ()) == ()


def test_shared_identifiers_list_is_capped_at_ten_sorted() -> None:
    names = [f"ident_{c}x" for c in "qwertyuiopasdf"]  # 14 identifiers
    text = " ".join(names)
    (hint,) = linkage_hints([1], _trajectory(("DiagnostAgent (-> ActionAgent)", text), ("ActionAgent", text)))
    assert hint.shared_count == 14
    assert hint.shared_identifiers == tuple(sorted(names)[:10])
    assert hint.overlap == 1.0


def test_who_and_when_hints_link_executors_to_their_own_handoffs(who_and_when: Path) -> None:
    found: list[tuple[str, int, int, str, str | None, int]] = []
    for record in iter_dataset(who_and_when):
        trajectory = record.trajectory
        augmented = augment_with_handoffs(range(trajectory.n_steps), trajectory).ids
        for hint in linkage_hints(augmented, trajectory):
            assert trajectory.steps[hint.handoff_step].role == f"Orchestrator (-> {hint.executor_agent})"
            assert hint.handoff_agent == "Orchestrator"
            found.append(
                (
                    trajectory.qid,
                    hint.executor_step,
                    hint.handoff_step,
                    hint.kind,
                    hint.cites_plan,
                    hint.shared_count,
                )
            )
    # Magentic-One agents write prose, not code: one plan phrase and no identifier overlap in all 146 logs.
    assert [(qid, step, kind, phrase, shared) for qid, step, _, kind, phrase, shared in found] == [
        ("hand_crafted/3", 85, "cites_plan", "as planned", 0)
    ]
