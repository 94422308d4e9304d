"""Role names compared the way the LongRCA benchmark scorer compares them, and explicit handoffs.

One rule decides a reference's validity at load, a prediction's correctness when scored and a handoff's
sender when a method reads the log; one implementation keeps the three in agreement. The normalisation (LongRCA
App. L.1) and the handoff rule: docs/reliability.md ("Role names and handoffs").
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
    """An explicit instruction from one agent to another, read from a recorded label."""

    sender: str
    recipient: str


def strip_handoff_suffix(role: str) -> str:
    """The role trimmed and without one trailing ``(-> X)`` / ``(→ X)`` suffix (step 1 and 2 of the rule)."""
    return _HANDOFF_SUFFIX.sub("", role.strip(), count=1).strip()


def normalize_role(role: str, *, keep_handoff: bool = False) -> str:
    """The scorer's normal form of a role name (``""`` when nothing is left); ``keep_handoff`` is the ablation
    rule that keeps a trailing handoff suffix."""
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
