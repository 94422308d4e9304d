"""RCTA's options table, its presets and the ablation flags each component condition resolves to.

The presets' sources and the conditions' definitions are in ``docs/methods/rcta.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from pydantic import PositiveInt, model_validator

from rcarun.methods._options import MethodOptions, parse_options
from rcarun.methods.context import TruncationPolicy
from rcarun.methods.llm import Reasoning

from .candidates import DEFAULT_CAP
from .segment import SegmentationConfig

__all__ = [
    "ABLATIONS",
    "PRESETS",
    "PRESET_REASONING",
    "Ablation",
    "AblationName",
    "Preset",
    "RctaOptions",
    "StageBudgets",
    "StageReasoning",
]

AblationName = Literal["no-a1", "no-a2", "no-a3", "no-a4"]
Preset = Literal["full", "ablation"]
ABLATIONS: tuple[AblationName, ...] = ("no-a1", "no-a2", "no-a3", "no-a4")
_STEP_CHAR_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class Ablation:
    """What a condition keeps of RCTA (paper App. H); every flag is on for full RCTA.

    Each flag names what it switches; ``docs/methods/rcta.md`` ("Component controls") tabulates them.
    """

    pooled_candidates: bool = True
    stage_one_cues: bool = True
    handoff_evidence: bool = True
    linkage_hints: bool = True
    backward_rules: bool = True
    role_classes: bool = True
    handoff_labels: bool = True
    delegation_trace: bool = True
    validation_retry: bool = True

    @classmethod
    def of(cls, name: AblationName | None) -> Ablation:
        """The flags of a condition: None is full RCTA, else one of `ABLATIONS`."""
        return _ABLATION_FLAGS[name]


_ABLATION_FLAGS: Mapping[AblationName | None, Ablation] = {
    None: Ablation(),
    "no-a1": Ablation(pooled_candidates=False, stage_one_cues=False),
    "no-a2": Ablation(handoff_evidence=False, linkage_hints=False),
    "no-a3": Ablation(
        linkage_hints=False,
        backward_rules=False,
        role_classes=False,
        handoff_labels=False,
        delegation_trace=False,
    ),
    "no-a4": Ablation(validation_retry=False),
}


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


# Budgets and reasoning per preset, apart so that either can change alone (sources: docs/methods/rcta.md).
PRESETS: Mapping[str, StageBudgets] = {
    "full": StageBudgets(summary=4_000, outline=6_000, attribution=8_000),
    "ablation": StageBudgets(summary=4_000, outline=12_000, attribution=32_000),
}
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
    ablation: AblationName | None = None
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
