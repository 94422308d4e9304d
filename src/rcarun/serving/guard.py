"""The process between rcarun and one replica: it ends the replica's process group when rcarun dies.

SIGKILL or the OOM killer gives rcarun no chance to stop its replicas, so each runs under this guard, which ends
the group once its parent is no longer ``--owner``. Standard library only, run by path in isolated mode, so it
starts fast. How it works: docs/reliability.md ("The replica guard").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["POLL_S", "main"]

POLL_S = 0.2
"""How often the guard looks whether rcarun still runs (its child's exit wakes it at once)."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_EXIT_CANNOT_RUN = 127


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rcarun-guard", description="run a replica; end its group when rcarun dies"
    )
    parser.add_argument(
        "--owner", type=int, required=True, help="pid of the rcarun process this replica serves"
    )
    parser.add_argument("--grace", type=float, required=True, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the replica's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # the group it ends must be its own, never its caller's
    wake = _wake_on_signals()
    if os.getppid() != args.owner:
        return 0  # rcarun died before the guard ran: start nothing
    try:
        child = subprocess.Popen(command, stdout=2, stderr=2, preexec_fn=_dies_with(os.getpid()))
    except (OSError, subprocess.SubprocessError) as exc:
        _tell_rcarun(f"error {exc}")
        return _EXIT_CANNOT_RUN
    _tell_rcarun(f"pid {child.pid}")
    while True:
        status = _reap(child)
        if status is not None:
            if os.getppid() != args.owner:
                os.killpg(os.getpgrp(), signal.SIGKILL)  # what the replica left, with no rcarun to end it
            return _exit_as(status)
        if os.getppid() != args.owner:
            _end_group(child, args.owner, args.grace, wake)
        _sleep(wake, POLL_S)


def _wake_on_signals() -> int:
    """A pipe SIGCHLD and SIGTERM write to, so a wait wakes at once (handlers, reset by exec for the child)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    for signum in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(signum, _note)
    return read


def _note(signum: int, frame: Any) -> None:
    """SIGTERM is for the child (it reaches the whole group); the guard waits for the child to exit."""


def _sleep(wake: int, seconds: float) -> None:
    select.select([wake], [], [], seconds)
    try:
        while os.read(wake, 512):
            pass
    except BlockingIOError:
        pass


def _dies_with(guard_pid: int) -> Callable[[], None] | None:
    """In the child before exec: SIGTERM when the guard dies (Linux), or exit if it is already gone."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        # prctl reads unsigned longs: pass that width, or the upper half of a register is whatever it was.
        libc.prctl(
            _PR_SET_PDEATHSIG,
            ctypes.c_ulong(signal.SIGTERM),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
        if os.getppid() != guard_pid:
            os._exit(1)

    return arm


def _tell_rcarun(line: str) -> None:
    """One line on stdout (a pipe rcarun reads), then stdout is /dev/null: nothing else goes there."""
    with contextlib.suppress(OSError):  # rcarun already gone: the wait that follows sees it
        os.write(1, f"{line}\n".encode())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _reap(child: subprocess.Popen[bytes]) -> int | None:
    """The child's exit status (``-N`` for signal N) once it has exited, else None."""
    pid, status = os.waitpid(child.pid, os.WNOHANG)
    if pid == 0:
        return None
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode


def _end_group(child: subprocess.Popen[bytes], owner: int, grace_s: float, wake: int) -> None:
    """rcarun is gone: SIGTERM to the group, SIGKILL to what is left after ``grace_s`` (the guard too)."""
    print(
        f"rcarun guard: rcarun (pid {owner}) is gone; ending replica pid {child.pid} and its process group "
        f"(SIGTERM, SIGKILL after {grace_s:g} s)",
        file=sys.stderr,
        flush=True,
    )
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _reap(child) is None and time.monotonic() < deadline:
        _sleep(wake, min(POLL_S, max(0.0, deadline - time.monotonic())))
    os.killpg(group, signal.SIGKILL)


def _exit_as(status: int) -> int:
    """Exit as the child did: its code, or killed by the same signal."""
    if status >= 0:
        return status
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep their default anyway
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    return 128 - status


if __name__ == "__main__":
    sys.exit(main())
