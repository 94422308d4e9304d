"""FALAT stage 2: salient tokens, the linking rules and the dependency graph, on hand-made runs (no LLM)."""

from __future__ import annotations

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.falat import (
    DependencyGraph,
    Edge,
    ancestors,
    link_steps,
    salient_tokens,
    type_steps,
)


def _step(index: int, agent: str, role: str, content: str) -> Step:
    return Step(index=index, agent=agent, role=role, content=content)


def _run(*steps: Step, task: str = "") -> Trajectory:
    return Trajectory(qid="d/1", source="d", task=task, steps=steps, sha256="0" * 64)


def _edges(graph: DependencyGraph) -> set[tuple[int, int, tuple[str, ...], tuple[str, ...]]]:
    return {(e.step, e.depends_on, e.kinds, e.shared) for e in graph.edges}


def test_salient_tokens() -> None:
    text = (
        'Read "sales_2020.csv" from https://example.com/data.csv, population 737,015 vs 4,965 '
        "and 1.0 or 0.01 "
        "or 1.46 in 2020; `df.groupby`, myVar, data_frame and __init__; {\"is_done\": true} don't it's"
    )
    assert sorted(salient_tokens(text)) == [
        "1.46",
        "2020",
        "4965",
        "737015",
        "data.csv",
        "data_frame",
        "df.groupby",
        "example.com",
        "https://example.com/data.csv",
        "myvar",
        "sales_2020",
        "sales_2020.csv",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("'ab' and 'abc'", {"abc"}),  # quoted strings of 3 to 80 characters
        ("'" + "q" * 81 + "'", set()),
        ("Ask 'The  Big\tShip' now", {"the big ship"}),  # whitespace inside a quote collapses, casefolded
        ("007 and 0100 and 42 and 100", {"0100", "100"}),  # three digits without the leading zeros
        ("see https://x.org/a.", {"https://x.org/a"}),  # trailing punctuation is not part of a URL
        ('{"user_name": "alice"}', {"alice"}),  # a JSON key is structure, its quoted value is data
        ("a_b _x_ count_ RUN_ALL", {"run_all"}),  # snake_case needs an inner underscore and 4 characters
        ("plain words only", set()),
    ],
)
def test_salient_token_rules(text: str, expected: set[str]) -> None:
    assert set(salient_tokens(text)) == expected


def test_linking_a_hand_made_trajectory(orders: Trajectory) -> None:
    types = type_steps(orders)
    assert [t.type for t in types] == [
        "message",
        "decision",
        "tool_call",
        "tool_output",
        "message",
        "message",
    ]
    graph = link_steps(orders, types)
    # orders.csv is in the task statement, so it links nothing; amount_usd and 15230.5 are produced by steps.
    assert graph.tokens_of(1) == frozenset({"amount_usd"})
    assert graph.tokens_of(4) == frozenset({"15230.5"})
    assert _edges(graph) == {
        (1, 0, ("reply",), ()),
        (2, 1, ("instruction", "reference"), ("amount_usd",)),
        (3, 2, ("tool_result",), ()),
        (4, 1, ("instruction",), ()),
        (4, 3, ("reference",), ("15230.5",)),
        (5, 2, ("reference",), ("amount_usd",)),
        (5, 4, ("reply", "reference"), ("15230.5",)),
    }
    assert graph.kind_counts() == {"tool_result": 1, "instruction": 2, "reply": 2, "reference": 4}
    assert [e.depends_on for e in graph.parents(5)] == [4, 2]
    assert ancestors(graph, 4) == frozenset({0, 1, 2, 3})
    assert ancestors(graph, 0) == frozenset()


def test_link_window_and_min_shared_tokens(orders: Trajectory) -> None:
    types = type_steps(orders)
    narrow = link_steps(orders, types, window=2)
    # the handoff at step 1 is 3 steps before step 4: out of the window, so step 4 replies to step 3 instead
    assert (4, 3, ("reply", "reference"), ("15230.5",)) in _edges(narrow)
    assert not any(e.step == 4 and e.depends_on == 1 for e in narrow.edges)
    assert not any(e.step == 5 and e.depends_on == 2 for e in narrow.edges)
    strict = link_steps(orders, types, min_shared_tokens=2)
    assert strict.kind_counts()["reference"] == 0


def test_tool_output_without_a_call_replies_to_the_message_it_answers() -> None:
    trajectory = _run(
        _step(0, "Coder", "assistant", "Let me think about it."),
        _step(1, "Computer_terminal", "user", "There is no code from the last 1 message for me to execute."),
        _step(2, "Coder", "assistant", "```python\nprint(2)\n```"),
        _step(3, "Computer_terminal", "user", "exitcode: 0 (execution succeeded)\nCode output: 2"),
        _step(4, "Computer_terminal", "user", "exitcode: 0 (execution succeeded)\nCode output: 2"),
    )
    graph = link_steps(trajectory, type_steps(trajectory))
    assert {(e.step, e.depends_on, e.kinds) for e in graph.edges} == {
        (1, 0, ("reply",)),
        (2, 1, ("reply",)),
        (3, 2, ("tool_result",)),
        (4, 2, ("tool_result",)),  # consecutive outputs answer the same call
    }


