"""The `rcarun` command as a user runs it: a sweep from a config file, stopped with Ctrl-C, then resumed."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rcarun.data import bundled_sample_path
from rcarun.mock import MockConfig, MockProcess


def _config(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(
        f"""
[sweep]
dataset = "{bundled_sample_path()}"
realizations = 2
drain_timeout_s = 20

[[methods]]
name = "all-at-once"

[backbones.sim]
provider = "simulated"
model = "sim-model"
base_url = "{base_url}"
limits = {{ concurrency = 2 }}
"""
    )
    return path


def _count(db: Path, sql: str) -> int:
    if (
        not db.exists()
    ):  # sqlite3.connect would create it empty, which rcarun refuses to take for a results.db
        raise sqlite3.OperationalError(f"{db} does not exist yet")
    with sqlite3.connect(db, timeout=5) as connection:
        return int(connection.execute(sql).fetchone()[0])


def _start(config: Path, db: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rcarun.cli",
            "sweep",
            "--config",
            str(config),
            "--db",
            str(db),
            "--run",
            "r1",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_predictions(db: Path, at_least: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if _count(db, "SELECT count(*) FROM predictions") >= at_least:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.05)
    raise AssertionError(
        f"no {at_least} predictions in time; stderr: {process.stderr.read() if process.stderr else ''}"
    )


@pytest.mark.slow
def test_first_ctrl_c_drains_in_flight_calls_and_the_run_resumes(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    with MockProcess(MockConfig(latency_s=0.4)) as server:
        config = _config(tmp_path, server.base_url)
        process = _start(config, db)
        _wait_for_predictions(db, 2, process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
        assert process.returncode == 3, err
        assert "stopping admission" in err
        assert "stopped" in out
        # Drained, not cancelled: every call that was sent got its answer and its row.
        assert _count(db, "SELECT count(*) FROM calls WHERE status = 'cancelled'") == 0
        assert _count(db, "SELECT count(*) FROM runs WHERE status = 'stopped'") == 1
        stopped_at = _count(db, "SELECT count(*) FROM predictions")
        assert 2 <= stopped_at < 20

        resumed = _start(config, db)
        _, err = resumed.communicate(timeout=60)
        assert resumed.returncode == 0, err
        accepted = server.stats().accepted

    assert _count(db, "SELECT count(*) FROM predictions") == 20
    assert _count(db, "SELECT count(*) FROM runs WHERE status = 'finished'") == 1
    assert accepted == _count(db, "SELECT count(*) FROM calls WHERE status = 'ok'") == 20


def test_second_ctrl_c_cancels_and_leaves_a_consistent_database(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    with MockProcess(MockConfig(latency_s=2.0)) as server:
        config = _config(tmp_path, server.base_url)
        process = _start(config, db)
        deadline = time.monotonic() + 30
        while server.stats().accepted < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)

    assert process.returncode == 130, err
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        statuses = dict(connection.execute("SELECT status, count(*) FROM calls GROUP BY status").fetchall())
        run_status = connection.execute("SELECT status FROM runs").fetchone()[0]
    # The two calls in flight were cancelled before their 2-s answers and are recorded as such.
    assert statuses == {"cancelled": 2}
    assert run_status == "stopped"
