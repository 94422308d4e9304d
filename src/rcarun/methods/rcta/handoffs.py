"""Handoff evidence retrieval (RCTA's A2): which logged instruction each candidate step is compared with.

Why: a late, visible error often only carries out a flawed instruction given earlier. RCTA therefore adds, for
every base candidate, the nearest earlier handoff that plausibly instructed it, so that the attribution call can
judge whether the decisive error was already in the instruction (LongRCA Sec. 4.2; App. H "Candidate ordering and
role matching"; release notes 3.7). This module is pure and deterministic; it never calls an LLM.

What a handoff is: a step that announces an explicit handoff, `rcarun.data.Step.handoff` — a trailing
``(-> X)`` / ``(→ X)`` in the step's agent name first (LongRCA, ``"DiagnostAgent (-> ActionAgent)"``), else in
its raw role (Who&When Magentic-One, ``"Orchestrator (-> WebSurfer)"``). `handoffs_of` lists them as
`HandoffRecord` values. Handoffs are only ever read from the log: nothing is synthesised, inferred from content
or guessed from a role class.

The rule for one candidate step ``c`` (`nearest_handoff_for`):

1. The candidate's raw agent name is ``Step.agent`` exactly as loaded (LongRCA: the recorded ``name``, possibly
   itself a handoff form; Who&When hand-crafted: the role without its suffix, e.g. ``"WebSurfer"``). Its class is
   `rcarun.methods.rcta.roles.role_class` of that name (a handoff form is classified by its sender).
2. Executor or verifier class: the nearest handoff at a step ``< c`` whose recipient equals the raw agent name,
   compared case-sensitively and without trimming or normalising either side beyond what the data layer already
   did (``"ActionAgent"`` never matches a handoff to ``"actionagent"``). When none exists the answer is None:
   there is NO fallback to a handoff addressed to someone else, even when one exists.
3. Any other class (planner, terminal, human, unknown): the nearest handoff at a step ``< c``, whoever the
   recipient is ("plan context").
4. A step id outside ``0 <= c < n_steps`` gets None.

Consequences worth knowing:

* "Nearest earlier" is STRICTLY earlier in both branches. The paper states "strictly earlier" only for the
  executor/verifier branch and says "nearest earlier" for the others; the release (3.7, and its
  ``_nearest_preceding_delegate``) uses the same strict comparison for both, which we follow where the paper is
  silent. A handoff step that is itself a candidate is therefore paired with the PREVIOUS handoff, not with
  itself, and a handoff after the candidate is never used.
* An executor or verifier candidate whose raw name is itself a handoff form (``"ActionAgent (-> JudgeAgent)"``)
  is matched against recipients with that full string, which no parsed recipient equals, so it gets None. Both
  sources compare against the candidate's recorded name; we do not strip the suffix.
* Who&When hand-crafted: the Orchestrator's step has agent ``"Orchestrator"`` and role ``"Orchestrator (->
  WebSurfer)"``; its recipient ``"WebSurfer"`` equals the WebSurfer step's agent, so the executor branch finds it.

Where paper and release differ, the paper is followed:

* Role classes: the paper's App. H lists (`role_class`: WebSurfer, FileSurfer, Assistant, Coder, the TravelPlanner
  agents, the ``*Expert`` rule, ...). The release's default profile knows only the OpenHands/Magentic names and
  its Who&When profile gives every raw name its own class, so there Who&When executors and TravelPlanner agents
  fall into the any-recipient branch; here they take the recipient-matching branch.
* Which steps are handoffs: every step that announces one (paper: "a logged message in which a sender instructs a
  recipient"). The release's enricher tests a ``user``-role human or terminal step for message/observation before
  it looks for a delegate target, so such a step would not count as a delegate there; no Who&When step is such a
  case (all of its handoffs are Orchestrator steps).

Augmentation (`augment_with_handoffs`): the base ids are deduplicated; each base id that is a step of the
trajectory gets at most one handoff by the rule above; the augmented set is the union, deduplicated and sorted
ascending (release 3.7) with NO second cap (paper App. H: "the expanded set is deduplicated without a second
80-step cap"). Added handoffs are not themselves augmented again; a candidate that is itself a handoff stays.
Base ids that are not steps of the trajectory pass through unchanged and get no handoff (the release keeps them
too; excerpts later contain only ids present in the trajectory, App. H).
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
    """One logged handoff instruction.

    Attributes:
        step: the step id (0-based index) of the instructing step.
        sender: the agent that hands off, as parsed (e.g. ``"DiagnostAgent"``, ``"Orchestrator"``).
        recipient: the agent handed to, as parsed (e.g. ``"ActionAgent"``, ``"WebSurfer"``).
        agent: the raw agent name of the step, ``Step.agent`` (LongRCA: the handoff form itself; Who&When:
            ``"Orchestrator"``).
        text: the full content of the step, the instruction text a quote is grounded in.
    """

    step: int
    sender: str
    recipient: str
    agent: str
    text: str


@dataclass(frozen=True, slots=True)
class HandoffLink:
    """A candidate and the handoff retrieved for it.

    Attributes:
        candidate: the candidate's step id.
        handoff: the retrieved handoff's step id (always ``< candidate``).
        rule: which branch found it (``"recipient"`` for executor/verifier candidates, else ``"any"``).
    """

    candidate: int
    handoff: int
    rule: MatchRule


@dataclass(frozen=True, slots=True)
class Augmentation:
    """The base candidates with their handoff evidence added.

    Attributes:
        base: the base candidate ids, deduplicated, ascending (ids outside the trajectory included).
        ids: the augmented set, ``base`` plus every retrieved handoff, deduplicated, ascending, uncapped.
        links: one link per base candidate that got a handoff, in ascending candidate order.
        added: the ids in `ids` that are not in `base` (handoffs that were not already candidates), ascending.
    """

    base: tuple[int, ...]
    ids: tuple[int, ...]
    links: tuple[HandoffLink, ...]
    added: tuple[int, ...]

    def handoff_of(self, candidate: int) -> int | None:
        """The handoff step retrieved for a base candidate, or None when it got none."""
        return next((link.handoff for link in self.links if link.candidate == candidate), None)


def handoffs_of(trajectory: Trajectory) -> tuple[HandoffRecord, ...]:
    """Every explicit handoff the log records, in step order (see the module docstring for what counts)."""
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
    """The branch a candidate spoken by ``agent`` (a raw name) uses: by its role class, see the module docstring."""
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
    candidate_step_id: int,
    trajectory: Trajectory,
    handoffs: Sequence[HandoffRecord] | None = None,
) -> HandoffRecord | None:
    """The handoff RCTA attaches to one candidate step (rule in the module docstring).

    Args:
        candidate_step_id: the candidate's step id.
        trajectory: the trajectory the candidate belongs to.
        handoffs: the trajectory's handoffs when already computed (`handoffs_of`); computed when None.

    Returns:
        The nearest strictly earlier matching handoff, or None when there is none or the id is not a step.
    """
    index = _HandoffIndex(handoffs_of(trajectory) if handoffs is None else handoffs)
    found = _nearest(candidate_step_id, trajectory, index)
    return None if found is None else found[0]


def augment_with_handoffs(
    candidate_ids: Iterable[int],
    trajectory: Trajectory,
    handoffs: Sequence[HandoffRecord] | None = None,
) -> Augmentation:
    """Add to the base candidates the handoff each of them is compared with (A2).

    Args:
        candidate_ids: the base candidate step ids (already prioritised and capped upstream), any order,
            duplicates allowed.
        trajectory: the trajectory they belong to.
        handoffs: the trajectory's handoffs when already computed (`handoffs_of`); computed when None.

    Returns:
        The deduplicated, uncapped, ascending augmented set with its links and added ids.
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
    return Augmentation(
        base=base,
        ids=tuple(sorted(base_set.union(added))),
        links=tuple(links),
        added=added,
    )
