"""FALAT stage 2, linking: the typed dependency graph of one trajectory (no LLM).

The walk and the pruning both read it: which earlier step each step answers, follows or takes data from, and
the salient tokens that show reuse. The rules: ``docs/methods/falat.md``, stage 2.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rcarun.data import Trajectory, role_matches
from rcarun.methods.falat.step_types import TypedStep

__all__ = [
    "EDGE_KINDS",
    "SHOWN_TOKENS",
    "DependencyGraph",
    "Edge",
    "EdgeKind",
    "ancestors",
    "ancestors_in",
    "link_steps",
    "parent_map",
    "salient_tokens",
]

EdgeKind = Literal["tool_result", "instruction", "reply", "reference"]
EDGE_KINDS: tuple[EdgeKind, ...] = ("tool_result", "instruction", "reply", "reference")
SHOWN_TOKENS = 5  # shared tokens named per link in prompts and output

_JSON_KEY = re.compile(r'"[^"\n]{1,80}"\s*:')
_URL = re.compile(r"https?://[^\s<>()\[\]{}'\"`]+")
_QUOTED = re.compile(r"(?<!\w)(?:'([^'\n]{3,80})'|\"([^\"\n]{3,80})\"|`([^`\n]{3,80})`)(?!\w)")
_FILE_NAME = re.compile(r"(?<![\w.])[\w-]{2,}(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,5}(?![\w])")
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?!\w)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CAMEL = re.compile(r"[a-z][A-Z]")
_BOILERPLATE_MIN_STEPS = 3


@dataclass(frozen=True, slots=True)
class Edge:
    """``step`` depends on the earlier step ``depends_on``.

    Attributes:
        step: the dependent (later) step.
        depends_on: the step whose output or instruction it uses; always ``< step``.
        kinds: every kind of link between the two, in `EDGE_KINDS` order.
        shared: the salient tokens credited to ``depends_on`` by a ``reference`` link, sorted.
    """

    step: int
    depends_on: int
    kinds: tuple[EdgeKind, ...]
    shared: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DependencyGraph:
    """Typed dependencies among the steps of one trajectory.

    Attributes:
        n_steps: the number of steps (nodes ``0 .. n_steps-1``).
        edges: every edge, sorted by ``(step, depends_on)``; edges only point backward.
        tokens: each step's salient tokens after the task/agent/boilerplate exclusions (empty when not
            computed); pruning reads content reuse from them.
    """

    n_steps: int
    edges: tuple[Edge, ...]
    tokens: tuple[frozenset[str], ...] = ()

    def __post_init__(self) -> None:
        for edge in self.edges:
            if not 0 <= edge.depends_on < edge.step < self.n_steps:
                raise ValueError(
                    f"edge {edge.step} -> {edge.depends_on} does not point backward inside the graph"
                )
        if self.tokens and len(self.tokens) != self.n_steps:
            raise ValueError(f"tokens has {len(self.tokens)} entries for {self.n_steps} steps")

    def parents(self, step: int) -> tuple[Edge, ...]:
        """The edges out of ``step`` (what it depends on), nearest first."""
        found = [edge for edge in self.edges if edge.step == step]
        return tuple(sorted(found, key=lambda edge: -edge.depends_on))

    def edge(self, step: int, depends_on: int) -> Edge | None:
        return next((e for e in self.edges if e.step == step and e.depends_on == depends_on), None)

    def tokens_of(self, step: int) -> frozenset[str]:
        return self.tokens[step] if self.tokens else frozenset()

    def kind_counts(self) -> dict[str, int]:
        """How many edges carry each kind (an edge with two kinds counts for both)."""
        counts = Counter(kind for edge in self.edges for kind in edge.kinds)
        return {kind: counts.get(kind, 0) for kind in EDGE_KINDS}


def salient_tokens(text: str) -> frozenset[str]:
    """The salient tokens of ``text``: URLs, file names, numbers, quoted strings and identifiers, casefolded.

    JSON object keys are removed before extraction. Exclusions that need the whole trajectory (task tokens,
    agent names, boilerplate) are applied by `link_steps`.
    """
    text = _JSON_KEY.sub(" ", text)
    found: set[str] = set()
    found.update(match.group(0).rstrip(".,;:!?").casefold() for match in _URL.finditer(text))
    for match in _QUOTED.finditer(text):
        quoted = " ".join(next(group for group in match.groups() if group is not None).split())
        if len(quoted) >= 3:
            found.add(quoted.casefold())
    found.update(match.group(0).casefold() for match in _FILE_NAME.finditer(text))
    for match in _NUMBER.finditer(text):
        number = match.group(0).rstrip(",").replace(",", "")
        if len(number.replace(".", "").lstrip("0")) >= 3:  # "1.0", "0.01" and list numbers are not data
            found.add(number)
    for match in _WORD.finditer(text):
        word = match.group(0)
        snake = "_" in word.strip("_") and any(char.isalpha() for char in word) and len(word) >= 4
        if snake or _CAMEL.search(word):
            found.add(word.casefold())
    return frozenset(found)


def link_steps(
    trajectory: Trajectory,
    types: Sequence[TypedStep],
    *,
    window: int = 20,
    min_shared_tokens: int = 1,
    boilerplate_share: float = 0.5,
) -> DependencyGraph:
    """Build the dependency graph of ``trajectory`` by the linking rules of docs/methods/falat.md (stage 2).

    Args:
        trajectory: the run.
        types: `type_steps` of the run.
        window: how many steps back instruction and reference links may reach.
        min_shared_tokens: tokens a step must take from one earlier step for a reference link.
        boilerplate_share: a token found in at least 3 steps and in more than this share of them is ignored.
    """
    steps = trajectory.steps
    n = len(steps)
    if len(types) != n:
        raise ValueError(f"{len(types)} step types for {n} steps")
    tokens = _step_tokens(trajectory, boilerplate_share)
    links: dict[tuple[int, int], set[EdgeKind]] = {}
    shared: dict[tuple[int, int], list[str]] = {}

    def add(step: int, depends_on: int, kind: EdgeKind) -> None:
        links.setdefault((step, depends_on), set()).add(kind)

    last_handoff: dict[int, str] = {}  # step -> recipient, only for steps announcing a handoff
    for i, step in enumerate(steps):
        if i > 0:
            if types[i].type == "tool_output":
                call = next((j for j in range(i - 1, -1, -1) if types[j].type != "tool_output"), None)
                if call is not None:
                    add(i, call, "tool_result" if types[call].type == "tool_call" else "reply")
                else:
                    add(i, i - 1, "reply")
            else:
                instruction = next(
                    (
                        j
                        for j in range(i - 1, max(-1, i - 1 - window), -1)
                        if j in last_handoff and role_matches(step.agent, last_handoff[j])
                    ),
                    None,
                )
                if instruction is not None:
                    add(i, instruction, "instruction")
                else:
                    add(i, i - 1, "reply")
        if step.handoff is not None:
            last_handoff[i] = step.handoff.recipient

    last_holder: dict[str, int] = {}
    for i in range(n):
        credited: dict[int, list[str]] = {}
        for token in tokens[i]:
            j = last_holder.get(token)
            if j is not None and i - j <= window:
                credited.setdefault(j, []).append(token)
        for j, credited_tokens in credited.items():
            if len(credited_tokens) >= min_shared_tokens:
                add(i, j, "reference")
                shared[(i, j)] = sorted(credited_tokens)
        for token in tokens[i]:
            last_holder[token] = i

    edges = tuple(
        Edge(
            step=i,
            depends_on=j,
            kinds=tuple(k for k in EDGE_KINDS if k in kinds),
            shared=tuple(shared.get((i, j), ())),
        )
        for (i, j), kinds in sorted(links.items())
    )
    return DependencyGraph(n_steps=n, edges=edges, tokens=tokens)


def _step_tokens(trajectory: Trajectory, boilerplate_share: float) -> tuple[frozenset[str], ...]:
    excluded = set(salient_tokens(trajectory.task))
    for agent in trajectory.agents:
        excluded.add(agent.casefold())
        excluded.update(salient_tokens(agent))
    raw = [salient_tokens(step.content) - excluded for step in trajectory.steps]
    frequency = Counter(token for step_tokens in raw for token in step_tokens)
    limit = boilerplate_share * len(raw)
    boilerplate = {t for t, df in frequency.items() if df >= _BOILERPLATE_MIN_STEPS and df > limit}
    return tuple(frozenset(step_tokens - boilerplate) for step_tokens in raw)


def parent_map(graph: DependencyGraph) -> dict[int, list[int]]:
    """Each step's direct dependencies (every step is a key, with an empty list when it has none)."""
    parents: dict[int, list[int]] = {i: [] for i in range(graph.n_steps)}
    for edge in graph.edges:
        parents[edge.step].append(edge.depends_on)
    return parents


def ancestors(graph: DependencyGraph, step: int) -> frozenset[int]:
    """Every step ``step`` depends on, directly or through other steps (``step`` itself excluded)."""
    return ancestors_in(parent_map(graph), step)


def ancestors_in(parents: Mapping[int, Sequence[int]], step: int) -> frozenset[int]:
    """`ancestors` over a `parent_map` computed once (the pruning asks for many steps of one graph)."""
    seen: set[int] = set()
    stack = list(parents.get(step, ()))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(parents.get(node, ()))
    return frozenset(seen)
