"""FALAT stage 1, typing: each step is a decision, a tool call, a tool output or a message (no LLM).

Every later stage reads these types. The rules, in the order tried, are in ``docs/methods/falat.md`` (stage 1);
`TypedStep.rule` names the clause that matched, so a surprising type can be traced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rcarun.data import Step, Trajectory

__all__ = ["STEP_TYPES", "StepType", "TypedStep", "type_step", "type_steps"]

StepType = Literal["decision", "tool_call", "tool_output", "message"]
STEP_TYPES: tuple[StepType, ...] = ("decision", "tool_call", "tool_output", "message")

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
_INTENT_WINDOW = 400  # characters: an intent marker counts only near the start of a step


@dataclass(frozen=True, slots=True)
class TypedStep:
    """A step's type and the rule that gave it (``rule`` names the matching clause of the typing rules)."""

    index: int
    type: StepType
    rule: str


def type_step(step: Step) -> TypedStep:
    """Type one step by the first matching rule of docs/methods/falat.md (stage 1)."""
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
