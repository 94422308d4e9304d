"""RCTA handoff evidence (A2): exact recipient matching, strictly earlier, no fallback, uncapped dedup, real data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rcarun.data import Step, Trajectory, iter_dataset
from rcarun.methods.rcta.handoffs import (
    HandoffLink,
    HandoffRecord,
    augment_with_handoffs,
    handoffs_of,
    match_rule,
    nearest_handoff_for,
)


def _trajectory(*names: str) -> Trajectory:
    """A LongRCA-style trajectory: one step per name (the agent), content naming the step."""
    steps = tuple(
        Step(index=i, agent=name, role="assistant", content=f"step {i}") for i, name in enumerate(names)
    )
    return Trajectory(qid="t__001", source="swe_bench_pro", task="", steps=steps, sha256="0" * 64)


def _nearest(step: int, trajectory: Trajectory) -> int | None:
    found = nearest_handoff_for(step, trajectory)
    return None if found is None else found.step


def test_handoffs_of_reads_name_form_and_role_form() -> None:
    longrca = _trajectory(
        "human", "DiagnostAgent (-> ActionAgent)", "ActionAgent", "DiagnostAgent (→ JudgeAgent)"
    )
    assert handoffs_of(longrca) == (
        HandoffRecord(
            step=1,
            sender="DiagnostAgent",
            recipient="ActionAgent",
            agent="DiagnostAgent (-> ActionAgent)",
            text="step 1",
        ),
        HandoffRecord(
            step=3,
            sender="DiagnostAgent",
            recipient="JudgeAgent",
            agent="DiagnostAgent (→ JudgeAgent)",
            text="step 3",
        ),
    )
    magentic = Trajectory(
        qid="1",
        source="hand_crafted",
        task="",
        steps=(
            Step(0, "Orchestrator", "Orchestrator (thought)", "thinking"),
            Step(1, "Orchestrator", "Orchestrator (-> WebSurfer)", "Search for the paper."),
            Step(2, "WebSurfer", "WebSurfer", "I typed the query."),
        ),
        sha256="0" * 64,
    )
    assert handoffs_of(magentic) == (
        HandoffRecord(
            step=1,
            sender="Orchestrator",
            recipient="WebSurfer",
            agent="Orchestrator",
            text="Search for the paper.",
        ),
    )
    # The Magentic-One executor finds the Orchestrator's handoff addressed to it by its bare agent name.
    assert _nearest(2, magentic) == 1


def test_match_rule_by_role_class() -> None:
    assert [match_rule(n) for n in ("ActionAgent", "JudgeAgent", "WebSurfer", "Data_Expert")] == [
        "recipient"
    ] * 4
    assert [
        match_rule(n) for n in ("DiagnostAgent", "Computer_terminal", "human", "mystery", "actionagent")
    ] == ["any"] * 5
    assert match_rule("ActionAgent (-> JudgeAgent)") == "recipient"  # classified by its sender


def test_recipient_match_is_case_sensitive() -> None:
    trajectory = _trajectory("DiagnostAgent (-> actionagent)", "ActionAgent")
    assert _nearest(1, trajectory) is None
    # With a correctly spelled handoff further back, that one is used, not the nearer mis-cased one.
    trajectory = _trajectory(
        "DiagnostAgent (-> ActionAgent)", "DiagnostAgent (-> actionagent)", "ActionAgent"
    )
    assert _nearest(2, trajectory) == 0
    # The mis-cased candidate name is "unknown" class and so takes the nearest handoff of any recipient.
    trajectory = _trajectory("DiagnostAgent (-> ActionAgent)", "DiagnostAgent (-> JudgeAgent)", "actionagent")
    assert _nearest(2, trajectory) == 1


def test_nearest_strictly_earlier_never_at_or_after() -> None:
    names = (
        "human",  # 0
        "DiagnostAgent (-> ActionAgent)",  # 1
        "ActionAgent",  # 2
        "DiagnostAgent (-> ActionAgent)",  # 3
        "ActionAgent",  # 4
        "DiagnostAgent (-> ActionAgent)",  # 5
    )
    trajectory = _trajectory(*names)
    assert _nearest(2, trajectory) == 1
    assert _nearest(4, trajectory) == 3  # the nearest, not the first
    # A handoff step as a candidate (planner: any recipient) gets the previous handoff, never itself.
    assert _nearest(3, trajectory) == 1
    assert _nearest(5, trajectory) == 3
    assert _nearest(1, trajectory) is None  # only later handoffs exist
    assert _nearest(0, trajectory) is None
    # An executor before its only handoff gets nothing.
    assert _nearest(0, _trajectory("ActionAgent", "DiagnostAgent (-> ActionAgent)")) is None


def test_no_cross_recipient_fallback_for_executor_and_verifier() -> None:
    trajectory = _trajectory(
        "DiagnostAgent (-> JudgeAgent)",  # 0
        "ActionAgent",  # 1: only a handoff to JudgeAgent is earlier
        "DiagnostAgent (-> ActionAgent)",  # 2
        "Verification_Expert",  # 3: handoffs to JudgeAgent and ActionAgent, none to Verification_Expert
        "JudgeAgent",  # 4: the handoff to JudgeAgent at 0, although 2 is nearer
    )
    assert _nearest(1, trajectory) is None
    assert _nearest(3, trajectory) is None
    assert _nearest(4, trajectory) == 0
    link = nearest_handoff_for(4, trajectory)
    assert link is not None and link.recipient == "JudgeAgent" and link.sender == "DiagnostAgent"


def test_other_classes_take_nearest_handoff_of_any_recipient() -> None:
    trajectory = _trajectory(
        "DiagnostAgent (-> ActionAgent)",  # 0
        "ActionAgent",  # 1
        "DiagnostAgent (-> JudgeAgent)",  # 2
        "Computer_terminal",  # 3 terminal
        "human",  # 4 human
        "mystery_agent",  # 5 unknown
        "DiagnostAgent",  # 6 planner
    )
    assert [_nearest(i, trajectory) for i in (3, 4, 5, 6)] == [2, 2, 2, 2]
    assert _nearest(1, trajectory) == 0


def test_handoff_form_executor_candidate_matches_nothing() -> None:
    # Its raw name is the full handoff form, which no parsed recipient equals (both sources: the recorded name).
    trajectory = _trajectory("DiagnostAgent (-> ActionAgent)", "ActionAgent (-> JudgeAgent)")
    assert _nearest(1, trajectory) is None


def test_ids_outside_the_trajectory_get_no_handoff() -> None:
    trajectory = _trajectory("DiagnostAgent (-> ActionAgent)", "ActionAgent")
    assert _nearest(2, trajectory) is None
    assert _nearest(-1, trajectory) is None
    augmentation = augment_with_handoffs([1, 7, -3], trajectory)
    assert augmentation.base == (-3, 1, 7)
    assert augmentation.ids == (-3, 0, 1, 7)
    assert augmentation.links == (HandoffLink(candidate=1, handoff=0, rule="recipient"),)


def test_augmentation_dedups_without_a_second_cap() -> None:
    # 200 steps: a handoff to ActionAgent every 10 steps, ActionAgent in between.
    names = ["DiagnostAgent (-> ActionAgent)" if i % 10 == 0 else "ActionAgent" for i in range(200)]
    trajectory = _trajectory(*names)
    candidates = [i for i in range(100) if i % 10 != 0]
    assert len(candidates) == 90
    augmentation = augment_with_handoffs(candidates + candidates[:5], trajectory)  # duplicates collapse
    assert augmentation.base == tuple(candidates)
    assert augmentation.added == tuple(range(0, 100, 10))
    assert len(augmentation.ids) == 100  # > 80: no second cap
    assert augmentation.ids == tuple(range(100))
    assert len(augmentation.links) == 90
    assert augmentation.handoff_of(37) == 30
    assert augmentation.handoff_of(30) is None  # not a base candidate


def test_candidate_handoffs_stay_and_added_handoffs_are_not_augmented_again() -> None:
    trajectory = _trajectory(
        "human",  # 0
        "DiagnostAgent (-> ActionAgent)",  # 1
        "ActionAgent",  # 2
        "DiagnostAgent (-> ActionAgent)",  # 3
        "ActionAgent",  # 4
    )
    only_executor = augment_with_handoffs([4, 4], trajectory)
    assert (only_executor.ids, only_executor.added) == ((3, 4), (3,))  # 3 is not augmented in turn: no 1
    with_handoff = augment_with_handoffs([4, 3], trajectory)
    assert with_handoff.ids == (1, 3, 4)
    assert with_handoff.added == (1,)
    assert with_handoff.links == (
        HandoffLink(candidate=3, handoff=1, rule="any"),
        HandoffLink(candidate=4, handoff=3, rule="recipient"),
    )


def test_never_synthesised_without_logged_handoffs() -> None:
    trajectory = _trajectory("human", "DiagnostAgent", "ActionAgent", "JudgeAgent", "Computer_terminal")
    augmentation = augment_with_handoffs(range(5), trajectory)
    assert augmentation.ids == (0, 1, 2, 3, 4)
    assert augmentation.added == () and augmentation.links == ()
    assert handoffs_of(trajectory) == ()


def test_precomputed_handoffs_give_the_same_answer() -> None:
    trajectory = _trajectory("DiagnostAgent (-> ActionAgent)", "DiagnostAgent (-> JudgeAgent)", "ActionAgent")
    records = handoffs_of(trajectory)
    assert nearest_handoff_for(2, trajectory, records) == nearest_handoff_for(2, trajectory) == records[0]
    # Only the given handoffs are searched: an empty list means no evidence.
    assert nearest_handoff_for(2, trajectory, ()) is None


def test_who_and_when_hand_crafted_executors_find_the_orchestrators_nearest_handoff(
    who_and_when: Path,
) -> None:
    records = [r for r in iter_dataset(who_and_when) if r.trajectory.source == "hand_crafted"]
    assert len(records) == 20
    matched: Counter[str] = Counter()
    terminal_pairs: list[tuple[str, int, int]] = []
    for record in records:
        trajectory = record.trajectory
        handoffs = handoffs_of(trajectory)
        for step in trajectory.steps:
            if step.agent not in ("WebSurfer", "FileSurfer", "Coder", "Assistant", "ComputerTerminal"):
                continue
            found = nearest_handoff_for(step.index, trajectory, handoffs)
            # Reference answer by a plain scan of the raw roles.
            to_me = [
                s.index for s in trajectory.steps[: step.index] if s.role == f"Orchestrator (-> {step.agent})"
            ]
            if step.agent == "ComputerTerminal":  # terminal class: nearest handoff of any recipient
                any_handoff = [
                    s.index for s in trajectory.steps[: step.index] if s.role.startswith("Orchestrator (->")
                ]
                assert found is not None and found.step == any_handoff[-1]
                terminal_pairs.append((trajectory.qid, step.index, found.step))
                assert (
                    to_me and found.step == to_me[-1]
                )  # in these logs the terminal's own handoff is the nearest
                continue
            if not to_me:
                assert found is None
                continue
            assert found is not None
            assert (found.step, found.sender, found.recipient, found.agent) == (
                to_me[-1],
                "Orchestrator",
                step.agent,
                "Orchestrator",
            )
            assert found.text == trajectory.steps[to_me[-1]].content
            matched[step.agent] += 1
    assert matched == Counter({"WebSurfer": 227, "Assistant": 11, "FileSurfer": 9})
    assert [(index, handoff) for _, index, handoff in terminal_pairs] == [(12, 10), (16, 14)]


def test_who_and_when_augmentation_adds_only_logged_handoffs(who_and_when: Path) -> None:
    added_total = 0
    for record in iter_dataset(who_and_when):
        trajectory = record.trajectory
        augmentation = augment_with_handoffs(range(trajectory.n_steps), trajectory)
        assert augmentation.ids == tuple(range(trajectory.n_steps))
        assert augmentation.added == ()
        for link in augmentation.links:
            assert trajectory.steps[link.handoff].handoff is not None
            assert link.handoff < link.candidate
        if record.trajectory.source == "algorithm_generated":  # AG2 chats announce no handoffs
            assert augmentation.links == ()
        # Base = the WebSurfer steps only: every added id is an Orchestrator handoff step.
        surfer = [s.index for s in trajectory.steps if s.agent == "WebSurfer"]
        only_surfer = augment_with_handoffs(surfer, trajectory)
        assert all(trajectory.steps[i].role == "Orchestrator (-> WebSurfer)" for i in only_surfer.added)
        added_total += len(only_surfer.added)
    assert added_total == 227  # each WebSurfer step is preceded by its own handoff in these logs
