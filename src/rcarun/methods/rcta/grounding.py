"""Quote grounding: does a quote cited from a handoff really come from that handoff's logged text?

A4 checks the provenance of cited instruction text (paper Sec. 4.2, App. F) with the release's rule (notes
3.10). Normalisation, words and thresholds: ``docs/methods/rcta.md`` ("Quote grounding").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "MIN_QUOTE_CHARS",
    "MIN_QUOTE_WORDS",
    "MIN_WORD_CHARS",
    "GroundingDetail",
    "GroundingRule",
    "grounding_detail",
    "normalize_quote_text",
    "quote_is_grounded",
    "quote_words",
]

GroundingRule = Literal["substring", "words"]

MIN_QUOTE_CHARS = 15
MIN_QUOTE_WORDS = 4
MIN_WORD_CHARS = 4
_WORD_SHARE_NUMERATOR, _WORD_SHARE_DENOMINATOR = 4, 5  # at least 80% of the quote's words

_WORD_RUN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class GroundingDetail:
    """Why a quote is or is not grounded: the rule that did (``"substring"`` tried first) and the counts.

    ``substring`` is computed even for a quote too short to count; ``word_share`` is None without words.
    """

    grounded: bool
    rule: GroundingRule | None
    quote_chars: int
    substring: bool
    quote_words: int
    shared_words: int
    word_share: float | None


def normalize_quote_text(text: str) -> str:
    """Whitespace runs collapsed to one space, trimmed and lowercased; punctuation kept."""
    return " ".join(text.split()).lower()


def quote_words(text: str) -> frozenset[str]:
    """The distinct lowercased words of 4+ characters of ``text`` (docs/methods/rcta.md)."""
    return frozenset(word.lower() for word in _WORD_RUN.findall(text) if len(word) >= MIN_WORD_CHARS)


def grounding_detail(quote: str, source_text: str) -> GroundingDetail:
    """Apply the grounding rule to a cited ``quote`` and the handoff text it claims; report what matched."""
    quote_norm = normalize_quote_text(quote)
    substring = bool(quote_norm) and quote_norm in normalize_quote_text(source_text)
    words = quote_words(quote)
    shared = len(words & quote_words(source_text)) if words else 0
    long_enough = len(quote_norm) >= MIN_QUOTE_CHARS
    n_words = len(words)
    share_ok = _WORD_SHARE_DENOMINATOR * shared >= _WORD_SHARE_NUMERATOR * n_words  # exact 80%, no floats
    words_match = n_words >= MIN_QUOTE_WORDS and share_ok
    rule: GroundingRule | None = None
    if long_enough and substring:
        rule = "substring"
    elif long_enough and words_match:
        rule = "words"
    return GroundingDetail(
        grounded=rule is not None,
        rule=rule,
        quote_chars=len(quote_norm),
        substring=substring,
        quote_words=n_words,
        shared_words=shared,
        word_share=shared / n_words if n_words else None,
    )


def quote_is_grounded(quote: str, source_text: str) -> bool:
    """True when ``quote`` is grounded in ``source_text`` by the rule in docs/methods/rcta.md."""
    return grounding_detail(quote, source_text).grounded
