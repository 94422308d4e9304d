"""A reader that stops reading is not an error: `rcarun report | head` ends quietly.

When the other end of stdout goes away, the next write raises `BrokenPipeError`, and the interpreter's own flush
at exit raises it again (exit status 120). `survives_closed_stdout` catches it around a command, points stdout
(and stderr, when that was the closed one) at the null device and returns `CLOSED_PIPE_STATUS`: 141, 128 +
SIGPIPE, what a shell reports for ``grep`` in the same place (a success without ``set -o pipefail``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from collections.abc import Callable
from typing import Final, ParamSpec, TextIO

__all__ = ["CLOSED_PIPE_STATUS", "silence_closed_output", "survives_closed_stdout"]

CLOSED_PIPE_STATUS: Final = 141
"""128 + SIGPIPE: the status a shell shows for a tool whose reader went away."""

_P = ParamSpec("_P")


def _point_at_null(stream: TextIO) -> None:
    """Send what is left of ``stream`` (buffered text included) to the null device instead of its closed pipe."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return  # not a real file (a test's capture): nothing will flush it into a pipe
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)


def silence_closed_output() -> int:
    """After a `BrokenPipeError`: stop every later write and the exit-time flush from raising it again.

    stdout is flushed where it still can be (the closed pipe may be stderr's) and then pointed at the null
    device; stderr too, but only when it is the closed one, so that a message on a working terminal is never
    lost.

    Returns:
        `CLOSED_PIPE_STATUS`, for the command to exit with.
    """
    with contextlib.suppress(BrokenPipeError, ValueError):
        sys.stdout.flush()
    _point_at_null(sys.stdout)
    try:
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        _point_at_null(sys.stderr)
    return CLOSED_PIPE_STATUS


def survives_closed_stdout(command: Callable[_P, int]) -> Callable[_P, int]:
    """Wrap a command that returns its exit status so that a closed stdout ends it with `CLOSED_PIPE_STATUS`.

    stdout is flushed inside the wrapper, so a pipe that closed after the last ``print`` is caught here too, not
    at interpreter exit. Usable on any ``cmd_*`` function and on ``rcarun.cli.main`` itself.
    """

    @functools.wraps(command)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> int:
        try:
            status = command(*args, **kwargs)
            with contextlib.suppress(ValueError):  # a closed capture stream in tests: nothing to flush
                sys.stdout.flush()
        except BrokenPipeError:
            return silence_closed_output()
        return status

    return wrapper
