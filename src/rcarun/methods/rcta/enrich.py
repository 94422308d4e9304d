"""Step enrichment: the per-step facts RCTA's deterministic parts read (release notes 3.3; no LLM).

Why: the segmenter cuts on finish actions, verifier PASS/FAIL flips and role-class shifts, and the later stages
show heads/tails, fingerprints and handoff targets. Computing those facts once, from the recorded name, role and
text only, keeps every consumer in agreement and makes each rule testable alone.

Fields of an `EnrichedStep` (one per `rcarun.data.Step`):

- ``step_id`` = `Step.index`; ``role`` = `Step.role` (the chat role in LongRCA and AG2, the raw Magentic-One
  role such as ``"Orchestrator (thought)"`` in Who&When hand_crafted); ``agent_raw`` = `Step.agent`;
  ``role_class`` = `role_class(agent_raw)` with the PAPER's App. H list (`rcarun.methods.rcta.roles`), not the
  release's narrower one (the paper is the default where the two differ).
- ``content`` in full; ``head`` = the first 500 characters; ``tail`` = the last 500 characters, or ``""`` when
  the content is at most 500 characters long (the release's choice: the tail never repeats a short head);
  ``content_len`` = ``len(content)`` in code points (the unit every character limit of RCTA uses).
- ``delegate_target`` = `Step.handoff`'s recipient (the name's ``(-> X)`` first, else the role's), else None.

``action_type``, the first rule that matches (the release's order; its ``action_finish`` / ``action_bash`` /
``action_python`` are called ``finish`` / ``bash`` / ``python`` here):

1. chat role exactly ``"user"`` and class ``human`` → ``message``;
2. chat role exactly ``"user"`` and class ``terminal`` → ``observation``;
3. a delegate target → ``delegate``;
4. class ``verifier`` → ``judge``;
5. the content contains ``finish(`` (a word boundary before ``finish``, optional whitespace before the
   parenthesis, any case) → ``finish``;
6. a fenced block opened as ```` ```bash ````, ```` ```shell ```` or ```` ```sh ```` (any case, optional
   whitespace after the backticks) → ``bash``;
7. a fenced block opened as ```` ```python ```` → ``python``;
8. the content contains the literal ``<think>`` and, with every closed ``<think>...</think>`` block removed
   (any case, across lines) and the rest trimmed, fewer than 80 characters remain → ``thinking`` (the text of
   an unclosed block counts as outside it);
9. otherwise ``message``.

Rules 1 and 2 compare the chat role as recorded, as the release does, so they never fire on Who&When
hand_crafted, whose roles are Magentic-One labels (``"human"``, ``"ComputerTerminal"``); those steps fall
through to the later rules.

``exit_code``: the first match of ``exit code`` / ``exit_code`` / ``exitcode`` / ``return code`` /
``return_code`` / ``returncode`` followed by ``:`` or ``=`` and an integer (any case, optional whitespace
around the separator; this already covers AG2's ``"exitcode: 1 (execution failed)"``); only when that pattern
is absent anywhere, the first ``exited with code N``. The release's precedence: the first pattern wins even
when the second occurs earlier. Forms without a separator (``"exit code 1"``) are not parsed.

``success``: ``exit_code == 0`` when an exit code was parsed; else False when a whole-word, case-sensitive
error token ``Error``, ``Traceback``, ``Exception``, ``FAIL`` or ``fatal`` appears (so ``"TypeError"`` alone
does not count, a traceback does); else None (unknown).

``verifier_signal``: only for steps of class ``verifier`` or ``terminal``, else None. FAIL phrases are tested
first, then PASS phrases, all case-insensitive, ``\\s`` standing for any whitespace run:

- FAIL: ``verdict[:=]fail``, ``verify[:=]fail`` (whitespace allowed around the separator), ``test(s) failed``,
  ``assertion error`` / ``AssertionError``, ``verification fail...``;
- PASS: ``verdict[:=]pass``, ``verify[:=]pass``, ``test(s) passed``, ``all tests pass...``,
  ``verification success...``.

These are the release's lists, kept because the paper only says the markers are optional boundary cues. They
are crude on purpose (``"0 tests failed"`` reads as FAIL) and never used as a judgement of the run.

``step_hash``: the first 16 hex digits of SHA-1 over the UTF-8 bytes of
``f"{step_id}|{agent_raw}|{head200}|{tail200}"``, where ``head200`` is the first 200 characters of the content
and ``tail200`` the last 200 characters when the content is longer than 200, else ``""`` (the release's
layout). Characters UTF-8 cannot encode (lone surrogates) become ``?``. The hash fingerprints a step for
caches and audit trails; it is not a security device.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

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
ACTION_TYPES: tuple[ActionType, ...] = (
    "message",
    "observation",
    "delegate",
    "judge",
    "finish",
    "bash",
    "python",
    "thinking",
)
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
    """One step with the facts RCTA's deterministic stages read (rules in the module docstring).

    Attributes:
        step_id: the step's 0-based index, the id methods predict.
        role: the recorded chat role (`Step.role`).
        agent_raw: the recorded agent name (`Step.agent`), possibly a handoff form.
        role_class: the App. H class of `agent_raw`.
        action_type: what the step does, by the nine-rule decision order.
        content: the full text.
        head: the first 500 characters.
        tail: the last 500 characters, ``""`` when the content is at most 500 characters.
        content_len: ``len(content)``.
        step_hash: 16 hex digits fingerprinting id, name and the content's ends.
        exit_code: the parsed exit/return code, or None.
        success: True/False from the exit code or error tokens, None when unknown.
        verifier_signal: ``"PASS"``/``"FAIL"`` for verifier and terminal steps that say so, else None.
        delegate_target: the recipient of the step's explicit handoff, or None.
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
    """The action type by the decision order 1-9 of the module docstring."""
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
