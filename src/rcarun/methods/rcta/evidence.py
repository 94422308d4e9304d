"""What the attribution call reads: base candidates, their excerpts and handoffs, and linkage hints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rcarun.data import Trajectory

from .candidates import CandidatePool, pool_candidates
from .handoffs import HandoffLink, HandoffRecord, augment_with_handoffs
from .linkage import LinkageHint, linkage_hints
from .options import Ablation
from .schemas import LocalSummary, Outline

__all__ = ["Evidence", "StageOne", "gather_evidence", "uniform_ids"]


@dataclass(frozen=True, slots=True)
class StageOne:
    """Stage I's summaries and outline, with what each call recorded."""

    summaries: tuple[LocalSummary, ...]
    summary_records: tuple[dict[str, Any], ...]
    outline: Outline
    outline_record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Evidence:
    """The candidate pool, the base candidates the condition uses, the excerpts, handoff links and hints."""

    pool: CandidatePool
    base_ids: tuple[int, ...]
    excerpt_ids: tuple[int, ...]
    links: tuple[HandoffLink, ...]
    hints: tuple[LinkageHint, ...]


def uniform_ids(n_steps: int, count: int) -> tuple[int, ...]:
    """``count`` step ids spread over ``0..n_steps-1``: the centre of each of ``count`` equal bins."""
    count = min(count, n_steps)
    return tuple(((2 * i + 1) * n_steps) // (2 * count) for i in range(count))


def gather_evidence(
    trajectory: Trajectory,
    stage_one: StageOne,
    handoffs: Sequence[HandoffRecord],
    *,
    flags: Ablation,
    cap: int,
) -> Evidence:
    """Pool Stage I's proposals (A1), add each base candidate's handoff (A2) and the linkage hints."""
    pool = pool_candidates(stage_one.summaries, trajectory, outline=stage_one.outline, cap=cap)
    base_ids = tuple(pool.base_ids)
    if not flags.pooled_candidates:
        base_ids = uniform_ids(trajectory.n_steps, len(pool.base_ids))
    links: tuple[HandoffLink, ...] = ()
    if flags.handoff_evidence:
        augmentation = augment_with_handoffs(base_ids, trajectory, handoffs)
        links = augmentation.links
        excerpt_ids = tuple(i for i in augmentation.ids if 0 <= i < trajectory.n_steps)
    else:
        excerpt_ids = base_ids
    hints: tuple[LinkageHint, ...] = ()
    if flags.linkage_hints:
        hints = linkage_hints(excerpt_ids, trajectory, handoffs)
    return Evidence(pool, base_ids, excerpt_ids, links, hints)
