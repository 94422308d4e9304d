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
    - Memory is bounded by backpressure: the enqueue methods are plain (non-blocking, never dropping) so they
      fit anywhere, including sync callbacks; producers ``await writer.wait_for_room()`` at their admission
      point (e.g. before sending a call), which suspends while ``max_queued_rows`` entries are waiting. The
      queue then never holds more than ``max_queued_rows`` plus what one producer enqueues between waits.
    - A failed batch is never dropped silently: the batch is rolled back, the writer stops writing, and every
      later call (enqueue, ``flush``, closing the ``async with``) raises `StoreError` naming the cause.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from rcarun.errors import StoreError
from rcarun.store.blobs import blob_sha256, compress_blob
from rcarun.store.migrations import DEFAULT_BUSY_TIMEOUT_S, open_connection
from rcarun.store.rows import (
    CALL_STATUSES,
    ITEM_STATUSES,
    CallRow,
    EventRow,
    ItemRow,
    PredictionRow,
    TrajectoryRow,
)

__all__ = ["StoreWriter"]


@dataclass(frozen=True, slots=True)
class _Blob:
    sha256: str
    data: bytes


@dataclass(frozen=True, slots=True)
class _FlushRequest:
    # Resolved by the writer task once every entry ahead of this one is committed (or the writer has failed).
    done: asyncio.Future[None]


class _Stop:
    """Queued by close: commit what is ahead, then end the writer task."""


_STOP: Final = _Stop()

_Row = _Blob | CallRow | PredictionRow | ItemRow | TrajectoryRow | EventRow
_Entry = _Row | _FlushRequest | _Stop


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

# Within one transaction the order of tables does not matter (the commit is atomic); within a table the
# enqueue order is kept, so call_ids follow enqueue order and the last upsert of a key wins.
_INSERTS: Final[dict[type, _Insert]] = {
    _Blob: _Insert(
        "INSERT OR IGNORE INTO blobs (sha256, zlib_data, size) VALUES (?, ?, ?)",
        lambda blob: (blob.sha256, compress_blob(blob.data), len(blob.data)),
    ),
    TrajectoryRow: _insert("trajectories", TrajectoryRow, unique=("run_id", "qid")),
    CallRow: _insert("calls", CallRow),
    PredictionRow: _insert("predictions", PredictionRow, unique=_WORK_KEY),
    ItemRow: _insert("items", ItemRow, unique=_WORK_KEY),
    EventRow: _insert("run_events", EventRow),
}


class _BatchWriter:
    """The write connection; lives on, and is only touched from, the writer's one thread."""

    def __init__(self, path: Path, busy_timeout_s: float, run_id: int | None) -> None:
        self.connection = open_connection(path, busy_timeout_s=busy_timeout_s)
        if run_id is not None:
            found = self.connection.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if found is None:
                self.connection.close()
                raise StoreError(f"{path}: no run with run_id {run_id}; create it with get_or_create_run")

    def write(self, batch: Sequence[_Row]) -> None:
        grouped: dict[type, list[tuple[Any, ...]]] = {row_type: [] for row_type in _INSERTS}
        # Parameters (and blob compression) are built before BEGIN: the write lock is held only for inserts.
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

    def close(self) -> None:
        self.connection.close()


