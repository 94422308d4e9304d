"""A sweep killed with SIGKILL mid-run and rerun ends with one prediction per item and no call paid twice."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers.sweeps import make_config, rows
from rcarun.mock import MockConfig, MockProcess
from rcarun.runner import run_sweep

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {tests!r})
    from helpers.sweeps import make_config
    from rcarun.runner import run_sweep

    config = make_config({{"sim": {{"base_url": sys.argv[1], "limits": {{"concurrency": 2}}}}}}, realizations=2)
    asyncio.run(run_sweep(config, db_path=sys.argv[2], run_name="killed", show_progress=False))
    """
)


def _predictions(db: Path) -> int:
    if not db.exists():
        return 0  # sqlite3.connect would create it empty, which rcarun refuses to take for a results.db
    try:
        with sqlite3.connect(db, timeout=5) as connection:
            return int(connection.execute("SELECT count(*) FROM predictions").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.mark.slow
async def test_sigkill_then_rerun_gives_exactly_one_prediction_per_item(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    tests_dir = str(Path(__file__).resolve().parents[1])
    with MockProcess(MockConfig(latency_s=0.25)) as server:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD.format(tests=tests_dir), server.base_url, str(db)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while _predictions(db) < 6 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        killed_at = _predictions(db)
        assert 6 <= killed_at < 20

        config = make_config(
            {"sim": {"base_url": server.base_url, "limits": {"concurrency": 2}}}, realizations=2
        )
        outcome = await run_sweep(config, db_path=db, run_name="killed", show_progress=False)
        accepted = server.stats().accepted

    assert outcome.status == "finished"
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    per_item = rows(
        db, "SELECT backbone, method, qid, realization, count(*) FROM predictions GROUP BY 1, 2, 3, 4"
    )
    assert len(per_item) == 20 and all(row[-1] == 1 for row in per_item)
    paid = rows(
        db, "SELECT cache_key, count(*) FROM calls WHERE status IN ('ok', 'length') GROUP BY cache_key"
    )
    assert all(count == 1 for _, count in paid)
    # The server answered at most the in-flight calls (concurrency 2) whose rows the kill lost before commit.
    assert 0 <= accepted - len(paid) <= 2
