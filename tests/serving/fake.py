"""The fake `vllm` command for managed-replica tests: a `ServeSpec` running it, its behaviour in the environment,
and the pids it leaves in a directory so that a test can prove no process outlived its stop."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

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
