"""What a command prints is shown, never obeyed: stdout passes every write through `rcarun.text.terminal_safe`.

`rcarun show` prints answers, reasoning and prompts that quote trajectory steps; the report, the sweep summary
and `data check` quote names, error messages and server text. Any of them may hold the escape sequences that
clear a screen, retitle a window or write the clipboard (OSC 52). Escaping at each print would miss the next one,
so `main` writes to stdout through `SafeStdout` for the whole command: text shows control characters as visible
escapes, and JSON stays valid and parses back equal (C0 is already escaped by ``json.dumps``; what it leaves raw
becomes a ``\\uXXXX`` escape). Lines to stderr go through `terminal_safe` where they are printed, since the
progress bars draw there with control sequences of their own.
"""

from __future__ import annotations

import io
from typing import TextIO

from rcarun.text import terminal_safe

__all__ = ["SafeStdout"]


class SafeStdout(io.TextIOBase):
    """``stream`` with every write made `terminal_safe`; the rest (flush, fileno, isatty) is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(terminal_safe(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.stream.errors
