"""The single writer of results.db: call sites enqueue rows, one task commits them in batched transactions.

Enqueueing is cheap and in memory; batches are written on one dedicated thread, so the loop never waits on disk.
Invariants (each tested): rows commit in enqueue order, one transaction per batch, one bad row costing only itself
(`batch`); a failing disk drops nothing (retried in smaller chunks, ``on_trouble`` once, spilled at the end:
`spill`); memory is bounded by `wait_for_room`; after a final failure every call raises `StoreError`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from rcarun.errors import StoreError
from rcarun.store.batch import BatchWriter, Blob, Row, answered_calls
from rcarun.store.blobs import blob_sha256
from rcarun.store.connect import DEFAULT_BUSY_TIMEOUT_S
from rcarun.store.rows import (
    CALL_STATUSES,
    ITEM_STATUSES,
    CallRow,
    EventRow,
    ItemRow,
    PredictionRow,
    TrajectoryRow,
)
from rcarun.store.spill import spill_rows

__all__ = ["StoreWriter"]

_BatchWriter = BatchWriter  # benchmarks/ablations.py patches the class here


@dataclass(frozen=True, slots=True)
class _FlushRequest:
    # Resolved by the writer task once every entry ahead of this one is committed (or writes are failing).
    done: asyncio.Future[None]


class _Stop:
    """Queued by close: commit what is ahead, then end the writer task."""


_STOP: Final = _Stop()

_Entry = Row | _FlushRequest | _Stop

# Retries of a failing commit: first after this many seconds, doubling up to the cap.
_RETRY_FIRST_S: Final = 0.1
_RETRY_CAP_S: Final = 2.0


def _describe(batch: Sequence[Row]) -> str:
    counts: dict[str, int] = {}
    for row in batch:
        name = type(row).__name__.lstrip("_")
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count} {name}" for name, count in counts.items())


class StoreWriter:
    """Batches rows into results.db from one task; use as ``async with StoreWriter(path) as writer:``.

    Enqueue methods are synchronous, keep order and run on the loop's thread; leaving the block commits all
    (also on an error or cancel). ``max_queued_rows`` (4,000 of ~600 bytes: 8 batches) and ``max_queued_bytes``
    bound the queue; ``on_trouble`` and ``on_recovered`` run on the loop's thread and must not raise;
    ``spill_run_id`` None drops what a give-up holds.
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
        self._pending: list[Row] = []
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
        self._batch_writer: BatchWriter | None = None
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
                self._executor, BatchWriter, self._path, self._busy_timeout_s, self._run_id
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
        """Queue ``data`` for the blobs table (once while remembered) and return its key, ``blob_sha256(data)``
        (which a caller that has it passes as ``sha256``)."""
        if sha256 is None:
            sha256 = blob_sha256(data)
        if sha256 in self._recent_blobs:
            self._recent_blobs.move_to_end(sha256)
            return sha256
        self._enqueue(Blob(sha256, data), run_id=None)
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
        """The backpressure point: return once the queue is below its bounds (at once while writes fail: admission
        stops then); `StoreError` when the writer failed for good."""
        self._raise_if_failed()
        while self._full() and self._failure is None and self._trouble is None:
            self._room.clear()
            await self._room.wait()
        self._raise_if_failed()

    async def flush(self) -> None:
        """Return once everything enqueued before is committed; `StoreError` while writes fail or for good."""
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

    def _enqueue(self, entry: Row, *, run_id: int | None) -> None:
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
        if kind is Blob:
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
        if kind is Blob:
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
        """Wait for an entry, then until the batch is due (full, a flush or stop queued, or ``flush_interval_s``
        after its first entry), and move it to ``_pending``; return (stopping, flushes) met at its end."""
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
        """Commit the pending rows (ever smaller chunks while writes fail); return whether any were committed."""
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

    def _note_trouble(self, rows: Sequence[Row], error: BaseException) -> None:
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
        answered = answered_calls(self._pending)
        cause = self._trouble.__cause__ if self._trouble is not None else None
        failing = f"writing {self._path} kept failing ({type(cause).__name__}: {cause})"
        rows = f"{len(self._pending)} rows: {_describe(self._pending)}"
        message = f"{failing}; {answered} answered calls could not be stored ({rows})"
        if self._spill_run_id is not None:
            try:
                spilled = await loop.run_in_executor(self._executor, self._spill, list(self._pending))
            except (StoreError, sqlite3.Error, OSError) as error:
                message += f"; keeping them in a spill file failed too ({error})"
            else:
                message = (
                    f"{failing}; its {answered} answered calls ({rows}) are kept in {spilled}, which a resume of "
                    "the run stores first"
                )
                self._spilled_to = spilled
        if self._spilled_to is None:
            self._unstored_answers = answered
        self._failure = StoreError(message)
        self._failure.__cause__ = cause
        self._pending.clear()
        self._room.set()

    def _spill(self, rows: Sequence[Row]) -> Path:
        """Write ``rows`` to the run's spill file (on the writer's thread: it reads results.db, which still reads)."""
        assert self._batch_writer is not None and self._spill_run_id is not None
        return spill_rows(self._batch_writer.connection, self._path, self._spill_run_id, rows)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """Turn an unexpected end of the writer task (a bug, or a cancelled loop) into a visible failure."""
        if self._failure is None and (task.cancelled() or task.exception() is not None):
            cause = asyncio.CancelledError() if task.cancelled() else task.exception()
            failure = StoreError(f"the writer task for {self._path} ended unexpectedly ({cause!r})")
            failure.__cause__ = cause
            self._unstored_answers = answered_calls(self._pending) + answered_calls(
                [entry for entry in self._entries if not isinstance(entry, _FlushRequest | _Stop)]
            )
            self._failure = failure
        # Nothing will consume the queue any more: release anyone waiting on a flush or for room.
        while self._entries:
            entry = self._pop()
            if isinstance(entry, _FlushRequest) and not entry.done.done():
                entry.done.set_result(None)
        self._room.set()
