"""The scorer's role normalisation and handoff detection, case by case (LongRCA App. L.1, release notes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcarun.data import (
    Handoff,
    Step,
    Trajectory,
    iter_dataset,
    normalize_role,
    parse_handoff,
    role_matches,
)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("  Planner  ", "planner"),
        ("DiagnostAgent (-> ActionAgent)", "diagnostagent"),
        ("DiagnostAgent(->ActionAgent)", "diagnostagent"),
        ("Orchestrator (→ WebSurfer)", "orchestrator"),
        ("Planner (Review)", "planner (review)"),  # other parentheticals survive
        ("Orchestrator (thought)", "orchestrator (thought)"),
        ("A (-> B) (-> C)", "a (-> b)"),  # only ONE trailing suffix goes
        ("Web   Surfer\t Agent", "web surfer agent"),
        ("ＰＬＡＮＮＥＲ", "planner"),  # NFKC folds full-width letters
        ("Straße", "strasse"),  # casefold, not lower
        ("Agent (-> (nested))", "agent (-> (nested))"),  # X may not hold parentheses
        ("(-> B)", ""),
        ("   ", ""),
    ],
)
def test_normalize_role_follows_the_scorer(raw: str, normal: str) -> None:
    assert normalize_role(raw) == normal


def test_keep_handoff_is_the_ablation_rule() -> None:
    assert (
        normalize_role("DiagnostAgent  (-> ActionAgent) ", keep_handoff=True)
        == "diagnostagent (-> actionagent)"
    )
    assert not role_matches("DiagnostAgent", "DiagnostAgent (-> ActionAgent)", keep_handoff=True)
    assert role_matches("diagnostagent (-> ActionAgent)", "DiagnostAgent (-> ActionAgent)", keep_handoff=True)


def test_role_matches_needs_a_non_empty_prediction() -> None:
    assert role_matches("DiagnostAgent", "DiagnostAgent (-> ActionAgent)")
    assert role_matches("diagnostagent  (→ JudgeAgent)", "DiagnostAgent (-> ActionAgent)")
    assert not role_matches("Planner", "Planner (Review)")
    assert not role_matches(None, "Planner")
    assert not role_matches("", "")
    assert not role_matches("(-> X)", "(-> Y)")  # both normalise to "", which is never correct


@pytest.mark.parametrize(
    ("label", "handoff"),
    [
        ("DiagnostAgent (-> ActionAgent)", Handoff("DiagnostAgent", "ActionAgent")),
        ("Orchestrator (→  WebSurfer )", Handoff("Orchestrator", "WebSurfer")),
        ("Orchestrator (thought)", None),
        ("Orchestrator (termination condition)", None),
        ("(-> ActionAgent)", None),  # no sender
        ("Planner (-> )", None),  # no recipient
        ("Planner", None),
    ],
)
def test_parse_handoff(label: str, handoff: Handoff | None) -> None:
    assert parse_handoff(label) == handoff


def test_trajectory_exposes_handoffs_from_names_then_roles() -> None:
    steps = (
        Step(0, "human", "user", "task"),
        Step(1, "DiagnostAgent (-> ActionAgent)", "assistant", "fix the parser"),  # LongRCA: in the name
        Step(2, "Orchestrator", "Orchestrator (-> WebSurfer)", "search"),  # Who&When: in the role
        Step(3, "Orchestrator", "Orchestrator (thought)", "hmm"),
    )
    trajectory = Trajectory("q", "s", "", steps, "0" * 64)
    assert trajectory.handoffs == (
        (1, Handoff("DiagnostAgent", "ActionAgent")),
        (2, Handoff("Orchestrator", "WebSurfer")),
    )
    assert steps[3].handoff is None


def test_who_and_when_handoffs_are_orchestrator_instructions_to_recorded_agents(who_and_when: Path) -> None:
    found = 0
    for record in iter_dataset(who_and_when):
        trajectory = record.trajectory
        agents = {normalize_role(agent) for agent in trajectory.agents}
        for index, handoff in trajectory.handoffs:
            found += 1
            assert trajectory.steps[index].role.startswith("Orchestrator (->")
            assert handoff.sender == "Orchestrator"
            assert normalize_role(handoff.recipient) in agents
    assert found > 20  # every Magentic-One log hands off; the AG2 group chats never do


def test_long_names_follow_the_same_rule_as_short_ones() -> None:
    # Short names are remembered (a sweep meets the same few), long ones computed each time: one rule for both.
    for stem in ("Planner", "P" * 400):
        assert normalize_role(f"  {stem}  Agent (-> Coder) ") == f"{stem.casefold()} agent"
        assert normalize_role(f"{stem} (-> Coder)", keep_handoff=True) == f"{stem.casefold()} (-> coder)"
        assert normalize_role(f"{stem} (-> Coder)") == stem.casefold()
