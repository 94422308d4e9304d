"""Managed replicas never outlive rcarun, and a run is never served by a server it did not start: `rcarun sweep`
and `rcarun serve` SIGKILLed (mid-run, during start-up, with replicas ignoring SIGTERM) leave no replica process
running; a replica left by a killed rcarun is ended with one line and a foreign server refused with one; the
server that answers must be the replica's own; a ``VLLM_API_KEY`` in the shell does not lock the client out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcarun.serving import ManagedReplicas, ServeError
from rcarun.serving.ports import MARKER, process_identity
from serving.fake import (
    FAKE_COMMAND,
    alive,
    fake_spec,
    free_port_base,
    managed_sweep_toml,
    recorded_pids,
    start_rcarun,
    wait_for_pids,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc"),
]


def _gone_within(pids: list[int], seconds: float) -> None:
    started = time.monotonic()
    while living := [pid for pid in pids if alive(pid)]:
        assert time.monotonic() - started < seconds, f"{len(living)} of {len(pids)} still running: {living}"
        time.sleep(0.05)


def _kill_left(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("command", "behaviour", "settle_s", "gone_within_s"),
    [
        ("sweep", {"mock": {"latency_s": 0.5}}, 1.0, 2.0),
        (
            "sweep",
            {"mock": {"latency_s": 0.5}, "ignore_sigterm": True},
            1.0,
            3.0,
        ),  # grace_s = 1, then SIGKILL
        ("sweep", {"startup_s": 30}, 0.2, 2.0),  # killed while the replicas load
        ("serve", {"mock": {"latency_s": 0.5}}, 1.0, 2.0),
    ],
    ids=["sweep-mid-run", "sweep-replicas-ignore-sigterm", "sweep-during-start-up", "serve"],
)
def test_a_sigkilled_rcarun_leaves_no_replica_or_child_running(
    tmp_path: Path, command: str, behaviour: dict[str, Any], settle_s: float, gone_within_s: float
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    config = managed_sweep_toml(tmp_path / "sweep.toml", grace_s=1.0)
    if command == "serve":
        args = ["serve", "--config", str(config), "--log-dir", str(tmp_path / "logs")]
    else:
        args = ["sweep", "--config", str(config), "--db", str(tmp_path / "r.db"), "--no-progress"]
    process = start_rcarun(args, {**behaviour, "pid_dir": str(pid_dir), "spawn_child": True})
    pids: list[int] = []
    try:
        pids = wait_for_pids(pid_dir, 4, process)  # two replicas, each with a child
        time.sleep(settle_s)
        assert all(alive(pid) for pid in pids)
        process.send_signal(signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL
        _gone_within(pids, gone_within_s)
    finally:
        process.kill()
        process.communicate()
        _kill_left(pids)
    log = (tmp_path / ("logs" if command == "serve" else "r.db.serve-logs") / "qwen-0.log").read_text()
    assert f"rcarun (pid {process.pid}) is gone; ending replica pid" in log


@pytest.mark.parametrize("guards_too", [False, True], ids=["rcarun-killed", "rcarun-and-guards-killed"])
def test_a_resume_on_fixed_ports_after_a_sigkill_runs_on_its_own_replicas(
    tmp_path: Path, guards_too: bool
) -> None:
    """With ``guards_too`` the replicas' guards die with rcarun and the replicas ignore the SIGTERM that sends
    them: stale replicas hold the ports when the resume starts, and it ends them with one line."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    base = free_port_base()
    config = managed_sweep_toml(tmp_path / "sweep.toml", realizations=2, port_base=base)
    args = ["sweep", "--config", str(config), "--db", str(tmp_path / "r.db"), "--no-progress", "--limit", "2"]
    behaviour: dict[str, Any] = {
        "pid_dir": str(pid_dir),
        "mock": {"latency_s": 1.0},
        "ignore_sigterm": guards_too,
    }
    first = start_rcarun(args, behaviour)
    killed = wait_for_pids(pid_dir, 2, first)
    try:
        time.sleep(0.5)
        guards = {os.getpgid(pid) for pid in killed} if guards_too else set()
        for pid in (first.pid, *guards):
            os.kill(pid, signal.SIGKILL)
        first.wait()
        if guards_too:
            time.sleep(0.5)
            assert all(alive(pid) for pid in killed)  # stale: nothing left to end them
        resumed = start_rcarun(args, behaviour)
        _, stderr = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, stderr.decode()
        assert not [pid for pid in killed if alive(pid)]
        stale_lines = [line for line in stderr.decode().splitlines() if "stale replica ended" in line]
        with sqlite3.connect(tmp_path / "r.db") as db:
            events = [
                (kind, json.loads(detail))
                for kind, detail in db.execute("SELECT kind, detail_json FROM run_events ORDER BY rowid")
            ]
        starts = [detail for kind, detail in events if kind == "replicas_started"]
        served_by = {replica["pid"] for replica in starts[-1]["replicas"]}
        assert len(starts) == 2 and len(served_by) == 2 and not served_by & set(killed)
        ended = [detail for kind, detail in events if kind == "stale_replica_ended"]
        if guards_too:
            # One line and one event: every process of the killed rcarun's replicas ended at once.
            assert len(stale_lines) == 1 and f"port {base}" in stale_lines[0]
            assert len(ended) == 1 and sorted(ended[0]["pids"]) == sorted(killed)
        else:
            assert stale_lines == [] and ended == []  # its guards had ended them already
    finally:
        first.kill()
        first.communicate()
        _kill_left(recorded_pids(pid_dir))


