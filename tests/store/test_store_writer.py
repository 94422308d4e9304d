"""The writer: upserts, blob dedupe, commit order across batches, flush and close semantics, failure surfacing."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rcarun.errors import StoreError
from rcarun.store import EventRow, Store, StoreWriter, TrajectoryRow, blob_sha256

RowMaker = Callable[..., Any]

# Generous guard so a broken flush fails the test instead of hanging it; never a timing claim.
GUARD_S = 20.0


def _count(db_path: Path, sql: str) -> int:
    connection = sqlite3.connect(db_path)
    try:
        return int(connection.execute(sql).fetchone()[0])
    finally:
        connection.close()


async def test_prediction_and_item_upserts_leave_one_row_with_the_last_write(
    db_path: Path, store: Store, run_id: int, make_prediction: RowMaker, make_item: RowMaker
) -> None:
    async with StoreWriter(db_path, run_id) as writer:
        writer.add_prediction(make_prediction(run_id, pred_role="first", pred_step=1))
        writer.set_item(make_item(run_id, status="interrupted", attempts=1))
        await writer.flush()
        # Same key again, once in a later batch and twice within one batch: still one row, last write wins.
        writer.add_prediction(make_prediction(run_id, pred_role="second", pred_step=2))
        writer.add_prediction(make_prediction(run_id, pred_role="third", pred_step=None, abstained=True))
        writer.set_item(make_item(run_id, status="failed", attempts=2, error="boom"))
        writer.set_item(make_item(run_id, status="done", attempts=3))

    predictions = store.predictions(run_id)
    assert len(predictions) == 1
    assert (predictions[0].pred_role, predictions[0].pred_step, predictions[0].abstained) == (
        "third",
        None,
        True,
    )
    items = store.items(run_id)
    assert len(items) == 1
    assert (items[0].status, items[0].attempts, items[0].error) == ("done", 3, None)


async def test_trajectory_rows_upsert_on_run_and_qid(db_path: Path, store: Store, run_id: int) -> None:
    first = TrajectoryRow(run_id, "q1", "who-when", 5, '["a","b","c","d","e"]', "b", 1, "aa")
    async with StoreWriter(db_path, run_id) as writer:
        writer.add_trajectory(first)
        writer.add_trajectory(replace(first, sha256="bb"))
        writer.add_trajectory(replace(first, qid="q2"))
    assert [(row.qid, row.sha256) for row in store.trajectories(run_id)] == [("q1", "bb"), ("q2", "aa")]


async def test_blobs_are_deduplicated_and_round_trip(db_path: Path, store: Store, run_id: int) -> None:
    prompt = ("You are judging a failed agent run. " * 60).encode()
    random_bytes = os.urandom(50_000)
    async with StoreWriter(db_path, run_id, flush_interval_s=60.0) as writer:
        first = writer.put_blob(prompt)
        second = writer.put_blob(prompt)
        assert first == second == blob_sha256(prompt)
        # The repeat was recognised before queueing: one entry waits, not two.
        assert writer.pending == 1
        random_key = writer.put_blob(random_bytes)
        empty_key = writer.put_blob(b"")
    assert _count(db_path, "SELECT count(*) FROM blobs") == 3
    assert store.read_blob(first) == prompt
    assert store.read_blob(random_key) == random_bytes
    assert store.read_blob(empty_key) == b""
    assert _count(db_path, f"SELECT size FROM blobs WHERE sha256 = '{first}'") == len(prompt)
    # Text under 64 KiB is kept readable; 50 KB of random bytes are not text, so they are compressed.
    assert _count(db_path, f"SELECT text = '{prompt.decode()}' FROM blobs WHERE sha256 = '{first}'") == 1
    assert _count(db_path, f"SELECT text IS NULL FROM blobs WHERE sha256 = '{random_key}'") == 1


async def test_blobs_repeated_across_writers_are_stored_once(
    db_path: Path, store: Store, run_id: int
) -> None:
    for _ in range(2):
        async with StoreWriter(db_path, run_id) as writer:
            writer.put_blob(b"same prompt")
    assert _count(db_path, "SELECT count(*) FROM blobs") == 1


async def test_recent_blob_memory_is_bounded(db_path: Path, run_id: int) -> None:
    async with StoreWriter(db_path, run_id, recent_blob_capacity=2, flush_interval_s=60.0) as writer:
        for data in (b"a", b"b", b"c"):
            writer.put_blob(data)
        writer.put_blob(b"a")  # forgotten (capacity 2), so queued again; INSERT OR IGNORE keeps one copy
        writer.put_blob(b"c")  # remembered
        assert writer.pending == 4
    assert _count(db_path, "SELECT count(*) FROM blobs") == 3


async def test_a_default_writer_remembers_a_bounded_number_of_blob_hashes(db_path: Path, run_id: int) -> None:
    """A sweep enqueues a new blob or two per call: the hashes kept to skip repeats must not grow with it."""
    async with StoreWriter(db_path, run_id, flush_interval_s=60.0) as writer:
        for index in range(4_097):
            writer.put_blob(b"blob %d" % index)
        writer.put_blob(b"blob 1")  # among the last 4,096: remembered, not queued again
        writer.put_blob(b"blob 0")  # the oldest: forgotten, queued again (stored once all the same)
        assert writer.pending == 4_098
    assert _count(db_path, "SELECT count(*) FROM blobs") == 4_097


async def test_rows_commit_in_enqueue_order_across_batch_boundaries(
    db_path: Path, run_id: int, make_call: RowMaker, make_prediction: RowMaker, make_item: RowMaker
) -> None:
    # Triggers log every insert in the order SQLite performs them, across all batches.
    connection = sqlite3.connect(db_path)
    connection.executescript(
        """
        CREATE TABLE insert_log (position INTEGER PRIMARY KEY, kind TEXT, item_id TEXT, calls_of_item INTEGER);
        CREATE TRIGGER log_call AFTER INSERT ON calls BEGIN
            INSERT INTO insert_log (kind, item_id) VALUES ('call', NEW.item_id); END;
        CREATE TRIGGER log_prediction AFTER INSERT ON predictions BEGIN
            INSERT INTO insert_log (kind, item_id, calls_of_item)
            VALUES ('prediction', NEW.item_id, (SELECT count(*) FROM calls WHERE item_id = NEW.item_id)); END;
        """
    )
    connection.close()

    n_items = 10
    # Per item: two attempts, a prediction and the item status = 4 rows; batches of 3 cut items at every offset.
    async with StoreWriter(db_path, run_id, batch_size=3, flush_interval_s=0.0) as writer:
        for index in range(n_items):
            qid = f"q{index:02d}"
            writer.add_call(make_call(run_id, qid=qid, attempt=1, status="rate_limited"))
            writer.add_call(make_call(run_id, qid=qid, attempt=2))
            writer.add_prediction(make_prediction(run_id, qid=qid))
            writer.set_item(make_item(run_id, qid=qid))
        assert writer.committed_rows < 4 * n_items  # still queued: nothing yielded to the writer task yet
    assert writer.committed_rows == 4 * n_items

    connection = sqlite3.connect(db_path)
    try:
        log = connection.execute(
            "SELECT kind, item_id, calls_of_item FROM insert_log ORDER BY position"
        ).fetchall()
        call_items = [item for kind, item, _ in log if kind == "call"]
        expected_items = [f"bb-a|all-at-once|q{index:02d}|r0" for index in range(n_items)]
        assert call_items == [item for item in expected_items for _ in range(2)]
        assert [item for kind, item, _ in log if kind == "prediction"] == expected_items
        # Every prediction found both of its item's attempts already written.
        assert {calls for kind, _, calls in log if kind == "prediction"} == {2}
        attempts = connection.execute("SELECT qid, attempt FROM calls ORDER BY call_id").fetchall()
        assert attempts == [(f"q{index:02d}", attempt) for index in range(n_items) for attempt in (1, 2)]
    finally:
        connection.close()


async def test_flush_commits_everything_enqueued_before_it(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    # A long interval and a large batch: without flush these rows would sit in the queue for a minute.
    async with StoreWriter(db_path, run_id, batch_size=10_000, flush_interval_s=60.0) as writer:
        for attempt in range(1, 6):
            writer.add_call(make_call(run_id, attempt=attempt))
        await asyncio.sleep(0)  # let the writer task start its batch and wait for more
        assert _count(db_path, "SELECT count(*) FROM calls") == 0
        await asyncio.wait_for(writer.flush(), GUARD_S)
        assert _count(db_path, "SELECT count(*) FROM calls") == 5
        assert writer.committed_rows == 5
        await asyncio.wait_for(writer.flush(), GUARD_S)  # nothing pending: returns too
        writer.add_call(make_call(run_id, attempt=6))
    # Leaving the block drained the last row without waiting out the interval.
    assert _count(db_path, "SELECT count(*) FROM calls") == 6


async def test_a_full_batch_commits_at_once_and_a_partial_one_waits_for_its_interval(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    # The writer task sleeps through a batch's interval rather than waking for every row; what ends the wait
    # early is the batch filling up.
    async with StoreWriter(db_path, run_id, batch_size=5, flush_interval_s=60.0) as writer:
        for attempt in range(1, 5):
            writer.add_call(make_call(run_id, attempt=attempt))
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        assert writer.committed_rows == 0  # four rows of five: they wait for the minute
        writer.add_call(make_call(run_id, attempt=5))
        async with asyncio.timeout(GUARD_S):
            while writer.committed_rows < 5:
                await asyncio.sleep(0.01)
        assert _count(db_path, "SELECT count(*) FROM calls") == 5


async def test_rows_added_one_by_one_within_an_interval_commit_together(
    db_path: Path, run_id: int, make_call: RowMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rcarun.store.batch import BatchWriter

    batches: list[int] = []
    original = BatchWriter.write

    def counting_write(self: Any, batch: Any) -> None:
        batches.append(len(batch))
        original(self, batch)

    monkeypatch.setattr(BatchWriter, "write", counting_write)
    async with StoreWriter(db_path, run_id, batch_size=500, flush_interval_s=0.5) as writer:
        for attempt in range(1, 41):
            writer.add_call(make_call(run_id, attempt=attempt))
            await asyncio.sleep(0.001)  # the loop turns between rows, as a sweep's answers arrive
        await asyncio.wait_for(writer.flush(), GUARD_S)
    assert batches == [40]


async def test_close_drains_the_queue_when_the_body_raises(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    with pytest.raises(RuntimeError, match="method crashed"):
        async with StoreWriter(db_path, run_id, flush_interval_s=60.0) as writer:
            writer.add_call(make_call(run_id))
            raise RuntimeError("method crashed")
    assert _count(db_path, "SELECT count(*) FROM calls") == 1


async def test_wait_for_room_bounds_the_queue_and_loses_nothing(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    async with StoreWriter(db_path, run_id, max_queued_rows=5, batch_size=2, flush_interval_s=0.0) as writer:
        high_water = 0
        for index in range(100):
            await writer.wait_for_room()
            writer.add_call(make_call(run_id, qid=f"q{index}"))
            high_water = max(high_water, writer.pending)
        # The producer outran the writer (so it had to wait), yet the queue never grew past its bound.
        assert high_water == 5
    assert _count(db_path, "SELECT count(*) FROM calls") == 100


async def test_wait_for_room_bounds_the_blob_bytes_queued_too(db_path: Path, run_id: int) -> None:
    """A row is small, a blob weighs what the prompt weighs: the queue's memory is bounded in bytes as well."""
    async with StoreWriter(
        db_path, run_id, max_queued_rows=1_000, max_queued_bytes=250, batch_size=2, flush_interval_s=0.0
    ) as writer:
        high_water = 0
        for index in range(100):
            await writer.wait_for_room()
            writer.put_blob(b"%03d" % index + b"x" * 97)  # 100 bytes each
            high_water = max(high_water, writer.queued_bytes)
        # Room while under 250 bytes, so one more 100-byte blob at most: the writer was outrun and caught up.
        assert high_water == 300
    assert _count(db_path, "SELECT count(*) FROM blobs") == 100
    assert _count(db_path, "SELECT sum(size) FROM blobs") == 10_000
    assert writer.queued_bytes == 0


