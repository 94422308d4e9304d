"""RCTA, Root-Cause Trajectory Attribution: the method wiring its parts into m + 2 LLM calls per trajectory.

Stage I summarises each segment and outlines the trajectory; Stage II attributes the failure from the
candidate excerpts, validated field by field (A4). Procedure, sources and choices: ``docs/methods/rcta.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rcarun.data import Trajectory
from rcarun.errors import ConfigError
from rcarun.methods.base import Attribution, Method
from rcarun.methods.llm import LLM, Message, Reply
from rcarun.methods.registry import method

from .enrich import enrich
from .evidence import Evidence, StageOne, gather_evidence, uniform_ids
from .grounding import quote_is_grounded
from .handoffs import handoffs_of
from .options import (
    ABLATIONS,
    PRESET_REASONING,
    PRESETS,
    Ablation,
    AblationName,
    RctaOptions,
    StageBudgets,
    StageReasoning,
)
from .output import Answers, Run, parsed, prediction
from .prompts import RctaPrompts, stage1_feedback, with_feedback
from .readers import parse_attribution, parse_local_summary, parse_outline
from .schemas import LocalSummary, Outline, fallback_outline, local_summary_schema, outline_schema
from .segment import Segment, segment
from .validate import FieldCheck, Validation, feedback_text, merge_fields, validate_attribution

__all__ = [
    "ABLATIONS",
    "PRESETS",
    "PRESET_REASONING",
    "RCTA",
    "SHAREABLE_STAGES",
    "STAGES",
    "RctaOptions",
    "StageBudgets",
    "StageReasoning",
    "uniform_ids",
]

STAGES: tuple[str, ...] = ("summary", "outline", "attribution")
SHAREABLE_STAGES: frozenset[str] = frozenset({"summary", "outline"})

# The release's for Stage I (inert under reasoning), the paper's 0 for attribution.
_TEMPERATURES: Mapping[str, float] = {"summary": 0.1, "outline": 0.1, "attribution": 0.0}


class RCTA(Method):
    """Root-Cause Trajectory Attribution: m + 2 calls per trajectory plus validation retries."""

    shareable_stages: frozenset[str] = SHAREABLE_STAGES

    def __init__(self, label: str, options: RctaOptions) -> None:
        self.label = label
        self.options = options
        self.budgets = options.budgets
        self.reasoning = options.reasoning
        # The preset fixes every stage's first budget: the runner lets no stage table override it.
        self.stage_budgets: Mapping[str, int] = {stage: getattr(self.budgets, stage) for stage in STAGES}
        self.ablation: AblationName | None = options.ablation
        self.flags = Ablation.of(options.ablation)
        self.prompts = RctaPrompts(options, self.flags)
        self._segmentation = options.segmentation_config()

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        output: dict[str, Any] = {"preset": self.options.resolved_preset, "ablation": self.ablation}
        if trajectory.n_steps == 0:
            output.update(calls=0, error="empty trajectory")
            return Attribution(None, None, False, False, abstained=True, output=output)
        run = Run(trajectory, llm, enrich(trajectory), handoffs_of(trajectory))
        segments = segment(run.enriched, config=self._segmentation)
        stage_one = await self._stage_one(run, segments)
        evidence = gather_evidence(
            trajectory, stage_one, run.handoffs, flags=self.flags, cap=self.options.candidate_cap
        )
        answers = await self._stage_two(run, stage_one, evidence)
        return prediction(run, self.flags, segments, stage_one, evidence, answers, output)

    async def _ask(
        self, run: Run, stage: str, messages: Sequence[Message], schema: Mapping[str, Any]
    ) -> Reply:
        """One call of ``stage`` at its preset's budget and reasoning, at its temperature."""
        run.calls += 1
        return await run.llm.chat(
            messages,
            stage=stage,
            max_tokens=self.stage_budgets[stage],
            schema=schema,
            temperature=_TEMPERATURES[stage],
            reasoning=getattr(self.reasoning, stage),
        )

    # --- Stage I -------------------------------------------------------------------------------------------

    async def _stage_one(self, run: Run, segments: Sequence[Segment]) -> StageOne:
        summaries: list[LocalSummary] = []
        records: list[dict[str, Any]] = []
        for seg in segments:  # sequential, as released: the calls of one item are not raced
            summary, record = await self._summarise(run, seg)
            summaries.append(summary)
            records.append(record)
            if record.get("failed"):
                run.fallbacks.append(f"summary:{seg.segment_id}")
        outline, outline_record = await self._outline(run, summaries)
        return StageOne(tuple(summaries), tuple(records), outline, outline_record)

    async def _summarise(self, run: Run, seg: Segment) -> tuple[LocalSummary, dict[str, Any]]:
        schema = local_summary_schema(seg.segment_id, seg.step_ids)
        messages, truncation = self.prompts.summary_messages(run.trajectory, seg, schema, run.llm)

        async def attempt(request: Sequence[Message]) -> tuple[LocalSummary, Reply]:
            reply = await self._ask(run, "summary", request, schema)
            summary = parse_local_summary(parsed(reply), segment_id=seg.segment_id, valid_ids=seg.step_ids)
            return summary, reply

        first, reply = await attempt(messages)
        record: dict[str, Any] = {
            "segment": seg.segment_id,
            "parsed": isinstance(parsed(reply), dict),
            "finish_reason": reply.finish_reason,
            "errors": len(first.errors),
            "retried": False,
            "used": "first",
        }
        used = first
        if first.errors and self.options.stage1_retry:
            feedback = stage1_feedback([e.message for e in first.errors])
            retry, retry_reply = await attempt(with_feedback(messages, feedback))
            record.update(
                retried=True,
                retry_parsed=isinstance(parsed(retry_reply), dict),
                retry_errors=len(retry.errors),
            )
            if len(retry.errors) <= len(first.errors):
                used, record["used"] = retry, "retry"
        own = seg.valid_ids
        dropped = sorted({p.step_id for p in used.proposals if p.step_id not in own})
        if dropped:  # the release's coercion: ids outside the segment's own steps are dropped
            used = replace(used, proposals=tuple(p for p in used.proposals if p.step_id in own))
            record["dropped_ids"] = dropped
        if not record["parsed"] and not record.get("retry_parsed", False):
            record["failed"] = True
        if truncation["applied"]:
            record["truncation"] = truncation
        return used, record

    async def _outline(self, run: Run, summaries: Sequence[LocalSummary]) -> tuple[Outline, dict[str, Any]]:
        trajectory, segment_ids = run.trajectory, [s.segment_id for s in summaries]
        schema = outline_schema(trajectory, segment_ids)
        messages = self.prompts.outline_messages(trajectory, run.enriched, summaries, schema)

        async def attempt(request: Sequence[Message]) -> tuple[Outline, Reply]:
            reply = await self._ask(run, "outline", request, schema)
            return parse_outline(parsed(reply), trajectory=trajectory, segment_ids=segment_ids), reply

        outline, reply = await attempt(messages)
        record: dict[str, Any] = {
            "parsed": outline.readable,
            "finish_reason": reply.finish_reason,
            "errors": len(outline.errors),
            "retried": False,
            "used": "first",
            "fallback": False,
        }
        if outline.readable and outline.errors and self.options.stage1_retry:
            feedback = stage1_feedback([e.message for e in outline.errors])
            retry, _ = await attempt(with_feedback(messages, feedback))
            record.update(retried=True, retry_parsed=retry.readable, retry_errors=len(retry.errors))
            if retry.readable and len(retry.errors) <= len(outline.errors):
                outline, record["used"] = retry, "retry"
        if not outline.readable:
            outline = fallback_outline(summaries)
            record["fallback"] = True
            run.fallbacks.append("outline")
        record["phases"] = len(outline.phases)
        record["phases_in_range"] = outline.phase_count_in_range
        return outline, record

    # --- Stage II ------------------------------------------------------------------------------------------

    async def _stage_two(self, run: Run, stage_one: StageOne, evidence: Evidence) -> Answers:
        schema = self.prompts.attribution_schema(run.trajectory)
        messages, truncation = self.prompts.attribution_messages(
            run.trajectory, run.enriched, stage_one.summaries, stage_one.outline, evidence, schema, run.llm
        )

        async def attempt(request: Sequence[Message]) -> tuple[Validation, Reply]:
            reply = await self._ask(run, "attribution", request, schema)
            return self._validate(reply, run), reply

        attempts = [await attempt(messages)]
        first = attempts[0][0]
        if not first.valid and self.flags.validation_retry:
            attempts.append(await attempt(with_feedback(messages, feedback_text(first))))
        retry = attempts[1][0] if len(attempts) > 1 else None
        return Answers(tuple(attempts), merge_fields(first, retry), truncation)

    def _validate(self, reply: Reply, run: Run) -> Validation:
        validation = validate_attribution(
            parse_attribution(parsed(reply)),
            run.trajectory,
            handoff_texts_by_step={h.step: h.text for h in run.handoffs},
            quote_grounded=quote_is_grounded,
            release_consistency_rules=self.options.release_consistency_rules,
        )
        if self.flags.delegation_trace:
            return validation
        # The A3 control omits the instruction-evidence check (App. H): the trace is not asked, not checked.
        checks = tuple(FieldCheck(c.name) if c.name == "delegation_trace" else c for c in validation.checks)
        return replace(validation, checks=checks)


def _factory(name: str, fixed: AblationName | None) -> None:
    @method(name)
    def create(label: str, options: Mapping[str, Any]) -> RCTA:
        table = dict(options)
        if fixed is not None:
            if "ablation" in table and table["ablation"] != fixed:
                raise ConfigError(f"{name}: ablation is fixed to {fixed!r}; got {table['ablation']!r}")
            table["ablation"] = fixed
        return RCTA(label, RctaOptions.from_mapping(table, name=name))


_factory("rcta", None)
for _ablation in ABLATIONS:
    _factory(f"rcta/{_ablation}", _ablation)
