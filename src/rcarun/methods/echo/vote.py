"""ECHO's consensus (part 3 of the method): the confidence-weighted vote, the decoupled pairing and the fallback.

Pure functions over validated conclusions, tested without any model: the published vote (``baselines.md``,
"ECHO") with rcarun's tie rules where the notes are silent, stated in ``docs/methods/echo.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rcarun.methods.echo.answers import CONCLUSION_TYPES, Conclusion, Evaluation

__all__ = ["Vote", "VoteOutcome", "consensus_vote", "pair_conclusion", "score_key"]

_REVIEW_SPREAD = 0.5
_SCORE_DIGITS = 9  # sums of confidences are compared after rounding, so 0.1 + 0.2 ties with 0.3


@dataclass(frozen=True, slots=True)
class Vote:
    """One analyst's conclusion as it enters the vote (in decoupled mode, the paired conclusion).

    Attributes:
        analyst: the analyst's place in the panel.
        conclusion: the conclusion voted.
    """

    analyst: int
    conclusion: Conclusion


def pair_conclusion(agent_focused: Conclusion, step_focused: Conclusion) -> Conclusion:
    """Decoupled mode: who from the agent-focused answer, where from the step-focused one, weight = the lower."""
    return Conclusion(
        type=agent_focused.type,
        attribution=agent_focused.attribution,
        mistake_step=step_focused.mistake_step,
        confidence=min(agent_focused.confidence, step_focused.confidence),
        reasoning=f"who: {agent_focused.reasoning}\nwhere: {step_focused.reasoning}",
    )


@dataclass(frozen=True, slots=True)
class VoteOutcome:
    """The result of `consensus_vote`.

    Attributes:
        kept / dropped: positions in ``votes`` of the votes kept and dropped by the confidence filter.
        type_sums: summed confidence per conclusion type (kept votes).
        winning_type: the type of the consensus, None when no vote was kept.
        agent_scores / step_scores: summed confidence per agent / step in the winning group, ranked (score
            descending, ties by recorded order / earliest step).
        attribution: the attributed agents, ranked; ``attribution[0]`` is the answer.
        mistake_step: the chosen step, None when no step inside the log was voted (or the fallback had none).
        confidence: mean confidence of the winning votes (None for the fallback or an abstention).
        fallback_used: no vote was kept and the answer comes from mean error likelihoods.
        agent_mean_likelihood: mean error_likelihood per agent over the valid evaluations, recorded order.
        confidence_spread: max - min confidence of all votes given (before the filter), None without votes.
        review_reasons: why the consensus requires review (empty when it does not).
    """

    kept: tuple[int, ...]
    dropped: tuple[int, ...]
    type_sums: Mapping[str, float]
    winning_type: str | None
    agent_scores: tuple[tuple[str, float], ...]
    step_scores: tuple[tuple[int, float], ...]
    attribution: tuple[str, ...]
    mistake_step: int | None
    confidence: float | None
    fallback_used: bool
    agent_mean_likelihood: Mapping[str, float] = field(default_factory=dict)
    confidence_spread: float | None = None
    review_reasons: tuple[str, ...] = ()

    @property
    def role(self) -> str | None:
        return self.attribution[0] if self.attribution else None

    @property
    def requires_review(self) -> bool:
        return bool(self.review_reasons)


def score_key(value: float) -> float:
    """A sum of confidences as compared by the vote (rounded, so that 0.1 + 0.2 ties with 0.3)."""
    return round(value, _SCORE_DIGITS)


def consensus_vote(
    votes: Sequence[Vote],
    evaluations: Sequence[Evaluation] = (),
    *,
    agents: Sequence[str],
    n_steps: int,
    min_confidence: float = 0.3,
) -> VoteOutcome:
    """Confidence-weighted vote over the analysts' conclusions, with the fallback and the disagreement report.

    Args:
        votes: one per well-formed conclusion, each analyst's on each view (agents are assumed recorded; steps
            outside ``[0, n_steps)`` are tallied but never chosen).
        evaluations: all valid agent evaluations, for the fallback.
        agents: the recorded agents, in recorded order (the agent tie rule).
        n_steps: the log's length.
        min_confidence: votes below it are dropped; in a multi_agent consensus, the score an agent needs.
    """
    rank = {agent: position for position, agent in enumerate(agents)}
    kept_at = tuple(at for at, vote in enumerate(votes) if vote.conclusion.confidence >= min_confidence)
    kept = [votes[at] for at in kept_at]
    dropped = tuple(at for at, vote in enumerate(votes) if vote.conclusion.confidence < min_confidence)
    type_sums = {
        kind: math.fsum(v.conclusion.confidence for v in kept if v.conclusion.type == kind)
        for kind in CONCLUSION_TYPES
    }
    review = _review_reasons(votes, kept)
    spread = _spread_of(votes)
    means = _mean_likelihoods(evaluations, rank)

    if not kept:
        fallback_agent, fallback_step = _fallback(evaluations, means)
        return VoteOutcome(
            kept=(),
            dropped=dropped,
            type_sums=type_sums,
            winning_type=None,
            agent_scores=(),
            step_scores=(),
            attribution=(fallback_agent,) if fallback_agent is not None else (),
            mistake_step=fallback_step,
            confidence=None,
            fallback_used=fallback_agent is not None,
            agent_mean_likelihood=means,
            confidence_spread=spread,
            review_reasons=review,
        )

    # A tie between the types goes to single_agent: CONCLUSION_TYPES lists it first and max keeps the first.
    winning_type = max(CONCLUSION_TYPES, key=lambda kind: score_key(type_sums[kind]))
    group = [vote for vote in kept if vote.conclusion.type == winning_type]
    agent_scores, step_scores = _group_scores(group, rank)
    if winning_type == "single_agent":
        attribution: tuple[str, ...] = (agent_scores[0][0],)
    else:
        attribution = tuple(
            agent for agent, score in agent_scores if score_key(score) >= score_key(min_confidence)
        )
    in_range = [step for step, _ in step_scores if 0 <= step < n_steps]
    return VoteOutcome(
        kept=kept_at,
        dropped=dropped,
        type_sums=type_sums,
        winning_type=winning_type,
        agent_scores=tuple(agent_scores),
        step_scores=tuple(step_scores),
        attribution=attribution,
        mistake_step=in_range[0] if in_range else None,
        confidence=math.fsum(vote.conclusion.confidence for vote in group) / len(group),
        fallback_used=False,
        agent_mean_likelihood=means,
        confidence_spread=spread,
        review_reasons=review,
    )


def _group_scores(
    group: Sequence[Vote], rank: Mapping[str, int]
) -> tuple[list[tuple[str, float]], list[tuple[int, float]]]:
    """Summed confidence per agent (named once per vote) and per step, ranked with the tie rules."""
    agent_totals: dict[str, list[float]] = {}
    step_totals: dict[int, list[float]] = {}
    for vote in group:
        for agent in dict.fromkeys(vote.conclusion.attribution):
            agent_totals.setdefault(agent, []).append(vote.conclusion.confidence)
        step_totals.setdefault(vote.conclusion.mistake_step, []).append(vote.conclusion.confidence)
    agent_scores = sorted(
        ((agent, math.fsum(values)) for agent, values in agent_totals.items()),
        key=lambda item: (-score_key(item[1]), rank.get(item[0], len(rank)), item[0]),
    )
    step_scores = sorted(
        ((step, math.fsum(values)) for step, values in step_totals.items()),
        key=lambda item: (-score_key(item[1]), item[0]),
    )
    return agent_scores, step_scores


def _spread_of(votes: Sequence[Vote]) -> float | None:
    if not votes:
        return None
    confidences = [vote.conclusion.confidence for vote in votes]
    return max(confidences) - min(confidences)


def _review_reasons(votes: Sequence[Vote], kept: Sequence[Vote]) -> tuple[str, ...]:
    reasons = []
    types = {vote.conclusion.type for vote in kept}
    if len(types) > 2:
        reasons.append(f"{len(types)} conclusion types")
    spread = _spread_of(votes)
    if spread is not None and score_key(spread) > _REVIEW_SPREAD:
        reasons.append(f"confidence spread {spread:.2f} > {_REVIEW_SPREAD}")
    return tuple(reasons)


def _mean_likelihoods(evaluations: Sequence[Evaluation], rank: Mapping[str, int]) -> dict[str, float]:
    collected: dict[str, list[float]] = {}
    for evaluation in evaluations:
        collected.setdefault(evaluation.agent, []).append(evaluation.error_likelihood)
    ordered = sorted(collected, key=lambda agent: (rank.get(agent, len(rank)), agent))
    return {agent: math.fsum(collected[agent]) / len(collected[agent]) for agent in ordered}


def _fallback(evaluations: Sequence[Evaluation], means: Mapping[str, float]) -> tuple[str | None, int | None]:
    if not means:
        return None, None
    # `means` is in recorded order and max keeps the first of equal scores.
    agent = max(means, key=lambda name: score_key(means[name]))
    own = [evaluation for evaluation in evaluations if evaluation.agent == agent]
    best = min(own, key=lambda evaluation: (-score_key(evaluation.error_likelihood), evaluation.step_index))
    return agent, best.step_index
