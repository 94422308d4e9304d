"""RCTA role classes for every name App. H lists, the Expert rule, handoff senders and the Orchestrator suffix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcarun.data import iter_dataset
from rcarun.methods.rcta.roles import role_class, sender_name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        *[(n, "planner") for n in ("DiagnostAgent", "Task_Planner", "Orchestrator", "manager_agent")],
        *[
            (n, "executor")
            for n in (
                "ActionAgent",
                "Action_Expert",
                "WebSurfer",
                "FileSurfer",
                "Assistant",
                "Coder",
                "transport_agent",
                "stay_agent",
                "food_attr_agent",
            )
        ],
        *[(n, "verifier") for n in ("JudgeAgent", "Verification_Expert", "verifier_agent")],
        ("Computer_terminal", "terminal"),
        ("ComputerTerminal", "terminal"),
        ("human", "human"),
        # The Expert rule: verifier when the name says verif/validat, else executor.
        ("DataVerification_Expert", "verifier"),
        ("Fact_VALIDATION_Expert", "verifier"),
        ("Validator Expert", "verifier"),
        ("Boggle_Board_Expert", "executor"),
        ("PythonExpert", "executor"),
        # Handoff names are classified by their sender; an Orchestrator status suffix stays planner.
        ("DiagnostAgent (-> ActionAgent)", "planner"),
        ("ActionAgent (→ JudgeAgent)", "executor"),
        ("Orchestrator (thought)", "planner"),
        ("Orchestrator (termination condition)", "planner"),
        ("  WebSurfer  ", "executor"),
        # Exact names are case-sensitive and unmatched names stay unknown.
        ("websurfer", "unknown"),
        ("Human", "unknown"),
        ("Planner (Review)", "unknown"),
        ("assistant", "unknown"),
    ],
)
def test_role_class(name: str, expected: str) -> None:
    assert role_class(name) == expected


def test_sender_name() -> None:
    assert sender_name(" DiagnostAgent (-> ActionAgent) ") == "DiagnostAgent"
    assert sender_name(" Coder ") == "Coder"


def test_who_and_when_agents_all_get_a_class(who_and_when: Path) -> None:
    classes = {
        agent: role_class(agent)
        for record in iter_dataset(who_and_when)
        for agent in record.trajectory.agents
    }
    assert classes["Orchestrator"] == "planner" and classes["WebSurfer"] == "executor"
    assert classes["Computer_terminal"] == "terminal"
    assert all(c == "verifier" for a, c in classes.items() if a.endswith("Expert") and "Verification" in a)
