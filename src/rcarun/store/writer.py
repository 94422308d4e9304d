"""The single writer of results.db: one asyncio task batches every row into one transaction per batch.

A sweep makes thousands of calls a minute across many backbones. If every call site wrote its own row,
SQLite's one-writer lock would serialise the event loop on disk syncs. Instead call sites enqueue rows (cheap,
in memory) and one task drains the queue into batched transactions, run on one dedicated thread so the loop
never waits on disk.

Invariants (each has a test):
    - Rows are committed in the order they were enqueued: the queue is FIFO and a batch is committed before
      the next one starts, so a prediction is never committed before the calls and blobs enqueued ahead of it.
    - Each batch is one transaction. A killed process loses at most the batches not yet committed and never
      leaves part of a batch behind (WAL rolls an unfinished transaction back on the next open).
    - One bad row never costs the others. A value SQLite refuses (an integer beyond 64 bits, a string with a
      lone surrogate, a broken constraint) sends that batch through row by row: a row that fails is stored
      repaired when it can be (lone surrogates become U+FFFD, out-of-range integers NULL) and rejected
      otherwise; either way a ``row_repaired`` / ``row_rejected`` event says so, and a rejected row's work item
      is stored as ``failed`` (its later ``done`` is rewritten), so a resume does not take it for finished. The
      rest of the batch commits. The boundaries (wire parsing, answer readers, the dataset loader) make values
      storable first; this is the net under them.
    - A failing disk loses only what it must. When a commit fails for the file's sake (disk full, I/O error,
      a lock held too long), nothing is dropped: the batch stays pending and is retried in ever smaller
      chunks (so whatever still fits is kept), the ``on_trouble`` callback fires once (the runner stops
      admission), and new rows still queue behind it. Closing keeps retrying for ``give_up_after_s``; then the
      rows still pending are written to a spill file on another disk (`rcarun.store.spill`), which
      `take_up_spill` stores at the run's next start, and the error names it; only when that fails too are they
      lost, and the error names how many answered calls they held.
    - Memory is bounded by backpressure: the enqueue methods are plain (non-blocking, never dropping) so they
      fit anywhere, including sync callbacks; producers ``await writer.wait_for_room()`` at their admission
      point (e.g. before sending a call), which suspends while ``max_queued_rows`` entries or
      ``max_queued_bytes`` of blob data are waiting. The queue then never holds more than those plus what one
      producer enqueues between waits: a row is a few hundred bytes, a blob (a request or response body) as
      much as the prompt, so both are bounded. While writes are failing nobody waits for room: admission has
      stopped, so only work in flight adds rows.
    - Nothing waits forever on the writer: after a final failure every later call (enqueue, ``flush``,
      closing the ``async with``) raises `StoreError` naming the cause.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import sqlite3
import uuid
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from rcarun.errors import StoreError
from rcarun.store.blobs import blob_columns, blob_sha256
from rcarun.store.connect import DEFAULT_BUSY_TIMEOUT_S, open_connection
from rcarun.store.rows import (
    CALL_STATUSES,
    ITEM_STATUSES,
    CallRow,
    EventRow,
    ItemRow,
    PredictionRow,
    TrajectoryRow,
)
from rcarun.store.spill import SpillHeader, find_spills, read_spill, write_spill
from rcarun.text import repair_surrogates

__all__ = ["StoreWriter", "take_up_spill"]


@dataclass(frozen=True, slots=True)
class _Blob:
    sha256: str
    data: bytes


@dataclass(frozen=True, slots=True)
class _FlushRequest:
    # Resolved by the writer task once every entry ahead of this one is committed (or writes are failing).
    done: asyncio.Future[None]


class _Stop:
    """Queued by close: commit what is ahead, then end the writer task."""


_STOP: Final = _Stop()

_Row = _Blob | CallRow | PredictionRow | ItemRow | TrajectoryRow | EventRow
_Entry = _Row | _FlushRequest | _Stop

# SQLite refuses the value, not the file: the row alone is at fault.
_VALUE_ERRORS: Final = (
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    OverflowError,
    UnicodeError,
    ValueError,
    TypeError,
)
# SQLite's signed 64-bit INTEGER.
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# Retries of a failing commit: first after this many seconds, doubling up to the cap.
_RETRY_FIRST_S: Final = 0.1
_RETRY_CAP_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class _Insert:
    """How one row type becomes one executemany parameter tuple."""

    sql: str
    params: Callable[[Any], tuple[Any, ...]]


def _insert(table: str, row_type: type, *, unique: tuple[str, ...] = ()) -> _Insert:
    """An INSERT for a row dataclass whose field names are its table's columns; an upsert on ``unique``."""
    columns = [f.name for f in fields(row_type)]
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    if unique:
        updates = ", ".join(f"{column} = excluded.{column}" for column in columns if column not in unique)
        sql += f" ON CONFLICT ({', '.join(unique)}) DO UPDATE SET {updates}"
    getter = attrgetter(*columns)
    return _Insert(sql, lambda row: tuple(getter(row)))


