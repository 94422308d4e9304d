"""Who holds a port and whose replica it is, read from /proc: the listening socket's process, its group and
rcarun's marker, a dead or reused pid told from a live rcarun, and the end of every process a dead rcarun left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rcarun.serving.ports import (
    MARKER,
    PortHolder,
    end_marked,
    identity_alive,
    port_free,
    port_holders,
    process_identity,
)
from serving.fake import alive

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")

_LISTEN = "import socket, sys, time; s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(); "
_LISTEN += "print(s.getsockname()[1], flush=True); time.sleep(60)"


@contextlib.contextmanager
def _listener(address: str, marker: str | None) -> Iterator[tuple[subprocess.Popen[str], int]]:
    env = {key: value for key, value in os.environ.items() if key != MARKER}
    if marker is not None:
        env[MARKER] = marker
    process = subprocess.Popen(
        [sys.executable, "-c", _LISTEN, address],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        yield process, int(process.stdout.readline())
    finally:
        process.kill()
        process.wait()


def _dead_identity() -> str:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = process_identity(process.pid)
    process.kill()
    process.wait()
    return identity


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0"])
def test_the_process_listening_on_a_port_is_found_with_its_group_and_marker(address: str) -> None:
    with _listener(address, "123:456") as (process, port):
        assert not port_free("127.0.0.1", port)
        (holder,) = port_holders("127.0.0.1", port) or []
        assert holder.pid == process.pid and holder.pgid == process.pid  # a session leader of its own
        assert holder.owner == "123:456" and "socket.socket()" in holder.command
    assert port_free("127.0.0.1", port)
    assert port_holders("127.0.0.1", port) == []


def test_an_unmarked_listener_names_no_rcarun() -> None:
    with _listener("127.0.0.1", None) as (_, port):
        (holder,) = port_holders("127.0.0.1", port) or []
        assert holder.owner is None and not holder.stale


def test_an_identity_is_alive_only_while_that_very_process_runs() -> None:
    assert identity_alive(process_identity(os.getpid()))
    assert not identity_alive(_dead_identity())
    start = process_identity(os.getpid()).partition(":")[2]
    assert not identity_alive(f"{os.getpid()}:{int(start) + 1}")  # the pid, reused by a later process
    assert not identity_alive("not-a-pid:1")
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = process_identity(zombie.pid)
    zombie.send_signal(signal.SIGKILL)
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    assert not identity_alive(identity)  # killed, not yet reaped: gone all the same
    zombie.wait()


def test_a_holder_is_stale_when_the_rcarun_its_marker_names_is_gone() -> None:
    assert PortHolder(pid=1, pgid=1, command="x", owner=_dead_identity()).stale
    assert not PortHolder(pid=1, pgid=1, command="x", owner=process_identity(os.getpid())).stale


def test_ending_a_dead_rcarun_s_replicas_kills_every_process_it_marked_and_nothing_else() -> None:
    dead = _dead_identity()
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    marked = [subprocess.Popen(sleep, env={**os.environ, MARKER: dead}) for _ in range(2)]
    other = subprocess.Popen(sleep, env={**os.environ, MARKER: process_identity(os.getpid())})
    try:
        deadline = time.monotonic() + 10
        # The marker is in /proc/PID/environ once exec is done.
        while any(
            f"{MARKER}={dead}".encode() not in Path(f"/proc/{p.pid}/environ").read_bytes() for p in marked
        ):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert sorted(end_marked(dead)) == sorted(p.pid for p in marked)
        assert [p.wait(timeout=5) for p in marked] == [-9, -9]
        assert alive(other.pid)
    finally:
        for process in (*marked, other):
            process.kill()
            process.wait()
