"""RCTA, Root-Cause Trajectory Attribution: the pipeline that wires RCTA's tested parts into m + 2 LLM calls.

LongRCA paper Sec. 4, App. H, L.3; its summary Sec. 5.1–5.3, App. D–F; release notes 3.1–3.13. Per trajectory:

1. `enrich` and `segment` the steps (no LLM).
2. Stage I (A1), one ``"summary"`` call per segment (task-conditioned) proposing tagged step ids from the
   segment's own steps (overlap steps are shown as read-only context), then one ``"outline"`` call aggregating
   the summaries into phases and conflicts. The prompt asks for 3–8 phases (summary App. E); an outline of
   another length is used as answered and recorded (``diagnostics.outline_phases_in_range``), since the paper's
   implementation left 308 of 1,140 outside the range. An outline that cannot be read is replaced by
   `fallback_outline` (one phase per summary), and the fallback is recorded.
3. `pool_candidates` pools the summaries' proposals *and* the outline's phase steps (abstract, Sec. 4.1,
   summary App. F; each candidate's ``source`` is ``summary``, ``outline`` or ``both``), prioritised by tag and
   capped at 80, giving the base candidates; A2 `augment_with_handoffs` adds the nearest earlier handoff of
   each; the excerpts are the augmented ids present in the trajectory, with their original text and step ids,
   plus the release's linkage hints.
4. Stage II (A3), one ``"attribution"`` call (temperature 0) with the root-cause decision rules and the
   backward instruction–execution rules; A4 validates it field by field, sends at most one retry with
   `feedback_text`, and `merge_fields` keeps each field from the attempt where it is valid.

Every call — each segment summary, the outline, the attribution and its A4 retry — shows the task instruction
whole (up to 12,000 characters, `rcarun.methods.context.task_text`; option ``include_task``): methods receive the
task instruction (paper Sec. 3.2) and the summaries are task-conditioned (Sec. 4.1).

The prediction's role is the answer's ``root_cause.agent`` field (never the speaker of the root step), its step
``root_cause.step``; validity is `role_is_valid` / `step_is_valid`; ``abstained`` is `FinalFields.abstain`. An
abstaining prediction keeps the valid role and step the model gave with it (release notes 3.12: "abstaining
outputs still carry whatever agent and step they have"): the paper scores the fields given in its main
comparisons and counts abstentions as errors only in the component conditions (App. L.1), so the report can
apply either rule.

Validity and coverage (`rcarun.methods.rcta.validate`): A4's checks are field checks (paper Sec. 4.2: "field
validity and the provenance of cited handoff evidence"); the release's cross-field rules (planner agent =>
planner step, faithful claim => C1/A2, ...) are off, and available only as the release-only option
``release_consistency_rules``. ``output["covered"]`` is App. L.1's coverage: a non-abstaining output passing the
four checks of recorded role, root-step validity, chain structure and cited handoff evidence
(``output["coverage_checks"]`` says which passed), after the merge (the first answer's under ``no-a4``; without
the handoff-evidence check under ``no-a3``).

Presets (method option ``preset``), stated separately in `PRESETS` and `PRESET_REASONING`: ``full`` 4,000 /
6,000 / 8,000 output tokens for summary / outline / attribution (the Full benchmark, App. H), ``ablation``
4,000 / 12,000 / 32,000 (the component study, App. H: "All component conditions share these settings", so a
component condition defaults to it, full RCTA to ``full``; the component study runs full RCTA at ``ablation``
too, as `configs/sweeps/mini-components.toml` does). Reasoning: the ablation preset's summary off, outline
and attribution high are App. H's; the paper gives no values for Full (only "different reasoning settings",
summary App. E), so Full's, the same, are our choice. The single length-triggered retry that doubles the
budget up to 65,536 is the run's stage policy, applied by the session behind ``llm.chat``; this module never
sees a length stop except in the final `Reply`. The preset's budgets are exposed as ``stage_budgets`` so that a
sweep's stage table never silently overrides them.

Stage I is shareable (`RCTA.shareable_stages`): every condition with the same options except ``ablation`` sends
byte-identical summary and outline requests (retries included, since they depend only on Stage I answers), so the
runner's call cache serves them across conditions and an ablation sweep pays for Stage I once per trajectory
(paper Sec. 5.1: "ablations share segmentation and summary caches").

Component controls (option ``ablation``, paper App. H "Component-control implementation"):

- ``no-a1``: Stage I still runs (shared), but its package is withheld from attribution: the base candidates are
  as many uniformly positioned steps as the full pool holds (``ids[i] = ((2i + 1) * n) // (2k)``), and location
  and provenance cues are masked — no candidate tags, notes or proposing summaries on the excerpts, and the local
  summaries and the outline are replaced by a one-line notice. Handoff augmentation, hints and A4 stay.
- ``no-a2``: no handoff evidence: the excerpts are the base candidates only, no handoff annotations and no
  linkage hints (a hint names the handoff an executor followed, which is handoff evidence).
- ``no-a3``: the same excerpts (handoffs included, original texts and ids), but no backward-reasoning rules in
  the system prompt, no linkage hints, no role-class annotations, neutral ``CONTEXT`` labels on added handoff
  excerpts, and no instruction-evidence check: ``delegation_trace`` is dropped from the answer schema and its
  A4 check is skipped (so coverage no longer requires it, as App. L.1 says the A3 control's checks change).
- ``no-a4``: the first attribution answer (after any length retry) is the prediction as answered: no
  validation retry, no field merging or sanitising. Its validity and coverage are still measured
  (`merge_fields` of the first attempt) and recorded; ``abstained`` is then only the model's own ``abstain``.

Choices where paper and release are silent or differ (each documented where it is made):

- Stage I validation retry (option ``stage1_retry``, default on): the release validates every stage and retries
  once with the error list appended (first 20 errors for summaries and the outline); the paper states the retry
  only for attribution and is silent on Stage I, so the release's behaviour is taken. A summary is retried when
  its reader found errors; the retry's summary is used unless it has more errors than the first. Ids a used
  summary proposes outside its segment's own steps are then dropped (the release's coercion) and recorded. The
  outline is retried when readable with errors (its phase count is none: the release never enforces 3–8); an
  unreadable outline gets the fallback and no retry (the release's fallback passes validation).
- Retries (Stage I and attribution) resend the first request with the feedback appended to the user message, as
  the release does, rather than replaying the previous answer.
- Temperatures: 0.1 for summary and outline (the release; inert under reasoning), 0 for attribution (paper).
- Step contents longer than ``step_char_limit`` (200,000, the release's safety cap) are cut in the middle before
  any prompt is built; then the shared context policy of `rcarun.methods.context` (``truncation``) fits each
  prompt to the backbone's window by capping the shown step contents (summary: the segment's steps and overlap;
  attribution: the excerpts).
- ``used_handoff`` in the diagnostics: the predicted root step is a handoff step retrieved as A2 evidence.

Unreadable answers and fallbacks (``Attribution.error`` / ``fallback``; ``diagnostics.fallbacks`` stays as it
is):

- ``error``: the prediction lacks the role or the step because no attribution attempt that counts (the first
  and the A4 retry; only the first under ``no-a4``) gave a readable value for it: the answer was not a JSON
  object, or ``root_cause.agent`` / ``root_cause.step`` was missing or of the wrong type in every attempt. The
  text says which, with the last parse or reader error. A model that abstained on purpose has no error, and a
  value that was read but is not a recorded agent or not a step of the log is validity, not an error.
- ``fallback``: A4's rule made the output abstain (an essential field missing after the merge, the model did
  not abstain) and so overrode something the model gave: a role or step that was read but invalid in every
  attempt is dropped, or a valid field is kept beside an abstention that scoring counts as an error. When
  neither field was ever read there is nothing to override, and only ``error`` is set.
- Not fallbacks: the A4 retry and the field merge (they choose among the model's own answers), and the Stage I
  fallbacks (an unreadable outline replaced by one phase per summary, a failed summary): they shape the
  evidence the attribution call sees but do not decide the prediction; they stay in ``diagnostics.fallbacks``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from pydantic import PositiveInt, model_validator

from rcarun.data import Trajectory
from rcarun.errors import ConfigError
from rcarun.methods._options import MethodOptions, parse_options
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.context import TruncationPolicy, cut_middle, fit_prompt, ground_truth_line, task_text
from rcarun.methods.llm import LLM, Message, Reasoning, Reply
from rcarun.methods.prompt_files import load_prompt
from rcarun.methods.registry import method

from .candidates import DEFAULT_CAP, CandidatePool, pool_candidates
from .enrich import EnrichedStep, enrich
from .grounding import quote_is_grounded
from .handoffs import HandoffLink, HandoffRecord, augment_with_handoffs, handoffs_of
from .linkage import LinkageHint, linkage_hints
from .schemas import (
    LocalSummary,
    Outline,
    attribution_schema,
    fallback_outline,
    local_summary_schema,
    outline_schema,
    parse_attribution,
    parse_local_summary,
    parse_outline,
    scorable_agents,
)
from .segment import Segment, SegmentationConfig, segment
from .validate import FieldCheck, FinalFields, Validation, feedback_text, merge_fields, validate_attribution

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

Ablation = Literal["no-a1", "no-a2", "no-a3", "no-a4"]
Preset = Literal["full", "ablation"]
ABLATIONS: tuple[Ablation, ...] = ("no-a1", "no-a2", "no-a3", "no-a4")
STAGES: tuple[str, ...] = ("summary", "outline", "attribution")
SHAREABLE_STAGES: frozenset[str] = frozenset({"summary", "outline"})

_SUMMARY_TEMPERATURE = 0.1
_OUTLINE_TEMPERATURE = 0.1
_ATTRIBUTION_TEMPERATURE = 0.0
_STAGE1_FEEDBACK_ERRORS = 20  # the release appends the first 20 errors to a local/phase retry
_STEP_CHAR_LIMIT = 200_000
_NOTE_CHARS = 300  # a candidate note longer than this is cut in the excerpt header
_CUT_NOTE = (
    "\nSome long step texts were cut in the middle to fit the model's context; their step ids are kept.\n"
)


@dataclass(frozen=True, slots=True)
class StageBudgets:
    """First-attempt output budgets in tokens of the three stages."""

    summary: int
    outline: int
    attribution: int


@dataclass(frozen=True, slots=True)
class StageReasoning:
    """The reasoning setting sent with each of the three stages."""

    summary: Reasoning
    outline: Reasoning
    attribution: Reasoning


# Output budgets: Full 4,000 / 6,000 / 8,000 (paper App. H, summary App. E); ablation 4,000 / 12,000 / 32,000
# (App. H "Ablation inference settings").
PRESETS: Mapping[str, StageBudgets] = {
    "full": StageBudgets(summary=4_000, outline=6_000, attribution=8_000),
    "ablation": StageBudgets(summary=4_000, outline=12_000, attribution=32_000),
}
# Reasoning: the ablation's values are App. H's ("local summaries (reasoning off)", "aggregation and attribution
# use reasoning at high effort"). For Full the paper says only that the stages use "different reasoning settings"
# (summary App. E) and gives no values; Full's are our choice, the same per-stage values (which do differ by
# stage), stated here on their own so that either can change without the other.
PRESET_REASONING: Mapping[str, StageReasoning] = {
    "full": StageReasoning(summary="off", outline="high", attribution="high"),
    "ablation": StageReasoning(summary="off", outline="high", attribution="high"),
}


class RctaOptions(MethodOptions):
    """RCTA's options table (a sweep's ``options`` for the method; unknown keys are a `ConfigError`).

    Attributes:
        preset: ``"full"`` or ``"ablation"``: the stages' output budgets (`PRESETS`) and reasoning settings
            (`PRESET_REASONING`). None: the paper's for the condition, ``"full"`` for full RCTA and
            ``"ablation"`` for a component condition (``ablation`` set, or ``rcta/no-aX``), as App. H runs them.
        ablation: None (all components) or one of `ABLATIONS`.
        include_task: show the task instruction, whole up to 12,000 characters, in every call: each segment
            summary, the outline, the attribution and its A4 retry (paper Sec. 3.2, 4.1: methods receive the task
            instruction; the summaries are task-conditioned).
        include_ground_truth: add the task's correct final answer to every stage (off: the LongRCA protocol).
        truncation: the shared context policy, ``"cap-steps"`` or ``"none"`` (`rcarun.methods.context`).
        candidate_cap: base candidates kept before handoff augmentation (80 in the paper).
        segmentation: overrides of `SegmentationConfig` fields (``max_steps``, ``max_chars``, ...), or None for
            the release's constants.
        stage1_retry: one validation retry for a summary or outline with errors (the release's behaviour).
        step_char_limit: step contents longer than this are cut in the middle before prompting (the release's
            200,000-character safety cap).
        release_consistency_rules: release-only, off by default: also apply the release's cross-field rules
            (planner agent => planner step and no D/E/X category; faithful claim => root at the prescribing
            step, its sender or a handoff form as agent, category C1 or A2) to A4's validity and retry. The
            paper has no such rule and keeps role and step independent; coverage never uses them.
    """

    preset: Preset | None = None
    ablation: Ablation | None = None
    include_task: bool = True
    include_ground_truth: bool = False
    truncation: TruncationPolicy = "cap-steps"
    candidate_cap: PositiveInt = DEFAULT_CAP
    segmentation: dict[str, int] | None = None
    stage1_retry: bool = True
    step_char_limit: PositiveInt = _STEP_CHAR_LIMIT
    release_consistency_rules: bool = False

    @model_validator(mode="after")
    def _segmentation_builds(self) -> RctaOptions:
        if self.segmentation is not None:
            known = {f.name for f in fields(SegmentationConfig)}
            unknown = sorted(set(self.segmentation) - known)
            if unknown:
                raise ValueError(f"unknown segmentation field(s) {unknown}; known: {sorted(known)}")
            try:
                SegmentationConfig(**self.segmentation)
            except ValueError as exc:
                raise ValueError(f"segmentation: {exc}") from None
        return self

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], *, name: str = "rcta") -> RctaOptions:
        """Parse and check an options table; ``name`` is the registered method name used in error messages."""
        return parse_options(name, cls, options)

    def segmentation_config(self) -> SegmentationConfig:
        """The segmenter's limits: the release's constants with this table's overrides."""
        return SegmentationConfig() if self.segmentation is None else SegmentationConfig(**self.segmentation)

    @property
    def resolved_preset(self) -> Preset:
        """The preset this condition runs at (``preset``, or the paper's for it: App. H)."""
        if self.preset is not None:
            return self.preset
        return "full" if self.ablation is None else "ablation"

    @property
    def budgets(self) -> StageBudgets:
        return PRESETS[self.resolved_preset]

    @property
    def reasoning(self) -> StageReasoning:
        return PRESET_REASONING[self.resolved_preset]


def uniform_ids(n_steps: int, count: int) -> tuple[int, ...]:
    """``count`` step ids spread uniformly over ``0..n_steps-1`` (the centre of each of ``count`` equal bins)."""
    count = min(count, n_steps)
    return tuple(((2 * i + 1) * n_steps) // (2 * count) for i in range(count))


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _id_ranges(ids: Sequence[int]) -> str:
    """Ids as ``"0-5, 9, 12-14"``."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    start = previous = None
    for value in [*ordered, None]:
        if value is not None and previous is not None and value == previous + 1:
            previous = value
            continue
        if start is not None and previous is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = value
    return ", ".join(parts) if parts else "(none)"


def _signal_summary(steps: Sequence[EnrichedStep]) -> str:
    """The release's verifier-signal digest: count, first PASS, first FAIL, last signal, first 20 signals."""
    signals = [(s.step_id, s.verifier_signal) for s in steps if s.verifier_signal is not None]
    if not signals:
        return "none"
    first_pass = next((i for i, sig in signals if sig == "PASS"), None)
    first_fail = next((i for i, sig in signals if sig == "FAIL"), None)
    listed = ", ".join(f"{sig}@{i}" for i, sig in signals[:20])
    return (
        f"{len(signals)} signal(s); first PASS at {first_pass}; first FAIL at {first_fail}; "
        f"last {signals[-1][1]} at {signals[-1][0]}; in order: {listed}"
    )


def _step_header(step: EnrichedStep, *, role_class: bool) -> str:
    facts: list[str] = [step.role_class] if role_class else []
    facts.append(step.action_type)
    if step.delegate_target is not None:  # Who&When keeps the recipient in the role, not in the agent name
        facts.append(f"hands off to {step.delegate_target}")
    if step.exit_code is not None:
        facts.append(f"exit code {step.exit_code}")
    if step.verifier_signal is not None:
        facts.append(f"signal {step.verifier_signal}")
    facts.append(f"{step.content_len} chars")
    return f"[step {step.step_id}] {step.agent_raw} ({'; '.join(facts)})"


def _capped(content: str, cap: int | None) -> str:
    return cut_middle(content, cap) if cap is not None and len(content) > cap else content


def _summary_json(summary: LocalSummary) -> dict[str, Any]:
    return {
        "segment_id": summary.segment_id,
        "step_range": list(summary.step_range) if summary.step_range else None,
        "segment_goal": summary.segment_goal,
        "key_events": [{"event": e.event, "step_ids": list(e.step_ids)} for e in summary.key_events],
        "proposed_steps": [
            {"step_id": p.step_id, "tags": list(p.tags), "note": p.note} for p in summary.proposals
        ],
        "verifier_findings": [
            {"step_ids": list(f.step_ids), "result": f.result, "note": f.note}
            for f in summary.verifier_findings
        ],
        "uncertainties": list(summary.uncertainties),
    }


def _outline_json(outline: Outline) -> dict[str, Any]:
    def rng(value: tuple[int, int] | None) -> list[int] | None:
        return list(value) if value else None

    return {
        "phases": [
            {
                "phase_id": p.phase_id,
                "step_range": rng(p.step_range),
                "phase_goal": p.phase_goal,
                "involved_agents": list(p.involved_agents),
                "sub_phases": [
                    {"step_range": rng(s.step_range), "description": s.description} for s in p.sub_phases
                ],
                "failure_signals": [
                    {"description": f.description, "step_ids": list(f.step_ids), "severity": f.severity}
                    for f in p.failure_signals
                ],
                "supporting_step_ids": list(p.supporting_step_ids),
            }
            for p in outline.phases
        ],
        "conflicts": [
            {"description": c.description, "segment_ids": list(c.segment_ids), "step_ids": list(c.step_ids)}
            for c in outline.conflicts
        ],
    }


def _with_feedback(messages: Sequence[Message], feedback: str) -> list[Message]:
    """The first request again, with the validation feedback appended to its last user message."""
    head, last = list(messages[:-1]), messages[-1]
    return [*head, Message(last.role, f"{last.content}\n\n{feedback}")]


def _stage1_feedback(errors: Sequence[str]) -> str:
    lines = [
        "Your previous answer did not pass validation. Answer again with the complete JSON object, "
        "correcting these problems:"
    ]
    lines += [f"- {error}" for error in errors[:_STAGE1_FEEDBACK_ERRORS]]
    if len(errors) > _STAGE1_FEEDBACK_ERRORS:
        lines.append(f"- ... and {len(errors) - _STAGE1_FEEDBACK_ERRORS} more")
    return "\n".join(lines)


def _parsed(reply: Reply) -> Any:
    return reply.parsed if reply.parse_error is None else None


@dataclass(slots=True)
class _Run:
    """What one trajectory's run accumulates for the output JSON: calls made and fallbacks taken."""

    calls: int = 0
    fallbacks: list[str] = field(default_factory=list)


class RCTA(Method):
    """Root-Cause Trajectory Attribution: m + 2 calls per trajectory plus validation retries."""

    shareable_stages: frozenset[str] = SHAREABLE_STAGES

    def __init__(self, label: str, options: RctaOptions) -> None:
        self.label = label
        self.options = options
        self.budgets = options.budgets
        self.reasoning = options.reasoning
        # The preset fixes every stage's first budget: the runner lets no stage table override it.
        self.stage_budgets: Mapping[str, int] = {
            "summary": self.budgets.summary,
            "outline": self.budgets.outline,
            "attribution": self.budgets.attribution,
        }
        self.ablation: Ablation | None = options.ablation
        self._segmentation = options.segmentation_config()
        self._summary_system = load_prompt("rcta_summary_system.txt").template.strip()
        self._summary_user = load_prompt("rcta_summary_user.txt")
        self._outline_system = load_prompt("rcta_outline_system.txt").template.strip()
        self._outline_user = load_prompt("rcta_outline_user.txt")
        backward = (
            ""
            if self.ablation == "no-a3"
            else "\n" + load_prompt("rcta_attribution_backward.txt").template.strip()
        )
        self._attribution_system = (
            load_prompt("rcta_attribution_system.txt").substitute(backward_rules=backward).strip()
        )
        self._attribution_user = load_prompt("rcta_attribution_user.txt")

    # --- shared prompt pieces ------------------------------------------------------------------------------

    def _content(self, step: EnrichedStep) -> str:
        return _capped(step.content, self.options.step_char_limit)

    async def _chat(
        self,
        run: _Run,
        llm: LLM,
        messages: Sequence[Message],
        *,
        stage: str,
        max_tokens: int,
        schema: Mapping[str, Any],
        temperature: float,
        reasoning: Reasoning,
    ) -> Reply:
        run.calls += 1
        return await llm.chat(
            messages,
            stage=stage,
            max_tokens=max_tokens,
            schema=schema,
            temperature=temperature,
            reasoning=reasoning,
        )

    # --- Stage I -------------------------------------------------------------------------------------------

    def summary_messages(
        self, trajectory: Trajectory, seg: Segment, schema: Mapping[str, Any], llm: LLM
    ) -> tuple[list[Message], dict[str, Any]]:
        """The local-summary request of one segment, and the truncation applied to fit ``llm``'s window."""
        shown = [*seg.overlap_steps, *seg.steps]
        contents = [self._content(s) for s in shown]
        n_overlap = len(seg.overlap_steps)

        def render(cap: int | None) -> str:
            blocks = [
                f"{_step_header(s, role_class=True)}\n{_capped(c, cap)}"
                for s, c in zip(shown, contents, strict=True)
            ]
            overlap = ""
            if n_overlap:
                overlap = (
                    "\n=== CONTEXT FROM THE PREVIOUS SEGMENT (read-only; these ids must not be cited) ===\n"
                    + "\n\n".join(blocks[:n_overlap])
                    + "\n=== END OF CONTEXT ===\n"
                )
            return self._summary_user.substitute(
                task=task_text(trajectory, include=self.options.include_task),
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                segment_id=seg.segment_id,
                first=seg.step_ids[0],
                last=seg.step_ids[-1],
                n_steps=trajectory.n_steps,
                agents=", ".join(seg.agents),
                signals=", ".join(seg.verifier_signals) or "none",
                valid_ids=_id_ranges(seg.step_ids),
                overlap=overlap,
                steps="\n\n".join(blocks[n_overlap:]),
                truncation_note="" if cap is None else _CUT_NOTE,
                schema=_compact(schema),
            )

        return self._fitted(render, contents, llm, self.budgets.summary, self._summary_system)

    async def _summarise(
        self, run: _Run, trajectory: Trajectory, seg: Segment, llm: LLM
    ) -> tuple[LocalSummary, dict[str, Any]]:
        schema = local_summary_schema(seg.segment_id, seg.step_ids)
        messages, truncation = self.summary_messages(trajectory, seg, schema, llm)

        async def attempt(request: Sequence[Message]) -> tuple[LocalSummary, Reply]:
            reply = await self._chat(
                run,
                llm,
                request,
                stage="summary",
                max_tokens=self.budgets.summary,
                schema=schema,
                temperature=_SUMMARY_TEMPERATURE,
                reasoning=self.reasoning.summary,
            )
            summary = parse_local_summary(_parsed(reply), segment_id=seg.segment_id, valid_ids=seg.step_ids)
            return summary, reply

        first, reply = await attempt(messages)
        record: dict[str, Any] = {
            "segment": seg.segment_id,
            "parsed": isinstance(_parsed(reply), dict),
            "finish_reason": reply.finish_reason,
            "errors": len(first.errors),
            "retried": False,
            "used": "first",
        }
        used = first
        if first.errors and self.options.stage1_retry:
            feedback = _stage1_feedback([e.message for e in first.errors])
            retry, retry_reply = await attempt(_with_feedback(messages, feedback))
            record.update(
                retried=True,
                retry_parsed=isinstance(_parsed(retry_reply), dict),
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

    def outline_messages(
        self,
        trajectory: Trajectory,
        enriched: Sequence[EnrichedStep],
        summaries: Sequence[LocalSummary],
        schema: Mapping[str, Any],
    ) -> list[Message]:
        """The trajectory-outline request (summaries are short; no truncation is applied)."""
        user = self._outline_user.substitute(
            task=task_text(trajectory, include=self.options.include_task),
            ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
            n_steps=trajectory.n_steps,
            valid_ids=_id_ranges(range(trajectory.n_steps)),
            n_segments=len(summaries),
            agents=", ".join(trajectory.agents),
            signals=_signal_summary(enriched),
            summaries="\n".join(_compact(_summary_json(s)) for s in summaries),
            schema=_compact(schema),
        )
        return [Message("system", self._outline_system), Message("user", user)]

    async def _outline(
        self,
        run: _Run,
        trajectory: Trajectory,
        enriched: Sequence[EnrichedStep],
        summaries: Sequence[LocalSummary],
        llm: LLM,
    ) -> tuple[Outline, dict[str, Any]]:
        segment_ids = [s.segment_id for s in summaries]
        schema = outline_schema(trajectory, segment_ids)
        messages = self.outline_messages(trajectory, enriched, summaries, schema)

        async def attempt(request: Sequence[Message]) -> tuple[Outline, Reply]:
            reply = await self._chat(
                run,
                llm,
                request,
                stage="outline",
                max_tokens=self.budgets.outline,
                schema=schema,
                temperature=_OUTLINE_TEMPERATURE,
                reasoning=self.reasoning.outline,
            )
            return parse_outline(_parsed(reply), trajectory=trajectory, segment_ids=segment_ids), reply

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
            feedback = _stage1_feedback([e.message for e in outline.errors])
            retry, _ = await attempt(_with_feedback(messages, feedback))
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

    def _excerpt_label(
        self,
        step_id: int,
        pool: CandidatePool,
        base: frozenset[int],
        links: Sequence[HandoffLink],
    ) -> list[str]:
        """Annotation lines under an excerpt's header, by condition."""
        lines: list[str] = []
        if step_id in base and self.ablation != "no-a1":
            candidate = next((c for c in pool.candidates if c.step_id == step_id), None)
            if candidate is not None:
                notes = "; ".join(n[:_NOTE_CHARS] for n in candidate.notes) or "-"
                lines.append(
                    f"candidate: tags {', '.join(candidate.tags) or '-'}; "
                    f"proposed by {', '.join(candidate.proposed_by)}; notes: {notes}"
                )
        receivers = [link.candidate for link in links if link.handoff == step_id]
        if receivers:
            if self.ablation == "no-a3":
                lines.append("CONTEXT: an earlier step shown for context.")
            else:
                lines.append(
                    "HANDOFF INSTRUCTION: the logged instruction preceding candidate step(s) "
                    f"{', '.join(map(str, receivers))}; it is their specification source, so check it first."
                )
        return lines

    def _excerpt_guide(self) -> str:
        if self.ablation == "no-a1":
            return "Each excerpt is one step's original text with its id."
        proposed = (
            "Each excerpt is one step's original text with its id. Steps proposed by the summaries (local:<segment>) "
            "or the outline (outline:<phase>) carry their tags, who proposed them and their notes."
        )
        if self.ablation == "no-a3":
            return f"{proposed} Steps marked CONTEXT are shown as further context."
        if self.ablation == "no-a2":
            return proposed
        return (
            f"{proposed} A HANDOFF INSTRUCTION is the logged instruction that preceded the candidates it names; "
            "compare them with it."
        )

    @staticmethod
    def _hints_text(hints: Sequence[LinkageHint]) -> str:
        if not hints:
            return ""
        lines = [
            "=== LINKAGE HINTS (rule-based; they only direct attention) ===",
            "Each hint says that an executor step may carry out the handoff instruction addressed to it. "
            "Trace the root back to the instruction only if the executor copied the same defect; a weak hint "
            "means overlapping scope only.",
        ]
        for hint in hints:
            evidence = (
                f'cites the plan ("{hint.cites_plan}")'
                if hint.cites_plan is not None
                else f"shares {hint.shared_count} code identifiers ({', '.join(hint.shared_identifiers)})"
            )
            lines.append(
                f"- step {hint.executor_step} ({hint.executor_agent}) may implement handoff step "
                f"{hint.handoff_step} ({hint.handoff_agent} -> {hint.handoff_recipient}): {evidence}; "
                f"{hint.strength} hint, identifier overlap {hint.overlap}"
            )
        return "\n".join(lines) + "\n"

    def attribution_messages(
        self,
        trajectory: Trajectory,
        enriched: Sequence[EnrichedStep],
        *,
        summaries: Sequence[LocalSummary],
        outline: Outline,
        pool: CandidatePool,
        base_ids: Sequence[int],
        excerpt_ids: Sequence[int],
        links: Sequence[HandoffLink],
        hints: Sequence[LinkageHint],
        schema: Mapping[str, Any],
        llm: LLM,
    ) -> tuple[list[Message], dict[str, Any]]:
        """The final attribution request, and the truncation applied to its excerpts."""
        base = frozenset(base_ids)
        shown = [enriched[i] for i in excerpt_ids]
        contents = [self._content(s) for s in shown]
        labels = [self._excerpt_label(s.step_id, pool, base, links) for s in shown]
        role_classes = self.ablation != "no-a3"
        if self.ablation == "no-a1":
            masked = "(not provided in this condition)"
            outline_text = summaries_text = masked
        else:
            outline_text = _compact(_outline_json(outline))
            if outline.fallback:
                outline_text = (
                    "(the outline could not be built; one phase per segment summary)\n" + outline_text
                )
            summaries_text = "\n".join(_compact(_summary_json(s)) for s in summaries)

        def render(cap: int | None) -> str:
            blocks = [
                "\n".join([_step_header(s, role_class=role_classes), *label, _capped(c, cap)])
                for s, c, label in zip(shown, contents, labels, strict=True)
            ]
            return self._attribution_user.substitute(
                task=task_text(trajectory, include=self.options.include_task),
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                agents=", ".join(scorable_agents(trajectory)),
                n_steps=trajectory.n_steps,
                last_step=trajectory.n_steps - 1,
                outline=outline_text,
                summaries=summaries_text,
                hints=self._hints_text(hints),
                excerpt_guide=self._excerpt_guide(),
                excerpts="\n\n".join(blocks) if blocks else "(no excerpts)",
                truncation_note="" if cap is None else _CUT_NOTE,
                schema=_compact(schema),
            )

        return self._fitted(render, contents, llm, self.budgets.attribution, self._attribution_system)

    def _fitted(
        self,
        render: Callable[[int | None], str],
        contents: Sequence[str],
        llm: LLM,
        max_tokens: int,
        system: str,
    ) -> tuple[list[Message], dict[str, Any]]:
        """The system prompt and the user prompt cut by the shared context policy, with what was cut."""
        fitted = fit_prompt(
            render,
            [len(c) for c in contents],
            llm=llm,
            max_tokens=max_tokens,
            system=system,
            policy=self.options.truncation,
        )
        return [Message("system", system), Message("user", fitted.text)], fitted.truncation.as_output()

    def _attribution_schema(self, trajectory: Trajectory) -> dict[str, Any]:
        schema = attribution_schema(trajectory)
        if self.ablation != "no-a3":
            return schema
        # The A3 control asks for no instruction evidence: delegation_trace leaves the schema.
        analysis = dict(schema["properties"]["analysis"])
        properties = {k: v for k, v in analysis["properties"].items() if k != "delegation_trace"}
        analysis.update(properties=properties, required=list(properties))
        return {**schema, "properties": {**schema["properties"], "analysis": analysis}}

    def _validate(
        self, reply: Reply, trajectory: Trajectory, handoffs: Sequence[HandoffRecord]
    ) -> Validation:
        validation = validate_attribution(
            parse_attribution(_parsed(reply)),
            trajectory,
            handoff_texts_by_step={h.step: h.text for h in handoffs},
            quote_grounded=quote_is_grounded,
            release_consistency_rules=self.options.release_consistency_rules,
        )
        if self.ablation != "no-a3":
            return validation
        # The A3 control omits the instruction-evidence check (App. H): the trace is neither asked nor checked.
        checks = tuple(FieldCheck(c.name) if c.name == "delegation_trace" else c for c in validation.checks)
        return replace(validation, checks=checks)

    # --- the pipeline --------------------------------------------------------------------------------------

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        run = _Run()
        output: dict[str, Any] = {"preset": self.options.resolved_preset, "ablation": self.ablation}
        if trajectory.n_steps == 0:
            output.update(calls=0, error="empty trajectory")
            return Attribution(None, None, False, False, abstained=True, output=output)
        enriched = enrich(trajectory)
        segments = segment(enriched, config=self._segmentation)
        handoffs = handoffs_of(trajectory)

        summaries: list[LocalSummary] = []
        summary_records: list[dict[str, Any]] = []
        for seg in segments:  # sequential, as released: the calls of one item are not raced
            summary, record = await self._summarise(run, trajectory, seg, llm)
            summaries.append(summary)
            summary_records.append(record)
            if record.get("failed"):
                run.fallbacks.append(f"summary:{seg.segment_id}")
        outline, outline_record = await self._outline(run, trajectory, enriched, summaries, llm)

        pool = pool_candidates(summaries, trajectory, outline=outline, cap=self.options.candidate_cap)
        base_ids = pool.base_ids
        if self.ablation == "no-a1":
            base_ids = uniform_ids(trajectory.n_steps, len(pool.base_ids))
        links: tuple[HandoffLink, ...] = ()
        if self.ablation == "no-a2":
            excerpt_ids = tuple(base_ids)
        else:
            augmentation = augment_with_handoffs(base_ids, trajectory, handoffs)
            links = augmentation.links
            excerpt_ids = tuple(i for i in augmentation.ids if 0 <= i < trajectory.n_steps)
        hints: tuple[LinkageHint, ...] = ()
        if self.ablation not in ("no-a2", "no-a3"):
            hints = linkage_hints(excerpt_ids, trajectory, handoffs)

        schema = self._attribution_schema(trajectory)
        messages, truncation = self.attribution_messages(
            trajectory,
            enriched,
            summaries=summaries,
            outline=outline,
            pool=pool,
            base_ids=base_ids,
            excerpt_ids=excerpt_ids,
            links=links,
            hints=hints,
            schema=schema,
            llm=llm,
        )

        async def attempt(request: Sequence[Message]) -> tuple[Validation, Reply]:
            reply = await self._chat(
                run,
                llm,
                request,
                stage="attribution",
                max_tokens=self.budgets.attribution,
                schema=schema,
                temperature=_ATTRIBUTION_TEMPERATURE,
                reasoning=self.reasoning.attribution,
            )
            return self._validate(reply, trajectory, handoffs), reply

        first, first_reply = await attempt(messages)
        attempts = [_attempt_record("first", first, first_reply)]
        retry: Validation | None = None
        if not first.valid and self.ablation != "no-a4":
            retry, retry_reply = await attempt(_with_feedback(messages, feedback_text(first)))
            attempts.append(_attempt_record("retry", retry, retry_reply))
        final = merge_fields(first, retry)

        if self.ablation == "no-a4":  # the first answer as answered: no merge, no sanitising
            raw = first.answer
            role: str | None = raw.agent
            step: int | None = raw.step
            abstained = raw.abstain is True
            evidence = raw.evidence_step_ids or ()
        else:
            role, step, abstained = final.agent, final.step, final.abstain
            evidence = final.evidence_step_ids or ()
        if final.agent is None or final.step is None:
            run.fallbacks.append("abstain_missing_fields")
        handoff_steps = {link.handoff for link in links}
        used_handoff = step is not None and step in handoff_steps
        # Recall by source (Fig. 6a): the base candidates each source proposed; none under the A1 control,
        # whose base candidates are uniformly placed steps, not proposals.
        by_source: dict[str, tuple[int, ...]] = {
            source: () if self.ablation == "no-a1" else pool.base_ids_from(source)
            for source in ("summary", "outline")
        }
        output.update(
            calls=run.calls,
            segments=[
                {
                    "id": s.segment_id,
                    "steps": [s.step_ids[0], s.step_ids[-1]],
                    "overlap": list(s.overlap_ids),
                    "cut": s.cut_reason,
                }
                for s in segments
            ],
            stages={"summary": summary_records, "outline": outline_record, "attribution": attempts},
            candidates={
                "base_ids": list(base_ids),
                "count": len(base_ids),
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
            excerpt_ids=list(excerpt_ids),
            handoff_links=[[link.candidate, link.handoff, link.rule] for link in links],
            linkage_hints=[
                {"executor": h.executor_step, "handoff": h.handoff_step, "kind": h.kind, "overlap": h.overlap}
                for h in hints
            ],
            truncation=truncation,
            answer=_final_json(final),
            field_sources={k: v for k, v in final.sources.items()},
            final_errors=list(final.errors),
            abstain=final.abstain,
            model_abstained=final.model_abstained,
            needs_review=final.needs_review,
            covered=final.covered,
            coverage_checks=dict(final.coverage_checks),
            diagnostics={
                "base_candidate_ids": list(base_ids),
                "summary_candidate_ids": list(by_source["summary"]),
                "outline_candidate_ids": list(by_source["outline"]),
                "excerpt_ids": list(excerpt_ids),
                "evidence_ids": list(evidence),
                "used_handoff": used_handoff,
                "outline_phases": len(outline.phases),
                "outline_phases_in_range": outline.phase_count_in_range,
                "outline_fallback": outline.fallback,
                "fallbacks": list(run.fallbacks),
            },
        )
        if self.ablation == "no-a4":
            output["raw_answer"] = {"agent": role, "step": step, "abstain": first.answer.abstain}
        counted = [(first, first_reply)]
        if retry is not None and self.ablation != "no-a4":
            counted.append((retry, retry_reply))
        model_abstained = first.answer.abstain is True if self.ablation == "no-a4" else final.model_abstained
        error, fallback = _unread_and_overridden(
            counted,
            {"agent": role, "step": step},
            model_abstained=model_abstained,
            merged=self.ablation != "no-a4",
        )
        return Attribution(
            pred_role=role,
            pred_step=step,
            role_valid=role_is_valid(role, trajectory),
            step_valid=step_is_valid(step, trajectory),
            abstained=abstained,
            output=output,
            error=error,
            fallback=fallback,
        )


def _unread_and_overridden(
    attempts: Sequence[tuple[Validation, Reply]],
    predicted: Mapping[str, object],
    *,
    model_abstained: bool,
    merged: bool,
) -> tuple[str | None, str | None]:
    """The prediction's ``error`` and ``fallback`` (module docstring).

    Args:
        attempts: the attribution attempts that count, in order, with their replies.
        predicted: the essential fields as predicted (``agent``, ``step``), None when missing.
        model_abstained: the model's own kept ``abstain`` said so.
        merged: A4 ran (the merge decides abstention); False for the A4 control.
    """
    missing = [name for name, value in predicted.items() if value is None]
    if not missing or model_abstained:
        return None, None
    unread = [name for name in missing if all(getattr(v.answer, name) is None for v, _ in attempts)]
    error = None
    if unread:
        if not any(isinstance(_parsed(reply), dict) for _, reply in attempts):
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


def _attempt_record(name: str, validation: Validation, reply: Reply) -> dict[str, Any]:
    return {
        "attempt": name,
        "parsed": isinstance(_parsed(reply), dict),
        "finish_reason": reply.finish_reason,
        "valid": validation.valid,
        "errors": list(validation.errors),
    }


def _final_json(final: FinalFields) -> dict[str, Any]:
    trace = final.delegation_trace
    return {
        "agent": final.agent,
        "step": final.step,
        "reason": final.reason,
        "evidence_step_ids": list(final.evidence_step_ids) if final.evidence_step_ids is not None else None,
        "primary_category": final.primary_category,
        "contributing_factors": (
            list(final.contributing_factors) if final.contributing_factors is not None else None
        ),
        "delegation_trace": None
        if trace is None
        else {
            "checked": trace.checked,
            "faithful_implementation": trace.faithful_implementation,
            "prescribing_step": trace.prescribing_step,
            "quote": trace.quote,
            "defect_in_quote": trace.defect_in_quote,
        },
        "failure_chain": None
        if final.failure_chain is None
        else [{"step": n.step, "agent": n.agent, "role": n.role} for n in final.failure_chain],
        "counterfactual": final.counterfactual,
        "confidence": final.confidence,
    }


def _factory(name: str, fixed: Ablation | None) -> None:
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
