"""Managed replicas against the fake `vllm` command: start and health wait, deadlines with the log tail, model and
max_model_len checks, death and restart, and shutdown that leaves no process behind (SIGKILL when SIGTERM is
ignored, process groups reaching children)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rcarun.serving import ManagedReplicas, ServeError
from serving.fake import alive, fake_spec, recorded_pids

pytestmark = pytest.mark.slow


async def _chat(base_url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(f"{base_url}/chat/completions", json=body) as response:
                await response.read()
                return response.status
        except aiohttp.ClientError:
            return -1


async def _wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_replicas_start_split_by_tensor_parallelism_and_are_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    monkeypatch.setenv("RCARUN_FAKE_VLLM", f'{{"startup_s": 0.5, "pid_dir": "{pid_dir}"}}')
    spec = fake_spec(tmp_path, extra_args=("--enable-prefix-caching",))
    async with ManagedReplicas(spec) as fleet:
        record = fleet.record
        assert [r.gpus for r in record.replicas] == [(0, 1), (2, 3)]
        assert len({r.port for r in record.replicas}) == 2
        assert record.version == "0.0.0+rcarun.fake" and record.version_source == "GET /version"
        assert record.max_model_len == 8192 and record.model_root == "/models/Qwen3-test"
        assert all(r.startup_s >= 0.5 for r in record.replicas)  # the health wait covered the load time
        argv = record.replicas[1].argv
        assert argv[3:5] == ("serve", "/models/Qwen3-test")
        assert "--enable-prefix-caching" in argv and argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert [await _chat(url, "qwen-test") for url in fleet.base_urls] == [200, 200]
        pids = recorded_pids(pid_dir)
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
    assert not [pid for pid in pids if alive(pid)]
    log = (tmp_path / "logs" / "qwen-1.log").read_text()
    assert "CUDA_VISIBLE_DEVICES='2,3'" in log and "Shutdown complete." in log


async def test_a_replica_that_stays_silent_fails_the_start_with_its_log_tail_and_nothing_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    monkeypatch.setenv(
        "RCARUN_FAKE_VLLM", f'{{"startup_s": 60, "pid_dir": "{pid_dir}", "spawn_child": true}}'
    )
    started = time.monotonic()
    with pytest.raises(ServeError) as caught:
        async with ManagedReplicas(fake_spec(tmp_path, startup_timeout_s=1.5, grace_s=2.0)):
            pytest.fail("the replicas must not be reported up")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "\n" not in message
    assert "did not answer /health within startup_timeout_s = 1.5 s" in message
    assert "loading weights and profiling memory" in message  # the log's tail
    pids = recorded_pids(pid_dir)
    assert len(pids) == 4  # two leaders, two children
    assert not [pid for pid in pids if alive(pid)]


async def test_a_replica_that_exits_at_start_fails_at_once_naming_its_status(tmp_path: Path) -> None:
    # A trailing --port with no value: the command's own parser refuses it and exits with status 2.
    spec = fake_spec(tmp_path, gpus=(0,), tensor_parallel=1, extra_args=("--port",))
    with pytest.raises(ServeError, match=r"replica 0 \(GPUs 0, port \d+\) exited with status 2"):
        async with ManagedReplicas(spec):
            pass


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ({"report_model": "Qwen/other"}, r"serves \['Qwen/other'\], not the backbone's model 'qwen-test'"),
        ({"report_max_model_len": 4096}, r"max_model_len 4096, but the config says 8192"),
    ],
)
async def test_a_replica_serving_something_else_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behaviour: dict[str, Any], expected: str
) -> None:
    import json

    monkeypatch.setenv("RCARUN_FAKE_VLLM", json.dumps(behaviour))
    with pytest.raises(ServeError, match=expected) as caught:
        async with ManagedReplicas(fake_spec(tmp_path, gpus=(0,), tensor_parallel=1)):
            pass
    assert "\n" not in str(caught.value)


async def test_a_dead_replica_is_marked_down_its_children_killed_and_restarted_on_the_same_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    behaviour = {
        "pid_dir": str(pid_dir),
        "spawn_child": True,
        "devices": {"0,1": {"die_after": 2, "die_once_file": str(tmp_path / "died")}},
    }
    monkeypatch.setenv("RCARUN_FAKE_VLLM", json.dumps(behaviour))
    events: list[tuple[str, dict[str, Any]]] = []
    availability: list[tuple[int, bool]] = []
    fleet = ManagedReplicas(fake_spec(tmp_path), on_event=lambda kind, detail: events.append((kind, detail)))
    fleet.on_availability = lambda index, up: availability.append((index, up))
    async with fleet:
        crashed_leader = fleet.pids()[0]
        crashed_group = [int(pid) for pid in (pid_dir / f"{crashed_leader}.pid").read_text().split()]
        assert len(crashed_group) == 2  # the leader and its sleeping child
        url = fleet.base_urls[0]
        statuses = [await _chat(url, "qwen-test") for _ in range(2)]
        assert statuses[0] == 200 and statuses[1] == -1  # the second request met the crash
        await _wait_for(lambda: any(kind == "replica_restarted" for kind, _ in events))
        assert availability == [(0, False), (0, True)]
        assert [kind for kind, _ in events] == ["replica_died", "replica_restarted"]
        died = events[0][1]
        assert died["index"] == 0 and died["status"] == 1 and "EngineCore died" in died["log_tail"]
        assert await _chat(url, "qwen-test") == 200  # the same URL, a new process
        assert fleet.restarts_used == [1, 0] and fleet.pids()[0] != crashed_leader
        # The crashed leader's child, left running by the crash, went with its process group.
        assert not [pid for pid in crashed_group if alive(pid)]
    assert not [pid for pid in recorded_pids(pid_dir) if alive(pid)]


async def test_a_replica_out_of_restarts_is_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCARUN_FAKE_VLLM", '{"die_after": 1}')
    events: list[str] = []
    spec = fake_spec(tmp_path, gpus=(0,), tensor_parallel=1, restarts=1)
    async with ManagedReplicas(spec, on_event=lambda kind, _: events.append(kind)) as fleet:
        url = fleet.base_urls[0]
        await _chat(url, "qwen-test")
        await _wait_for(lambda: "replica_restarted" in events)
        await _chat(url, "qwen-test")
        await asyncio.wait_for(fleet.wait_lost(), 20)
    assert events == ["replica_died", "replica_restarted", "replica_died", "replica_lost"]


async def test_a_replica_ignoring_sigterm_is_killed_with_its_group_after_the_grace_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    monkeypatch.setenv(
        "RCARUN_FAKE_VLLM", f'{{"ignore_sigterm": true, "spawn_child": true, "pid_dir": "{pid_dir}"}}'
    )
    fleet = ManagedReplicas(fake_spec(tmp_path, grace_s=1.0))
    await fleet.start()
    pids = recorded_pids(pid_dir)
    assert len(pids) == 4 and all(alive(pid) for pid in pids)
    started = time.monotonic()
    await fleet.stop()
    took = time.monotonic() - started
    assert 1.0 <= took < 5.0  # waited out the grace period, then SIGKILL
    assert not [pid for pid in pids if alive(pid)]
    assert "ignoring it" in (tmp_path / "logs" / "qwen-0.log").read_text()


async def test_a_cancel_during_the_grace_period_kills_every_group_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    monkeypatch.setenv(
        "RCARUN_FAKE_VLLM", f'{{"ignore_sigterm": true, "spawn_child": true, "pid_dir": "{pid_dir}"}}'
    )
    fleet = ManagedReplicas(fake_spec(tmp_path, grace_s=60.0))
    await fleet.start()
    pids = recorded_pids(pid_dir)
    stopping = asyncio.create_task(fleet.stop())
    await asyncio.sleep(0.3)
    stopping.cancel()  # a second Ctrl-C while the replicas ignore SIGTERM
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await _wait_for(lambda: not [pid for pid in pids if alive(pid)], timeout_s=5)
