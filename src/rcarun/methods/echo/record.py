"""What an ECHO run records: each analyst call, the vote table and consensus, and which rule decided.

The output is compact but complete enough to audit a vote by hand; ``Attribution.error`` and ``fallback``
follow ``docs/methods/echo.md`` ("Errors, fallbacks, output").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rcarun.methods.echo.answers import AnswerReading, Evaluation, is_unit
from rcarun.methods.echo.vote import Vote, VoteOutcome, score_key
from rcarun.methods.llm import Reply

__all__ = ["call_record", "output_record", "rules_that_decided", "synthesis", "unusable"]

_MAX_ALTERNATIVES = 5


class Analyst(Protocol):
    """A member of the panel as the record names it (`rcarun.methods.echo.method.AnalystSpec`)."""

    @property
    def persona(self) -> str: ...

    @property
    def temperature(self) -> float: ...


def call_record(
    analyst: int, spec: Analyst, focus: str, reply: Reply, reading: AnswerReading
) -> dict[str, Any]:
    """What ``output["calls"]`` keeps of one analyst call."""
    record: dict[str, Any] = {
        "analyst": analyst,
        "persona": spec.persona,
        "temperature": spec.temperature,
        "focus": focus,
        "answer": reply.parsed if isinstance(reply.parsed, dict) else None,
        "finish_reason": reply.finish_reason,
        "well_formed": reading.conclusion is not None,
        "problems": list(reading.problems),
        "skipped_evaluations": list(reading.skipped),
    }
    if not isinstance(reply.parsed, dict):
        record["parse_error"] = reply.parse_error or "the answer is not a JSON object"
        record["raw_text"] = reply.text[:2000]
    return record


def output_record(
    panel: Sequence[Analyst],
    *,
    decoupled: bool,
    min_confidence: float,
    context_info: Mapping[str, Any],
    calls: Sequence[Mapping[str, Any]],
    votes: Sequence[Vote],
    outcome: VoteOutcome,
    alternatives: Sequence[tuple[int, Mapping[str, Any]]],
) -> dict[str, Any]:
    """The run's ``output``: panel, context, calls, vote table, consensus, alternatives, disagreement, fallback."""
    personas = {analyst: spec.persona for analyst, spec in enumerate(panel)}
    kept = set(outcome.kept)
    consensus: dict[str, Any] | None = None
    if outcome.winning_type is not None:
        winners = [
            vote
            for at, vote in enumerate(votes)
            if at in kept and vote.conclusion.type == outcome.winning_type
        ]
        consensus = {
            "type": outcome.winning_type,
            "attribution": list(outcome.attribution),
            "mistake_step": outcome.mistake_step,
            "confidence": outcome.confidence,
            "reasoning": synthesis(outcome, winners, personas, len(panel)),
        }
    ranked_alternatives = sorted(
        alternatives,
        key=lambda item: -(float(item[1]["confidence"]) if is_unit(item[1].get("confidence")) else 0.0),
    )
    voted = {vote.analyst for vote in votes}
    return {
        "n_analysts": len(panel),
        "n_calls": len(calls),
        "decoupled": decoupled,
        "panel": [{"persona": s.persona, "temperature": s.temperature} for s in panel],
        "context": dict(context_info),
        "calls": list(calls),
        "vote_table": {
            "min_confidence": min_confidence,
            "votes": [
                {
                    "analyst": v.analyst,
                    "persona": personas[v.analyst],
                    "type": v.conclusion.type,
                    "attribution": list(v.conclusion.attribution),
                    "mistake_step": v.conclusion.mistake_step,
                    "confidence": v.conclusion.confidence,
                    "kept": at in kept,
                }
                for at, v in enumerate(votes)
            ],
            "no_vote": [{"analyst": analyst} for analyst in range(len(panel)) if analyst not in voted],
            "type_sums": dict(outcome.type_sums),
            "winning_type": outcome.winning_type,
            "agent_scores": [{"agent": a, "score": s} for a, s in outcome.agent_scores],
            "step_scores": [{"step": st, "score": s} for st, s in outcome.step_scores],
        },
        "consensus": consensus,
        "agent_mean_likelihood": dict(outcome.agent_mean_likelihood),
        "alternative_hypotheses": [
            {"analyst": analyst, **dict(hypothesis)}
            for analyst, hypothesis in ranked_alternatives[:_MAX_ALTERNATIVES]
        ],
        "disagreement": {
            "requires_review": outcome.requires_review,
            "reasons": list(outcome.review_reasons),
            "confidence_spread": outcome.confidence_spread,
        },
        "fallback": {
            "used": outcome.fallback_used,
            "agent": outcome.role if outcome.fallback_used else None,
            "step": outcome.mistake_step if outcome.fallback_used else None,
        },
    }


def rules_that_decided(
    outcome: VoteOutcome, n_votes: int, possible: int, n_steps: int, *, min_confidence: float
) -> str | None:
    """The design's rules that decided the answer instead of the votes (``docs/methods/echo.md``), or None.

    ``possible`` is the number of votes the panel could cast (one per analyst).
    """
    malformed = possible - n_votes
    low, floor = len(outcome.dropped), min_confidence
    if outcome.fallback_used:
        return (
            f"echo: no vote kept ({malformed} of {possible} votes lost to malformed answers, {low} below "
            f"min_confidence {floor}); agent with the highest mean error likelihood and its most likely "
            "step chosen (published fallback)"
        )
    if outcome.winning_type is None:
        if low:
            return (
                f"echo: all {low} well-formed votes below min_confidence {floor} and no valid agent "
                "evaluation: abstains (published rule)"
            )
        return None
    ties = []
    sums = [score_key(value) for value in outcome.type_sums.values()]
    if len(sums) > 1 and sums.count(max(sums)) > 1:
        ties.append("conclusion types tied, single_agent taken")
    scores = [score_key(score) for _, score in outcome.agent_scores]
    if len(scores) > 1 and scores[0] == scores[1]:
        ties.append("top agents tied, first in recorded order taken")
    steps = [score_key(score) for step, score in outcome.step_scores if 0 <= step < n_steps]
    if len(steps) > 1 and steps[0] == steps[1]:
        ties.append("top steps tied, earliest taken")
    return f"echo: {'; '.join(ties)} (published tie rules)" if ties else None


def unusable(calls: Sequence[Mapping[str, Any]], evaluations: Sequence[Evaluation]) -> str | None:
    """Why no analyst answer could be used, when none could (``docs/methods/echo.md``), else None."""
    if not calls or evaluations or any(call["well_formed"] for call in calls):
        return None
    first = calls[0]
    reason = first.get("parse_error") or "; ".join(first["problems"][:3]) or "malformed answer"
    return f"no analyst answer could be used ({len(calls)} of {len(calls)} calls malformed); first: {reason}"


def synthesis(
    outcome: VoteOutcome, winners: Sequence[Vote], personas: Mapping[int, str], possible: int
) -> str:
    """A deterministic account of the consensus, built from the winning votes (no LLM call)."""
    names = ", ".join(personas[v.analyst] for v in winners)
    agents = ", ".join(f"{agent} ({score:.2f})" for agent, score in outcome.agent_scores)
    steps = ", ".join(f"{step} ({score:.2f})" for step, score in outcome.step_scores)
    lines = [
        f"{outcome.winning_type} conclusion backed by {len(winners)} of {possible} votes ({names}); "
        f"agent scores: {agents}; step scores: {steps}."
    ]
    lines.extend(f"[{personas[v.analyst]}] {v.conclusion.reasoning}" for v in winners)
    return "\n".join(lines)
