"""Role classes of recorded agent names, as RCTA's step enricher assigns them (LongRCA App. H).

The class decides A2's handoff matching, the segmenter's cuts and A4's planner rule; the naming rules are in
``docs/methods/rcta.md`` ("Role classes").
"""

from __future__ import annotations

import re
from typing import Literal

from rcarun.data import parse_handoff

__all__ = ["ROLE_CLASSES", "RoleClass", "role_class", "sender_name"]

RoleClass = Literal["planner", "executor", "verifier", "terminal", "human", "unknown"]
ROLE_CLASSES: tuple[RoleClass, ...] = ("planner", "executor", "verifier", "terminal", "human", "unknown")

_EXACT: dict[str, RoleClass] = {
    **dict.fromkeys(("DiagnostAgent", "Task_Planner", "Orchestrator", "manager_agent"), "planner"),
    **dict.fromkeys(
        (
            "ActionAgent",
            "Action_Expert",
            "WebSurfer",
            "FileSurfer",
            "Assistant",
            "Coder",
            "transport_agent",
            "stay_agent",
            "food_attr_agent",
        ),
        "executor",
    ),
    **dict.fromkeys(("JudgeAgent", "Verification_Expert", "verifier_agent"), "verifier"),
    **dict.fromkeys(("Computer_terminal", "ComputerTerminal"), "terminal"),
    "human": "human",
}
_ORCHESTRATOR_STATUS = re.compile(r"^Orchestrator\s*\([^()]*\)$")
_VERIFYING = re.compile(r"verif|validat", re.IGNORECASE)


def sender_name(name: str) -> str:
    """The name trimmed, or the sender of a handoff name."""
    handoff = parse_handoff(name)
    return handoff.sender if handoff is not None else name.strip()


def role_class(name: str) -> RoleClass:
    """The role class of a recorded agent name (docs/methods/rcta.md)."""
    base = sender_name(name)
    exact = _EXACT.get(base)
    if exact is not None:
        return exact
    if _ORCHESTRATOR_STATUS.match(base):
        return "planner"
    if base.endswith("Expert"):  # covers "_Expert"
        return "verifier" if _VERIFYING.search(base) else "executor"
    return "unknown"
