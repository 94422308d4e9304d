"""FALAT (Rafi et al., 2026): dependency-guided search for the step that introduced a failure — RECONSTRUCTED.

No public code of FALAT exists. The LongRCA paper describes it in one sentence: it traces "typed dependencies
among decisions, tool outputs, and messages to separate error sources from downstream carriers and guide
candidate pruning and verification". This module rebuilds that idea as six stages, each a plain function over
frozen dataclasses so that each can be tested on its own. Where a stage is deterministic, its rules are
written here.

Stages (LLM = one model call; everything else is deterministic):

1. Typing (`type_steps`). Each step gets one type, by the first rule that matches:

   - ``tool_output``: the speaker is a terminal/tool agent (``Computer_terminal``, ``ComputerTerminal``,
     ``terminal``, ``tool``, ``environment``, ``observation``, compared casefolded without ``_ -`` and
     spaces), or the raw chat role is ``tool``/``function``/``ipython``/``observation``, or the content opens
     with an exit-code line (``exitcode: 1 (execution failed)``, ``Exit code = 0``). Only the start counts, so
     an agent quoting an exit code is not a tool.
   - ``tool_call``: a fenced code block tagged with a programming or shell language (python, bash, sh, sql,
     ...); a function-call marker (a ``finish(`` action, an ``Action:``/``Tool call:`` line, ``<function=``,
     ``<tool_call>``, a ``"tool_calls"``/``"function_call"`` key); or an agent's report of an action it took
     with a tool, opening with "I clicked/typed/scrolled/input/..." (Magentic-One's WebSurfer: the agent chose
     the action, the page it then saw is part of the same step).
   - ``decision``: a step that announces an explicit handoff (``Step.handoff``: an instruction to another
     agent); a planner by name (the agent's name contains orchestrat / planner / manager / diagnost, e.g.
     Magentic-One's Orchestrator thoughts and ledgers, LongRCA's DiagnostAgent, Task_Planner, manager_agent);
     or an intent marker in the first 400 characters ("plan", "I will", "we'll", "let's", "next step", "next
     speaker", "we should", "we need to", "I suggest", ...).
   - ``message``: everything else (the task statement, reports, verifications, "TERMINATE").

2. Linking (`link_steps` → `DependencyGraph`). Edges only point backward (``depends_on < step``); a pair of
   steps has one edge listing every kind that links it:

   - ``tool_result``: a tool output depends on the call it answers — the latest earlier step that is not
     itself a tool output (consecutive outputs answer the same call) — when that step is a tool call. When it
     is not (an AG2 terminal saying "there is no code to execute"), the edge is a ``reply`` to it instead.
   - ``instruction``: any other step depends on the latest step at most ``link_window`` steps back that handed
     off to its speaker (recipient and speaker compared as the scorer compares roles).
   - ``reply``: a step with neither of the above depends on the step just before it (the message it answers).
   - ``reference``: a step depends on an earlier step at most ``link_window`` steps back whose outputs it
     reuses: for every salient token of the step, the latest earlier step in the window holding the same token
     is credited; a step credited with at least ``min_shared_tokens`` tokens is linked. Salient tokens are
     URLs, file names and domains (``name.ext``), numbers with at least three digits not counting leading
     zeros (thousands separators dropped, so ``737,015`` = ``737015``; ``1.46`` counts, ``1.0`` and ``0.01``
     do not), quoted strings of 3–80 characters, and code identifiers (snake_case or camelCase), all
     casefolded. JSON object keys are removed first (they are structure, not data), and a token does not count
     when it occurs in the task statement (it was given, not produced), is a recorded agent's name, or is
     boilerplate: present in at least 3 steps and in more than ``boilerplate_share`` of all steps.

3. Failure point (LLM, stage ``"locate"``): one call over the typed log (fitted to the context window by the
   shared cap-steps policy of `rcarun.methods.context`) asks for the earliest step where the failure is
   VISIBLE, as ``{reason, failure_step}`` with the step's bounds in the schema (a digit string such as ``"12"``
   is read as that integer, by the scorer's rule, `rcarun.data.parse_step`). A malformed, non-integer or
   out-of-range answer falls back to the last step (the end of a failed run is where its failure is certainly
   visible); the fallback and its cause are recorded.

4. Backward walk (`walk_back`): the failure step itself (it may be where the error is made, e.g. a wrong final
   answer) and its ancestors in breadth-first order of hops, ties broken by the later step (closer to the
   failure), up to ``max_candidates`` steps in all.

5. Pruning (`prune_carriers`): a candidate is a downstream carrier when one of its own ancestors in the graph
   is also a candidate AND it reuses that ancestor's content: it shares at least ``min_shared_tokens`` salient
   tokens with it, or it is a tool output whose ``tool_result`` edge points at it (an output carries whatever
   its call got wrong). Carriers are set aside with the candidates they carry from; the rest are the
   source-most candidates. An instruction or reply edge alone is not reuse: an agent that follows an
   instruction may still make its own mistake.

6. Verification and decision (LLM, stage ``"verify"``, then `decide`). The source-most candidates are verified
   one call each, earliest step first (`search_sources`). Each prompt shows the task, the candidate with its
   direct dependencies (up to ``max_context_parents`` nearest parents, with the kinds and shared tokens of
   each link), the dependency path to the failure and the failure step, within ``verify_context_chars``
   characters of step text (the candidate may take twice the share of each other step); the answer is
   ``{reason, is_source, confidence}``. A step is verified when ``is_source`` is true and ``confidence >=
   min_confidence``. An answer that is not a JSON object, or whose ``is_source`` is not a boolean or whose
   ``confidence`` is not a number in [0, 1], is recorded as malformed and counts as not verified.

   The queue is ordered by step and the search stops at the first verified step: that IS the earliest verified
   source, with fewer calls than verifying every candidate. At most ``max_verify_calls`` calls are made;
   candidates left in the queue when the budget runs out are recorded as unverified. Pruned carriers are never
   verified: that is the description's "prune candidates that only carry an earlier error".

   Option ``reinstate_carriers`` (default ``False``; NOT part of FALAT as described, and tuned on gold labels,
   so it is off in every reproduction run): when verification clears every candidate a carrier carries from,
   the carrier is put back into the queue (a carrier always comes after what it carries from, so the queue
   stays in step order). It was motivated by a run against Who&When's attribution labels — walking back from
   the last step with a verifier that only confirms the labelled step, the search reaches the label in 117 of
   146 trajectories with reinstatement and in 65 without — which makes it a choice fitted to the labels the
   method is scored on (fidelity audit 2026-12, §1.6); it stays available for ablations that say so.

   Decision (`decide`): the earliest verified source (rule ``"earliest-verified"``). Fallbacks, recorded: with
   no verified step, the candidate with the highest confidence among well-formed verdicts (ties: the earlier
   step; rule ``"highest-confidence"``); with no well-formed verdict at all, the failure step (rule
   ``"failure-step"``).

Protocol (LongRCA Sec. 5.1): the prediction has an explicit role and a 0-based step. FALAT localises a step
and does not ask the model for a role, so the role is the recorded speaker (``Step.agent``) of the chosen
step, set as an explicit field; it is therefore always one of the recorded agents. Step answers carry their
bounds in the schema; invalid fields are recorded, never repaired (a fallback is a documented rule of the
method, and is recorded as such). The task's ground-truth final answer is not shown unless
``include_ground_truth=True``.

Unreadable answers and fallbacks (``Attribution.error`` / ``fallback``; the output's ``failure.fallback`` and
``decision.fallback`` records stay as they are):

- ``fallback`` is set when a recorded fallback shaped the prediction: the locate fallback (the walk started
  from the last step because the locate answer was unusable: the candidates, and so the prediction, follow
  from the rule) and the decision fallbacks ``"highest-confidence"`` and ``"failure-step"`` (no verified
  source). The text names each rule that fired and, for the decision, how many verdicts were malformed.
- ``error`` is set when the prediction rests on no answer of the model: the locate answer could not be read
  (not a JSON object, ``failure_step`` missing or not an integer) and no verification was readable, so the
  predicted step is the last step by rule. A locate answer that was read but lies outside the log is validity,
  not an error; one readable verdict is enough for the prediction to rest on the model.

A trajectory without steps is an abstention with no call. Calls per trajectory: 1 (locate) + at most
``min(max_verify_calls, max_candidates)`` (verify); 1 + 8 with the defaults.

The task: the locate prompt and every verify prompt state the task instruction whole (up to
`rcarun.methods.context.TASK_CHAR_CAP`, `task_text`): the record's ``question``, or on LongRCA records, which have
none, the instruction the loader derived from the opening step(s) of the history (`rcarun.data.derive_task`).
A verify prompt shows only the candidate, its nearest dependencies and the failure step, so without that line a
verifier would judge a step against a task it never saw.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from string import Template
from typing import Any, Literal, TypeGuard

from rcarun.data import Step, Trajectory, parse_step, role_matches
from rcarun.errors import ConfigError
from rcarun.methods.base import Attribution, Method, is_int, role_is_valid, step_is_valid
from rcarun.methods.context import (
    TRUNCATION_POLICIES,
    Truncation,
    cut_middle,
    fit_prompt,
    ground_truth_line,
    task_text,
    truncation_summary,
)
from rcarun.methods.llm import LLM, Message, Reasoning, Reply
from rcarun.methods.registry import method

__all__ = [
    "EDGE_KINDS",
    "STEP_TYPES",
    "Candidate",
    "Decision",
    "DecisionRule",
    "DependencyGraph",
    "Edge",
    "EdgeKind",
    "FailurePoint",
    "Falat",
    "FalatOptions",
    "PrunedCandidate",
    "Pruning",
    "SearchResult",
    "StepType",
    "TypedStep",
    "Verdict",
    "ancestors",
    "decide",
    "is_verified",
    "link_steps",
    "locate_schema",
    "parse_failure_point",
    "parse_verdict",
    "prune_carriers",
    "salient_tokens",
    "search_sources",
    "type_step",
    "type_steps",
    "verify_schema",
    "walk_back",
]

StepType = Literal["decision", "tool_call", "tool_output", "message"]
STEP_TYPES: tuple[StepType, ...] = ("decision", "tool_call", "tool_output", "message")
EdgeKind = Literal["tool_result", "instruction", "reply", "reference"]
EDGE_KINDS: tuple[EdgeKind, ...] = ("tool_result", "instruction", "reply", "reference")
DecisionRule = Literal["earliest-verified", "highest-confidence", "failure-step"]

_METHOD = "falat"
_REASON_CHARS = 500  # reasons kept in the output: enough to read, small enough to keep output_json compact
_RAW_CHARS = 300
_SHOWN_TOKENS = 5  # shared tokens named per link in prompts and output

# --- typing rules --------------------------------------------------------------------------------
_TERMINAL_AGENTS = frozenset({"computerterminal", "terminal", "tool", "tools", "environment", "observation"})
_TOOL_CHAT_ROLES = frozenset({"tool", "function", "ipython", "observation"})
_EXIT_CODE_START = re.compile(r"\A\s*exit\s*code\s*[:=]?\s*-?\d+", re.IGNORECASE)
_CODE_FENCE = re.compile(
    r"```[ \t]*(?:python3?|py|bash|sh|shell|zsh|console|sql|javascript|js|typescript|ts|r|ruby|go|java|"
    r"c|cpp|c\+\+|rust|powershell|ps1|cmd|bat)[ \t]*\n",
    re.IGNORECASE,
)
_CALL_MARKERS = re.compile(
    r"\bfinish\(|^\s*(?:action|tool call|function call)\s*:|<function=|<tool_call>"
    r"|\"(?:tool_calls|function_call)\"\s*:",
    re.IGNORECASE | re.MULTILINE,
)
_ACTION_REPORT = re.compile(
    r"\A\s*I (?:clicked|typed|input|scrolled|navigated|visited|opened|searched|pressed|hovered|entered|"
    r"selected|ran|executed|went back)\b",
    re.IGNORECASE,
)
_PLANNER_NAME = re.compile(r"orchestrat|planner|manager|diagnost", re.IGNORECASE)
_INTENT_MARKERS = re.compile(
    r"\b(?:plan|I will|I'll|we will|we'll|let's|let us|next step|next speaker|we should|we need to|I propose|"
    r"I suggest)\b",
    re.IGNORECASE,
)
_INTENT_WINDOW = 400

# --- salient tokens ------------------------------------------------------------------------------
_JSON_KEY = re.compile(r'"[^"\n]{1,80}"\s*:')
_URL = re.compile(r"https?://[^\s<>()\[\]{}'\"`]+")
_QUOTED = re.compile(r"(?<!\w)(?:'([^'\n]{3,80})'|\"([^\"\n]{3,80})\"|`([^`\n]{3,80})`)(?!\w)")
_FILE_NAME = re.compile(r"(?<![\w.])[\w-]{2,}(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,5}(?![\w])")
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?!\w)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CAMEL = re.compile(r"[a-z][A-Z]")
_BOILERPLATE_MIN_STEPS = 3


# ============================================================ options


@dataclass(frozen=True, slots=True)
class FalatOptions:
    """FALAT's options; the module docstring says what each rule does with them."""

    max_tokens: int = 8000
    temperature: float | None = 0.0
    reasoning: Reasoning | None = None
    include_task: bool = True
    include_ground_truth: bool = False
    truncation: Literal["cap-steps", "none"] = "cap-steps"
    max_candidates: int = 8
    max_verify_calls: int = 8
    link_window: int = 20
    min_shared_tokens: int = 1
    boilerplate_share: float = 0.5
    max_context_parents: int = 4
    verify_context_chars: int = 16_000
    min_confidence: float = 0.5
    reinstate_carriers: bool = False
    locate_stage: str = "locate"
    verify_stage: str = "verify"

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> FalatOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"{_METHOD}: unknown option(s) {unknown}; known: {sorted(known)}")
        parsed = cls(**options)
        positive = (
            "max_tokens",
            "max_candidates",
            "link_window",
            "min_shared_tokens",
            "verify_context_chars",
        )
        for name in positive:
            value = getattr(parsed, name)
            if not is_int(value) or value <= 0:
                raise ConfigError(f"{_METHOD}: {name} must be a positive integer")
        for name in ("max_verify_calls", "max_context_parents"):
            value = getattr(parsed, name)
            if not is_int(value) or value < 0:
                raise ConfigError(f"{_METHOD}: {name} must be a non-negative integer")
        if parsed.temperature is not None and not _is_number(parsed.temperature):
            raise ConfigError(f"{_METHOD}: temperature must be a number or null")
        if parsed.reasoning not in (None, "off", "low", "medium", "high"):
            raise ConfigError(f"{_METHOD}: reasoning must be one of off, low, medium, high")
        if parsed.truncation not in TRUNCATION_POLICIES:
            raise ConfigError(f"{_METHOD}: truncation must be 'cap-steps' or 'none'")
        for name in ("include_task", "include_ground_truth", "reinstate_carriers"):
            if not isinstance(getattr(parsed, name), bool):
                raise ConfigError(f"{_METHOD}: {name} must be true or false")
        if not _is_number(parsed.boilerplate_share) or not 0 < parsed.boilerplate_share <= 1:
            raise ConfigError(f"{_METHOD}: boilerplate_share must be a number in (0, 1]")
        if not _is_number(parsed.min_confidence) or not 0 <= parsed.min_confidence <= 1:
            raise ConfigError(f"{_METHOD}: min_confidence must be a number in [0, 1]")
        for name in ("locate_stage", "verify_stage"):
            value = getattr(parsed, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{_METHOD}: {name} must be a non-empty string")
        return parsed


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ============================================================ 1. typing


@dataclass(frozen=True, slots=True)
class TypedStep:
    """A step's type and the rule that gave it (``rule`` names the matching clause of the typing rules)."""

    index: int
    type: StepType
    rule: str


def type_step(step: Step) -> TypedStep:
    """Type one step by the first matching rule of the module docstring."""
    speaker = re.sub(r"[\s_\-]+", "", step.agent).casefold()
    content = step.content
    if speaker in _TERMINAL_AGENTS:
        return TypedStep(step.index, "tool_output", "terminal-agent")
    if step.role.strip().casefold() in _TOOL_CHAT_ROLES:
        return TypedStep(step.index, "tool_output", "tool-role")
    if _EXIT_CODE_START.search(content):
        return TypedStep(step.index, "tool_output", "exit-code")
    if _CODE_FENCE.search(content):
        return TypedStep(step.index, "tool_call", "code-block")
    if _CALL_MARKERS.search(content):
        return TypedStep(step.index, "tool_call", "call-marker")
    if _ACTION_REPORT.search(content):
        return TypedStep(step.index, "tool_call", "action-report")
    if step.handoff is not None:
        return TypedStep(step.index, "decision", "handoff")
    if _PLANNER_NAME.search(step.agent):
        return TypedStep(step.index, "decision", "planner")
    if _INTENT_MARKERS.search(content[:_INTENT_WINDOW]):
        return TypedStep(step.index, "decision", "intent")
    return TypedStep(step.index, "message", "default")


def type_steps(trajectory: Trajectory) -> tuple[TypedStep, ...]:
    """Every step of ``trajectory`` typed, in order."""
    return tuple(type_step(step) for step in trajectory.steps)


# ============================================================ 2. linking


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
    """Build the dependency graph of ``trajectory`` by the linking rules of the module docstring.

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


def _parent_map(graph: DependencyGraph) -> dict[int, list[int]]:
    parents: dict[int, list[int]] = {i: [] for i in range(graph.n_steps)}
    for edge in graph.edges:
        parents[edge.step].append(edge.depends_on)
    return parents


def ancestors(graph: DependencyGraph, step: int) -> frozenset[int]:
    """Every step ``step`` depends on, directly or through other steps (``step`` itself excluded)."""
    return _ancestors(_parent_map(graph), step)


def _ancestors(parents: Mapping[int, Sequence[int]], step: int) -> frozenset[int]:
    seen: set[int] = set()
    stack = list(parents.get(step, ()))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(parents.get(node, ()))
    return frozenset(seen)


# ============================================================ 3. failure point


@dataclass(frozen=True, slots=True)
class FailurePoint:
    """Where the failure becomes visible.

    Attributes:
        step: the step used by the walk.
        fallback: the answer was unusable and ``step`` is the last step.
        reason: the model's reason ("" on a fallback without one).
        answer: the parsed answer as given (None when it was not a JSON object).
        error: why the answer was unusable, when ``fallback``.
    """

    step: int
    fallback: bool
    reason: str = ""
    answer: Any = None
    error: str | None = None


def locate_schema(n_steps: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "failure_step": {"type": "integer", "minimum": 0, "maximum": n_steps - 1},
        },
        "required": ["reason", "failure_step"],
        "additionalProperties": False,
    }


def parse_failure_point(reply: Reply, n_steps: int) -> FailurePoint:
    """The locate answer, read strictly: an unusable ``failure_step`` gives the last step."""
    answer = reply.parsed if isinstance(reply.parsed, dict) else None
    last = n_steps - 1
    if answer is None:
        return FailurePoint(last, True, error=reply.parse_error or "the answer is not a JSON object")
    reason = answer.get("reason")
    reason_text = reason[:_REASON_CHARS] if isinstance(reason, str) else ""
    step = parse_step(answer.get("failure_step"))
    if step is None:
        return FailurePoint(last, True, reason_text, answer, "failure_step is missing or not an integer")
    if not 0 <= step < n_steps:
        return FailurePoint(last, True, reason_text, answer, f"failure_step {step} is outside [0, {last}]")
    return FailurePoint(step, False, reason_text, answer)


# ============================================================ 4. backward walk


@dataclass(frozen=True, slots=True)
class Candidate:
    """A step reached from the failure step by walking dependencies backward.

    Attributes:
        step: the candidate step.
        hops: edges between it and the failure step (0 for the failure step itself).
        via: the step one hop closer to the failure through which it was reached (None for the failure step).
    """

    step: int
    hops: int
    via: int | None


def walk_back(graph: DependencyGraph, failure_step: int, max_candidates: int) -> tuple[Candidate, ...]:
    """The failure step and its ancestors, nearest first (fewest hops, then later step);
    at most ``max_candidates`` steps."""
    if not 0 <= failure_step < graph.n_steps:
        raise ValueError(f"failure step {failure_step} is outside the graph")
    parents = _parent_map(graph)
    found = [Candidate(failure_step, 0, None)]
    seen = {failure_step}
    layer = [failure_step]
    hops = 0
    while layer and len(found) < max_candidates:
        hops += 1
        reached: dict[int, int] = {}  # parent -> the child it was reached through (the latest child wins)
        for child in layer:
            for parent in parents[child]:
                if parent not in seen and parent not in reached:
                    reached[parent] = child
        layer = sorted(reached, reverse=True)
        seen.update(layer)
        found.extend(Candidate(step, hops, reached[step]) for step in layer[: max_candidates - len(found)])
    return tuple(found)


def _path_to_failure(candidates: Mapping[int, Candidate], step: int) -> list[int]:
    path = [step]
    via = candidates[step].via
    while via is not None:
        path.append(via)
        via = candidates[via].via
    return path


# ============================================================ 5. pruning


@dataclass(frozen=True, slots=True)
class PrunedCandidate:
    """A downstream carrier: it reuses the content of candidates it depends on.

    Attributes:
        step: the carrier.
        carries_from: the candidates among its ancestors whose content it reuses, ascending.
        reasons: one short reason per entry of ``carries_from``.
    """

    step: int
    carries_from: tuple[int, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pruning:
    """Candidates split into source-most ones (``kept``) and downstream carriers (``pruned``), ascending."""

    kept: tuple[int, ...]
    pruned: tuple[PrunedCandidate, ...]


def prune_carriers(
    graph: DependencyGraph, candidates: Sequence[Candidate], *, min_shared_tokens: int = 1
) -> Pruning:
    """Set aside each candidate that reuses the content of a candidate among its ancestors."""
    parents = _parent_map(graph)
    steps = {candidate.step for candidate in candidates}
    kept: list[int] = []
    pruned: list[PrunedCandidate] = []
    for step in sorted(steps):
        carries: list[tuple[int, str]] = []
        for earlier in sorted(_ancestors(parents, step) & steps):
            reason = _reuse(graph, step, earlier, min_shared_tokens)
            if reason is not None:
                carries.append((earlier, reason))
        if carries:
            pruned.append(PrunedCandidate(step, tuple(s for s, _ in carries), tuple(r for _, r in carries)))
        else:
            kept.append(step)
    return Pruning(tuple(kept), tuple(pruned))


def _reuse(graph: DependencyGraph, step: int, earlier: int, min_shared_tokens: int) -> str | None:
    edge = graph.edge(step, earlier)
    if edge is not None and "tool_result" in edge.kinds:
        return f"tool output of step {earlier}"
    common = sorted(graph.tokens_of(step) & graph.tokens_of(earlier))
    if len(common) >= min_shared_tokens:
        return f"reuses {len(common)} token(s) of step {earlier}: {', '.join(common[:_SHOWN_TOKENS])}"
    return None


# ============================================================ 6. verification


@dataclass(frozen=True, slots=True)
class Verdict:
    """One verification answer.

    Attributes:
        step: the verified candidate.
        valid: the answer was a JSON object with a boolean ``is_source`` and a ``confidence`` in [0, 1].
        is_source: the answer's ``is_source`` (False when not ``valid``).
        confidence: the answer's ``confidence`` (None when not ``valid``).
        reason: the answer's reason, cut to 500 characters.
        error: why the answer is malformed, when not ``valid``.
        raw_text: the head of the answer's text, kept only when it was not JSON.
        finish_reason: the call's finish reason.
    """

    step: int
    valid: bool
    is_source: bool = False
    confidence: float | None = None
    reason: str = ""
    error: str | None = None
    raw_text: str | None = None
    finish_reason: str = "stop"


def verify_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "is_source": {"type": "boolean"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["reason", "is_source", "confidence"],
        "additionalProperties": False,
    }


def parse_verdict(step: int, reply: Reply) -> Verdict:
    """Read a verify answer strictly; a malformed one is a `Verdict` with ``valid=False`` (never repaired)."""
    answer = reply.parsed if isinstance(reply.parsed, dict) else None
    if answer is None:
        return Verdict(
            step,
            False,
            error=reply.parse_error or "the answer is not a JSON object",
            raw_text=reply.text[:_RAW_CHARS],
            finish_reason=reply.finish_reason,
        )
    reason = answer.get("reason")
    reason_text = reason[:_REASON_CHARS] if isinstance(reason, str) else ""
    is_source = answer.get("is_source")
    confidence = answer.get("confidence")
    if not isinstance(is_source, bool):
        problem = "is_source is missing or not a boolean"
    elif not _is_number(confidence) or not 0 <= confidence <= 1:
        problem = "confidence is missing or not a number in [0, 1]"
    else:
        return Verdict(
            step, True, is_source, float(confidence), reason_text, finish_reason=reply.finish_reason
        )
    return Verdict(step, False, reason=reason_text, error=problem, finish_reason=reply.finish_reason)


def is_verified(verdict: Verdict, min_confidence: float) -> bool:
    """A well-formed verdict saying ``is_source`` with at least ``min_confidence``."""
    return (
        verdict.valid
        and verdict.is_source
        and verdict.confidence is not None
        and verdict.confidence >= min_confidence
    )


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The verification search.

    Attributes:
        verdicts: in call order (which is increasing step order).
        reinstated: carriers put back into the queue after everything they carry from was cleared, in order.
        unverified: candidates still queued when the call budget ran out.
        stop: ``"source-found"``, ``"budget"`` (calls exhausted with candidates left) or ``"exhausted"``.
    """

    verdicts: tuple[Verdict, ...]
    reinstated: tuple[int, ...]
    unverified: tuple[int, ...]
    stop: Literal["source-found", "budget", "exhausted"]


async def search_sources(
    pruning: Pruning,
    verify: Callable[[int], Awaitable[Verdict]],
    *,
    max_calls: int,
    min_confidence: float,
    reinstate: bool = False,
) -> SearchResult:
    """Verify source-most candidates earliest first, stopping at the first verified one (module docstring).

    Args:
        pruning: the candidates after `prune_carriers`.
        verify: one verification (one model call) of a step.
        max_calls: the most verifications made.
        min_confidence: the confidence a positive verdict needs.
        reinstate: put a carrier back into the queue once every candidate it carries from was cleared (the
            ``reinstate_carriers`` option, off by default: not in the description, see the module docstring).
    """
    queue = list(pruning.kept)
    heapq.heapify(queue)
    queued = set(queue)
    cleared: set[int] = set()
    verdicts: list[Verdict] = []
    reinstated: list[int] = []
    while queue:
        if len(verdicts) >= max_calls:
            return SearchResult(tuple(verdicts), tuple(reinstated), tuple(sorted(queue)), "budget")
        step = heapq.heappop(queue)
        verdict = await verify(step)
        verdicts.append(verdict)
        if is_verified(verdict, min_confidence):
            return SearchResult(tuple(verdicts), tuple(reinstated), (), "source-found")
        cleared.add(step)
        if reinstate:
            for carrier in pruning.pruned:
                if carrier.step not in queued and set(carrier.carries_from) <= cleared:
                    heapq.heappush(queue, carrier.step)
                    queued.add(carrier.step)
                    reinstated.append(carrier.step)
    return SearchResult(tuple(verdicts), tuple(reinstated), (), "exhausted")


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen step, the rule that chose it, and whether that rule is a fallback."""

    step: int
    rule: DecisionRule
    fallback: bool


def decide(verdicts: Sequence[Verdict], failure_step: int, *, min_confidence: float) -> Decision:
    """The earliest verified source; else the highest-confidence candidate; else the failure step."""
    verified = [verdict.step for verdict in verdicts if is_verified(verdict, min_confidence)]
    if verified:
        return Decision(min(verified), "earliest-verified", False)
    scored = [(verdict.confidence, -verdict.step) for verdict in verdicts if verdict.confidence is not None]
    if scored:
        return Decision(-max(scored)[1], "highest-confidence", True)
    return Decision(failure_step, "failure-step", True)


# ============================================================ the method


def _load_prompt(name: str) -> Template:
    return Template(resources.files("rcarun.methods").joinpath("prompts", name).read_text(encoding="utf-8"))


def _speaker(step: Step) -> str:
    """The agent as shown in prompts, with the handoff target when its role has one and its name does not."""
    handoff = step.handoff
    if handoff is None or step.agent != handoff.sender:
        return step.agent
    return f"{step.agent} (-> {handoff.recipient})"


def _render_step(step: Step, step_type: StepType, cap: int | None) -> str:
    content = step.content
    if cap is not None and len(content) > cap:
        content = cut_middle(content, cap)
    return f"[step {step.index}] ({step_type}) {_speaker(step)}: {content}"


def _weighted_caps(lengths: Sequence[int], weights: Sequence[int], total: int) -> list[int | None]:
    """Per-step caps ``weight * c``, for the largest ``c`` whose capped lengths sum to at most ``total``."""
    if sum(lengths) <= total:
        return [None] * len(lengths)
    low, high = 0, max(lengths, default=0)
    while low < high:
        mid = (low + high + 1) // 2
        if sum(min(length, weight * mid) for length, weight in zip(lengths, weights, strict=True)) <= total:
            low = mid
        else:
            high = mid - 1
    return [
        weight * low if length > weight * low else None
        for length, weight in zip(lengths, weights, strict=True)
    ]


def _min_cap(first: int | None, second: int | None) -> int | None:
    if first is None:
        return second
    return first if second is None else min(first, second)


class Falat(Method):
    """FALAT reconstructed: typing, linking, locate (LLM), backward walk, pruning, verify (LLM), decision."""

    def __init__(self, label: str, options: FalatOptions) -> None:
        self.label = label
        self.options = options
        self._system = _load_prompt("falat_system.txt").template.strip()
        self._locate = _load_prompt("falat_locate_user.txt")
        self._verify = _load_prompt("falat_verify_user.txt")

    def _task(self, trajectory: Trajectory) -> str:
        return task_text(trajectory, include=self.options.include_task)

    def locate_messages(
        self, trajectory: Trajectory, types: Sequence[TypedStep], llm: LLM
    ) -> tuple[list[Message], Truncation]:
        """The locate prompt over the whole typed log, fitted to ``llm``'s context window."""
        schema_text = json.dumps(locate_schema(trajectory.n_steps), ensure_ascii=False)

        def render(cap: int | None) -> str:
            note = (
                "\nSome long steps were cut in the middle to fit the model's context; "
                "their step numbers are kept.\n"
                if cap is not None
                else ""
            )
            log = "\n".join(_render_step(step, types[step.index].type, cap) for step in trajectory.steps)
            return self._locate.substitute(
                task=self._task(trajectory),
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                agents=", ".join(trajectory.agents),
                n_steps=trajectory.n_steps,
                log=log,
                truncation_note=note,
                schema=schema_text,
            )

        fitted = fit_prompt(
            render,
            [len(step.content) for step in trajectory.steps],
            llm=llm,
            max_tokens=self.options.max_tokens,
            system=self._system,
            policy=self.options.truncation,
        )
        return [Message("system", self._system), Message("user", fitted.text)], fitted.truncation

    def verify_messages(
        self,
        trajectory: Trajectory,
        types: Sequence[TypedStep],
        graph: DependencyGraph,
        failure_point: FailurePoint,
        candidates: Mapping[int, Candidate],
        step: int,
        llm: LLM,
    ) -> tuple[list[Message], Truncation]:
        """The verify prompt for candidate ``step``: its nearest dependencies, itself and the failure step.

        Args:
            trajectory: the run.
            types: `type_steps` of the run.
            graph: `link_steps` of the run.
            failure_point: the located failure.
            candidates: the walk's candidates by step (the dependency path to the failure is read from them).
            step: the candidate to verify.
            llm: whose context window the prompt is fitted to.
        """
        options = self.options
        steps = trajectory.steps
        parent_edges = graph.parents(step)[: options.max_context_parents]
        parent_edges = tuple(sorted(parent_edges, key=lambda edge: edge.depends_on))
        failure = failure_point.step
        shown = [edge.depends_on for edge in parent_edges] + [step] + ([failure] if failure != step else [])
        weights = [1] * len(parent_edges) + [2] + ([1] if failure != step else [])
        allocated = _weighted_caps(
            [len(steps[s].content) for s in shown], weights, options.verify_context_chars
        )
        alloc = dict(zip(shown, allocated, strict=True))

        def link_note(edge: Edge) -> str:
            note = f"-- step {step} depends on it by: {', '.join(edge.kinds)}"
            if edge.shared:
                note += f" (shared: {', '.join(edge.shared[:_SHOWN_TOKENS])})"
            return note

        def render(cap: int | None) -> str:
            def line(index: int) -> str:
                return _render_step(steps[index], types[index].type, _min_cap(alloc[index], cap))

            parents = "\n".join(f"{link_note(edge)}\n{line(edge.depends_on)}" for edge in parent_edges)
            cut = cap is not None or any(
                a is not None and len(steps[s].content) > a for s, a in alloc.items()
            )
            note = "\nSome long steps were cut in the middle; their step numbers are kept.\n" if cut else ""
            if failure_point.fallback:
                failure_note = f"The failure is taken to be visible at the last step, step {failure}."
            else:
                failure_note = f"The failure first becomes visible at step {failure}: {failure_point.reason}"
            path = " -> ".join(str(s) for s in _path_to_failure(candidates, step))
            return self._verify.substitute(
                task=self._task(trajectory),
                ground_truth=ground_truth_line(trajectory, options.include_ground_truth),
                n_steps=trajectory.n_steps,
                failure_note=failure_note,
                candidate=step,
                candidate_type=types[step].type,
                candidate_agent=_speaker(steps[step]),
                path=path,
                parents=parents or "(none: the candidate depends on no earlier step)",
                candidate_step=line(step),
                failure_step=line(failure) if failure != step else "(the candidate itself)",
                truncation_note=note,
                schema=json.dumps(verify_schema(), ensure_ascii=False),
            )

        fitted = fit_prompt(
            render,
            [len(steps[s].content) if a is None else a for s, a in alloc.items()],
            llm=llm,
            max_tokens=options.max_tokens,
            system=self._system,
            policy=options.truncation,
        )
        return [Message("system", self._system), Message("user", fitted.text)], fitted.truncation

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        options = self.options
        if trajectory.n_steps == 0:
            return Attribution(None, None, False, False, abstained=True, output={"abstained": "no steps"})
        types = type_steps(trajectory)
        graph = link_steps(
            trajectory,
            types,
            window=options.link_window,
            min_shared_tokens=options.min_shared_tokens,
            boilerplate_share=options.boilerplate_share,
        )

        messages, locate_truncation = self.locate_messages(trajectory, types, llm)
        locate_reply = await llm.chat(
            messages,
            stage=options.locate_stage,
            max_tokens=options.max_tokens,
            schema=locate_schema(trajectory.n_steps),
            temperature=options.temperature,
            reasoning=options.reasoning,
        )
        failure = parse_failure_point(locate_reply, trajectory.n_steps)

        walk = walk_back(graph, failure.step, options.max_candidates)
        pruning = prune_carriers(graph, walk, min_shared_tokens=options.min_shared_tokens)
        by_step = {candidate.step: candidate for candidate in walk}
        truncations: list[Truncation] = []

        async def verify(step: int) -> Verdict:
            verify_messages, truncation = self.verify_messages(
                trajectory, types, graph, failure, by_step, step, llm
            )
            truncations.append(truncation)
            reply = await llm.chat(
                verify_messages,
                stage=options.verify_stage,
                max_tokens=options.max_tokens,
                schema=verify_schema(),
                temperature=options.temperature,
                reasoning=options.reasoning,
            )
            return parse_verdict(step, reply)

        search = await search_sources(
            pruning,
            verify,
            max_calls=options.max_verify_calls,
            min_confidence=options.min_confidence,
            reinstate=options.reinstate_carriers,
        )
        decision = decide(search.verdicts, failure.step, min_confidence=options.min_confidence)
        role = trajectory.steps[decision.step].agent
        output = _output(
            types, graph, failure, locate_reply, locate_truncation, walk, pruning, search, decision
        )
        output["verify_truncation"] = truncation_summary(options.truncation, truncations)
        output["decision"]["role"] = role
        return Attribution(
            pred_role=role,
            pred_step=decision.step,
            role_valid=role_is_valid(role, trajectory),
            step_valid=step_is_valid(decision.step, trajectory),
            abstained=False,
            output=output,
            error=_unusable(failure, search.verdicts),
            fallback=_fallbacks(failure, search.verdicts, decision),
        )


def _locate_unreadable(failure: FailurePoint) -> bool:
    """The locate answer was not read (not a JSON object, or no integer ``failure_step``), as opposed to a
    step that was read but lies outside the log."""
    return failure.fallback and (
        failure.answer is None or parse_step(failure.answer.get("failure_step")) is None
    )


def _unusable(failure: FailurePoint, verdicts: Sequence[Verdict]) -> str | None:
    """Why the prediction rests on no answer of the model (module docstring), or None."""
    if not _locate_unreadable(failure) or any(verdict.valid for verdict in verdicts):
        return None
    reason = f"locate answer unreadable: {failure.error}"
    if verdicts:
        reason += (
            f"; no verification readable ({len(verdicts)} of {len(verdicts)}, first: {verdicts[0].error})"
        )
    return reason


def _fallbacks(failure: FailurePoint, verdicts: Sequence[Verdict], decision: Decision) -> str | None:
    """The recorded fallbacks that shaped the prediction, named with how often they fired, or None."""
    rules = []
    if failure.fallback:
        rules.append(f"locate answer unusable ({failure.error}), walk started at the last step")
    if decision.fallback:
        malformed = sum(1 for verdict in verdicts if not verdict.valid)
        rule = (
            "highest-confidence candidate chosen"
            if decision.rule == "highest-confidence"
            else ("failure step chosen")
        )
        rules.append(f"no verified source ({malformed} of {len(verdicts)} verdicts malformed), {rule}")
    return f"falat: {'; '.join(rules)} (the method's documented fallback)" if rules else None


def _output(
    types: Sequence[TypedStep],
    graph: DependencyGraph,
    failure: FailurePoint,
    locate_reply: Reply,
    locate_truncation: Truncation,
    walk: Sequence[Candidate],
    pruning: Pruning,
    search: SearchResult,
    decision: Decision,
) -> dict[str, Any]:
    """The compact record kept as ``output_json`` (no prompts)."""
    type_counts = Counter(typed.type for typed in types)
    failure_record: dict[str, Any] = {
        "step": failure.step,
        "fallback": failure.fallback,
        "reason": failure.reason,
        "finish_reason": locate_reply.finish_reason,
        "truncation": locate_truncation.as_output(),
    }
    if failure.fallback:
        failure_record["error"] = failure.error
        failure_record["answer"] = failure.answer
        if failure.answer is None:
            failure_record["raw_text"] = locate_reply.text[:_RAW_CHARS]
    reinstated = set(search.reinstated)
    verifications = []
    for verdict in search.verdicts:
        record: dict[str, Any] = {
            "step": verdict.step,
            "valid": verdict.valid,
            "is_source": verdict.is_source,
            "confidence": verdict.confidence,
            "reason": verdict.reason,
            "reinstated": verdict.step in reinstated,
            "finish_reason": verdict.finish_reason,
        }
        if not verdict.valid:
            record["error"] = verdict.error
            if verdict.raw_text is not None:
                record["raw_text"] = verdict.raw_text
        verifications.append(record)
    return {
        "types": {step_type: type_counts.get(step_type, 0) for step_type in STEP_TYPES},
        "graph": {"nodes": graph.n_steps, "edges": len(graph.edges), "edge_kinds": graph.kind_counts()},
        "failure": failure_record,
        "candidates": {
            "walk": [{"step": c.step, "hops": c.hops} for c in walk],
            "kept": list(pruning.kept),
            "pruned": [
                {"step": p.step, "carries_from": list(p.carries_from), "reasons": list(p.reasons)}
                for p in pruning.pruned
            ],
        },
        "verifications": verifications,
        "search": {
            "stop": search.stop,
            "reinstated": list(search.reinstated),
            "unverified": list(search.unverified),
        },
        "decision": {"step": decision.step, "rule": decision.rule, "fallback": decision.fallback},
    }


@method("falat")
def _create_falat(label: str, options: Mapping[str, Any]) -> Falat:
    return Falat(label, FalatOptions.from_mapping(options))
