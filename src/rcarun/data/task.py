"""The task instruction of a record: its ``question`` when it has one, else the opening step(s) of its history.

LongRCA records have no ``question``; a method showing one segment of a long log would never see the task, so
the loader derives it once (`derive_task`) and every method shows it whole. The history is never changed. Rule
and per-source profiles: docs/reliability.md ("The task of a record").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .roles import normalize_role
from .trajectory import Step

__all__ = [
    "MAX_TASK_STEPS",
    "TASK_PROFILES",
    "TaskDerivation",
    "TaskProfile",
    "derive_task",
    "task_key",
    "task_profile",
]

MAX_TASK_STEPS = 3
"""The most opening steps the task is taken from; a bound for a log whose environment speaks many times first."""

_JOIN = "\n\n"


@dataclass(frozen=True, slots=True)
class TaskProfile:
    """Where one kind of source states its task: the normalised agents whose opening run of steps is the task."""

    name: str
    givers: frozenset[str]

    def is_giver(self, agent: str) -> bool:
        return normalize_role(agent) in self.givers


def _profile(name: str, *givers: str) -> TaskProfile:
    return TaskProfile(name, frozenset(normalize_role(giver) for giver in givers))


_OPENHANDS = _profile("openhands", "human")
_MAGENTIC = _profile("magentic", "human", "user", "system", "Computer_terminal", "ComputerTerminal")
_WHO_AND_WHEN_HAND_CRAFTED = _profile("who-and-when-hand-crafted", "human")
_DEFAULT = _profile("default", "human", "user", "system")

TASK_PROFILES: Mapping[str, TaskProfile] = {
    "swe_bench_pro": _OPENHANDS,
    "terminal_bench_2": _OPENHANDS,
    "travelplanner": _MAGENTIC,
    "vitabench": _MAGENTIC,
    "webarena_verified": _MAGENTIC,
    "hand_crafted": _WHO_AND_WHEN_HAND_CRAFTED,
    "algorithm_generated": _DEFAULT,
}
"""The profile of each known source, by its name as the loaders give it (the dataset directory's name)."""


def task_profile(source: str) -> TaskProfile:
    """The profile of ``source`` (trimmed and casefolded), the default profile for a source not listed."""
    return TASK_PROFILES.get(source.strip().casefold(), _DEFAULT)


@dataclass(frozen=True, slots=True)
class TaskDerivation:
    """The task a history states (``""``: none), the rule (``"history[0..k]"``, ``"none"``) and its steps."""

    text: str
    source: str
    steps: tuple[int, ...]


def derive_task(steps: Sequence[Step], source: str) -> TaskDerivation:
    """The task stated by the opening step(s) of a history, by ``source``'s profile (docs/reliability.md)."""
    if not steps:
        return TaskDerivation("", "none", ())
    profile = task_profile(source)
    opening = [steps[0]]
    if profile.is_giver(steps[0].agent):
        first = normalize_role(steps[0].agent)
        for step in steps[1:MAX_TASK_STEPS]:
            if normalize_role(step.agent) != first:
                break
            opening.append(step)
    text = _JOIN.join(step.content.strip() for step in opening if step.content.strip())
    if not text:
        return TaskDerivation("", "none", ())
    # Trailing empty steps of the run add nothing, so they are not named as where the task came from.
    while not opening[-1].content.strip():
        opening.pop()
    last = opening[-1].index
    rule = "history[0]" if last == 0 else f"history[0..{last}]"
    return TaskDerivation(text, rule, tuple(step.index for step in opening))


def task_key(task: str) -> str | None:
    """Hex SHA-256 of the task text with whitespace runs as one space; None for no task."""
    text = re.sub(r"\s+", " ", task).strip()
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None
