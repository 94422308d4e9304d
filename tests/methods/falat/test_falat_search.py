"""FALAT stages 4 to 6 without the model: backward walk, pruning, the verification search and the decision.

The graph is drawn by hand (the ``hand_graph`` fixture) and the verifier is a plain function, so each rule is
pinned on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import pytest

from rcarun.methods.falat import (
    Candidate,
    DependencyGraph,
    Edge,
    FalatOptions,
    PrunedCandidate,
    Pruning,
    Verdict,
    decide,
    is_verified,
    path_to_failure,
    prune_carriers,
    search_sources,
    walk_back,
)


def test_backward_walk_is_nearest_first_and_bounded(hand_graph: DependencyGraph) -> None:
    walk = walk_back(hand_graph, 9, max_candidates=6)
    assert walk == (
        Candidate(9, 0, None),
        Candidate(8, 1, 9),
        Candidate(5, 1, 9),
        Candidate(7, 2, 8),
        Candidate(2, 2, 5),
        Candidate(6, 3, 7),
    )
    assert [c.step for c in walk_back(hand_graph, 9, max_candidates=100)] == [9, 8, 5, 7, 2, 6, 3, 1, 0]
    assert walk_back(hand_graph, 0, max_candidates=8) == (Candidate(0, 0, None),)
    with pytest.raises(ValueError, match="outside the graph"):
        walk_back(hand_graph, 10, max_candidates=8)


def test_the_walk_always_keeps_the_failure_step(hand_graph: DependencyGraph) -> None:
    assert walk_back(hand_graph, 9, max_candidates=1) == (Candidate(9, 0, None),)


def test_a_step_reached_twice_is_credited_to_the_later_child() -> None:
    # 0 <- 2 <- 4 and 0 <- 3 <- 4: step 0 is two hops away both ways, reached through 3, closer to the failure
    graph = DependencyGraph(
        5,
        (
            Edge(1, 0, ("reply",)),
            Edge(2, 0, ("reply",)),
            Edge(3, 0, ("reference",)),
            Edge(4, 2, ("reply",)),
            Edge(4, 3, ("reference",)),
        ),
    )
    assert walk_back(graph, 4, 8) == (
        Candidate(4, 0, None),
        Candidate(3, 1, 4),
        Candidate(2, 1, 4),
        Candidate(0, 2, 3),
    )


def test_the_path_to_the_failure_follows_the_walk(hand_graph: DependencyGraph) -> None:
    by_step = {c.step: c for c in walk_back(hand_graph, 9, max_candidates=100)}
    assert path_to_failure(by_step, 9) == [9]
    assert path_to_failure(by_step, 6) == [6, 7, 8, 9]
    assert path_to_failure(by_step, 0) == [0, 1, 2, 5, 9]


def test_pruning_keeps_source_most_candidates(hand_graph: DependencyGraph) -> None:
    pruning = prune_carriers(hand_graph, walk_back(hand_graph, 9, max_candidates=6))
    # 5 depends on 2 by an instruction only and shares nothing with it: an instruction alone is not reuse.
    assert pruning.kept == (2, 5, 6)
    assert pruning.pruned == (
        PrunedCandidate(7, (5,), ("reuses 1 token(s) of step 5: a",)),
        PrunedCandidate(8, (7,), ("tool output of step 7",)),
        PrunedCandidate(
            9,
            (5, 7, 8),
            (
                "reuses 1 token(s) of step 5: a",
                "reuses 2 token(s) of step 7: a, x",
                "reuses 1 token(s) of step 8: x",
            ),
        ),
    )
    # with two shared tokens required: 8 still carries 7 (by its tool_result edge), 9 only carries 7 (a and x)
    strict = prune_carriers(hand_graph, walk_back(hand_graph, 9, max_candidates=6), min_shared_tokens=2)
    assert strict.kept == (2, 5, 6, 7)
    assert [(p.step, p.carries_from) for p in strict.pruned] == [(8, (7,)), (9, (7,))]


def test_only_candidates_are_carried_from(hand_graph: DependencyGraph) -> None:
    # without 5 and 7 among the candidates, 9 carries only from 8, whose tool output reuses nothing of 9's
    candidates = [Candidate(9, 0, None), Candidate(8, 1, 9)]
    pruning = prune_carriers(hand_graph, candidates)
    assert pruning.kept == (8,)
    assert pruning.pruned == (PrunedCandidate(9, (8,), ("reuses 1 token(s) of step 8: x",)),)
    assert prune_carriers(hand_graph, []) == Pruning((), ())


def test_shared_tokens_are_named_up_to_five() -> None:
    tokens = (frozenset(f"t{i}" for i in range(7)), frozenset(f"t{i}" for i in range(7)))
    graph = DependencyGraph(2, (Edge(1, 0, ("reply",)),), tokens)
    pruning = prune_carriers(graph, walk_back(graph, 1, 8))
    assert pruning.pruned[0].reasons == ("reuses 7 token(s) of step 0: t0, t1, t2, t3, t4",)


def _pruning(graph: DependencyGraph) -> Pruning:
    return prune_carriers(graph, walk_back(graph, 9, max_candidates=6))


def _verifier(sources: Mapping[int, float], calls: list[int]) -> Callable[[int], Awaitable[Verdict]]:
    async def verify(step: int) -> Verdict:
        calls.append(step)
        confidence = sources.get(step, 0.1)
        return Verdict(step, True, step in sources, confidence)

    return verify


async def test_search_stops_at_the_earliest_verified_source(hand_graph: DependencyGraph) -> None:
    calls: list[int] = []
    result = await search_sources(
        _pruning(hand_graph), _verifier({5: 0.9, 6: 0.9}, calls), max_calls=8, min_confidence=0.5
    )
    assert calls == [2, 5]
    assert (result.stop, result.reinstated, result.unverified) == ("source-found", (), ())
    assert decide(result.verdicts, 9, min_confidence=0.5).step == 5


async def test_pruned_carriers_are_never_verified_by_default(hand_graph: DependencyGraph) -> None:
    calls: list[int] = []
    result = await search_sources(_pruning(hand_graph), _verifier({}, calls), max_calls=8, min_confidence=0.5)
    assert calls == [2, 5, 6]
    assert (result.stop, result.reinstated) == ("exhausted", ())
    assert FalatOptions().reinstate_carriers is False  # not in FALAT's description; tuned on gold labels


async def test_cleared_candidates_reinstate_their_carriers_when_asked(hand_graph: DependencyGraph) -> None:
    calls: list[int] = []
    result = await search_sources(
        _pruning(hand_graph), _verifier({}, calls), max_calls=8, min_confidence=0.5, reinstate=True
    )
    assert calls == [2, 5, 6, 7, 8, 9]
    assert (result.stop, result.reinstated) == ("exhausted", (7, 8, 9))

    calls = []
    result = await search_sources(
        _pruning(hand_graph), _verifier({8: 0.7}, calls), max_calls=8, min_confidence=0.5, reinstate=True
    )
    assert calls == [2, 5, 6, 7, 8]
    assert decide(result.verdicts, 9, min_confidence=0.5).step == 8


async def test_search_budget_leaves_unverified_candidates(hand_graph: DependencyGraph) -> None:
    calls: list[int] = []
    result = await search_sources(_pruning(hand_graph), _verifier({}, calls), max_calls=2, min_confidence=0.5)
    assert calls == [2, 5]
    assert (result.stop, result.unverified) == ("budget", (6,))
    calls = []
    result = await search_sources(
        _pruning(hand_graph), _verifier({}, calls), max_calls=2, min_confidence=0.5, reinstate=True
    )
    assert (result.stop, result.unverified) == ("budget", (6, 7))  # 7 came back when 5 was cleared


async def test_a_zero_budget_verifies_nothing(hand_graph: DependencyGraph) -> None:
    calls: list[int] = []
    result = await search_sources(
        _pruning(hand_graph), _verifier({2: 1.0}, calls), max_calls=0, min_confidence=0.5
    )
    assert calls == []
    assert (result.verdicts, result.stop, result.unverified) == ((), "budget", (2, 5, 6))
    assert decide(result.verdicts, 9, min_confidence=0.5).rule == "failure-step"
    empty = await search_sources(Pruning((), ()), _verifier({}, calls), max_calls=0, min_confidence=0.5)
    assert (empty.stop, empty.unverified) == ("exhausted", ())


async def test_a_weak_positive_verdict_does_not_stop_the_search(hand_graph: DependencyGraph) -> None:
    calls: list[int] = []
    result = await search_sources(
        _pruning(hand_graph), _verifier({2: 0.4, 6: 0.5}, calls), max_calls=8, min_confidence=0.5
    )
    assert calls == [2, 5, 6]  # 2 says "source" with 0.4 < 0.5; 6 reaches the threshold
    assert result.stop == "source-found"
    assert decide(result.verdicts, 9, min_confidence=0.5).step == 6


def test_what_counts_as_verified() -> None:
    assert is_verified(Verdict(1, True, True, 0.5), 0.5)  # the threshold itself counts
    assert not is_verified(Verdict(1, True, True, 0.49), 0.5)
    assert not is_verified(Verdict(1, True, False, 1.0), 0.5)  # confident that it is not the source
    assert not is_verified(Verdict(1, False, True, 1.0, error="bad"), 0.0)  # malformed never counts
    assert is_verified(Verdict(1, True, True, 0.0), 0.0)


def test_decision_rules() -> None:
    def v(step: int, is_source: bool, confidence: float) -> Verdict:
        return Verdict(step, True, is_source, confidence)

    earliest = decide([v(3, True, 0.9), v(1, True, 0.8)], 9, min_confidence=0.5)
    assert (earliest.step, earliest.rule, earliest.fallback) == (1, "earliest-verified", False)
    hedged = decide([v(1, True, 0.4), v(2, False, 0.45)], 9, min_confidence=0.5)
    assert (hedged.step, hedged.rule, hedged.fallback) == (2, "highest-confidence", True)
    tie = decide([v(6, False, 0.3), v(2, False, 0.3), v(4, False, 0.1)], 9, min_confidence=0.5)
    assert (tie.step, tie.rule) == (2, "highest-confidence")
    malformed = decide([Verdict(2, False, error="bad")], 9, min_confidence=0.5)
    assert (malformed.step, malformed.rule, malformed.fallback) == (9, "failure-step", True)
    assert decide([], 4, min_confidence=0.5).rule == "failure-step"
