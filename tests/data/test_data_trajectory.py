"""The agent rule and the invariants of the data values, independent of any file."""

from __future__ import annotations

import dataclasses

import pytest

from rcarun.data import Reference, Step, Trajectory, agent_from_role, agent_of_step


@pytest.mark.parametrize(
    ("role", "agent"),
    [
        ("Orchestrator (-> WebSurfer)", "Orchestrator"),
        ("Orchestrator (thought)", "Orchestrator"),
        ("Orchestrator (termination condition)", "Orchestrator"),
        ("Orchestrator (-> ComputerTerminal)", "Orchestrator"),
        ("WebSurfer", "WebSurfer"),
        ("human", "human"),
        ("  Assistant  ", "Assistant"),
        ("Planner (Review) (-> Coder)", "Planner (Review)"),  # only ONE trailing suffix goes
        ("(thought)", ""),
    ],
)
def test_agent_from_role_removes_one_trailing_parenthetical(role: str, agent: str) -> None:
    assert agent_from_role(role) == agent


def test_a_non_empty_name_wins_and_a_handoff_name_is_kept_whole() -> None:
    assert agent_of_step("DiagnostAgent (-> ActionAgent)", "assistant") == "DiagnostAgent (-> ActionAgent)"
    assert agent_of_step("Computer_terminal", "user") == "Computer_terminal"
    assert agent_of_step("", "Orchestrator (thought)") == "Orchestrator"
    assert agent_of_step("   ", "WebSurfer") == "WebSurfer"
    assert agent_of_step(None, "Orchestrator (-> FileSurfer)") == "Orchestrator"


def _trajectory(agents: list[str]) -> Trajectory:
    steps = tuple(Step(index=i, agent=a, role="assistant", content=f"m{i}") for i, a in enumerate(agents))
    return Trajectory(qid="s/1", source="s", task="", steps=steps, sha256="0" * 64)


def test_agents_are_distinct_in_order_of_first_appearance() -> None:
    trajectory = _trajectory(["human", "Orchestrator", "WebSurfer", "Orchestrator", "Assistant", "human"])
    assert trajectory.n_steps == 6
    assert trajectory.agents == ("human", "Orchestrator", "WebSurfer", "Assistant")


def test_step_indices_must_equal_positions() -> None:
    with pytest.raises(ValueError, match="position 1 has index 2"):
        Trajectory(
            qid="s/1",
            source="s",
            task="",
            steps=(Step(0, "a", "user", ""), Step(2, "b", "user", "")),
            sha256="",
        )


def test_values_are_frozen() -> None:
    reference = Reference(role="WebSurfer", step=3, rationale="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        reference.step = 4  # type: ignore[misc]
