"""What RCTA records of a run and predicts from it: the output JSON, the prediction, its error and fallback.

The rules for ``error`` and ``fallback`` are in ``docs/methods/rcta.md`` ("Unreadable answers and fallbacks").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rcarun.data import Trajectory
from rcarun.methods.base import Attribution, role_is_valid, step_is_valid
from rcarun.methods.llm import LLM, Reply

from .enrich import EnrichedStep
from .evidence import Evidence, StageOne
from .handoffs import HandoffRecord
from .options import Ablation
from .segment import Segment
from .validate import FIELDS, FinalFields, Validation

__all__ = ["Answers", "Run", "parsed", "prediction"]

_ATTEMPTS = ("first", "retry")  # the names of Stage II's attempts, in order


@dataclass(slots=True)
class Run:
    """One trajectory's run: what every stage reads, and the calls and fallbacks the output records."""

    trajectory: Trajectory
    llm: LLM
    enriched: tuple[EnrichedStep, ...]
    handoffs: tuple[HandoffRecord, ...]
    calls: int = 0
    fallbacks: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Answers:
    """Stage II: the attempts that count with their replies (the first, the A4 retry if sent), merged."""

    attempts: tuple[tuple[Validation, Reply], ...]
    final: FinalFields
    truncation: dict[str, Any]


def parsed(reply: Reply) -> Any:
    """The reply's decoded JSON, or None when it could not be decoded."""
    return reply.parsed if reply.parse_error is None else None


def _attempt_record(name: str, validation: Validation, reply: Reply) -> dict[str, Any]:
    return {
        "attempt": name,
        "parsed": isinstance(parsed(reply), dict),
        "finish_reason": reply.finish_reason,
        "valid": validation.valid,
        "errors": list(validation.errors),
    }


def _unread_and_overridden(
    attempts: Sequence[tuple[Validation, Reply]],
    predicted: Mapping[str, object],
    *,
    model_abstained: bool,
    merged: bool,
) -> tuple[str | None, str | None]:
    """The prediction's ``error`` and ``fallback`` (docs/methods/rcta.md) from the attempts that count.

    ``predicted`` holds ``agent`` and ``step`` as predicted; ``merged``: A4 ran (False for the A4 control).
    """
    missing = [name for name, value in predicted.items() if value is None]
    if not missing or model_abstained:
        return None, None
    unread = [name for name in missing if all(getattr(v.answer, name) is None for v, _ in attempts)]
    error = None
    if unread:
        if not any(isinstance(parsed(reply), dict) for _, reply in attempts):
            last = attempts[-1][1]
            reason = last.parse_error or "the answer is not a JSON object"
            error = f"attribution answer unreadable ({len(attempts)} of {len(attempts)} attempts): {reason}"
        else:
            last_check = attempts[-1][0]
            reasons = "; ".join(m for name in unread for m in last_check.check(name).errors[:1])
            fields = " and ".join(f"root_cause.{name}" for name in unread)
            error = f"{fields} missing or mistyped in every attempt: {reasons}"
    fallback = None
    if merged and len(unread) < len(predicted):
        dropped = [name for name in missing if name not in unread]
        what = (
            f"{' and '.join(dropped)} invalid in every attempt"
            if dropped
            else f"{' and '.join(missing)} missing while the other field is valid"
        )
        fallback = f"rcta A4: {what}, the output abstains (published rule)"
    return error, fallback


def _final_json(final: FinalFields) -> dict[str, Any]:
    """The kept answer fields as the output records them (chain nodes without their descriptions)."""
    answer: dict[str, Any] = {name: getattr(final, name) for name in FIELDS if name != "abstain"}
    for name in ("evidence_step_ids", "contributing_factors"):
        answer[name] = None if answer[name] is None else list(answer[name])
    if final.delegation_trace is not None:
        answer["delegation_trace"] = asdict(final.delegation_trace)
    if final.failure_chain is not None:
        answer["failure_chain"] = [
            {"step": n.step, "agent": n.agent, "role": n.role} for n in final.failure_chain
        ]
    return answer


