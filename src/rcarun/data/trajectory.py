"""The values every attribution method and every analysis works on: a trajectory, its human label, the pair.

A method sees a `Trajectory` and nothing else; the `Reference` (the human label) travels beside it in a
`Record` so that the runner can score a prediction without ever handing the label to the method.

Agent of a step (one rule for every source, applied by `agent_of_step`):

1. If the step has a `name` that is non-empty after trimming whitespace, the agent is that trimmed name, kept
   as is. This covers Who&When algorithm_generated (AG2 group chats, where `role` is only user/assistant) and
   LongRCA, where a handoff form such as ``"DiagnostAgent (-> ActionAgent)"`` is itself a labellable agent and
   is therefore NOT split.
2. Otherwise the agent is the `role` with ONE trailing parenthetical suffix removed, e.g.
   ``"Orchestrator (thought)"``, ``"Orchestrator (-> WebSurfer)"`` and ``"Orchestrator (termination
   condition)"`` all become ``"Orchestrator"`` (Who&When hand_crafted Magentic-One logs, which carry no name).
3. A step whose agent comes out empty is unusable (the loaders raise `DataError`).

Labels are never repaired: a reference whose step is spoken by another agent is kept exactly as recorded.

Handoffs: `Step.handoff` is the explicit handoff the step announces (rules in `rcarun.data.roles`): the name's
``(-> X)`` suffix when the name carries one (LongRCA), else the role's (Who&When Magentic-One).
`Trajectory.handoffs` lists the steps that announce one.

Step numbers in labels and answers (`parse_step`: the loaders, every method and the scorer read them with it): a
JSON integer (never a boolean), or a string holding
an optionally signed decimal integer of ASCII digits, surrounding whitespace stripped (``"12"``, ``" 12 "``,
``"+3"``, ``"-1"``). Anything else (``3.0``, ``"3.5"``, ``"twelve"``, ``""``, ``None``, ``True``) holds no step.
Range is not part of the rule: ``"-1"`` reads as -1, which no trajectory contains.
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
    """The step number ``value`` holds, or None when it holds none (rule in the module docstring).

    Models asked for an integer sometimes answer ``"12"`` (JSON-mode providers among them); the scorer reads such
    a string as the step, so every method reads it the same way rather than discard it.
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
    """The agent behind a Magentic-One style role: the role without one trailing parenthetical suffix.

    Args:
        role: the raw role string, e.g. ``"Orchestrator (-> WebSurfer)"``.

    Returns:
        The trimmed agent name, e.g. ``"Orchestrator"``; empty if nothing is left.
    """
    return _TRAILING_PARENTHETICAL.sub("", role.strip(), count=1).strip()


def agent_of_step(name: str | None, role: str) -> str:
    """The agent of one history item: its non-empty `name` as is, else its role via `agent_from_role`."""
    if name is not None and name.strip():
        return name.strip()
    return agent_from_role(role)


@dataclass(frozen=True, slots=True)
class Step:
    """One message of a trajectory.

    Attributes:
        index: the 0-based position in the history; the step id methods predict and references name.
        agent: the agent that spoke, by the rule in this module's docstring.
        role: the raw role string as recorded (chat role, or Magentic-One role with its suffix).
        content: the message text, possibly empty.
    """

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

    Attributes:
        qid: the identifier, unique within a dataset and stable across loads (see `rcarun.data.loaders`).
        source: the sub-benchmark, e.g. ``"hand_crafted"`` or ``"vitabench"``.
        task: the task instruction: the record's ``question`` when it has a non-blank one, else the one its
            history states in its opening step(s) (`rcarun.data.task.derive_task`), else ``""``.
        steps: the history as recorded; ``steps[i].index == i``. A task derived from the history stays in it,
            as step 0, with its id.
        sha256: hex SHA-256 of the file's bytes (or of the JSONL line without its line terminator).
        ground_truth: the task's correct final answer when the record has one (Who&When ``ground_truth``),
            else ``""``. Not the attribution label: the Who&When baselines may show it to the model, which
            LongRCA's protocol does not do by default (each method's ``include_ground_truth`` option).
        task_source: the rule that gave ``task``: ``"question"``, ``"history[0]"``, ``"history[0..k]"`` (steps 0
            to k) or ``"none"`` (no task: methods show ``(not recorded)``). The loaders always set it; a
            trajectory built in memory without one gets ``"question"`` when it has a task, else ``"none"``.
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
    """The human label for a trajectory, kept apart from what methods see.

    Attributes:
        role: the labelled agent, raw as recorded (may be a handoff form; never repaired).
        step: the 0-based index of the decisive error, ``0 <= step < n_steps``.
        rationale: the annotator's explanation, ``""`` when absent.
    """

    role: str
    step: int
    rationale: str


@dataclass(frozen=True, slots=True)
class Record:
    """What the loaders yield: a trajectory, its label if the record carries one, and where it was read.

    Attributes:
        trajectory: what methods see.
        reference: the human label, or None for unlabelled data.
        origin: the file it came from, ``"<file>:<line>"`` for a JSONL line; ``""`` when built in memory.
        repaired_fields: the free-text fields whose unpaired UTF-16 surrogates the loader replaced by U+FFFD
            (``"history[2].content"``, ``"question"``, ...), in file order; empty when the text was loaded as
            recorded. The trajectory's ``sha256`` is still that of the original bytes.
    """

    trajectory: Trajectory
    reference: Reference | None
    origin: str = ""
    repaired_fields: tuple[str, ...] = ()
