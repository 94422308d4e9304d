"""Handoff evidence retrieval (RCTA's A2): which logged instruction each candidate step is compared with.

A late, visible error often only carries out a flawed instruction given earlier, so every base candidate
gets the nearest earlier handoff that plausibly instructed it. Rules: ``docs/methods/rcta.md``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from rcarun.data import Trajectory

from .roles import role_class

__all__ = [
    "Augmentation",
    "HandoffLink",
    "HandoffRecord",
    "MatchRule",
    "augment_with_handoffs",
    "handoffs_of",
    "match_rule",
    "nearest_handoff_for",
]

MatchRule = Literal["recipient", "any"]
"""How a candidate looks for its handoff: ``"recipient"`` (executor/verifier) or ``"any"`` (other classes)."""


@dataclass(frozen=True, slots=True)
class HandoffRecord:
    """One logged handoff instruction: its step, parsed sender and recipient, raw ``Step.agent``, and text.

    ``text`` is the step's full content, the instruction a quote is grounded in.
    """

    step: int
    sender: str
    recipient: str
    agent: str
    text: str


@dataclass(frozen=True, slots=True)
class HandoffLink:
    """A candidate's step, the earlier handoff retrieved for it, and the `MatchRule` branch that found it."""

    candidate: int
    handoff: int
    rule: MatchRule


@dataclass(frozen=True, slots=True)
class Augmentation:
    """The base candidates with their handoff evidence added; every id tuple is deduplicated and ascending.

    ``ids`` is ``base`` plus every retrieved handoff, uncapped; ``added`` the handoffs not already in
    ``base``; ``links`` one per base candidate that got a handoff.
    """

    base: tuple[int, ...]
    ids: tuple[int, ...]
    links: tuple[HandoffLink, ...]
    added: tuple[int, ...]

    def handoff_of(self, candidate: int) -> int | None:
        """The handoff step retrieved for a base candidate, or None when it got none."""
        return next((link.handoff for link in self.links if link.candidate == candidate), None)


def handoffs_of(trajectory: Trajectory) -> tuple[HandoffRecord, ...]:
    """Every explicit handoff the log records, in step order."""
    return tuple(
        HandoffRecord(
            step=index,
            sender=handoff.sender,
            recipient=handoff.recipient,
            agent=trajectory.steps[index].agent,
            text=trajectory.steps[index].content,
        )
        for index, handoff in trajectory.handoffs
    )


def match_rule(agent: str) -> MatchRule:
    """The branch a candidate spoken by ``agent`` (a raw name) uses: by its role class."""
    return "recipient" if role_class(agent) in ("executor", "verifier") else "any"


class _HandoffIndex:
    """Handoffs sorted by step, overall and per exact recipient, for bisection."""

    def __init__(self, handoffs: Sequence[HandoffRecord]) -> None:
        self._all = sorted(handoffs, key=lambda record: record.step)
        self._all_steps = [record.step for record in self._all]
        self._by_recipient: dict[str, list[HandoffRecord]] = {}
        for record in self._all:
            self._by_recipient.setdefault(record.recipient, []).append(record)
        self._recipient_steps = {
            recipient: [record.step for record in records]
            for recipient, records in self._by_recipient.items()
        }

    def before(self, step: int, recipient: str | None) -> HandoffRecord | None:
        """The handoff at the largest step ``< step``, addressed to ``recipient`` unless that is None."""
        if recipient is None:
            records, steps = self._all, self._all_steps
        else:
            records = self._by_recipient.get(recipient, [])
            steps = self._recipient_steps.get(recipient, [])
        position = bisect.bisect_left(steps, step)  # first handoff at or after the step: excluded
        return records[position - 1] if position > 0 else None


def _nearest(
    step_id: int, trajectory: Trajectory, index: _HandoffIndex
) -> tuple[HandoffRecord, MatchRule] | None:
    if not 0 <= step_id < trajectory.n_steps:
        return None
    agent = trajectory.steps[step_id].agent
    rule = match_rule(agent)
    found = index.before(step_id, agent if rule == "recipient" else None)
    return None if found is None else (found, rule)


def nearest_handoff_for(
    candidate_step_id: int, trajectory: Trajectory, handoffs: Sequence[HandoffRecord] | None = None
) -> HandoffRecord | None:
    """The nearest strictly earlier matching handoff of a candidate step, or None (docs/methods/rcta.md).

    ``handoffs``: the trajectory's, when already computed (`handoffs_of`).
    """
    index = _HandoffIndex(handoffs_of(trajectory) if handoffs is None else handoffs)
    found = _nearest(candidate_step_id, trajectory, index)
    return None if found is None else found[0]


def augment_with_handoffs(
    candidate_ids: Iterable[int], trajectory: Trajectory, handoffs: Sequence[HandoffRecord] | None = None
) -> Augmentation:
    """Add to the base candidates (any order, duplicates allowed) the handoff each is compared with (A2).

    ``handoffs``: the trajectory's, when already computed (`handoffs_of`).
    """
    base = tuple(sorted(set(candidate_ids)))
    index = _HandoffIndex(handoffs_of(trajectory) if handoffs is None else handoffs)
    links: list[HandoffLink] = []
    for candidate in base:
        found = _nearest(candidate, trajectory, index)
        if found is not None:
            record, rule = found
            links.append(HandoffLink(candidate=candidate, handoff=record.step, rule=rule))
    base_set = set(base)
    added = tuple(sorted({link.handoff for link in links} - base_set))
    return Augmentation(base=base, ids=tuple(sorted(base_set.union(added))), links=tuple(links), added=added)
