"""Ctrl-C is obeyed when stdout and stderr are a pipe whose reader is gone (`rcarun sweep 2>&1 | tee log`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from faults.conftest import SAFETY_S, backbone, item_statuses, sweep_args, write_sweep
from faults.hostile import HostileServer, slow

ITEMS = 12


def test_one_ctrl_c_stops_a_sweep_whose_output_pipe_is_closed(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(slow(1.0))
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"fx": backbone(server.base_url, limits={"concurrency": 2})},
        sweep={"drain_timeout_s": 5},
    )
    db = tmp_path / "results.db"
    reader, writer = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "rcarun.cli", *sweep_args(config, db, "piped")],
        cwd=tmp_path,
        stdout=writer,
        stderr=writer,
        stdin=subprocess.DEVNULL,
    )
    os.close(writer)
    try:
        assert server.wait_for(lambda log: len(log) >= 2, SAFETY_S), "the sweep never started"
        os.close(reader)  # `tee` died with the Ctrl-C: every later write to the pipe fails
        reader = -1
        child.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = child.wait(timeout=SAFETY_S)
        took = time.monotonic() - started
    finally:
        if reader >= 0:
            os.close(reader)
        if child.poll() is None:
            child.kill()
    assert code == 3, f"exit {code}: stopped by the interrupt, whatever became of its output"
    assert took < 5 + 5, f"{took:.1f} s to stop after Ctrl-C (drain deadline 5 s)"
    assert len(server.chat_log()) < ITEMS, "it ran to the end instead of stopping"
    statuses = item_statuses(db)
    assert "failed" not in statuses and statuses["done"] < ITEMS, dict(statuses)
