"""The methods' prompt files (``rcarun/methods/prompts``), as templates filled once per call.

Why not `string.Template` as is: its ``substitute`` runs a regular expression over the whole prompt text on every
call, with a Python callback per placeholder (4.3 us for the all-at-once prompt, against 1.2 here; inside a
sweep every part of a call's path costs about three times its time alone, docs/performance.md).
`PromptTemplate` is a `string.Template` that finds its placeholders once, when it is made, and fills them by
joining the pieces; the text it returns is the one `string.Template.substitute` returns, its errors
(`KeyError` for a name not given, `ValueError` for a ``$`` that starts no placeholder) the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from string import Template
from typing import Any

__all__ = ["PromptTemplate", "load_prompt"]


class PromptTemplate(Template):
    """A `string.Template` whose ``substitute`` fills placeholders found once, at construction."""

    def __init__(self, template: str) -> None:
        super().__init__(template)
        # Literal text at even positions, placeholder names at odd ones; None where the text holds a "$" that
        # starts no placeholder (`string.Template.substitute` raises for it, with its own message).
        self._pieces: tuple[str, ...] | None = None
        pieces: list[str] = []
        literal_start = 0
        for match in self.pattern.finditer(template):
            if match.group("invalid") is not None:
                return
            name = match.group("named") or match.group("braced")
            if name is None:  # "$$"
                continue
            pieces.append(template[literal_start : match.start()].replace(self.delimiter * 2, self.delimiter))
            pieces.append(name)
            literal_start = match.end()
        pieces.append(template[literal_start:].replace(self.delimiter * 2, self.delimiter))
        self._pieces = tuple(pieces)

    def substitute(self, mapping: Mapping[str, Any] | None = None, /, **kws: Any) -> str:
        pieces = self._pieces
        if pieces is None or mapping is not None:
            return super().substitute(mapping or {}, **kws)
        filled = list(pieces)
        for position in range(1, len(filled), 2):
            filled[position] = str(kws[filled[position]])
        return "".join(filled)


def load_prompt(name: str) -> PromptTemplate:
    """The prompt file ``rcarun/methods/prompts/<name>`` as a template."""
    return PromptTemplate(
        resources.files("rcarun.methods").joinpath("prompts", name).read_text(encoding="utf-8")
    )