_WORK_KEY = ("run_id", "backbone", "method", "qid", "realization")
_WorkKey = tuple[int, str, str, str, int]

# Within one transaction the order of tables does not matter (the commit is atomic); within a table the
# enqueue order is kept, so call_ids follow enqueue order and the last upsert of a key wins.
_INSERTS: Final[dict[type, _Insert]] = {
    _Blob: _Insert(
        "INSERT OR IGNORE INTO blobs (sha256, zlib_data, text, size) VALUES (?, ?, ?, ?)",
        lambda blob: (blob.sha256, *blob_columns(blob.data), len(blob.data)),
    ),
    TrajectoryRow: _insert("trajectories", TrajectoryRow, unique=("run_id", "qid")),
    CallRow: _insert("calls", CallRow),
    PredictionRow: _insert("predictions", PredictionRow, unique=_WORK_KEY),
    ItemRow: _insert("items", ItemRow, unique=_WORK_KEY),
    EventRow: _insert("run_events", EventRow),
}
_TABLES: Final[dict[type, str]] = {
    _Blob: "blobs",
    TrajectoryRow: "trajectories",
    CallRow: "calls",
    PredictionRow: "predictions",
    ItemRow: "items",
    EventRow: "run_events",
}


def _work_key(row: _Row) -> _WorkKey | None:
    if isinstance(row, CallRow | PredictionRow | ItemRow):
        return (row.run_id, row.backbone, row.method, row.qid, row.realization)
    return None


def _repaired(row: _Row) -> _Row | None:
    """A copy of ``row`` SQLite can store (lone surrogates as U+FFFD, integers beyond 64 bits as NULL), or None
    when nothing in it needed repair."""
    if isinstance(row, _Blob):
        return None
    changes: dict[str, Any] = {}
    for field in fields(row):
        value = getattr(row, field.name)
        if isinstance(value, str):
            fixed = repair_surrogates(value)
            if fixed is not value:
                changes[field.name] = fixed
        elif isinstance(value, int) and not isinstance(value, bool) and not _INT64_MIN <= value <= _INT64_MAX:
            changes[field.name] = None
    return dataclasses.replace(row, **changes) if changes else None


def _describe_row(row: _Row) -> dict[str, Any]:
    detail: dict[str, Any] = {"table": _TABLES[type(row)]}
    for name in ("item_id", "qid", "stage", "attempt"):
        value = getattr(row, name, None)
        if value is not None:
            # The detail must be storable itself, whatever the row held.
            detail[name] = repair_surrogates(value) if isinstance(value, str) else value
    return detail


