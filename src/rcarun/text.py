"""Text every layer must be able to store and send: the one rule for unpaired UTF-16 surrogates.

JSON may escape half of a surrogate pair (``"\\ud800"``), as when a provider or a dataset cuts an answer
mid-emoji, and Python's json decodes it into a ``str`` that cannot be encoded to UTF-8: SQLite refuses it and
so does every HTTP body. Wire parsing, the dataset loader, answer readers and the store all meet such text, and
all repair it the same way, replacing each unpaired surrogate with U+FFFD (a properly paired escape decodes to
one code point and is never touched).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["first_lone_surrogate", "repair_surrogates"]

# A Python str holds code points, so any code point in this range is an unpaired half of a surrogate pair.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def first_lone_surrogate(text: str) -> int | None:
    """The index of the first unpaired surrogate in ``text``, or None when it encodes to UTF-8 as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def repair_surrogates(text: str) -> str:
    """``text`` with each unpaired surrogate replaced by U+FFFD (the same object when there is none)."""
    if first_lone_surrogate(text) is None:
        return text
    return _SURROGATE.sub("\ufffd", text)
