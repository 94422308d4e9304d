"""Candidate pooling: which proposed steps become RCTA's base candidates, in which order (A1, LongRCA App. H).

The local summaries propose failure-relevant steps with tags. Before handoff augmentation (A2) RCTA pools these
proposals into at most 80 base candidates whose original text the attribution call will read. The order matters
only for which proposals survive the cap; it says nothing about the final root decision.

Rules (paper App. H "Candidate ordering and role matching"; the release pipeline has none of them — it takes the
sorted union of all proposed ids with no priority and no cap, release notes 3.6 / 3.13 item 1 — so the paper is
followed throughout):

1. Hints are deduplicated by integer step id. Merging keeps every distinct value of the hint fields the paper
   names, in order of first appearance over the summaries (segment order, then answer order): the *role* of a hint
   is its tag (the part it plays in the failure chain: manifestation, root, terminal context, other), its *source*
   is the proposing summary (``"local:<segment id>"``), its *note* the model's reason (empty notes dropped).
2. Base priority: possible_manifestation 0, possible_root 1, terminal_context 2, other 3. The tags are matched in
   exactly that order and the first one the merged hint carries sets the base priority (so it is the smallest
   number among its tags). A hint whose tags include none of the four (only ``recovered_noise``, or unknown tags
   the reader kept and flagged) counts as "other candidates": 3.
3. A hint tagged ``recovered_noise`` adds 3 — once, however many of the merged hints carry the tag.
4. Ties are broken by ascending step id.
5. The first ``cap`` (80) candidates are kept.
6. Only ids present in the trajectory become base candidates. The paper applies this when excerpts are built,
   after the cap ("the first 80 candidates are retained ... actual excerpts contain only IDs present in the
   trajectory"), and so do we: an id outside the trajectory can take a slot and is then dropped (recorded in
   ``dropped``). The local-summary schema restricts ids to the segment's own steps, so this happens only when a
   model ignores its schema.

Choices where the sources are silent: only the local summaries' ``proposed_steps`` are pooled (the paper says
summaries propose steps and the outline aggregates subgoals and conflicts; the release's extra pooling of the
outline's failure signals and first three supporting ids belongs to its unprioritised union and is not used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rcarun.data import Trajectory

from .schemas import LocalSummary

__all__ = [
    "BASE_PRIORITY",
    "DEFAULT_CAP",
    "RECOVERED_NOISE",
    "RECOVERED_NOISE_PENALTY",
    "Candidate",
    "CandidatePool",
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


@dataclass(frozen=True, slots=True)
class Candidate:
    """One pooled step with its merged hints.

    Attributes:
        step_id: the proposed step.
        tags: the distinct tags (the hints' roles) in order of first appearance.
        sources: the distinct proposing summaries, ``"local:<segment id>"``, in order of first appearance.
        notes: the distinct non-empty notes, in order of first appearance.
        base_priority: from the first matching tag (rule 2 of the module docstring).
        priority: ``base_priority`` plus 3 for recovered noise; lower is retrieved first.
    """

    step_id: int
    tags: tuple[str, ...]
    sources: tuple[str, ...]
    notes: tuple[str, ...]
    base_priority: int
    priority: int

    @property
    def recovered_noise(self) -> bool:
        return RECOVERED_NOISE in self.tags


@dataclass(frozen=True, slots=True)
class CandidatePool:
    """The base candidates and what was left out, for diagnostics (candidate retention, App. H).

    Attributes:
        candidates: the kept candidates in retrieval order (priority, then step id).
        overflow: candidates ranked beyond the cap, in retrieval order.
        dropped: ids within the cap that are not steps of the trajectory, in retrieval order.
        n_proposals: hints read from the summaries before deduplication.
    """

    candidates: tuple[Candidate, ...]
    overflow: tuple[Candidate, ...]
    dropped: tuple[int, ...]
    n_proposals: int

    @property
    def ids(self) -> tuple[int, ...]:
        """The kept ids in retrieval order."""
        return tuple(c.step_id for c in self.candidates)

    @property
    def base_ids(self) -> tuple[int, ...]:
        """The base-candidate set (before handoff augmentation), ascending."""
        return tuple(sorted(self.ids))


def base_priority(tags: Sequence[str]) -> int:
    """The base priority of a hint's tags: the first category of `BASE_PRIORITY` it carries, else 3."""
    for tag, priority in BASE_PRIORITY:
        if tag in tags:
            return priority
    return _OTHER_PRIORITY


class _Merged:
    __slots__ = ("notes", "sources", "tags")

    def __init__(self) -> None:
        self.tags: dict[str, None] = {}
        self.sources: dict[str, None] = {}
        self.notes: dict[str, None] = {}


def pool_candidates(
    local_summaries: Sequence[LocalSummary], trajectory: Trajectory, *, cap: int = DEFAULT_CAP
) -> CandidatePool:
    """Pool, prioritise and cap the steps the local summaries propose (rules in the module docstring).

    Args:
        local_summaries: the read summaries, in segment order.
        trajectory: decides which ids exist.
        cap: how many candidates are kept (80 in the paper).
    """
    if cap < 0:
        raise ValueError("cap must not be negative")
    merged: dict[int, _Merged] = {}
    n_proposals = 0
    for summary in local_summaries:
        source = f"local:{summary.segment_id}"
        for proposal in summary.proposals:
            n_proposals += 1
            entry = merged.setdefault(proposal.step_id, _Merged())
            entry.tags.update(dict.fromkeys(proposal.tags))
            entry.sources[source] = None
            if proposal.note.strip():
                entry.notes[proposal.note] = None
    ranked: list[Candidate] = []
    for step_id, entry in merged.items():
        tags = tuple(entry.tags)
        base = base_priority(tags)
        penalty = RECOVERED_NOISE_PENALTY if RECOVERED_NOISE in tags else 0
        ranked.append(
            Candidate(step_id, tags, tuple(entry.sources), tuple(entry.notes), base, base + penalty)
        )
    ranked.sort(key=lambda c: (c.priority, c.step_id))
    within, overflow = ranked[:cap], ranked[cap:]
    steps = range(trajectory.n_steps)
    return CandidatePool(
        candidates=tuple(c for c in within if c.step_id in steps),
        overflow=tuple(overflow),
        dropped=tuple(c.step_id for c in within if c.step_id not in steps),
        n_proposals=n_proposals,
    )