def test_a_tool_output_opening_the_log_replies_to_the_step_before() -> None:
    trajectory = _run(
        _step(0, "Computer_terminal", "user", "exitcode: 0"),
        _step(1, "Computer_terminal", "user", "exitcode: 1"),
    )
    graph = link_steps(trajectory, type_steps(trajectory))
    assert _edges(graph) == {(1, 0, ("reply",), ())}


def test_an_instruction_links_only_the_agent_it_was_handed_to() -> None:
    trajectory = _run(
        _step(0, "Planner", "Planner (-> Coder)", "Coder, write the script."),
        _step(1, "Reviewer", "assistant", "Noted."),
        _step(2, "coder", "assistant", "Done."),  # roles are compared as the scorer compares them
        _step(3, "Planner", "Planner (-> Reviewer)", "Reviewer, check it."),
        _step(4, "Coder", "assistant", "Waiting."),
    )
    graph = link_steps(trajectory, type_steps(trajectory))
    assert {(e.step, e.depends_on, e.kinds) for e in graph.edges} == {
        (1, 0, ("reply",)),
        (2, 0, ("instruction",)),
        (3, 2, ("reply",)),
        (4, 0, ("instruction",)),  # the latest handoff to Coder, not the later one to Reviewer
    }


def test_a_reference_credits_the_latest_holder_of_each_token() -> None:
    trajectory = _run(
        _step(0, "A", "assistant", "The file is report_v1.csv."),
        _step(1, "B", "assistant", "Copying report_v1.csv now."),
        _step(2, "C", "assistant", "Opened report_v1.csv."),
    )
    # in 3 of 3 steps the file name would be boilerplate: the share is raised so that it counts
    graph = link_steps(trajectory, type_steps(trajectory), boilerplate_share=1.0)
    # step 2 takes report_v1.csv from step 1 (the latest step that holds it), not from step 0
    assert graph.edge(2, 1) == Edge(2, 1, ("reply", "reference"), ("report_v1", "report_v1.csv"))
    assert graph.edge(2, 0) is None


def test_task_tokens_and_agent_names_do_not_link() -> None:
    trajectory = _run(
        _step(0, "data_loader", "assistant", "I am data_loader; reading input_table."),
        _step(1, "B", "assistant", "Ask data_loader about input_table and out_table."),
        _step(2, "C", "assistant", "The out_table is ready."),
        task="Summarise input_table.",
    )
    graph = link_steps(trajectory, type_steps(trajectory))
    assert graph.tokens_of(0) == frozenset()
    assert graph.tokens_of(1) == frozenset({"out_table"})
    assert graph.kind_counts()["reference"] == 1
    assert graph.edge(2, 1) == Edge(2, 1, ("reply", "reference"), ("out_table",))


def test_boilerplate_tokens_do_not_link() -> None:
    steps = tuple(
        _step(i, "A" if i % 2 else "B", "assistant", f"status of job_queue is fine, round {i}")
        for i in range(4)
    )
    trajectory = _run(*steps)
    types = type_steps(trajectory)
    assert link_steps(trajectory, types).kind_counts()["reference"] == 0  # in 4 of 4 steps: boilerplate
    assert link_steps(trajectory, types, boilerplate_share=1.0).kind_counts()["reference"] == 3


def test_a_token_in_fewer_than_three_steps_is_never_boilerplate() -> None:
    trajectory = _run(
        _step(0, "A", "assistant", "job_queue is empty"),
        _step(1, "B", "assistant", "job_queue is full"),
    )
    # in 2 of 2 steps, more than any share: still data, because it is in fewer than 3 steps
    graph = link_steps(trajectory, type_steps(trajectory), boilerplate_share=0.1)
    assert graph.edge(1, 0) == Edge(1, 0, ("reply", "reference"), ("job_queue",))


def test_graph_rejects_edges_that_do_not_point_backward() -> None:
    with pytest.raises(ValueError, match="does not point backward"):
        DependencyGraph(n_steps=3, edges=(Edge(step=1, depends_on=2, kinds=("reply",)),))
    with pytest.raises(ValueError, match="does not point backward"):
        DependencyGraph(n_steps=3, edges=(Edge(step=3, depends_on=0, kinds=("reply",)),))


def test_graph_and_linking_reject_mismatched_lengths(orders: Trajectory) -> None:
    with pytest.raises(ValueError, match="tokens has 2 entries for 3 steps"):
        DependencyGraph(n_steps=3, edges=(), tokens=(frozenset(), frozenset()))
    with pytest.raises(ValueError, match="5 step types for 6 steps"):
        link_steps(orders, type_steps(orders)[:5])


def test_graph_lookups() -> None:
    graph = DependencyGraph(
        n_steps=4,
        edges=(Edge(2, 0, ("reference",), ("abc",)), Edge(2, 1, ("reply",)), Edge(3, 2, ("tool_result",))),
    )
    assert graph.edge(2, 0) == Edge(2, 0, ("reference",), ("abc",))
    assert graph.edge(3, 0) is None
    assert [e.depends_on for e in graph.parents(2)] == [1, 0]  # nearest first
    assert graph.parents(0) == ()
    assert graph.tokens_of(2) == frozenset()  # tokens not computed
    assert ancestors(graph, 3) == frozenset({0, 1, 2})
    assert graph.kind_counts() == {"tool_result": 1, "instruction": 0, "reply": 1, "reference": 1}