async def test_a_failing_file_keeps_the_rows_retries_them_and_gives_up_only_at_close(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    troubles: list[StoreError] = []
    writer = StoreWriter(
        db_path,
        run_id,
        max_queued_rows=4,
        flush_interval_s=0.0,
        give_up_after_s=0.5,
        on_trouble=troubles.append,
    )
    async with writer:
        writer.add_call(make_call(run_id))
        await writer.flush()
        # Someone else breaks the file under the writer: the next batch cannot be written.
        saboteur = sqlite3.connect(db_path)
        saboteur.execute("DROP TABLE run_events")
        saboteur.close()
        writer.add_event(EventRow(run_id, "budget_stop"))
        writer.add_call(make_call(run_id, attempt=2, status="ok"))
        with pytest.raises(StoreError, match="no such table: run_events") as raised:
            await asyncio.wait_for(writer.flush(), GUARD_S)
        assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
        assert "being retried" in str(raised.value)
        # Nothing is dropped while the writer retries: rows still queue, and nobody waits for room.
        for attempt in range(3, 10):
            writer.add_call(make_call(run_id, attempt=attempt))
        await asyncio.wait_for(writer.wait_for_room(), GUARD_S)
        assert writer.uncommitted == 9
        assert len(troubles) == 1  # the runner hears of it once, to stop admission
        with pytest.raises(StoreError, match="8 answered calls could not be stored") as final:
            await asyncio.wait_for(writer.__aexit__(None, None, None), GUARD_S)
        assert "(9 rows: 1 EventRow, 8 CallRow)" in str(final.value)
        assert writer.unstored_answers == 8
        # After giving up every later call raises, and none waits.
        with pytest.raises(StoreError, match="kept failing"):
            writer.add_call(make_call(run_id, attempt=10))
    # Order is kept: the calls behind the event that cannot be written were not committed around it.
    assert _count(db_path, "SELECT count(*) FROM calls") == 1


async def test_rows_pending_on_a_failing_file_commit_once_it_works_again(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    troubles: list[StoreError] = []
    async with StoreWriter(
        db_path, run_id, flush_interval_s=0.0, busy_timeout_s=0.05, on_trouble=troubles.append
    ) as writer:
        saboteur = sqlite3.connect(db_path, isolation_level=None)
        saboteur.execute("BEGIN EXCLUSIVE")  # holds the file past the writer's busy timeout
        for attempt in range(1, 6):
            writer.add_call(make_call(run_id, attempt=attempt))
        for _ in range(200):
            if troubles:
                break
            await asyncio.sleep(0.02)
        assert troubles and "locked" in str(troubles[0])
        saboteur.execute("COMMIT")
        saboteur.close()
        for _ in range(200):
            if writer.trouble is None:
                break
            await asyncio.sleep(0.02)
        await asyncio.wait_for(writer.flush(), GUARD_S)
    assert _count(db_path, "SELECT count(*) FROM calls") == 5


async def test_a_value_sqlite_refuses_costs_its_own_row_and_item_not_the_batch(
    db_path: Path,
    store: Store,
    run_id: int,
    make_call: RowMaker,
    make_prediction: RowMaker,
    make_item: RowMaker,
) -> None:
    async with StoreWriter(db_path, run_id, flush_interval_s=60.0) as writer:
        for index in range(10):
            writer.add_call(make_call(run_id, qid=f"good{index}"))
        # Repairable: a lone surrogate in text and an integer beyond 64 bits in a nullable column.
        writer.add_prediction(
            make_prediction(run_id, qid="cut-emoji", pred_role="planner\ud800", pred_step=10**25)
        )
        writer.set_item(make_item(run_id, qid="cut-emoji", status="done"))
        # Not repairable: a NOT NULL count beyond 64 bits. The item's later 'done' must not stand.
        writer.add_call(make_call(run_id, qid="huge-usage", prompt_tokens=10**20))
        writer.add_prediction(make_prediction(run_id, qid="huge-usage"))
        writer.set_item(make_item(run_id, qid="huge-usage", status="done"))
    assert _count(db_path, "SELECT count(*) FROM calls WHERE qid LIKE 'good%'") == 10
    items = {item.qid: item for item in store.items(run_id)}
    assert items["cut-emoji"].status == "done"
    assert items["huge-usage"].status == "failed"
    assert "refused a value of this item's calls row" in (items["huge-usage"].error or "")
    predictions = {prediction.qid: prediction for prediction in store.predictions(run_id)}
    assert (predictions["cut-emoji"].pred_role, predictions["cut-emoji"].pred_step) == ("planner\ufffd", None)
    kinds = sorted(event.kind for event in store.events(run_id))
    assert kinds == ["row_rejected", "row_repaired"]
    assert "huge-usage" not in predictions  # a failed item has no prediction, as a resume expects
    # A resume does not take the failed item for finished unless told to skip failures.
    assert ("bb-a", "all-at-once", "huge-usage", 0) not in store.finished_item_keys(
        run_id, include_failed=False
    )


async def test_invalid_rows_are_refused_at_enqueue_without_harming_the_batch(
    db_path: Path, run_id: int, make_call: RowMaker, make_item: RowMaker
) -> None:
    async with StoreWriter(db_path, run_id) as writer:
        writer.add_call(make_call(run_id))
        with pytest.raises(StoreError, match="call status 'done'"):
            writer.add_call(make_call(run_id, status="done"))
        with pytest.raises(StoreError, match="1-based"):
            writer.add_call(make_call(run_id, attempt=0))
        with pytest.raises(StoreError, match="item status 'ok'"):
            writer.set_item(make_item(run_id, status="ok"))
        with pytest.raises(StoreError, match="run 999"):
            writer.add_call(make_call(999))
    assert _count(db_path, "SELECT count(*) FROM calls") == 1


async def test_writer_refuses_an_unknown_run_and_use_outside_its_block(
    db_path: Path, make_call: RowMaker
) -> None:
    with pytest.raises(StoreError, match="no run with run_id 42"):
        async with StoreWriter(db_path, 42):
            pass
    writer = StoreWriter(db_path)
    with pytest.raises(StoreError, match="not open"):
        writer.add_call(make_call(1))
    async with writer:
        pass
    with pytest.raises(StoreError, match="closed"):
        await writer.flush()


async def test_a_reader_sees_committed_rows_while_the_writer_is_open(
    db_path: Path, store: Store, run_id: int, make_prediction: RowMaker
) -> None:
    async with StoreWriter(db_path, run_id) as writer:
        writer.add_prediction(make_prediction(run_id, qid="q1"))
        await writer.flush()
        assert store.finished_item_keys(run_id) == {("bb-a", "all-at-once", "q1", 0)}
        store.set_run_status(
            run_id, "finished"
        )  # a reader's write waits for, then interleaves with, the writer
        writer.add_prediction(make_prediction(run_id, qid="q2"))
    assert len(store.predictions(run_id)) == 2


async def test_an_unexpected_end_of_the_writer_task_is_reported_not_hung_on(
    db_path: Path, run_id: int, make_call: RowMaker
) -> None:
    writer = StoreWriter(db_path, run_id, max_queued_rows=2, flush_interval_s=60.0)
    async with writer:
        # White-box: stands in for a loop shutting down under the writer (asyncio.run cancelling leftover tasks).
        task = writer._task
        assert task is not None
        task.cancel()
        await asyncio.wait({task})
        with pytest.raises(StoreError, match="ended unexpectedly"):
            writer.add_call(make_call(run_id))
        with pytest.raises(StoreError, match="ended unexpectedly"):
            await asyncio.wait_for(writer.wait_for_room(), GUARD_S)
        with pytest.raises(StoreError, match="ended unexpectedly"):
            await asyncio.wait_for(writer.flush(), GUARD_S)
        with pytest.raises(StoreError, match="ended unexpectedly"):
            await asyncio.wait_for(writer.__aexit__(None, None, None), GUARD_S)
