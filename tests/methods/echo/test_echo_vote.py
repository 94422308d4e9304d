"""ECHO's consensus as pure functions: the confidence-weighted vote, ties, the fallback, the decoupled pairing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from rcarun.methods.echo import Conclusion, Evaluation, Vote, consensus_vote, pair_conclusion

AGENTS = ("Planner", "Coder", "Computer_terminal")


def _rounded(scores: Sequence[tuple[Any, float]]) -> list[tuple[Any, float]]:
    return [(key, round(score, 9)) for key, score in scores]


def _vote(analyst: int, kind: str, agents: Sequence[str], step: int, confidence: float) -> Vote:
    return Vote(analyst, Conclusion(kind, tuple(agents), step, confidence))


def test_pair_weight_is_the_lower_confidence() -> None:
    paired = pair_conclusion(
        Conclusion("multi_agent", ("Planner", "Coder"), 1, 0.9, "who"),
        Conclusion("single_agent", ("Computer_terminal",), 5, 0.35, "where"),
    )
    assert paired == Conclusion("multi_agent", ("Planner", "Coder"), 5, 0.35, "who: who\nwhere: where")


def test_heaviest_type_wins_and_low_confidence_is_dropped() -> None:
    votes = [
        _vote(0, "single_agent", ["Coder"], 4, 0.4),
        _vote(1, "single_agent", ["Coder"], 4, 0.45),
        _vote(2, "multi_agent", ["Planner", "Coder"], 2, 0.8),
        _vote(3, "multi_agent", ["Planner"], 2, 0.29),  # below 0.3: dropped
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9)
    assert outcome.dropped == (3,)
    assert outcome.kept == (0, 1, 2)
    assert outcome.type_sums == {"single_agent": pytest.approx(0.85), "multi_agent": 0.8}
    assert outcome.winning_type == "single_agent"
    assert (outcome.role, outcome.mistake_step) == ("Coder", 4)
    assert outcome.confidence == pytest.approx(0.425)
    # With the low vote kept (threshold 0.2), multi_agent weighs 1.09 and wins.
    multi = consensus_vote(votes, agents=AGENTS, n_steps=9, min_confidence=0.2)
    assert multi.winning_type == "multi_agent"
    assert _rounded(multi.agent_scores) == [("Planner", 1.09), ("Coder", 0.8)]
    assert multi.attribution == ("Planner", "Coder")
    assert multi.mistake_step == 2


def test_agent_and_step_scores_are_summed_confidences() -> None:
    votes = [
        _vote(0, "single_agent", ["Planner"], 3, 0.5),
        _vote(1, "single_agent", ["Planner"], 6, 0.4),
        _vote(2, "single_agent", ["Coder"], 6, 0.8),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9)
    assert _rounded(outcome.agent_scores) == [("Planner", 0.9), ("Coder", 0.8)]
    assert _rounded(outcome.step_scores) == [(6, 1.2), (3, 0.5)]
    assert outcome.attribution == ("Planner",)
    assert outcome.mistake_step == 6  # the step is voted on its own, not the top agent's step


def test_multi_agent_attributes_every_agent_at_or_above_the_threshold() -> None:
    votes = [
        _vote(0, "multi_agent", ["Coder", "Planner"], 5, 0.6),
        _vote(1, "multi_agent", ["Computer_terminal", "Coder"], 5, 0.5),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9, min_confidence=0.5)
    assert _rounded(outcome.agent_scores) == [("Coder", 1.1), ("Planner", 0.6), ("Computer_terminal", 0.5)]
    assert outcome.attribution == ("Coder", "Planner", "Computer_terminal")
    assert outcome.role == "Coder"


def test_tie_rules() -> None:
    # Agents tie -> recorded order (Planner before Coder); steps tie -> earliest; 0.1 + 0.2 ties with 0.3.
    votes = [
        _vote(0, "single_agent", ["Coder"], 7, 0.1),
        _vote(1, "single_agent", ["Coder"], 7, 0.2),
        _vote(2, "single_agent", ["Planner"], 2, 0.3),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9, min_confidence=0.0)
    assert outcome.role == "Planner"
    assert outcome.mistake_step == 2
    # Types tie -> single_agent.
    tied = consensus_vote(
        [_vote(0, "multi_agent", ["Coder"], 1, 0.5), _vote(1, "single_agent", ["Planner"], 2, 0.5)],
        agents=AGENTS,
        n_steps=9,
    )
    assert tied.winning_type == "single_agent" and tied.role == "Planner"


def test_out_of_range_steps_are_tallied_but_never_chosen() -> None:
    votes = [
        _vote(0, "single_agent", ["Coder"], 99, 0.9),
        _vote(1, "single_agent", ["Coder"], -1, 0.8),
        _vote(2, "single_agent", ["Coder"], 3, 0.4),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=9)
    assert [step for step, _ in outcome.step_scores] == [99, -1, 3]
    assert outcome.mistake_step == 3
    only_outside = consensus_vote(votes[:1], agents=AGENTS, n_steps=9)
    assert (only_outside.role, only_outside.mistake_step) == ("Coder", None)


def test_fallback_uses_the_highest_mean_error_likelihood() -> None:
    evaluations = [
        Evaluation("Planner", 1, 0.9),
        Evaluation("Planner", 2, 0.1),  # Planner mean 0.5
        Evaluation("Coder", 6, 0.6),
        Evaluation("Coder", 4, 0.6),  # Coder mean 0.6, its top likelihood ties at steps 4 and 6 -> 4
        Evaluation("Computer_terminal", 0, 0.2),
    ]
    low = [_vote(0, "single_agent", ["Planner"], 1, 0.2)]
    outcome = consensus_vote(low, evaluations, agents=AGENTS, n_steps=9)
    assert outcome.fallback_used is True
    assert outcome.winning_type is None and outcome.kept == () and outcome.dropped == (0,)
    assert (outcome.role, outcome.mistake_step) == ("Coder", 4)
    assert outcome.agent_mean_likelihood == {
        "Planner": pytest.approx(0.5),
        "Coder": pytest.approx(0.6),
        "Computer_terminal": 0.2,
    }
    nothing = consensus_vote(low, (), agents=AGENTS, n_steps=9)
    assert (nothing.attribution, nothing.mistake_step, nothing.fallback_used) == ((), None, False)


def test_disagreement_report() -> None:
    spread = [_vote(0, "single_agent", ["Coder"], 1, 0.95), _vote(1, "single_agent", ["Coder"], 1, 0.35)]
    outcome = consensus_vote(spread, agents=AGENTS, n_steps=9)
    assert outcome.requires_review is True
    assert outcome.confidence_spread == pytest.approx(0.6)
    assert outcome.review_reasons == ("confidence spread 0.60 > 0.5",)
    # The spread counts dropped votes too; exactly 0.5 is not above the limit.
    calm = [_vote(0, "single_agent", ["Coder"], 1, 0.7), _vote(1, "multi_agent", ["Coder"], 1, 0.2)]
    calm_outcome = consensus_vote(calm, agents=AGENTS, n_steps=9)
    assert calm_outcome.confidence_spread == pytest.approx(0.5)
    assert calm_outcome.requires_review is False
    # Both types among the kept votes is ordinary disagreement, not a review case (only > 2 types are).
    split = [
        _vote(0, "single_agent", ["Coder"], 1, 0.6),
        _vote(1, "multi_agent", ["Coder", "Planner"], 1, 0.5),
    ]
    split_outcome = consensus_vote(split, agents=AGENTS, n_steps=9)
    assert split_outcome.kept == (0, 1)
    assert split_outcome.review_reasons == ()


def test_kept_and_dropped_are_positions_of_votes_not_analysts() -> None:
    # Six votes, analyst 1 voting on both sides of the confidence floor.
    votes = [
        _vote(0, "single_agent", ["Coder"], 40, 0.6),
        _vote(1, "single_agent", ["Planner"], 3, 0.7),
        _vote(0, "single_agent", ["Coder"], 40, 0.5),
        _vote(1, "single_agent", ["Coder"], 41, 0.2),  # below 0.3: dropped
        _vote(0, "multi_agent", ["Coder", "Planner"], 90, 0.9),
        _vote(1, "single_agent", ["Coder"], 40, 0.4),
    ]
    outcome = consensus_vote(votes, agents=AGENTS, n_steps=120)
    assert outcome.kept == (0, 1, 2, 4, 5) and outcome.dropped == (3,)
    assert outcome.type_sums == {"single_agent": pytest.approx(2.2), "multi_agent": pytest.approx(0.9)}
    assert outcome.winning_type == "single_agent"
    assert _rounded(outcome.agent_scores) == [("Coder", 1.5), ("Planner", 0.7)]
    assert _rounded(outcome.step_scores) == [(40, 1.5), (3, 0.7)]
    assert (outcome.role, outcome.mistake_step) == ("Coder", 40)
    assert outcome.confidence == pytest.approx(2.2 / 4)