class _BatchWriter:
    """The write connection; lives on, and is only touched from, the writer's one thread."""

    def __init__(self, path: Path, busy_timeout_s: float, run_id: int | None) -> None:
        self.connection = open_connection(path, busy_timeout_s=busy_timeout_s)
        # Work items one of whose rows was rejected: their item row must say failed, never done.
        self.failed_items: dict[_WorkKey, str] = {}
        if run_id is not None:
            found = self.connection.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if found is None:
                self.connection.close()
                raise StoreError(f"{path}: no run with run_id {run_id}; create it with get_or_create_run")

    def write(self, batch: Sequence[_Row]) -> None:
        """Commit ``batch`` as one transaction; a value SQLite refuses sends it through `_write_row_by_row`.

        Raises:
            sqlite3.Error, OSError: the file cannot take the batch (nothing of it is committed).
        """
        if self.failed_items:
            batch = [fixed for row in batch if (fixed := self._as_failed_if_poisoned(row)) is not None]
        try:
            grouped: dict[type, list[tuple[Any, ...]]] = {row_type: [] for row_type in _INSERTS}
            # Parameters (and compressed blobs) are built before BEGIN: the write lock is held only for inserts.
            for row in batch:
                grouped[type(row)].append(_INSERTS[type(row)].params(row))
            self.connection.execute("BEGIN IMMEDIATE")
            try:
                for row_type, params in grouped.items():
                    if params:
                        self.connection.executemany(_INSERTS[row_type].sql, params)
                self.connection.execute("COMMIT")
            except BaseException:
                if self.connection.in_transaction:
                    self.connection.execute("ROLLBACK")
                raise
        except _VALUE_ERRORS:
            self._write_row_by_row(batch)

    def _write_row_by_row(self, batch: Sequence[_Row]) -> None:
        """The same batch in one transaction, each row behind a savepoint so one refused value costs one row."""
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            for given in batch:
                row = self._as_failed_if_poisoned(given)
                if row is None:
                    continue
                error = self._try_insert(row)
                if error is None:
                    continue
                repaired = _repaired(row)
                if repaired is not None and self._try_insert(repaired) is None:
                    self._log_event(row, "row_repaired", error)
                    continue
                self._log_event(row, "row_rejected", error)
                key = _work_key(row)
                if key is not None:
                    reason = (
                        f"results.db refused a value of this item's {_TABLES[type(row)]} row "
                        f"({type(error).__name__}: {str(error)[:200]})"
                    )
                    self.failed_items.setdefault(key, reason)
                    self._fail_item(row, reason)
            self.connection.execute("COMMIT")
        except BaseException:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise

    def _try_insert(self, row: _Row) -> BaseException | None:
        self.connection.execute("SAVEPOINT one_row")
        try:
            insert = _INSERTS[type(row)]
            self.connection.execute(insert.sql, insert.params(row))
        except _VALUE_ERRORS as error:
            self.connection.execute("ROLLBACK TO one_row")
            self.connection.execute("RELEASE one_row")
            return error
        self.connection.execute("RELEASE one_row")
        return None

    def _as_failed_if_poisoned(self, row: _Row) -> _Row | None:
        """``row`` as it may be stored once a row of its item was rejected: the item failed, no prediction."""
        if not isinstance(row, ItemRow | PredictionRow):
            return row
        reason = self.failed_items.get((row.run_id, row.backbone, row.method, row.qid, row.realization))
        if reason is None:
            return row
        if isinstance(row, PredictionRow):
            return None
        return row if row.status == "failed" else dataclasses.replace(row, status="failed", error=reason)

    def _fail_item(self, row: _Row, reason: str) -> None:
        if not isinstance(row, CallRow | PredictionRow | ItemRow):
            return
        item = ItemRow(
            run_id=row.run_id,
            item_id=row.item_id,
            backbone=row.backbone,
            method=row.method,
            qid=row.qid,
            realization=row.realization,
            status="failed",
            error=reason,
        )
        repaired = _repaired(item)
        self._try_insert(repaired if isinstance(repaired, ItemRow) else item)

    def _log_event(self, row: _Row, kind: str, error: BaseException) -> None:
        run_id = getattr(row, "run_id", None)
        if run_id is None:
            return
        detail = {**_describe_row(row), "error": f"{type(error).__name__}: {str(error)[:300]}"}
        self._try_insert(
            EventRow(run_id=run_id, kind=kind, detail_json=json.dumps(detail, ensure_ascii=True))
        )

    def close(self) -> None:
        self.connection.close()


def _describe(batch: Sequence[_Row]) -> str:
    counts: dict[str, int] = {}
    for row in batch:
        name = type(row).__name__.lstrip("_")
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in counts.items())


def _answered_calls(rows: Sequence[_Row]) -> int:
    return sum(1 for row in rows if isinstance(row, CallRow) and row.status in ("ok", "length"))


_ROW_TYPES: Final[dict[str, type]] = {
    table: row_type for row_type, table in _TABLES.items() if row_type is not _Blob
}
SPILL_TAKEN_UP: Final = "spill_taken_up"


def _spill_record(row: _Row) -> dict[str, Any]:
    if isinstance(row, _Blob):
        return {
            "table": "blobs",
            "sha256": row.sha256,
            "zlib": base64.b64encode(zlib.compress(row.data, 1)).decode(),
        }
    return {"table": _TABLES[type(row)], "row": dataclasses.asdict(row)}


def _spilled_row(record: dict[str, Any]) -> _Row:
    if record["table"] == "blobs":
        return _Blob(str(record["sha256"]), zlib.decompress(base64.b64decode(record["zlib"])))
    row: _Row = _ROW_TYPES[record["table"]](**record["row"])
    return row


def _largest_call_id(connection: sqlite3.Connection, run_id: int) -> int:
    found = connection.execute("SELECT max(call_id) FROM calls WHERE run_id = ?", (run_id,)).fetchone()
    return int(found[0] or 0)


