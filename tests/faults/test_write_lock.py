"""Another tool holding results.db's write lock pauses the sweep; once the lock goes, the sweep goes on to the end.

The campaign (chaos-2026-12-04, C) held ``BEGIN IMMEDIATE`` for 20 s, past the writer's busy timeout: rcarun lost
nothing and finished every item, but ended ``stopped`` with exit 3. Here the writer's busy timeout is cut to
0.1 s (the only change to the sweep), so a lock held for 1.5 s is trouble: admission pauses, the calls in flight
land in the writer, and the sweep resumes and finishes when the lock goes.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, item_statuses, run_in_process, run_status, write_sweep
from faults.hostile import HostileServer, db_rows, integrity_check, slow
from rcarun.runner import scheduler
from rcarun.store import StoreWriter

ITEMS = 24


def _hold_write_lock(db: Path, seconds: float, held: threading.Event) -> None:
    connection = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        connection.execute("COMMIT")
    finally:
        connection.close()


@pytest.mark.slow
@pytest.mark.parametrize(("hold_s", "wait_s", "status"), [(1.5, 30, "finished"), (3.0, 0.5, "stopped")])
def test_a_write_lock_pauses_the_sweep_and_it_finishes_once_the_lock_goes(
    hold_s: float,
    wait_s: float,
    status: str,
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler, "StoreWriter", functools.partial(StoreWriter, busy_timeout_s=0.1))
    server = serve(slow(0.05))
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"fx": backbone(server.base_url, limits={"concurrency": 2})},
        sweep={"write_wait_s": wait_s},
    )
    db = tmp_path / "results.db"
    held = threading.Event()

    def lock_once_sending() -> None:
        assert server.wait_for(lambda log: len(log) >= 4, 20)
        _hold_write_lock(db, hold_s, held)

    locker = threading.Thread(target=lock_once_sending, daemon=True)
    locker.start()
    outcome = run_in_process(config, db, "locked")
    locker.join(10)
    assert held.is_set(), "the lock was never taken"
    assert outcome.status == status and run_status(db, "locked") == status
    assert integrity_check(db) == "ok"
    if status == "finished":
        # Every item done, every answer the server sent stored once, the pause recorded with its length.
        assert item_statuses(db) == {"done": ITEMS}
        answered = {entry.completion_id for entry in server.chat_log()}
        stored = [row[0] for row in db_rows(db, "SELECT response_sha256 FROM calls WHERE status = 'ok'")]
        assert len(stored) == len(answered)
        (paused,) = db_rows(db, "SELECT detail_json FROM run_events WHERE kind = 'writes_paused'")
        assert '"seconds"' in paused[0]
    else:
        # The lock outlived sweep.write_wait_s: the run stops, resumable, and said why.
        assert "results.db is not taking writes" in outcome.stop_reasons
        assert "failed" not in item_statuses(db)
