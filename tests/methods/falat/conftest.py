"""Hand-made inputs shared by the FALAT tests: a small run with every step type, and a hand-drawn graph."""

from __future__ import annotations

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.falat import DependencyGraph, Edge


@pytest.fixture
def orders() -> Trajectory:
    """Planner hands off to Coder, who runs code; the terminal answers; Coder reports; Reviewer accepts."""
    task = "What is the total of orders.csv?"
    steps = (
        Step(index=0, agent="human", role="human", content=task),
        Step(
            index=1,
            agent="Planner",
            role="Planner (-> Coder)",
            content="Load orders.csv and sum the amount_usd column.",
        ),
        Step(
            index=2,
            agent="Coder",
            role="assistant",
            content="```python\nimport pandas as pd\ndf = pd.read_csv('orders.csv')\n"
            "print(df['amount_usd'].sum())\n```",
        ),
        Step(
            index=3,
            agent="Computer_terminal",
            role="user",
            content="exitcode: 0 (execution succeeded)\nCode output: 15230.5",
        ),
        Step(index=4, agent="Coder", role="assistant", content="The total is 15,230.5 USD."),
        Step(
            index=5,
            agent="Reviewer",
            role="assistant",
            content="I checked the amount_usd column: 15,230.5 is correct. TERMINATE",
        ),
    )
    return Trajectory(qid="demo/orders", source="demo", task=task, steps=steps, sha256="0" * 64)


@pytest.fixture
def hand_graph() -> DependencyGraph:
    """Ten steps; token sets say who reuses what: 5 makes `a`, 7 reuses it and adds `x`, 8 is 7's output."""
    edges = (
        Edge(1, 0, ("reply",)),
        Edge(2, 1, ("reply",)),
        Edge(3, 2, ("reply",)),
        Edge(4, 3, ("reply",)),
        Edge(5, 2, ("instruction",)),
        Edge(6, 5, ("reply",)),
        Edge(7, 3, ("reference",)),
        Edge(7, 6, ("reply",)),
        Edge(8, 7, ("tool_result",)),
        Edge(9, 5, ("reference",)),
        Edge(9, 8, ("reply",)),
    )
    tokens = [frozenset[str]() for _ in range(10)]
    tokens[5] = frozenset({"a"})
    tokens[7] = frozenset({"a", "x"})
    tokens[8] = frozenset({"x"})
    tokens[9] = frozenset({"a", "x"})
    return DependencyGraph(n_steps=10, edges=edges, tokens=tuple(tokens))
