"""FALAT stage 1: each step's type and the rule that gave it, on hand-made steps (no LLM)."""

from __future__ import annotations

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.falat import STEP_TYPES, type_step, type_steps


def _step(index: int, agent: str, role: str, content: str) -> Step:
    return Step(index=index, agent=agent, role=role, content=content)


@pytest.mark.parametrize(
    ("agent", "role", "content", "expected"),
    [
        (
            "Computer_terminal",
            "user",
            "exitcode: 0 (execution succeeded)\nCode output: 4",
            ("tool_output", "terminal-agent"),
        ),
        ("ComputerTerminal", "ComputerTerminal", "The script ran.", ("tool_output", "terminal-agent")),
        ("search", "tool", '{"results": []}', ("tool_output", "tool-role")),
        ("Runner", "user", "Exit code = 1\nTraceback ...", ("tool_output", "exit-code")),
        ("Coder", "assistant", "Run this:\n```python\nprint(1)\n```", ("tool_call", "code-block")),
        ("Coder", "assistant", "```sh\nls -la\n```", ("tool_call", "code-block")),
        ("ActionAgent", "assistant", "Done. finish(answer='42')", ("tool_call", "call-marker")),
        ("Agent", "assistant", "Thought: look it up\nAction: search[awnings]", ("tool_call", "call-marker")),
        (
            "WebSurfer",
            "WebSurfer",
            "I clicked 'Details'.\n\nHere is a screenshot of the page.",
            ("tool_call", "action-report"),
        ),
        ("Orchestrator", "Orchestrator (-> WebSurfer)", "Please search for dojos.", ("decision", "handoff")),
        ("Orchestrator", "Orchestrator (thought)", "Updated Ledger: {}", ("decision", "planner")),
        ("Task_Planner", "assistant", "The team is ready.", ("decision", "planner")),
        ("Analyst", "assistant", "I will first check the table.", ("decision", "intent")),
        ("Analyst", "assistant", "The answer is 42. TERMINATE", ("message", "default")),
        ("Analyst", "assistant", "The run ended with exitcode: 1 above.", ("message", "default")),
        ("Analyst", "assistant", "```\nplain text in a fence\n```", ("message", "default")),
    ],
)
def test_each_step_type_and_its_rule(agent: str, role: str, content: str, expected: tuple[str, str]) -> None:
    typed = type_step(_step(7, agent, role, content))
    assert typed.index == 7
    assert (typed.type, typed.rule) == expected


def test_intent_markers_only_count_near_the_start() -> None:
    late = "The table has four rows. " + "x" * 500 + " I will check it again."
    assert type_step(_step(0, "Analyst", "assistant", late)).type == "message"


@pytest.mark.parametrize(
    "agent", ["computer terminal", "Computer-Terminal", "TOOL", "Environment", "observation"]
)
def test_terminal_agents_are_compared_casefolded_without_separators(agent: str) -> None:
    typed = type_step(_step(0, agent, "assistant", "I will run it next."))
    assert (typed.type, typed.rule) == ("tool_output", "terminal-agent")


@pytest.mark.parametrize(
    ("agent", "role", "content", "expected"),
    [
        # a terminal's output that quotes code is still an output: the speaker rule comes first
        ("Computer_terminal", "user", "```python\nprint(1)\n```", ("tool_output", "terminal-agent")),
        # an exit-code line opens the step: an output, even when code follows
        ("Runner", "assistant", "exitcode: 1\n```python\nprint(1)\n```", ("tool_output", "exit-code")),
        # a handoff that carries code is the code: tool calls come before decisions
        ("Planner", "Planner (-> Coder)", "Run this:\n```bash\nls\n```", ("tool_call", "code-block")),
        # a planner that states an intent is typed by its name, the earlier rule
        ("Orchestrator", "assistant", "I will ask the WebSurfer.", ("decision", "planner")),
        # an action report only counts at the start of the step
        ("WebSurfer", "assistant", "Earlier I clicked 'Details'.", ("message", "default")),
    ],
)
def test_the_first_matching_rule_wins(agent: str, role: str, content: str, expected: tuple[str, str]) -> None:
    typed = type_step(_step(0, agent, role, content))
    assert (typed.type, typed.rule) == expected


def test_every_step_is_typed_in_order_with_one_of_the_four_types() -> None:
    steps = (
        _step(0, "human", "human", "Count the awnings."),
        _step(1, "Coder", "assistant", "```python\nprint(3)\n```"),
        _step(2, "Computer_terminal", "user", "exitcode: 0\n3"),
        _step(3, "Coder", "assistant", "Let's check the total again."),
    )
    trajectory = Trajectory(qid="d/1", source="d", task="Count the awnings.", steps=steps, sha256="0" * 64)
    typed = type_steps(trajectory)
    assert [t.index for t in typed] == [0, 1, 2, 3]
    assert [t.type for t in typed] == ["message", "tool_call", "tool_output", "decision"]
    assert set(STEP_TYPES) == {"decision", "tool_call", "tool_output", "message"}
