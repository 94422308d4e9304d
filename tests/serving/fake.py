"""The fake `vllm` command for managed-replica tests: a `ServeSpec` and a sweep config running it, its behaviour in
the environment, and the pids it leaves in a directory so that a test can prove no process outlived its stop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rcarun.data import bundled_sample_path
from rcarun.serving import ServeSpec

FAKE_COMMAND = (sys.executable, "-m", "rcarun.mock.fake_vllm")


def fake_spec(tmp_path: Path, **changes: Any) -> ServeSpec:
    values: dict[str, Any] = {
        "backbone": "qwen",
        "served_model": "qwen-test",
        "model": "/models/Qwen3-test",
        "gpus": (0, 1, 2, 3),
        "tensor_parallel": 2,
        "max_model_len": 8192,
        "command": FAKE_COMMAND,
        "startup_timeout_s": 20.0,
        "restarts": 1,
        "grace_s": 5.0,
        "log_dir": tmp_path / "logs",
    }
    values.update(changes)
    return ServeSpec(**values)


def recorded_pids(pid_dir: Path) -> list[int]:
    """Every pid the fake replicas wrote (leaders and their children)."""
    return [int(pid) for path in pid_dir.glob("*.pid") for pid in path.read_text().split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill 0; it is gone for our purposes once it no longer runs.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def managed_sweep_toml(
    path: Path,
    *,
    realizations: int = 50,
    grace_s: float = 1.0,
    port_base: int | None = None,
    api_key_env: str | None = None,
) -> Path:
    """A sweep config with one managed backbone: two replicas of the fake command on GPUs 0,1 and 2,3."""
    key = f'api_key_env = "{api_key_env}"\n' if api_key_env else ""
    port = f"port_base = {port_base}\n" if port_base is not None else ""
    path.write_text(
        f"""
[sweep]
dataset = "{bundled_sample_path()}"
realizations = {realizations}
drain_timeout_s = 20

[[methods]]
name = "all-at-once"

[backbones.qwen]
provider = "vllm"
model = "qwen-test"
limits = {{ concurrency = 2 }}
{key}
[backbones.qwen.serve]
model = "/models/Qwen3-test"
gpus = [0, 1, 2, 3]
tensor_parallel = 2
command = {json.dumps(list(FAKE_COMMAND))}
startup_timeout_s = 30
grace_s = {grace_s}
{port}"""
    )
    return path


def start_rcarun(args: list[str], behaviour: dict[str, Any], **env: str) -> subprocess.Popen[bytes]:
    """``rcarun ARGS`` as a child process, the fake replicas behaving as ``behaviour`` says."""
    return subprocess.Popen(
        [sys.executable, "-m", "rcarun.cli", *args],
        env={**os.environ, "RCARUN_FAKE_VLLM": json.dumps(behaviour), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_pids(
    pid_dir: Path, count: int, process: subprocess.Popen[bytes], timeout_s: float = 60
) -> list[int]:
    """The pids the fake replicas wrote, once there are ``count`` of them (the process must still run)."""
    deadline = time.monotonic() + timeout_s
    while len(pids := recorded_pids(pid_dir)) < count:
        if process.poll() is not None:
            raise AssertionError(f"rcarun exited with {process.returncode}: {process.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(pids)} of {count} replica pids after {timeout_s} s")
        time.sleep(0.05)
    return pids


def free_port_base() -> int:
    """A port p with p and p + 1 free now (for a config with ``port_base`` and two replicas)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            base = int(first.getsockname()[1])
            if base >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
        return base
    raise RuntimeError("no two free ports in a row")
