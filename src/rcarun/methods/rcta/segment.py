"""Rule-based segmentation of an enriched trajectory for RCTA's local summaries (release notes 3.2; no LLM).

A long trajectory does not fit one summary call; the paper fixes the segments' shape (Sec. 4.1, App. E)
and the release the rules. Constants, cut rules, overlap and post-pass: ``docs/methods/rcta.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Literal, get_args

from .enrich import EnrichedStep, VerifierSignal
from .roles import RoleClass

__all__ = [
    "CUT_REASONS",
    "DEFAULT_CONFIG",
    "MAX_CHARS",
    "MAX_STEPS",
    "MIN_CHARS",
    "MIN_STEPS",
    "OVERLAP_STEPS",
    "TARGET_CHARS",
    "CutReason",
    "Segment",
    "SegmentationConfig",
    "segment",
    "split_oversized",
]

TARGET_CHARS = 24_000
MAX_CHARS = 32_000
MAX_STEPS = 80
MIN_STEPS = 8
MIN_CHARS = 10_000
OVERLAP_STEPS = 5

CutReason = Literal[
    "finish_signal",
    "verifier_signal_change",
    "agent_shift",
    "max_length",
    "max_steps",
    "soft_agent_shift_at_target",
    "end_of_trace",
    "split_in_half_left",
    "split_in_half_right",
]
CUT_REASONS: tuple[CutReason, ...] = get_args(CutReason)


@dataclass(frozen=True, slots=True)
class SegmentationConfig:
    """The segmenter's limits (code points, steps); the cut rules (a)–(f) using them: docs/methods/rcta.md."""

    target_chars: int = TARGET_CHARS
    max_chars: int = MAX_CHARS
    max_steps: int = MAX_STEPS
    min_steps: int = MIN_STEPS
    min_chars: int = MIN_CHARS
    overlap_steps: int = OVERLAP_STEPS

    def __post_init__(self) -> None:
        for name in ("target_chars", "max_chars", "max_steps", "min_steps", "min_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.overlap_steps < 0:
            raise ValueError(f"overlap_steps must be at least 0, got {self.overlap_steps}")


DEFAULT_CONFIG = SegmentationConfig()


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive own steps with their original ids, plus read-only overlap context.

    Only the own steps (``step_ids``) may be cited and count toward ``char_count``; ``role_classes`` and
    ``agents`` are distinct, in order of first appearance; ``cut_reason`` is the rule that closed the segment.
    """

    segment_id: int
    step_ids: tuple[int, ...]
    overlap_ids: tuple[int, ...]
    char_count: int
    cut_reason: CutReason
    role_classes: tuple[RoleClass, ...]
    agents: tuple[str, ...]
    verifier_signals: tuple[VerifierSignal, ...]
    steps: tuple[EnrichedStep, ...] = field(repr=False)
    overlap_steps: tuple[EnrichedStep, ...] = field(repr=False)

    @classmethod
    def from_steps(
        cls,
        segment_id: int,
        steps: Sequence[EnrichedStep],
        overlap: Sequence[EnrichedStep],
        cut_reason: CutReason,
    ) -> Segment:
        """A segment with its derived fields computed from its own and overlap steps."""
        if not steps:
            raise ValueError("a segment needs at least one own step")
        return cls(
            segment_id=segment_id,
            step_ids=tuple(step.step_id for step in steps),
            overlap_ids=tuple(step.step_id for step in overlap),
            char_count=sum(step.content_len for step in steps),
            cut_reason=cut_reason,
            role_classes=tuple(dict.fromkeys(step.role_class for step in steps)),
            agents=tuple(dict.fromkeys(step.agent_raw for step in steps)),
            verifier_signals=tuple(s.verifier_signal for s in steps if s.verifier_signal is not None),
            steps=tuple(steps),
            overlap_steps=tuple(overlap),
        )

    @property
    def valid_ids(self) -> frozenset[int]:
        """The ids this segment's summary may name: its own steps, never its overlap."""
        return frozenset(self.step_ids)

    @property
    def n_steps(self) -> int:
        """The number of own steps."""
        return len(self.step_ids)


def _tail(steps: Sequence[EnrichedStep], count: int) -> tuple[EnrichedStep, ...]:
    # Not steps[-count:]: with count == 0 that slice would be the whole sequence.
    return tuple(steps[max(0, len(steps) - count) :])


def _last_signal(steps: Sequence[EnrichedStep]) -> VerifierSignal | None:
    for step in reversed(steps):
        if step.verifier_signal is not None:
            return step.verifier_signal
    return None


def _cut_reason(
    current: Sequence[EnrichedStep], chars: int, incoming: EnrichedStep, config: SegmentationConfig
) -> CutReason | None:
    """The first boundary rule (a)-(f) that holds before `incoming` is appended, or None."""
    last = current[-1]
    enough_steps = len(current) >= config.min_steps
    substantial = chars >= config.min_chars
    class_changed = incoming.role_class != last.role_class
    if last.action_type == "finish" and enough_steps and substantial:
        return "finish_signal"
    previous_signal = _last_signal(current)
    if (
        incoming.verifier_signal is not None
        and previous_signal is not None
        and incoming.verifier_signal != previous_signal
        and substantial
    ):
        return "verifier_signal_change"
    if class_changed and incoming.action_type in ("delegate", "finish") and enough_steps and substantial:
        return "agent_shift"
    if chars + incoming.content_len > config.max_chars:
        return "max_length"
    if len(current) >= config.max_steps:
        return "max_steps"
    if chars >= config.target_chars and class_changed:
        return "soft_agent_shift_at_target"
    return None


def split_oversized(
    segments: Sequence[Segment], *, config: SegmentationConfig = DEFAULT_CONFIG
) -> tuple[Segment, ...]:
    """The release's post-pass: halve each multi-step segment over the cap once, then renumber from 0."""
    result: list[Segment] = []
    for seg in segments:
        if seg.char_count > config.max_chars and seg.n_steps > 1:
            middle = seg.n_steps // 2
            left, right = seg.steps[:middle], seg.steps[middle:]
            result.append(Segment.from_steps(0, left, seg.overlap_steps, "split_in_half_left"))
            result.append(
                Segment.from_steps(0, right, _tail(left, config.overlap_steps), "split_in_half_right")
            )
        else:
            result.append(seg)
    return tuple(replace(seg, segment_id=position) for position, seg in enumerate(result))


def segment(
    enriched_steps: Sequence[EnrichedStep], *, config: SegmentationConfig = DEFAULT_CONFIG
) -> tuple[Segment, ...]:
    """Cut a trajectory into segments numbered from 0, every step the own step of one (docs/methods/rcta.md).

    Raises:
        ValueError: the step ids are not strictly increasing.
    """
    for before, after in pairwise(enriched_steps):
        if after.step_id <= before.step_id:
            raise ValueError(f"step ids must be strictly increasing: {before.step_id} then {after.step_id}")
    closed: list[Segment] = []
    current: list[EnrichedStep] = []
    overlap: tuple[EnrichedStep, ...] = ()
    chars = 0
    for step in enriched_steps:
        if current:
            reason = _cut_reason(current, chars, step, config)
            if reason is not None:
                closed.append(Segment.from_steps(len(closed), current, overlap, reason))
                overlap = _tail(current, config.overlap_steps)
                current, chars = [], 0
        current.append(step)
        chars += step.content_len
    if current:
        closed.append(Segment.from_steps(len(closed), current, overlap, "end_of_trace"))
    return split_oversized(closed, config=config)
