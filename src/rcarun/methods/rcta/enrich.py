"""Step enrichment: the per-step facts RCTA's deterministic parts read (release notes 3.3; no LLM).

Computed once, from the recorded name, role and text only, so that every consumer agrees and each rule is
tested alone. The fields and their rules: ``docs/methods/rcta.md`` ("Step enrichment").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal, get_args

from rcarun.data import Step, Trajectory

from .roles import RoleClass, role_class

__all__ = [
    "ACTION_TYPES",
    "HASH_HEAD_CHARS",
    "HASH_TAIL_CHARS",
    "HEAD_CHARS",
    "TAIL_CHARS",
    "THINKING_MAX_OUTSIDE_CHARS",
    "ActionType",
    "EnrichedStep",
    "VerifierSignal",
    "classify_action",
    "compute_step_hash",
    "detect_verifier_signal",
    "enrich",
    "enrich_step",
    "infer_success",
    "parse_exit_code",
]

ActionType = Literal["message", "observation", "delegate", "judge", "finish", "bash", "python", "thinking"]
ACTION_TYPES: tuple[ActionType, ...] = get_args(ActionType)
VerifierSignal = Literal["PASS", "FAIL"]

HEAD_CHARS = 500
TAIL_CHARS = 500
HASH_HEAD_CHARS = 200
HASH_TAIL_CHARS = 200
# Rule 8: a step is "thinking" when less than this much text stands outside its <think> blocks.
THINKING_MAX_OUTSIDE_CHARS = 80

_FINISH = re.compile(r"\bfinish\s*\(", re.IGNORECASE)
_BASH_FENCE = re.compile(r"```\s*(?:bash|shell|sh)\b", re.IGNORECASE)
_PYTHON_FENCE = re.compile(r"```\s*python\b", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)

_VERIFIER_FAIL = re.compile(
    r"verdict\s*[:=]\s*fail|tests?\s+failed|assertion\s*error|verification\s+fail|verify\s*[:=]\s*fail",
    re.IGNORECASE,
)
_VERIFIER_PASS = re.compile(
    r"verdict\s*[:=]\s*pass|tests?\s+passed|all\s+tests\s+pass|verification\s+success|verify\s*[:=]\s*pass",
    re.IGNORECASE,
)
_SIGNALLING_CLASSES: frozenset[RoleClass] = frozenset({"verifier", "terminal"})

_EXIT_CODE = re.compile(r"(?:exit[ _]?code|return[ _]?code)\s*[:=]\s*(-?\d+)", re.IGNORECASE)
_EXITED_WITH = re.compile(r"exited\s+with\s+code\s+(-?\d+)", re.IGNORECASE)
_ERROR_TOKEN = re.compile(r"\b(?:Error|Traceback|Exception|FAIL|fatal)\b")


@dataclass(frozen=True, slots=True)
class EnrichedStep:
    """One step with the facts RCTA's deterministic stages read (each field's rule: docs/methods/rcta.md).

    ``role`` and ``agent_raw`` are `Step.role` and `Step.agent` as recorded; ``tail`` is ``""`` for content of
    at most 500 characters; ``success`` is None when unknown.
    """

    step_id: int
    role: str
    agent_raw: str
    role_class: RoleClass
    action_type: ActionType
    content: str
    head: str
    tail: str
    content_len: int
    step_hash: str
    exit_code: int | None
    success: bool | None
    verifier_signal: VerifierSignal | None
    delegate_target: str | None


def classify_action(role: str, klass: RoleClass, content: str, delegate_target: str | None) -> ActionType:
    """The action type by the decision order 1-9 in docs/methods/rcta.md."""
    if role == "user" and klass == "human":
        return "message"
    if role == "user" and klass == "terminal":
        return "observation"
    if delegate_target is not None:
        return "delegate"
    if klass == "verifier":
        return "judge"
    if _FINISH.search(content):
        return "finish"
    if _BASH_FENCE.search(content):
        return "bash"
    if _PYTHON_FENCE.search(content):
        return "python"
    if "<think>" in content and len(_THINK_BLOCK.sub("", content).strip()) < THINKING_MAX_OUTSIDE_CHARS:
        return "thinking"
    return "message"


def parse_exit_code(content: str) -> int | None:
    """The exit code a step reports: ``exit/return code [:=] N`` first, else ``exited with code N``."""
    match = _EXIT_CODE.search(content) or _EXITED_WITH.search(content)
    return int(match.group(1)) if match is not None else None


def infer_success(code: int | None, content: str) -> bool | None:
    """Whether the step succeeded: by its exit code, else False on an error token, else unknown (None)."""
    if code is not None:
        return code == 0
    if _ERROR_TOKEN.search(content):
        return False
    return None


def detect_verifier_signal(klass: RoleClass, content: str) -> VerifierSignal | None:
    """``"FAIL"`` or ``"PASS"`` for a verifier or terminal step whose text says so (FAIL tested first)."""
    if klass not in _SIGNALLING_CLASSES:
        return None
    if _VERIFIER_FAIL.search(content):
        return "FAIL"
    if _VERIFIER_PASS.search(content):
        return "PASS"
    return None


def compute_step_hash(step_id: int, agent_raw: str, content: str) -> str:
    """16 hex digits of SHA-1 over ``"{id}|{name}|{first 200}|{last 200 or ''}"`` in UTF-8."""
    head = content[:HASH_HEAD_CHARS]
    tail = content[-HASH_TAIL_CHARS:] if len(content) > HASH_HEAD_CHARS else ""
    key = f"{step_id}|{agent_raw}|{head}|{tail}"
    return hashlib.sha1(key.encode("utf-8", errors="replace"), usedforsecurity=False).hexdigest()[:16]


def enrich_step(step: Step) -> EnrichedStep:
    """The enriched form of one recorded step."""
    content = step.content
    klass = role_class(step.agent)
    handoff = step.handoff
    target = handoff.recipient if handoff is not None else None
    code = parse_exit_code(content)
    return EnrichedStep(
        step_id=step.index,
        role=step.role,
        agent_raw=step.agent,
        role_class=klass,
        action_type=classify_action(step.role, klass, content, target),
        content=content,
        head=content[:HEAD_CHARS],
        tail=content[-TAIL_CHARS:] if len(content) > HEAD_CHARS else "",
        content_len=len(content),
        step_hash=compute_step_hash(step.index, step.agent, content),
        exit_code=code,
        success=infer_success(code, content),
        verifier_signal=detect_verifier_signal(klass, content),
        delegate_target=target,
    )


def enrich(trajectory: Trajectory) -> tuple[EnrichedStep, ...]:
    """Every step of a trajectory enriched, in order (``result[i].step_id == i``)."""
    return tuple(enrich_step(step) for step in trajectory.steps)
