"""Role names compared the way the LongRCA benchmark scorer compares them, and explicit handoffs.

Why a module of its own: the same rule must decide a reference's validity when a dataset is loaded, a
prediction's correctness when it is scored and a handoff's sender when a method reads the log. One
implementation keeps those three in agreement.

Scorer normalisation (`normalize_role`, the benchmark's leaderboard rule, LongRCA App. L.1):
    1. trim surrounding whitespace;
    2. remove ONE trailing explicit handoff suffix ``(-> X)`` or ``(→ X)`` where X holds no parentheses
       (with the whitespace before it);
    3. Unicode NFKC;
    4. casefold;
    5. collapse runs of whitespace to one space.
Any other parenthetical survives: ``"Planner (Review)"`` stays distinct from ``"Planner"``. A predicted role is
correct when its normalised form is non-empty and equals the reference's normalised form.

The component-ablation rule of the paper ("normalizes case and whitespace while retaining handoff suffixes") is
``keep_handoff=True``: steps 1, 3, 4 and 5 only.

Handoff detection (`parse_handoff`): a label is an explicit handoff when, after trimming, it ends with
``(-> X)`` or ``(→ X)`` where X is non-empty and holds no parentheses; the sender is the text before the
suffix (trimmed, non-empty), the recipient is X trimmed. LongRCA records carry the handoff in the step's
``name`` (``"DiagnostAgent (-> ActionAgent)"``), Who&When's Magentic-One logs in its ``role``
(``"Orchestrator (-> WebSurfer)"``); `rcarun.data.Step.handoff` looks at the name first, then the role.
Other suffixes (``"Orchestrator (thought)"``) are not handoffs.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

__all__ = ["Handoff", "normalize_role", "parse_handoff", "role_matches", "strip_handoff_suffix"]

_HANDOFF_SUFFIX = re.compile(r"\s*\((?:->|→)\s*([^()]*?)\s*\)$")


@dataclass(frozen=True, slots=True)
class Handoff:
    """An explicit instruction from one agent to another, read from a recorded label.

    Attributes:
        sender: the agent that hands off, e.g. ``"DiagnostAgent"``.
        recipient: the agent handed to, e.g. ``"ActionAgent"``.
    """

    sender: str
    recipient: str


def strip_handoff_suffix(role: str) -> str:
    """The role trimmed and without one trailing ``(-> X)`` / ``(→ X)`` suffix (step 1 and 2 of the rule)."""
    return _HANDOFF_SUFFIX.sub("", role.strip(), count=1).strip()


def normalize_role(role: str, *, keep_handoff: bool = False) -> str:
    """The scorer's normal form of a role name (see the module docstring for the five steps).

    Args:
        role: a recorded or predicted role name.
        keep_handoff: the ablation rule: keep a trailing handoff suffix as part of the name.

    Returns:
        The normal form; ``""`` when nothing is left.
    """
    if len(role) <= _MEMO_MAX_CHARS:
        return _memo_normal_form(role, keep_handoff)
    return _normal_form(role, keep_handoff)


def _normal_form(role: str, keep_handoff: bool) -> str:
    trimmed = role.strip() if keep_handoff else strip_handoff_suffix(role)
    return " ".join(unicodedata.normalize("NFKC", trimmed).casefold().split())


# A sweep normalises the same few agent names for every record it loads and every answer it scores; a bounded
# memo of the short ones (agent names are) saves the regex and NFKC each time, and its size stays fixed.
_MEMO_MAX_CHARS = 200
_memo_normal_form = functools.lru_cache(maxsize=4096)(_normal_form)


def role_matches(predicted: str | None, reference: str, *, keep_handoff: bool = False) -> bool:
    """True when the normalised prediction is non-empty and equals the normalised reference."""
    if predicted is None:
        return False
    normal = normalize_role(predicted, keep_handoff=keep_handoff)
    return bool(normal) and normal == normalize_role(reference, keep_handoff=keep_handoff)


def parse_handoff(label: str) -> Handoff | None:
    """The handoff a recorded name or role announces, or None when it announces none."""
    trimmed = label.strip()
    match = _HANDOFF_SUFFIX.search(trimmed)
    if match is None:
        return None
    sender = trimmed[: match.start()].strip()
    recipient = match.group(1).strip()
    if not sender or not recipient:
        return None
    return Handoff(sender=sender, recipient=recipient)