def prediction(
    run: Run,
    flags: Ablation,
    segments: Sequence[Segment],
    stage_one: StageOne,
    evidence: Evidence,
    answers: Answers,
    output: dict[str, Any],
) -> Attribution:
    """The prediction from the kept fields (A4) or the first answer as given (A4 off), with ``output`` filled.

    A missing essential field after the merge adds ``abstain_missing_fields`` to the run's fallbacks.
    """
    first, final = answers.attempts[0][0], answers.final
    if flags.validation_retry:
        role, step, abstained = final.agent, final.step, final.abstain
        cited = final.evidence_step_ids or ()
    else:  # the first answer as answered: no merge, no sanitising
        role, step = first.answer.agent, first.answer.step
        abstained = first.answer.abstain is True
        cited = first.answer.evidence_step_ids or ()
    if final.agent is None or final.step is None:
        run.fallbacks.append("abstain_missing_fields")
    output.update(calls=run.calls, **_record(segments, stage_one, evidence, answers, flags=flags))
    output["diagnostics"].update(
        evidence_ids=list(cited),
        used_handoff=step is not None and step in {link.handoff for link in evidence.links},
        outline_phases=len(stage_one.outline.phases),
        outline_phases_in_range=stage_one.outline.phase_count_in_range,
        outline_fallback=stage_one.outline.fallback,
        fallbacks=list(run.fallbacks),
    )
    if not flags.validation_retry:
        output["raw_answer"] = {"agent": role, "step": step, "abstain": first.answer.abstain}
    error, fallback = _unread_and_overridden(
        answers.attempts,
        {"agent": role, "step": step},
        model_abstained=final.model_abstained if flags.validation_retry else first.answer.abstain is True,
        merged=flags.validation_retry,
    )
    return Attribution(
        pred_role=role,
        pred_step=step,
        role_valid=role_is_valid(role, run.trajectory),
        step_valid=step_is_valid(step, run.trajectory),
        abstained=abstained,
        output=output,
        error=error,
        fallback=fallback,
    )


def _record(
    segments: Sequence[Segment], stage_one: StageOne, evidence: Evidence, answers: Answers, *, flags: Ablation
) -> dict[str, Any]:
    """The output's record of the run, up to the diagnostics that depend on the prediction."""
    pool, final = evidence.pool, answers.final
    # Recall by source (Fig. 6a): none under the A1 control, whose base candidates are not proposals.
    by_source = {s: pool.base_ids_from(s) if flags.pooled_candidates else () for s in ("summary", "outline")}
    return {
        "segments": [
            {
                "id": s.segment_id,
                "steps": [s.step_ids[0], s.step_ids[-1]],
                "overlap": list(s.overlap_ids),
                "cut": s.cut_reason,
            }
            for s in segments
        ],
        "stages": {
            "summary": list(stage_one.summary_records),
            "outline": stage_one.outline_record,
            "attribution": [
                _attempt_record(n, *a) for n, a in zip(_ATTEMPTS, answers.attempts, strict=False)
            ],
        },
        "candidates": {
            "base_ids": list(evidence.base_ids),
            "count": len(evidence.base_ids),
            "pooled_ids": list(pool.base_ids),
            "pooled": [
                {"step": c.step_id, "source": c.source, "tags": list(c.tags), "priority": c.priority}
                for c in pool.candidates
            ],
            "proposals": pool.n_proposals,
            "outline_hints": pool.n_outline_hints,
            "overflow": len(pool.overflow),
            "dropped": list(pool.dropped),
        },
        "excerpt_ids": list(evidence.excerpt_ids),
        "handoff_links": [[link.candidate, link.handoff, link.rule] for link in evidence.links],
        "linkage_hints": [
            {"executor": h.executor_step, "handoff": h.handoff_step, "kind": h.kind, "overlap": h.overlap}
            for h in evidence.hints
        ],
        "truncation": answers.truncation,
        "answer": _final_json(final),
        "field_sources": dict(final.sources),
        "final_errors": list(final.errors),
        "abstain": final.abstain,
        "model_abstained": final.model_abstained,
        "needs_review": final.needs_review,
        "covered": final.covered,
        "coverage_checks": dict(final.coverage_checks),
        "diagnostics": {
            "base_candidate_ids": list(evidence.base_ids),
            "summary_candidate_ids": list(by_source["summary"]),
            "outline_candidate_ids": list(by_source["outline"]),
            "excerpt_ids": list(evidence.excerpt_ids),
        },
    }
