"""The values every attribution method and every analysis works on: a trajectory, its human label, the pair.

A method sees a `Trajectory` only; the `Reference` travels beside it in a `Record`, so the runner scores without
handing the label to the method. The agent rule, handoffs and step numbers: docs/reliability.md ("Trajectories,
agents and step numbers").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .roles import Handoff, parse_handoff

__all__ = ["Record", "Reference", "Step", "Trajectory", "agent_from_role", "agent_of_step", "parse_step"]

# One trailing "(...)" group without nested parentheses, with the whitespace before it.
_TRAILING_PARENTHETICAL = re.compile(r"\s*\([^()]*\)\s*$")
# ASCII digits only, as the scorer: full-width "１２" or Arabic-Indic "٣" are not step numbers.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


def parse_step(value: object) -> int | None:
    """The step number ``value`` holds: a JSON integer (not a bool) or a string of one (``" +3 "``), else None.

    Models asked for an integer sometimes answer ``"12"``; the scorer reads it as the step, so every method does.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if _INTEGER_TEXT.fullmatch(text):
            return int(text)
    return None


def agent_from_role(role: str) -> str:
    """The agent behind a Magentic-One style role, trimmed: ``"Orchestrator (-> WebSurfer)"`` is ``"Orchestrator"``."""
    return _TRAILING_PARENTHETICAL.sub("", role.strip(), count=1).strip()


def agent_of_step(name: str | None, role: str) -> str:
    """The agent of one history item: its non-empty `name` as is, else its role via `agent_from_role`."""
    if name is not None and name.strip():
        return name.strip()
    return agent_from_role(role)


@dataclass(frozen=True, slots=True)
class Step:
    """One message: its 0-based ``index`` (the step id), the ``agent`` that spoke (`agent_of_step`), the raw
    ``role`` as recorded and the ``content``, possibly empty."""

    index: int
    agent: str
    role: str
    content: str

    @property
    def handoff(self) -> Handoff | None:
        """The explicit handoff this step announces: in its agent name first, else in its raw role."""
        return parse_handoff(self.agent) or parse_handoff(self.role)


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A failed run as a method sees it: no labels.

    ``task`` is the ``question``, else what the history's opening states (``task_source`` names the rule; built in
    memory without one: ``"question"`` or ``"none"``); ``steps[i].index == i``; ``sha256`` of the file or JSONL
    line; ``ground_truth`` is the task's final answer (not the attribution label), ``""`` when absent.
    """

    qid: str
    source: str
    task: str
    steps: tuple[Step, ...]
    sha256: str
    ground_truth: str = ""
    task_source: str = ""
    # `agents`, computed once: a sweep asks for it several times a call (prompt, schema, reference, row).
    _agents: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.task_source:
            object.__setattr__(self, "task_source", "question" if self.task else "none")
        object.__setattr__(self, "_agents", tuple(dict.fromkeys(step.agent for step in self.steps)))
        for position, step in enumerate(self.steps):
            if step.index != position:
                raise ValueError(f"{self.qid}: step at position {position} has index {step.index}")

    @property
    def n_steps(self) -> int:
        """The number of steps in the history."""
        return len(self.steps)

    @property
    def agents(self) -> tuple[str, ...]:
        """Distinct agents in order of first appearance: the recorded role set methods choose from."""
        return self._agents

    @property
    def handoffs(self) -> tuple[tuple[int, Handoff], ...]:
        """``(step index, handoff)`` for every step that announces an explicit handoff, in order."""
        found = ((step.index, step.handoff) for step in self.steps)
        return tuple((index, handoff) for index, handoff in found if handoff is not None)


@dataclass(frozen=True, slots=True)
class Reference:
    """The human label, kept apart from what methods see: the agent as recorded (never repaired), the 0-based
    step of the decisive error and the annotator's rationale (``""`` when absent)."""

    role: str
    step: int
    rationale: str


@dataclass(frozen=True, slots=True)
class Record:
    """What the loaders yield: a trajectory, its label (None: unlabelled), where it was read (``"<file>:<line>"``
    for JSONL, ``""`` in memory) and the free-text fields whose lone surrogates became U+FFFD."""

    trajectory: Trajectory
    reference: Reference | None
    origin: str = ""
    repaired_fields: tuple[str, ...] = ()
