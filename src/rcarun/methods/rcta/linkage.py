"""Rule-based "faithful implementation" hints: executor steps that look like they carry out a handoff.

The release's hints (notes 3.8) direct the attribution call's attention from an executor candidate to the
handoff addressed to it; the A3 control sends none. Rules: ``docs/methods/rcta.md`` ("Linkage hints").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from rcarun.data import Trajectory

from .handoffs import HandoffRecord, handoffs_of, nearest_handoff_for
from .roles import role_class

__all__ = [
    "MAX_SHARED_LISTED",
    "MIN_EXECUTOR_IDENTIFIERS",
    "MIN_IDENTIFIER_CHARS",
    "MIN_SHARED_IDENTIFIERS",
    "OVERLAP_THRESHOLD_PERCENT",
    "LinkageHint",
    "LinkageKind",
    "code_identifiers",
    "linkage_hints",
    "plan_citation",
]

LinkageKind = Literal["cites_plan", "identifier_overlap"]

MIN_IDENTIFIER_CHARS = 6
MIN_EXECUTOR_IDENTIFIERS = 5
MIN_SHARED_IDENTIFIERS = 3
OVERLAP_THRESHOLD_PERCENT = 34  # overlap >= 0.34
MAX_SHARED_LISTED = 10

_PLAN_CITATION = re.compile(
    r"per the plan|as delegated|as instructed|as planned|as specified"
    r"|as (?:the )?plan (?:says|states|requires|specifies|dictates)"
    r"|following the (?:plan|delegation|instructions?|spec)"
    r"|according to the plan"
    r"|按照?计划|照计划|按委派|遵循计划|依照计划",
    re.IGNORECASE,
)
_IDENTIFIER_RUN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class LinkageHint:
    """A rule-based sign that an executor step carries out the handoff addressed to it (docs/methods/rcta.md).

    ``overlap`` is shared / executor identifiers, rounded to 2 decimals (0.0 with none);
    ``shared_identifiers`` the first `MAX_SHARED_LISTED` shared ones, sorted; ``cites_plan`` the phrase found.
    """

    executor_step: int
    executor_agent: str
    handoff_step: int
    handoff_agent: str
    handoff_recipient: str
    kind: LinkageKind
    cites_plan: str | None
    overlap: float
    shared_count: int
    shared_identifiers: tuple[str, ...]

    @property
    def strength(self) -> Literal["strong", "weak"]:
        """The release's word for the kind: ``"strong"`` for a plan citation, ``"weak"`` for overlap only."""
        return "strong" if self.kind == "cites_plan" else "weak"


def plan_citation(text: str) -> str | None:
    """The first plan-citation phrase in ``text`` as written, or None (phrases in docs/methods/rcta.md)."""
    match = _PLAN_CITATION.search(text)
    return None if match is None else match.group(0)


def code_identifiers(text: str) -> frozenset[str]:
    """The distinct code-identifier tokens of ``text`` (rule 5 in docs/methods/rcta.md), case preserved."""
    return frozenset(
        token
        for token in _IDENTIFIER_RUN.findall(text)
        if len(token) >= MIN_IDENTIFIER_CHARS
        and ("_" in token or any(c.isupper() for c in token[1:]) or any(c.isdigit() for c in token))
    )


def _overlap_fires(executor: int, shared: int) -> bool:
    return (
        executor >= MIN_EXECUTOR_IDENTIFIERS
        and shared >= MIN_SHARED_IDENTIFIERS
        and 100 * shared >= OVERLAP_THRESHOLD_PERCENT * executor
    )


def linkage_hints(
    candidate_ids: Iterable[int], trajectory: Trajectory, handoffs: Sequence[HandoffRecord] | None = None
) -> tuple[LinkageHint, ...]:
    """At most one hint per executor among the handoff-augmented ``candidate_ids``, in ascending step order.

    ``handoffs``: the trajectory's, when already computed (`handoffs_of`).
    """
    records = handoffs_of(trajectory) if handoffs is None else tuple(handoffs)
    hints: list[LinkageHint] = []
    for step_id in sorted(set(candidate_ids)):
        if not 0 <= step_id < trajectory.n_steps:
            continue
        step = trajectory.steps[step_id]
        if role_class(step.agent) != "executor":
            continue
        handoff = nearest_handoff_for(step_id, trajectory, records)
        if handoff is None:  # the executor branch: only a handoff addressed to this exact name
            continue
        cited = plan_citation(step.content)
        executor_identifiers = code_identifiers(step.content)
        shared = executor_identifiers & code_identifiers(handoff.text)
        if cited is None and not _overlap_fires(len(executor_identifiers), len(shared)):
            continue
        overlap = len(shared) / len(executor_identifiers) if executor_identifiers else 0.0
        hints.append(
            LinkageHint(
                executor_step=step_id,
                executor_agent=step.agent,
                handoff_step=handoff.step,
                handoff_agent=handoff.agent,
                handoff_recipient=handoff.recipient,
                kind="cites_plan" if cited is not None else "identifier_overlap",
                cites_plan=cited,
                overlap=round(overlap, 2),
                shared_count=len(shared),
                shared_identifiers=tuple(sorted(shared)[:MAX_SHARED_LISTED]),
            )
        )
    return tuple(hints)
