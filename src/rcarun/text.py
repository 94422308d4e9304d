"""Text every layer must be able to store, send and show: the rules for unpaired surrogates and for control
characters.

JSON may escape half of a surrogate pair (``"\\ud800"``), as when a provider or a dataset cuts an answer
mid-emoji, and Python's json decodes it into a ``str`` that cannot be encoded to UTF-8: SQLite refuses it and
so does every HTTP body. Wire parsing, the dataset loader, answer readers and the store all meet such text, and
all treat it by this module's rule: each unpaired surrogate becomes U+FFFD (a properly paired escape decodes to
one code point and is never touched). Both functions cost O(1) on ASCII text, the common case.

Answers, reasoning and trajectory steps hold whatever a model or an agent wrote, terminal control sequences
included: clear-screen, window titles, OSC 52 clipboard writes, hyperlinks, carriage returns that overwrite a line.
`terminal_safe` is the one rule for text shown to a person: every character that steers a terminal (C0 but newline
and tab, a carriage return not before a newline, DEL, C1, bidirectional overrides and isolates) is shown as a
visible escape instead, ``\x1b`` for C0 as Python's repr writes it, ``\u009b`` for the rest, which JSON reads back
as the same character, so JSON passed through it stays valid and equal.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["first_lone_surrogate", "repair_surrogates", "terminal_safe"]

# A str decoded from JSON holds code points, so any code point in this range is half of a pair, alone.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# What steers a terminal: C0 but tab and newline, a carriage return that overwrites (not one of a CRLF), DEL, C1
# (U+009B is a one-character CSI), and the bidirectional embeddings, overrides and isolates that reorder a line.
_TERMINAL_CONTROL: Final = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)"
)


def first_lone_surrogate(text: str) -> int | None:
    """The 0-based index of the first unpaired surrogate in ``text``, or None when there is none."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def repair_surrogates(text: str) -> str:
    """``text`` with each unpaired surrogate replaced by U+FFFD (the very same object when there is none).

    Two halves that arrived as separate code points are joined back into their character on the way.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with every terminal control character shown as a visible escape; newlines, tabs and all printable
    text, CJK and emoji included, are left as they are."""
    return _TERMINAL_CONTROL.sub(_visible, text)