@contextlib.contextmanager
def _fake_replica_on(port: int, tmp_path: Path, marker: str | None) -> Iterator[subprocess.Popen[bytes]]:
    """A fake vLLM answering on ``port``, started by the test (carrying ``marker`` as a replica would)."""
    env = {key: value for key, value in os.environ.items() if key not in (MARKER, "RCARUN_FAKE_VLLM")}
    if marker is not None:
        env[MARKER] = marker
    argv = [
        *FAKE_COMMAND,
        "serve",
        "/models/Qwen3-test",
        "--port",
        str(port),
        "--served-model-name",
        "qwen-test",
    ]
    argv += ["--max-model-len", "8192"]
    log = (tmp_path / f"outsider-{port}.log").open("wb")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while "startup complete" not in (tmp_path / f"outsider-{port}.log").read_text():
            assert process.poll() is None and time.monotonic() < deadline, "the outsider did not start"
            time.sleep(0.05)
        yield process
    finally:
        process.kill()
        process.wait()
        log.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dead_rcarun() -> str:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = process_identity(process.pid)
    process.kill()
    process.wait()
    return identity


async def test_a_replica_left_by_a_killed_rcarun_is_ended_with_one_event_and_the_start_goes_on(
    tmp_path: Path,
) -> None:
    port = _free_port()
    events: list[tuple[str, dict[str, Any]]] = []
    with _fake_replica_on(port, tmp_path, _dead_rcarun()) as stale:
        spec = fake_spec(tmp_path, gpus=(0,), tensor_parallel=1, port_base=port)
        async with ManagedReplicas(
            spec, on_event=lambda kind, detail: events.append((kind, detail))
        ) as fleet:
            assert stale.wait(timeout=5) == -signal.SIGKILL
            ((kind, detail),) = events
            assert kind == "stale_replica_ended" and detail["port"] == port and detail["pids"] == [stale.pid]
            assert fleet.pids() and fleet.pids()[0] != stale.pid
            assert fleet.base_urls == (f"http://127.0.0.1:{port}/v1",)


@pytest.mark.parametrize("owner", ["none", "live-rcarun"])
async def test_a_port_held_by_a_server_this_run_did_not_start_is_refused_in_one_line_and_left_alone(
    tmp_path: Path, owner: str
) -> None:
    port = _free_port()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    marker = process_identity(live.pid) if owner == "live-rcarun" else None
    try:
        with _fake_replica_on(port, tmp_path, marker) as outsider:
            spec = fake_spec(tmp_path, gpus=(0,), tensor_parallel=1, port_base=port)
            with pytest.raises(ServeError) as caught:
                async with ManagedReplicas(spec):
                    pytest.fail("the replicas must not be reported up")
            message = str(caught.value)
            assert "\n" not in message
            assert f"port {port} is already in use by pid {outsider.pid} (" in message
            expected = (
                "which rcarun did not start"
                if owner == "none"
                else f"a replica of rcarun pid {live.pid}, which"
            )
            assert expected in message and message.endswith("stop it or change port_base")
            await asyncio.sleep(0.2)
            assert outsider.poll() is None  # not ours to end
    finally:
        live.kill()
        live.wait()


async def test_a_health_answer_from_outside_the_replicas_process_group_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The replica command puts the server in a session of its own (setsid): it answers /health, but its socket
    # is not held by the replica's process group, as with a server that took the port after the check.
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    spec = fake_spec(
        tmp_path, gpus=(0,), tensor_parallel=1, command=("setsid", "-w", *FAKE_COMMAND), grace_s=0.5
    )
    monkeypatch.setenv("RCARUN_FAKE_VLLM", json.dumps({"pid_dir": str(pid_dir)}))
    try:
        with pytest.raises(
            ServeError, match=r"answers /health, but the server on port \d+ is pid \d+ \("
        ) as caught:
            async with ManagedReplicas(spec):
                pytest.fail("the replica must not be reported up")
        assert "\n" not in str(caught.value)
    finally:
        _kill_left(recorded_pids(pid_dir))


@pytest.mark.parametrize("api_key_env", [None, "RCARUN_TEST_REPLICA_KEY"])
def test_a_vllm_api_key_in_the_shell_does_not_lock_the_client_out(
    tmp_path: Path, api_key_env: str | None
) -> None:
    config = managed_sweep_toml(tmp_path / "sweep.toml", realizations=1, api_key_env=api_key_env)
    args = ["sweep", "--config", str(config), "--db", str(tmp_path / "r.db"), "--no-progress", "--limit", "2"]
    process = start_rcarun(
        args, {}, VLLM_API_KEY="shell-key-for-another-server", RCARUN_TEST_REPLICA_KEY="the-backbones-own-key"
    )
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr.decode()[-2000:]
