"""The task instruction of a record: its ``question`` when it has one, else the opening step(s) of its history.

LongRCA records have no ``question`` field (release notes, "Top-level fields"): "Methods receive only question_ID
and history, including the task instruction" (000 Sec. 3.2). A method that shows one segment of a 300-step log
(a binary-search half, an RCTA summary segment, a FALAT verification) would then never see the task, and one that
reduces distant steps (ECHO) would see it as a 15-word milestone. So the loader derives the task once, by the rule
below, stores it as `Trajectory.task` with the rule that produced it as `Trajectory.task_source`, and every method
shows it whole in every call (`rcarun.methods.context.task_text`, cut in the middle only beyond its stated cap).
The history is never changed: the task step stays step 0 of the log, with its id, and is still a step methods
may read and name.

Rule (`derive_task`), for a record without a non-blank ``question``:

1. The task starts at step 0. Every known shape puts it there (profiles below), and 000 Sec. 3.2 says the history
   includes it.
2. It extends over the steps right after step 0 that are spoken by the same agent, while that agent is one of the
   source profile's *task givers* — the voices that only feed input to the workflow (the human, the user, the
   environment) — up to `MAX_TASK_STEPS` steps in all. Before any workflow agent has acted such a step can only be
   more of the input (instructions sent as two messages), never the answer to a call. An opening agent that is not
   a task giver (a Who&When CaptainAgent expert quoting its "# General Task" and then working on it) gives step 0
   alone. Agents are compared the way the scorer compares roles (`rcarun.data.roles.normalize_role`).
3. The contents are joined with one blank line and trimmed at both ends. The rule is ``"history[0]"`` for one step
   and ``"history[0..k]"`` for steps 0 to k. Nothing left (step 0 empty or blank) gives ``""`` with the rule
   ``"none"``, which ``rcarun data check`` reports as a warning.

Source profiles (the step-0 shapes we know; the released LongRCA trajectories are not in this repository):

- ``swe_bench_pro``, ``terminal_bench_2`` (OpenHands workflows: DiagnostAgent, ActionAgent, JudgeAgent,
  Computer_terminal, human): the ``human`` step states the task (release notes, "Handoff naming": "human
  (task)"). Task givers: ``human``.
- ``travelplanner``, ``vitabench``, ``webarena_verified`` (Magentic-style workflows: Task_Planner, Action_Expert,
  Verification_Expert, Computer_terminal; TravelPlanner adds its domain agents): the task is given at step 0 by
  whoever opens the log (role table of the README of the authors' pipeline, F-WORKS-FBY/agent-error-trajectory-
  analysis). The project page's example TravelPlanner trajectory (longrca-bench.github.io) opens with the
  system/terminal record that loads the query, dates, budget, traveller count and workflow rules; VitaBench logs
  hold only Action_Expert and Computer_terminal (000 Table 24), so the user's request arrives as a
  Computer_terminal step. Task givers: ``human``, ``user``, ``system``, ``Computer_terminal``,
  ``ComputerTerminal``.
- ``hand_crafted`` (Who&When, Magentic-One): step 0 is ``human`` with the question (all 20 records). Task
  givers: ``human``.
- ``algorithm_generated`` (Who&When, CaptainAgent): step 0 is an expert quoting "# General Task" with the
  manager's plan (the question is inside it in 116 of 126 records), followed by the same expert at work (opening
  runs of up to 10 of its steps), which is why experts are not task givers. Task givers: ``human``, ``user``,
  ``system``.
- any other source: step 0; task givers ``human``, ``user``, ``system``.

Who&When records carry ``question``, so the rule only applies to them when a copy drops it.

`task_key` names the task for grouping: repeated attempts at one task (the paper's "task groups", 000 App. B)
share the hash of its text, with runs of whitespace read as one space so that reformatting does not split a
group; any other difference (a path, a date in the instruction) makes another task.
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
    """Where one kind of source states its task.

    Attributes:
        name: a short name for messages and tests (``"openhands"``, ``"magentic"``, ...).
        givers: normalised agent names (`normalize_role`) whose opening run of steps is the task.
    """

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
    """The task a history states and where it was found.

    Attributes:
        text: the task instruction, ``""`` when the history states none.
        source: the rule that produced it: ``"history[0]"``, ``"history[0..k]"`` or ``"none"``.
        steps: the step ids the text was taken from (empty for ``"none"``).
    """

    text: str
    source: str
    steps: tuple[int, ...]


def derive_task(steps: Sequence[Step], source: str) -> TaskDerivation:
    """The task instruction stated by the opening step(s) of a history, by the rule in the module docstring.

    Args:
        steps: the history, in order (``steps[0]`` is step 0).
        source: the record's source, which selects the profile (`task_profile`).

    Returns:
        The text, the rule that produced it and the steps it came from; ``("", "none", ())`` when step 0 holds
        nothing (or there are no steps).
    """
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
    """Hex SHA-256 of the task text with whitespace runs as one space (module docstring); None for no task."""
    text = re.sub(r"\s+", " ", task).strip()
    return hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None
