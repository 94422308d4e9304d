"""The guard between rcarun and a replica, run as rcarun runs it: it reports the replica's pid, exits as the
replica did, and ends the replica's whole process group (SIGTERM, SIGKILL after the grace) once rcarun is gone,
whatever killed rcarun."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rcarun.serving import guard
from serving.fake import alive

GUARD = [sys.executable, "-I", guard.__file__]
# A replica with a child of its own (a vLLM worker), both pids written to a file, then sleeping.
_REPLICA = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    if sys.argv[2] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(sys.argv[1], "w") as f:
        f.write(f"{__import__('os').getpid()} {child.pid}")
    time.sleep(60)
    """
)


def _run_guard(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GUARD, "--owner", str(os.getpid()), "--grace", "1", "--", *command],
        capture_output=True,
        text=True,
        timeout=20,
        start_new_session=True,
    )


def test_the_guard_reports_the_pid_and_exits_as_its_replica_did() -> None:
    done = _run_guard(sys.executable, "-c", "import os; print(os.getpid(), flush=True); raise SystemExit(3)")
    reported, printed = done.stdout.split("\n")[:2]
    assert done.returncode == 3
    # The replica's own output goes where the guard's stderr goes (the replica's log), never to the pid pipe.
    assert reported.startswith("pid ") and printed == ""
    assert reported == f"pid {done.stderr.split()[0]}"
    assert (
        _run_guard(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)").returncode
        == -9
    )


def test_the_guard_says_in_one_line_when_the_command_cannot_run() -> None:
    done = _run_guard("/nonexistent/vllm", "serve")
    assert done.returncode == 127
    assert done.stdout.startswith("error ") and "/nonexistent/vllm" in done.stdout
    assert done.stdout.count("\n") == 1


@pytest.mark.parametrize(("behaviour", "gone_within_s"), [("obey", 2.0), ("ignore", 3.0)])
def test_the_replica_and_its_children_end_when_the_guards_owner_is_sigkilled(
    tmp_path: Path, behaviour: str, gone_within_s: float
) -> None:
    pid_file = tmp_path / "pids"
    # The owner starts the guard the way rcarun does (session leader, its own pid as --owner) and sleeps.
    owner_code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        subprocess.Popen(
            {GUARD!r} + ["--owner", str(os.getpid()), "--grace", "1", "--",
                         sys.executable, "-c", {_REPLICA!r}, {str(pid_file)!r}, {behaviour!r}],
            start_new_session=True,
        )
        time.sleep(60)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code])
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or len(pid_file.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the replica never started"
            time.sleep(0.05)
        pids = [int(pid) for pid in pid_file.read_text().split()]
        assert all(alive(pid) for pid in pids)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        killed_at = time.monotonic()
        while any(alive(pid) for pid in pids):
            assert time.monotonic() - killed_at < gone_within_s, (
                f"still running: {[p for p in pids if alive(p)]}"
            )
            time.sleep(0.05)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_a_guard_whose_owner_is_already_gone_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    done = subprocess.run(
        [*GUARD, "--owner", "1", "--grace", "1", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True,
        timeout=20,
    )
    assert done.returncode == 0 and done.stdout == b"" and not marker.exists()


def test_a_guard_killed_alone_takes_its_replica_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    replica = [sys.executable, "-c", _REPLICA, str(pid_file), "obey"]
    guard_process = subprocess.Popen(
        [*GUARD, "--owner", str(os.getpid()), "--grace", "1", "--", *replica],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or len(pid_file.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the replica never started"
            time.sleep(0.05)
        leader = int(pid_file.read_text().split()[0])
        guard_process.send_signal(signal.SIGKILL)
        guard_process.wait()
        killed_at = time.monotonic()
        while alive(leader):  # PR_SET_PDEATHSIG: SIGTERM when the guard dies
            assert time.monotonic() - killed_at < 2.0, "the replica outlived its guard"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(guard_process.pid, signal.SIGKILL)  # the replica's worker, left to its group
