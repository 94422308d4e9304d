"""FALAT's deterministic stages (typing, linking, walk, pruning) over the real Who&When logs (no LLM)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rcarun.data import iter_dataset, load_trajectory_file
from rcarun.methods.falat import link_steps, prune_carriers, type_steps, walk_back

WHO_AND_WHEN = Path("/work/shared/data/who_and_when")

# Where ../shared exists, .ci/run sets RCARUN_REQUIRE_SHARED=1: then these tests run (and fail without the data).
pytestmark = pytest.mark.skipif(
    not WHO_AND_WHEN.is_dir() and os.environ.get("RCARUN_REQUIRE_SHARED") != "1",
    reason="Who&When data not available",
)


def test_deterministic_stages_on_a_real_group_chat() -> None:
    trajectory = load_trajectory_file(
        WHO_AND_WHEN / "algorithm_generated" / "10.json", "algorithm_generated"
    ).trajectory
    types = type_steps(trajectory)
    assert [t.type for t in types] == [
        "decision",
        "tool_output",
        "decision",
        "decision",
        "message",
        "tool_call",
        "tool_output",
        "tool_call",
        "tool_output",
        "message",
    ]
    graph = link_steps(trajectory, types)
    assert {(e.step, e.depends_on, e.kinds) for e in graph.edges if e.step >= 6} == {
        (6, 5, ("tool_result", "reference")),
        (7, 5, ("reference",)),
        (7, 6, ("reply", "reference")),
        (8, 7, ("tool_result",)),
        (9, 7, ("reference",)),
        (9, 8, ("reply", "reference")),
    }
    pruning = prune_carriers(graph, walk_back(graph, 9, 8))
    assert pruning.kept == (
        2,
        3,
        5,
    )  # step 5 introduces the fabricated population figures (the labelled root)


def test_deterministic_stages_on_a_real_magentic_one_log() -> None:
    trajectory = load_trajectory_file(WHO_AND_WHEN / "hand_crafted" / "1.json", "hand_crafted").trajectory
    types = type_steps(trajectory)
    assert [t.type for t in types[:5]] == ["message", "decision", "decision", "decision", "tool_call"]
    assert types[3].rule == "handoff"
    graph = link_steps(trajectory, types)
    for step, instruction in ((4, 3), (12, 10)):
        edge = graph.edge(step, instruction)
        assert edge is not None and edge.kinds == ("instruction",)


def test_deterministic_stages_never_crash_and_only_link_backward() -> None:
    count = 0
    for record in iter_dataset(WHO_AND_WHEN):
        trajectory = record.trajectory
        count += 1
        types = type_steps(trajectory)
        assert [t.index for t in types] == list(range(trajectory.n_steps))
        graph = link_steps(trajectory, types)
        assert all(0 <= e.depends_on < e.step < trajectory.n_steps for e in graph.edges)
        assert all(e.kinds for e in graph.edges)
        # every step but the first depends on something: a reply, an instruction or a tool result
        assert {e.step for e in graph.edges if set(e.kinds) - {"reference"}} == set(
            range(1, trajectory.n_steps)
        )
        for failure in {0, trajectory.n_steps // 2, trajectory.n_steps - 1}:
            walk = walk_back(graph, failure, 8)
            steps = [c.step for c in walk]
            assert len(steps) == len(set(steps)) <= 8 and steps[0] == failure
            assert all(s <= failure for s in steps)
            assert [c.hops for c in walk] == sorted(c.hops for c in walk)
            pruning = prune_carriers(graph, walk)
            assert sorted(pruning.kept + tuple(p.step for p in pruning.pruned)) == sorted(steps)
            assert min(steps) in pruning.kept  # the earliest candidate has no candidate to carry from
    assert count == 146