def _describe(batch: Sequence[_Row]) -> str:
    counts: dict[str, int] = {}
    for row in batch:
        name = type(row).__name__.lstrip("_")
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in counts.items())


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
        max_queued_rows: queue size at which `wait_for_room` starts to wait.
        recent_blob_capacity: how many recently enqueued blob hashes are remembered so a repeated prompt is
            not queued again (older repeats are still stored once, by INSERT OR IGNORE).
        busy_timeout_s: how long a write waits for another connection's write lock, in seconds.
    """

    def __init__(
        self,
        path: str | Path,
        run_id: int | None = None,
        *,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        max_queued_rows: int = 10_000,
        recent_blob_capacity: int = 65_536,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        if batch_size < 1 or max_queued_rows < 1 or flush_interval_s < 0 or recent_blob_capacity < 0:
            raise ValueError("batch_size and max_queued_rows must be >= 1, the others >= 0")
        self._path = Path(path)
        self._run_id = run_id
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._max_queued_rows = max_queued_rows
        self._recent_blob_capacity = recent_blob_capacity
        self._busy_timeout_s = busy_timeout_s
        self._recent_blobs: OrderedDict[str, None] = OrderedDict()
        self._entries: deque[_Entry] = deque()
        # Both events are only touched from the loop's thread. _has_entries: the writer task may have work.
        # _room: fewer than max_queued_rows entries wait (or the writer failed, so nobody should wait).
        self._has_entries = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._executor: ThreadPoolExecutor | None = None
        self._batch_writer: _BatchWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._entered = False
        self._closing = False
        self._failure: StoreError | None = None
        self._committed_rows = 0

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
    def committed_rows(self) -> int:
        """Rows (blobs included) committed by this writer so far."""
        return self._committed_rows

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
        """Return once fewer than ``max_queued_rows`` entries wait (at once, usually): the backpressure point.

        Raises:
            StoreError: the writer failed.
        """
        self._raise_if_failed()
        while len(self._entries) >= self._max_queued_rows and self._failure is None:
            self._room.clear()
            await self._room.wait()
        self._raise_if_failed()

    async def flush(self) -> None:
        """Return once everything enqueued before this call is committed.

        Raises:
            StoreError: the writer failed; rows enqueued but not committed are lost.
        """
        self._raise_if_failed()
        self._require_open()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._push(_FlushRequest(done))
        await done
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise StoreError(str(self._failure)) from self._failure.__cause__

    def _require_open(self) -> None:
        if self._task is None:
            raise StoreError("the StoreWriter is not open; use `async with StoreWriter(path) as writer:`")
        if self._closing:
            raise StoreError("the StoreWriter is closed")

    def _enqueue(self, entry: _Row, *, run_id: int | None) -> None:
        self._raise_if_failed()
        self._require_open()
        if run_id is not None and self._run_id is not None and run_id != self._run_id:
            raise StoreError(f"row for run {run_id} given to the writer of run {self._run_id}")
        self._push(entry)

    def _push(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._has_entries.set()
        if len(self._entries) >= self._max_queued_rows:
            self._room.clear()

    # -- the writer task ----------------------------------------------------------------------------------

    async def _next_entry(self, timeout_s: float | None) -> _Entry | None:
        """The oldest queued entry, waiting up to ``timeout_s`` (forever if None); None on timeout."""
        while not self._entries:
            self._has_entries.clear()
            if timeout_s is None:
                await self._has_entries.wait()
                continue
            if timeout_s <= 0:
                return None
            try:
                async with asyncio.timeout(timeout_s):
                    await self._has_entries.wait()
            except TimeoutError:
                return None
        entry = self._entries.popleft()
        if len(self._entries) < self._max_queued_rows:
            self._room.set()
        return entry

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            batch: list[_Row] = []
            flushes: list[asyncio.Future[None]] = []
            entry = await self._next_entry(None)
            deadline = loop.time() + self._flush_interval_s
            while entry is not None:
                if isinstance(entry, _Stop):
                    stopping = True
                    break
                if isinstance(entry, _FlushRequest):
                    flushes.append(entry.done)
                    break
                batch.append(entry)
                if len(batch) >= self._batch_size:
                    break
                entry = await self._next_entry(deadline - loop.time())
            if batch and self._failure is None:
                await self._commit(loop, batch)
            for done in flushes:
                if not done.done():
                    done.set_result(None)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """Turn an unexpected end of the writer task (a bug, or a cancelled loop) into a visible failure."""
        if self._failure is None and (task.cancelled() or task.exception() is not None):
            cause = asyncio.CancelledError() if task.cancelled() else task.exception()
            failure = StoreError(f"the writer task for {self._path} ended unexpectedly ({cause!r})")
            failure.__cause__ = cause
            self._failure = failure
        # Nothing will consume the queue any more: release anyone waiting on a flush or for room.
        while self._entries:
            entry = self._entries.popleft()
            if isinstance(entry, _FlushRequest) and not entry.done.done():
                entry.done.set_result(None)
        self._room.set()

    async def _commit(self, loop: asyncio.AbstractEventLoop, batch: list[_Row]) -> None:
        assert self._batch_writer is not None
        try:
            await loop.run_in_executor(self._executor, self._batch_writer.write, batch)
        except Exception as error:
            # After a failure the task keeps draining (and discarding) the queue, and wait_for_room stops
            # waiting; every later call on the writer raises this error instead.
            failure = StoreError(
                f"writing {self._path} failed; a batch of {len(batch)} rows ({_describe(batch)}) was rolled "
                f"back and the writer stopped ({type(error).__name__}: {error})"
            )
            failure.__cause__ = error
            self._failure = failure
            self._room.set()
        else:
            self._committed_rows += len(batch)