def take_up_spill(path: str | Path, run_id: int, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> list[str]:
    """Store the rows a full disk left in this run's spill files (`rcarun.store.spill`) and remove the files.

    Call it holding the run's lease and before reading what the run has done. Each file's rows go in one
    transaction with a ``spill_taken_up`` event naming the spill, so a spill found again after a kill between
    commit and removal is only removed. A spill of another results.db, or one this results.db has moved past (the
    run has calls it did not know of), is left as is.

    Returns:
        The lines to tell the user (none when there was nothing to tell).

    Raises:
        StoreError: a file cannot be read, or results.db still refuses its rows (the file is kept).
    """
    path = Path(path)
    told: list[str] = []
    for spill in find_spills(path, run_id):
        line = _take_up_one(path, run_id, spill, busy_timeout_s)
        if line is not None:
            told.append(line)
    return told


def _take_up_one(path: Path, run_id: int, spill: Path, busy_timeout_s: float) -> str | None:
    header, records = read_spill(spill)
    writer = _BatchWriter(path, busy_timeout_s, run_id)
    try:
        connection = writer.connection
        taken = connection.execute(
            "SELECT 1 FROM run_events WHERE run_id = ? AND kind = ? AND json_extract(detail_json, '$.spill_id') = ?",
            (run_id, SPILL_TAKEN_UP, header.spill_id),
        ).fetchone()
        if taken is None:
            run = connection.execute(
                "SELECT name, created_at FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if (
                header.db != str(path.resolve())
                or header.run_id != run_id
                or run is None
                or (header.run_name, header.run_created_at) != (run[0], run[1])
                or header.calls_before != _largest_call_id(connection, run_id)
            ):
                return (
                    f"{spill} holds {header.rows} rows of run {header.run_name!r} of {header.db} that this "
                    "results.db cannot take (another file or run, or the run went on without them); it was left "
                    "as is"
                )
            detail = {
                "spill_id": header.spill_id,
                "file": str(spill),
                "rows": header.rows,
                "answered": header.answered,
            }
            try:
                rows = [_spilled_row(record) for record in records]
            except (KeyError, TypeError, ValueError, zlib.error) as error:  # binascii.Error is a ValueError
                raise StoreError(
                    f"{spill}: a row in it cannot be read ({error!r}); the file is kept"
                ) from error
            rows.append(EventRow(run_id=run_id, kind=SPILL_TAKEN_UP, detail_json=json.dumps(detail)))
            try:
                writer.write(rows)
            except (sqlite3.Error, OSError) as error:
                raise StoreError(
                    f"storing the {header.rows} rows kept in {spill} into {path} failed "
                    f"({type(error).__name__}: {error}); the file is kept"
                ) from error
    finally:
        writer.close()
    spill.unlink()
    if taken is not None:
        return None
    return (
        f"stored the {header.rows} rows ({header.answered} answered calls) kept in {spill} since {path} "
        "was full; the file is removed"
    )


class StoreWriter:
    """Batches rows into results.db from one task; use as ``async with StoreWriter(path) as writer:``.

    Enqueue methods (`put_blob`, `add_call`, `add_prediction`, `set_item`, `add_trajectory`, `add_event`) are
    synchronous, return at once and keep order; call them from the event loop's thread. Await `wait_for_room`
    where a producer can pause, so memory stays bounded, and `flush` when rows must be visible to readers.
    Leaving the ``async with`` commits everything enqueued (also when the body raised or was cancelled), then
    closes the connection. The run's row must exist first (see `Store.get_or_create_run`).

    Args:
        path: the results.db file; created and migrated if needed.
        run_id: when given, the run must exist and every row must belong to it (a guard against mixed runs).
        batch_size: most rows per transaction.
        flush_interval_s: longest a row waits in the queue for a batch to fill before it is committed (s).
        max_queued_rows: queue size at which `wait_for_room` starts to wait. The writer falls behind a fast
            sweep more as results.db grows, so the queue often sits at this bound: at about 600 bytes a row
            (small prompts), 4,000 rows are 2.4 MB, still 8 batches ahead of the writer.
        max_queued_bytes: blob data queued (request and response bodies, uncompressed) at which `wait_for_room`
            starts to wait too, so that long prompts do not multiply the queue's memory.
        recent_blob_capacity: how many recently enqueued blob hashes are remembered so a repeated prompt is
            not queued again (older repeats are still stored once, by INSERT OR IGNORE). Each costs about
            210 bytes and a sweep enqueues one or two new blobs per call, so this bounds the writer's memory;
            the repeats worth catching are near each other (the realizations of a trajectory are queued side by
            side and send the same request).
        busy_timeout_s: how long a write waits for another connection's write lock, in seconds.
        give_up_after_s: once closing, how long failing writes are still retried before the rows pending are
            given up (s).
        on_trouble: called (on the loop's thread, with the error) when a commit first fails for the file's
            sake, and again after a recovery if it fails anew; must not raise.
        on_recovered: called (on the loop's thread) when every row pending through such trouble is committed;
            must not raise.
        spill_run_id: the run whose rows a give-up writes to a spill file (`rcarun.store.spill`) rather than
            dropping them; None: they are dropped.
    """

    def __init__(
        self,
        path: str | Path,
        run_id: int | None = None,
        *,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        max_queued_rows: int = 4_000,
        max_queued_bytes: int = 8 * 2**20,
        recent_blob_capacity: int = 4_096,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        give_up_after_s: float = 10.0,
        on_trouble: Callable[[StoreError], None] | None = None,
        on_recovered: Callable[[], None] | None = None,
        spill_run_id: int | None = None,
    ) -> None:
        if (
            min(batch_size, max_queued_rows, max_queued_bytes) < 1
            or flush_interval_s < 0
            or recent_blob_capacity < 0
        ):
            raise ValueError("batch_size, max_queued_rows and max_queued_bytes must be >= 1, the others >= 0")
        if not give_up_after_s >= 0:
            raise ValueError(f"give_up_after_s must be >= 0, got {give_up_after_s}")
        self._path = Path(path)
        self._run_id = run_id
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._max_queued_rows = max_queued_rows
        self._max_queued_bytes = max_queued_bytes
        self._recent_blob_capacity = recent_blob_capacity
        self._busy_timeout_s = busy_timeout_s
        self._give_up_after_s = give_up_after_s
        self._on_trouble = on_trouble
        self._on_recovered = on_recovered
        self._spill_run_id = spill_run_id
        self._recent_blobs: OrderedDict[str, None] = OrderedDict()
        self._entries: deque[_Entry] = deque()
        # Bytes of blob data in ``_entries``.
        self._queued_bytes = 0
        # Rows taken off the queue and not committed yet, oldest first (more than one batch while writes fail).
        self._pending: list[_Row] = []
        # The events are only touched from the loop's thread. _has_entries: the writer task may have work.
        # _batch_due: a batch need not wait for its deadline (see `_push`). _room: the queue is below both its
        # bounds (or writes fail, so nobody should wait).
        self._has_entries = asyncio.Event()
        self._batch_due = asyncio.Event()
        # Flush requests and the stop queued in ``_entries``: either ends the batch being collected.
        self._control_queued = 0
        self._room = asyncio.Event()
        self._room.set()
        self._executor: ThreadPoolExecutor | None = None
        self._batch_writer: _BatchWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._entered = False
        self._closing = False
        self._trouble: StoreError | None = None
        self._failure: StoreError | None = None
        self._committed_rows = 0
        self._unstored_answers = 0
        self._spilled_to: Path | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._entered:
            raise StoreError("a StoreWriter can be entered once")
        self._entered = True
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rcarun-store-writer")
        try:
            self._batch_writer = await loop.run_in_executor(
                self._executor, _BatchWriter, self._path, self._busy_timeout_s, self._run_id
            )
        except BaseException:
            self._executor.shutdown(wait=False)
            self._closing = True
            raise
        self._task = asyncio.create_task(self._run(), name="rcarun-store-writer")
        self._task.add_done_callback(self._on_task_done)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self._close()
        except StoreError:
            # The body's own exception says more about what went wrong; do not replace it.
            if exc is None:
                raise

    async def _close(self) -> None:
        if self._closing or self._task is None:
            return
        self._closing = True
        self._push(_STOP)
        # asyncio.wait neither raises the task's own error (the done-callback recorded it) nor cancels the task
        # when this wait is cancelled: a second Ctrl-C abandons the wait, the batch in progress still commits.
        await asyncio.wait({self._task})
        loop = asyncio.get_running_loop()
        assert self._executor is not None and self._batch_writer is not None
        await loop.run_in_executor(self._executor, self._batch_writer.close)
        self._executor.shutdown(wait=True)
        self._raise_if_failed()

    # -- enqueueing ---------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Entries queued and not yet taken into a batch."""
        return len(self._entries)

    @property
    def queued_bytes(self) -> int:
        """Bytes of blob data queued and not yet taken into a batch (what `max_queued_bytes` bounds)."""
        return self._queued_bytes

    @property
    def uncommitted(self) -> int:
        """Rows enqueued and not committed yet: those queued and those in a batch being (re)tried."""
        return len(self._pending) + sum(
            1 for entry in self._entries if not isinstance(entry, _FlushRequest | _Stop)
        )

    @property
    def committed_rows(self) -> int:
        """Rows (blobs included) committed by this writer so far."""
        return self._committed_rows

    @property
    def trouble(self) -> StoreError | None:
        """The error of the last failed commit while commits are failing (None when writes go through)."""
        return self._trouble

    @property
    def spilled_to(self) -> Path | None:
        """The spill file that keeps the rows results.db refused to the end, when there is one."""
        return self._spilled_to

    @property
    def unstored_answers(self) -> int:
        """Answered calls (status ok or length) whose rows were given up after writes kept failing."""
        return self._unstored_answers

    def put_blob(self, data: bytes, sha256: str | None = None) -> str:
        """Queue ``data`` for the blobs table (once) and return its key, the hex SHA-256 of ``data``.

        The hash is computed here, synchronously, so the caller can put the key in a row at once; the same
        bytes enqueued again while their hash is still remembered are not queued twice. A caller that already
        hashed ``data`` passes ``sha256`` to skip hashing it again (it must be ``blob_sha256(data)``).
        """
        if sha256 is None:
            sha256 = blob_sha256(data)
        if sha256 in self._recent_blobs:
            self._recent_blobs.move_to_end(sha256)
            return sha256
        self._enqueue(_Blob(sha256, data), run_id=None)
        if self._recent_blob_capacity:
            self._recent_blobs[sha256] = None
            if len(self._recent_blobs) > self._recent_blob_capacity:
                self._recent_blobs.popitem(last=False)
        return sha256

    def add_call(self, row: CallRow) -> None:
        """Queue one attempt's row; the writer assigns its call_id at commit, in enqueue order."""
        if row.status not in CALL_STATUSES:
            raise StoreError(f"call status {row.status!r} is not one of {sorted(CALL_STATUSES)}")
        if row.attempt < 1:
            raise StoreError(f"call attempt must be 1-based, got {row.attempt}")
        if row.realization < 0:
            raise StoreError(f"realization must be >= 0, got {row.realization}")
        self._enqueue(row, run_id=row.run_id)

    def add_prediction(self, row: PredictionRow) -> None:
        """Queue a prediction; it replaces any earlier one with the same work key (an upsert)."""
        self._enqueue(row, run_id=row.run_id)

    def set_item(self, row: ItemRow) -> None:
        """Queue an item's status; it replaces any earlier one for the same work key."""
        if row.status not in ITEM_STATUSES:
            raise StoreError(f"item status {row.status!r} is not one of {sorted(ITEM_STATUSES)}")
        self._enqueue(row, run_id=row.run_id)

    def add_trajectory(self, row: TrajectoryRow) -> None:
        """Queue a trajectory's reference facts; it replaces any earlier one for the same (run, qid)."""
        self._enqueue(row, run_id=row.run_id)

    def add_event(self, row: EventRow) -> None:
        """Queue a run event."""
        if not row.kind:
            raise StoreError("an event needs a kind")
        self._enqueue(row, run_id=row.run_id)

    async def wait_for_room(self) -> None:
        """Return once the queue is below ``max_queued_rows`` entries and ``max_queued_bytes`` of blob data (at
        once, usually): the backpressure point.

        While writes are failing it returns at once: the caller is about to find admission stopped.

        Raises:
            StoreError: the writer failed for good.
        """
        self._raise_if_failed()
        while self._full() and self._failure is None and self._trouble is None:
            self._room.clear()
            await self._room.wait()
        self._raise_if_failed()

    async def flush(self) -> None:
        """Return once everything enqueued before this call is committed.

        Raises:
            StoreError: writes are failing (the rows stay pending and are retried) or failed for good.
        """
        self._raise_if_failed()
        self._raise_if_troubled()
        self._require_open()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._push(_FlushRequest(done))
        await done
        self._raise_if_failed()
        self._raise_if_troubled()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise StoreError(str(self._failure)) from self._failure.__cause__

    def _raise_if_troubled(self) -> None:
        if self._trouble is not None:
            raise StoreError(str(self._trouble)) from self._trouble.__cause__

    def _require_open(self) -> None:
        if self._task is None:
            raise StoreError("the StoreWriter is not open; use `async with StoreWriter(path) as writer:`")
        if self._closing:
            raise StoreError("the StoreWriter is closed")

    def _enqueue(self, entry: _Row, *, run_id: int | None) -> None:
        if self._failure is not None or self._task is None or self._closing:
            self._raise_if_failed()
            self._require_open()
        if run_id is not None and self._run_id is not None and run_id != self._run_id:
            raise StoreError(f"row for run {run_id} given to the writer of run {self._run_id}")
        self._push(entry)

    def _full(self) -> bool:
        return len(self._entries) >= self._max_queued_rows or self._queued_bytes >= self._max_queued_bytes

    def _push(self, entry: _Entry) -> None:
        # The writer task is woken once a batch (the first entry, then the batch due), not once an entry: a
        # wake-up per row cost a sweep more CPU than the rows' own inserts.
        self._entries.append(entry)
        kind = type(entry)
        if kind is _Blob:
            self._queued_bytes += len(entry.data)  # type: ignore[union-attr]
        elif kind is _FlushRequest or kind is _Stop:
            self._control_queued += 1
            self._batch_due.set()
        self._has_entries.set()
        queued = len(self._entries)
        if queued >= self._max_queued_rows or self._queued_bytes >= self._max_queued_bytes:  # `_full`
            self._batch_due.set()
            if self._trouble is None:
                self._room.clear()
        elif queued >= self._batch_size:
            self._batch_due.set()

    def _pop(self) -> _Entry:
        """The oldest queued entry, taken off the queue."""
        entry = self._entries.popleft()
        kind = type(entry)
        if kind is _Blob:
            self._queued_bytes -= len(entry.data)  # type: ignore[union-attr]
        elif kind is _FlushRequest or kind is _Stop:
            self._control_queued -= 1
        return entry

    def _batch_is_due(self) -> bool:
        return self._control_queued > 0 or len(self._entries) >= self._batch_size or self._full()

    # -- the writer task ----------------------------------------------------------------------------------

    async def _collect_batch(
        self, loop: asyncio.AbstractEventLoop
    ) -> tuple[bool, list[asyncio.Future[None]]]:
        """Wait for an entry, then until the batch is due, and move it to ``_pending``.

        A batch starts with the first entry queued and is taken once ``batch_size`` rows are queued, the queue is
        full, a flush or the stop is queued, or ``flush_interval_s`` has passed since its first entry. It ends
        before a flush request or the stop, which are returned (stopping, flushes) and not moved.
        """
        while not self._entries:
            self._has_entries.clear()
            await self._has_entries.wait()
        if not self._batch_is_due() and self._flush_interval_s > 0:
            self._batch_due.clear()
            try:
                async with asyncio.timeout_at(loop.time() + self._flush_interval_s):
                    await self._batch_due.wait()
            except TimeoutError:
                pass
        stopping = False
        flushes: list[asyncio.Future[None]] = []
        room = self._batch_size - len(self._pending)
        while self._entries and room > 0:
            entry = self._pop()
            if isinstance(entry, _Stop):
                stopping = True
                break
            if isinstance(entry, _FlushRequest):
                flushes.append(entry.done)
                break
            self._pending.append(entry)
            room -= 1
        if not self._full():
            self._room.set()
        return stopping, flushes

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        give_up_at: float | None = None
        retry_s = _RETRY_FIRST_S
        while True:
            flushes: list[asyncio.Future[None]] = []
            if self._pending:
                # Writes are failing: take everything queued (order kept behind the pending rows), then retry.
                while self._entries and not stopping:
                    queued = self._pop()
                    if isinstance(queued, _Stop):
                        stopping = True
                    elif isinstance(queued, _FlushRequest):
                        flushes.append(queued.done)
                    else:
                        self._pending.append(queued)
                self._room.set()
            elif stopping:
                return
            else:
                stopping, flushes = await self._collect_batch(loop)
            if stopping and give_up_at is None:
                give_up_at = loop.time() + self._give_up_after_s
            if self._pending and self._failure is None:
                committed = await self._commit_pending(loop)
                if committed:
                    retry_s = _RETRY_FIRST_S
            for done in flushes:
                if not done.done():
                    done.set_result(None)
            if self._pending:
                if give_up_at is not None and loop.time() >= give_up_at:
                    await self._give_up(loop)
                    return
                pause = retry_s if give_up_at is None else min(retry_s, max(0.0, give_up_at - loop.time()))
                await self._sleep_unless_stopping(pause, stopping)
                retry_s = min(_RETRY_CAP_S, retry_s * 2)

    async def _sleep_unless_stopping(self, seconds: float, stopping: bool) -> None:
        """Wait before the next retry; a close (a STOP entry) cuts the wait short, so its deadline starts now."""
        if stopping:
            await asyncio.sleep(seconds)
            return
        self._has_entries.clear()
        if any(isinstance(entry, _Stop) for entry in self._entries):
            return
        try:
            async with asyncio.timeout(seconds):
                while not any(isinstance(entry, _Stop) for entry in self._entries):
                    self._has_entries.clear()
                    await self._has_entries.wait()
        except TimeoutError:
            pass

    async def _commit_pending(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Commit the pending rows: one batch when writes go through, ever smaller chunks while they fail.

        Returns whether anything was committed.
        """
        assert self._batch_writer is not None
        chunk = self._batch_size if self._trouble is None else max(1, len(self._pending) // 2)
        committed_any = recovered = False
        while self._pending:
            rows = self._pending[:chunk]
            try:
                await loop.run_in_executor(self._executor, self._batch_writer.write, rows)
            except Exception as error:
                if chunk > 1 and self._trouble is not None:
                    chunk //= 2  # a smaller transaction may still fit where the big one did not
                    continue
                self._note_trouble(rows, error)
                return committed_any
            del self._pending[: len(rows)]
            self._committed_rows += len(rows)
            committed_any = True
            if self._trouble is not None:
                self._trouble = None
                recovered = True
        if recovered and self._on_recovered is not None:
            self._on_recovered()
        return committed_any

    def _note_trouble(self, rows: Sequence[_Row], error: BaseException) -> None:
        trouble = StoreError(
            f"writing {self._path} failed ({type(error).__name__}: {error}); "
            f"{len(self._pending)} rows ({_describe(self._pending)}) wait to be committed and are being retried"
        )
        trouble.__cause__ = error
        first = self._trouble is None
        self._trouble = trouble
        self._room.set()  # nobody may wait for room while nothing is being committed
        if first and self._on_trouble is not None:
            self._on_trouble(trouble)

    async def _give_up(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop retrying: keep the pending rows in a spill file where one is allowed, else count them lost."""
        answered = _answered_calls(self._pending)
        cause = self._trouble.__cause__ if self._trouble is not None else None
        failing = f"writing {self._path} kept failing ({type(cause).__name__}: {cause})"
        rows = f"{len(self._pending)} rows: {_describe(self._pending)}"
        spill_problem = ""
        if self._spill_run_id is not None:
            try:
                spilled = await loop.run_in_executor(self._executor, self._spill, list(self._pending))
            except (StoreError, sqlite3.Error, OSError) as error:
                spill_problem = f"; keeping them in a spill file failed too ({error})"
            else:
                failure = StoreError(
                    f"{failing}; its {answered} answered calls ({rows}) are kept in {spilled}, which a resume of "
                    "the run stores first"
                )
                failure.__cause__ = cause
                self._spilled_to = spilled
                self._failure = failure
                self._pending.clear()
                self._room.set()
                return
        failure = StoreError(
            f"{failing}; {answered} answered calls could not be stored ({rows}){spill_problem}"
        )
        failure.__cause__ = cause
        self._unstored_answers = answered
        self._failure = failure
        self._pending.clear()
        self._room.set()

    def _spill(self, rows: Sequence[_Row]) -> Path:
        """Write ``rows`` to the run's spill file (on the writer's thread: it reads results.db, which still reads)."""
        assert self._batch_writer is not None and self._spill_run_id is not None
        connection = self._batch_writer.connection
        run = connection.execute(
            "SELECT name, created_at FROM runs WHERE run_id = ?", (self._spill_run_id,)
        ).fetchone()
        if run is None:
            raise StoreError(f"{self._path} has no run {self._spill_run_id}")
        header = SpillHeader(
            db=str(self._path.resolve()),
            run_id=self._spill_run_id,
            run_name=str(run[0]),
            run_created_at=str(run[1]),
            calls_before=_largest_call_id(connection, self._spill_run_id),
            spill_id=uuid.uuid4().hex,
            rows=len(rows),
            answered=_answered_calls(rows),
        )
        return write_spill(header, (_spill_record(row) for row in rows))

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """Turn an unexpected end of the writer task (a bug, or a cancelled loop) into a visible failure."""
        if self._failure is None and (task.cancelled() or task.exception() is not None):
            cause = asyncio.CancelledError() if task.cancelled() else task.exception()
            failure = StoreError(f"the writer task for {self._path} ended unexpectedly ({cause!r})")
            failure.__cause__ = cause
            self._unstored_answers = _answered_calls(self._pending) + _answered_calls(
                [entry for entry in self._entries if not isinstance(entry, _FlushRequest | _Stop)]
            )
            self._failure = failure
        # Nothing will consume the queue any more: release anyone waiting on a flush or for room.
        while self._entries:
            entry = self._pop()
            if isinstance(entry, _FlushRequest) and not entry.done.done():
                entry.done.set_result(None)
        self._room.set()
