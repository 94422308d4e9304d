"""Text every layer must be able to store and send: the one rule for unpaired UTF-16 surrogates.

JSON may escape half of a surrogate pair (``"\\ud800"``), as when a provider or a dataset cuts an answer
mid-emoji, and Python's json decodes it into a ``str`` that cannot be encoded to UTF-8: SQLite refuses it and
so does every HTTP body. Wire parsing, the dataset loader, answer readers and the store all meet such text, and
all treat it by this module's rule: each unpaired surrogate becomes U+FFFD (a properly paired escape decodes to
one code point and is never touched). Both functions cost O(1) on ASCII text, the common case.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["first_lone_surrogate", "repair_surrogates"]

# A str decoded from JSON holds code points, so any code point in this range is half of a pair, alone.
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


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
