"""Candidate pooling: which proposed steps become RCTA's base candidates, in which order (A1, LongRCA App. H).

The summaries' and the outline's step hints are merged, prioritised by tag and capped (80) before handoff
augmentation. Sources and rules: ``docs/methods/rcta.md`` ("Candidate pooling").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rcarun.data import Trajectory

from .schemas import LocalSummary, Outline

__all__ = [
    "BASE_PRIORITY",
    "DEFAULT_CAP",
    "OUTLINE_SUPPORTING_IDS",
    "RECOVERED_NOISE",
    "RECOVERED_NOISE_PENALTY",
    "Candidate",
    "CandidatePool",
    "HintSource",
    "base_priority",
    "pool_candidates",
]

# Matched in this order; the first tag a hint carries sets its base priority.
BASE_PRIORITY: tuple[tuple[str, int], ...] = (
    ("possible_manifestation", 0),
    ("possible_root", 1),
    ("terminal_context", 2),
    ("other", 3),
)
_OTHER_PRIORITY = 3
RECOVERED_NOISE = "recovered_noise"
RECOVERED_NOISE_PENALTY = 3
DEFAULT_CAP = 80
OUTLINE_SUPPORTING_IDS = 3  # the release pools the first 3 supporting ids of each phase (release notes 3.6)
_SUMMARY_PREFIX = "local:"
_OUTLINE_PREFIX = "outline:"

HintSource = Literal["summary", "outline", "both"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One pooled step with its merged hints, each kind distinct in order of first appearance.

    ``proposed_by`` names ``"local:<segment id>"`` or ``"outline:<phase id>"``; ``priority`` is
    ``base_priority`` (docs/methods/rcta.md, rule 2) plus 3 for recovered noise, lower retrieved first.
    """

    step_id: int
    tags: tuple[str, ...]
    proposed_by: tuple[str, ...]
    notes: tuple[str, ...]
    base_priority: int
    priority: int

    @property
    def recovered_noise(self) -> bool:
        return RECOVERED_NOISE in self.tags

    @property
    def source(self) -> HintSource:
        """Where the merged hints came from: the local summaries, the outline, or both."""
        summary = any(p.startswith(_SUMMARY_PREFIX) for p in self.proposed_by)
        outline = any(p.startswith(_OUTLINE_PREFIX) for p in self.proposed_by)
        if summary and outline:
            return "both"
        return "outline" if outline else "summary"


@dataclass(frozen=True, slots=True)
class CandidatePool:
    """The base candidates in retrieval order and what was left out, for diagnostics (App. H).

    ``overflow``: ranked beyond the cap; ``dropped``: ids within the cap that are no step of the trajectory;
    the counts are hints before deduplication.
    """

    candidates: tuple[Candidate, ...]
    overflow: tuple[Candidate, ...]
    dropped: tuple[int, ...]
    n_proposals: int
    n_outline_hints: int = 0

    @property
    def ids(self) -> tuple[int, ...]:
        """The kept ids in retrieval order."""
        return tuple(c.step_id for c in self.candidates)

    @property
    def base_ids(self) -> tuple[int, ...]:
        """The base-candidate set (before handoff augmentation), ascending."""
        return tuple(sorted(self.ids))

    def base_ids_from(self, source: Literal["summary", "outline"]) -> tuple[int, ...]:
        """The base candidates with at least one hint from ``source`` (a ``"both"`` id is in each), ascending."""
        return tuple(sorted(c.step_id for c in self.candidates if c.source in (source, "both")))


def base_priority(tags: Sequence[str]) -> int:
    """The base priority of a hint's tags: the first category of `BASE_PRIORITY` it carries, else 3."""
    for tag, priority in BASE_PRIORITY:
        if tag in tags:
            return priority
    return _OTHER_PRIORITY


class _Merged:
    __slots__ = ("notes", "proposed_by", "tags")

    def __init__(self) -> None:
        self.tags: dict[str, None] = {}
        self.proposed_by: dict[str, None] = {}
        self.notes: dict[str, None] = {}

    def add(self, tags: Sequence[str], proposer: str, note: str) -> None:
        self.tags.update(dict.fromkeys(tags))
        self.proposed_by[proposer] = None
        if note.strip():
            self.notes[note] = None


def pool_candidates(
    local_summaries: Sequence[LocalSummary],
    trajectory: Trajectory,
    *,
    outline: Outline | None = None,
    cap: int = DEFAULT_CAP,
) -> CandidatePool:
    """Pool, prioritise and cap (80 in the paper) the steps the summaries and the outline hint at."""
    if cap < 0:
        raise ValueError("cap must not be negative")
    merged: dict[int, _Merged] = {}
    n_proposals = n_outline_hints = 0
    for summary in local_summaries:
        proposer = f"{_SUMMARY_PREFIX}{summary.segment_id}"
        for proposal in summary.proposals:
            n_proposals += 1
            merged.setdefault(proposal.step_id, _Merged()).add(proposal.tags, proposer, proposal.note)
    for step_id, proposer, note in _outline_hints(outline):
        n_outline_hints += 1
        merged.setdefault(step_id, _Merged()).add((), proposer, note)
    ranked: list[Candidate] = []
    for step_id, entry in merged.items():
        tags = tuple(entry.tags)
        base = base_priority(tags)
        penalty = RECOVERED_NOISE_PENALTY if RECOVERED_NOISE in tags else 0
        ranked.append(
            Candidate(step_id, tags, tuple(entry.proposed_by), tuple(entry.notes), base, base + penalty)
        )
    ranked.sort(key=lambda c: (c.priority, c.step_id))
    within, overflow = ranked[:cap], ranked[cap:]
    steps = range(trajectory.n_steps)
    return CandidatePool(
        candidates=tuple(c for c in within if c.step_id in steps),
        overflow=tuple(overflow),
        dropped=tuple(c.step_id for c in within if c.step_id not in steps),
        n_proposals=n_proposals,
        n_outline_hints=n_outline_hints,
    )


def _outline_hints(outline: Outline | None) -> list[tuple[int, str, str]]:
    """The outline's step hints as ``(step id, proposer, note)``, phase by phase."""
    if outline is None:
        return []
    hints: list[tuple[int, str, str]] = []
    for position, phase in enumerate(outline.phases, start=1):
        phase_id = phase.phase_id if phase.phase_id is not None else position
        proposer = f"{_OUTLINE_PREFIX}{phase_id}"
        for signal in phase.failure_signals:
            severity = f" ({signal.severity})" if signal.severity else ""
            note = _note(f"outline phase {phase_id} failure signal{severity}", signal.description)
            hints += [(step_id, proposer, note) for step_id in signal.step_ids]
        goal = _note(f"supports outline phase {phase_id}", phase.phase_goal)
        hints += [(step_id, proposer, goal) for step_id in phase.supporting_step_ids[:OUTLINE_SUPPORTING_IDS]]
    return hints


def _note(label: str, text: str) -> str:
    return f"{label}: {text.strip()}" if text.strip() else label
