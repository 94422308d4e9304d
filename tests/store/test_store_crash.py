"""A writer process killed with SIGKILL mid-stream leaves a sound file holding a prefix of what it enqueued."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rcarun.store import Store, open_store

CRASH_WRITER = Path(__file__).with_name("crash_writer.py")
# Generous bounds so a broken writer fails the test instead of hanging it; never a timing claim.
WAIT_LIMIT_S = 30.0
KILL_AFTER_CALLS = 3_000


def _committed_calls(db_path: Path, run_id: int) -> int:
    connection = sqlite3.connect(db_path, timeout=10)
    try:
        return int(connection.execute("SELECT count(*) FROM calls WHERE run_id = ?", (run_id,)).fetchone()[0])
    finally:
        connection.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
# Where the kill lands relative to a transaction is chance; three kills (into three runs of one file) make a
# torn batch far more likely to be caught if the writer ever allowed one.
@pytest.mark.parametrize("kill", range(3))
def test_sigkill_mid_stream_leaves_an_intact_prefix(db_path: Path, store: Store, kill: int) -> None:
    run_id = store.get_or_create_run(f"crash-{kill}", "{}")
    process = subprocess.Popen(
        [sys.executable, str(CRASH_WRITER), str(db_path), str(run_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready", process.stderr.read() if process.stderr else ""
        # Kill only once the writer is well into streaming, so the kill lands among batches in flight.
        give_up_at = time.monotonic() + WAIT_LIMIT_S
        while _committed_calls(db_path, run_id) < KILL_AFTER_CALLS and time.monotonic() < give_up_at:
            time.sleep(0.01)
        assert process.poll() is None, "the writer process ended on its own"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=WAIT_LIMIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL

    store.close()
    with open_store(db_path) as reopened:
        connection = reopened.connection
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        call_sequences = [
            int(row[0].removeprefix("seq"))
            for row in connection.execute(
                "SELECT cache_key FROM calls WHERE run_id = ? ORDER BY call_id", (run_id,)
            )
        ]
        prediction_sequences = [
            json.loads(row[0])["seq"]
            for row in connection.execute("SELECT output_json FROM predictions WHERE run_id = ?", (run_id,))
        ]
        event_sequences = [
            json.loads(row[0])["seq"]
            for row in connection.execute(
                "SELECT detail_json FROM run_events WHERE run_id = ? AND kind = 'progress'", (run_id,)
            )
        ]
        committed = sorted(call_sequences + prediction_sequences + event_sequences)
        assert len(call_sequences) >= KILL_AFTER_CALLS
        # Exactly the first N enqueued rows, with no gap anywhere: a prefix, never a hole or a torn batch.
        assert committed == list(range(len(committed)))
        # call_ids follow enqueue order.
        assert call_sequences == sorted(call_sequences)
        # Each committed call's prompt blob, enqueued just before it, is there too.
        missing_blobs = connection.execute(
            "SELECT count(*) FROM calls LEFT JOIN blobs ON blobs.sha256 = calls.request_sha256 "
            "WHERE blobs.sha256 IS NULL"
        ).fetchone()[0]
        assert missing_blobs == 0
