"""Role classes of recorded agent names, exactly as RCTA's step enricher assigns them (LongRCA App. H).

The class of an agent decides which handoff an RCTA candidate is compared with (A2), where the segmenter may cut
(a role-class shift) and whether a planner verdict may point at a step (A4). The rule works on the recorded name
only, never on the content:

1. Trim whitespace. A handoff name ``"Sender (-> Recipient)"`` / ``"Sender (→ Recipient)"`` is classified by its
   sender (`rcarun.data.roles.parse_handoff`).
2. Exact names: planner ``DiagnostAgent, Task_Planner, Orchestrator, manager_agent``; executor ``ActionAgent,
   Action_Expert, WebSurfer, FileSurfer, Assistant, Coder, transport_agent, stay_agent, food_attr_agent``;
   verifier ``JudgeAgent, Verification_Expert, verifier_agent``; terminal ``Computer_terminal,
   ComputerTerminal``; human ``human``.
3. An Orchestrator status suffix keeps the planner class: ``"Orchestrator (thought)"``, ``"Orchestrator
   (termination condition)"``.
4. Any other name ending in ``Expert`` or ``_Expert``: verifier if it contains ``verif`` or ``validat``
   (case-insensitive), else executor.
5. Anything else: unknown.

Exact names are compared case-sensitively, as recorded (the release compares the literal strings).
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
    """The role class of a recorded agent name (rules in the module docstring)."""
    base = sender_name(name)
    exact = _EXACT.get(base)
    if exact is not None:
        return exact
    if _ORCHESTRATOR_STATUS.match(base):
        return "planner"
    if base.endswith("Expert"):  # covers "_Expert"
        return "verifier" if _VERIFYING.search(base) else "executor"
    return "unknown"
