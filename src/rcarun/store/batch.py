"""One results.db transaction per batch of rows: the write connection the writer's thread owns.

One bad row never costs the others: a value SQLite refuses (an integer beyond 64 bits, a lone surrogate, a
broken constraint) sends the batch through row by row, each behind a savepoint; a refused row is stored repaired
when it can be, else rejected, with a ``row_repaired`` / ``row_rejected`` event, and a rejected row's work item
is stored as ``failed`` so a resume does not take it for finished.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any, Final

from rcarun.errors import StoreError
from rcarun.store.blobs import blob_columns
from rcarun.store.connect import open_connection
from rcarun.store.rows import CallRow, EventRow, ItemRow, PredictionRow, TrajectoryRow, WorkKey
from rcarun.text import repair_surrogates

__all__ = ["TABLES", "BatchWriter", "Blob", "Row", "answered_calls"]


@dataclass(frozen=True, slots=True)
class Blob:
    sha256: str
    data: bytes


Row = Blob | CallRow | PredictionRow | ItemRow | TrajectoryRow | EventRow

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
_RunWorkKey = tuple[int, WorkKey]

# Within one transaction the order of tables does not matter (the commit is atomic); within a table the
# enqueue order is kept, so call_ids follow enqueue order and the last upsert of a key wins.
_INSERTS: Final[dict[type, _Insert]] = {
    Blob: _Insert(
        "INSERT OR IGNORE INTO blobs (sha256, zlib_data, text, size) VALUES (?, ?, ?, ?)",
        lambda blob: (blob.sha256, *blob_columns(blob.data), len(blob.data)),
    ),
    TrajectoryRow: _insert("trajectories", TrajectoryRow, unique=("run_id", "qid")),
    CallRow: _insert("calls", CallRow),
    PredictionRow: _insert("predictions", PredictionRow, unique=_WORK_KEY),
    ItemRow: _insert("items", ItemRow, unique=_WORK_KEY),
    EventRow: _insert("run_events", EventRow),
}
TABLES: Final[dict[type, str]] = {
    Blob: "blobs",
    TrajectoryRow: "trajectories",
    CallRow: "calls",
    PredictionRow: "predictions",
    ItemRow: "items",
    EventRow: "run_events",
}


def _work_key(row: Row) -> _RunWorkKey | None:
    if isinstance(row, CallRow | PredictionRow | ItemRow):
        return (row.run_id, WorkKey(row.backbone, row.method, row.qid, row.realization))
    return None


def _repaired(row: Row) -> Row | None:
    """A copy of ``row`` SQLite can store (lone surrogates as U+FFFD, integers beyond 64 bits as NULL), or None
    when nothing in it needed repair."""
    if isinstance(row, Blob):
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


def _describe_row(row: Row) -> dict[str, Any]:
    detail: dict[str, Any] = {"table": TABLES[type(row)]}
    for name in ("item_id", "qid", "stage", "attempt"):
        value = getattr(row, name, None)
        if value is not None:
            # The detail must be storable itself, whatever the row held.
            detail[name] = repair_surrogates(value) if isinstance(value, str) else value
    return detail


class BatchWriter:
    """The write connection; lives on, and is only touched from, the writer's one thread."""

    def __init__(self, path: Path, busy_timeout_s: float, run_id: int | None) -> None:
        self.connection = open_connection(path, busy_timeout_s=busy_timeout_s)
        # Work items one of whose rows was rejected: their item row must say failed, never done.
        self.failed_items: dict[_RunWorkKey, str] = {}
        if run_id is not None:
            found = self.connection.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if found is None:
                self.connection.close()
                raise StoreError(f"{path}: no run with run_id {run_id}; create it with get_or_create_run")

    def write(self, batch: Sequence[Row]) -> None:
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

    def _write_row_by_row(self, batch: Sequence[Row]) -> None:
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
                        f"results.db refused a value of this item's {TABLES[type(row)]} row "
                        f"({type(error).__name__}: {str(error)[:200]})"
                    )
                    self.failed_items.setdefault(key, reason)
                    self._fail_item(row, reason)
            self.connection.execute("COMMIT")
        except BaseException:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise

    def _try_insert(self, row: Row) -> BaseException | None:
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

    def _as_failed_if_poisoned(self, row: Row) -> Row | None:
        """``row`` as it may be stored once a row of its item was rejected: the item failed, no prediction."""
        if not isinstance(row, ItemRow | PredictionRow):
            return row
        reason = self.failed_items.get(
            (row.run_id, WorkKey(row.backbone, row.method, row.qid, row.realization))
        )
        if reason is None:
            return row
        if isinstance(row, PredictionRow):
            return None
        return row if row.status == "failed" else dataclasses.replace(row, status="failed", error=reason)

    def _fail_item(self, row: Row, reason: str) -> None:
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

    def _log_event(self, row: Row, kind: str, error: BaseException) -> None:
        run_id = getattr(row, "run_id", None)
        if run_id is None:
            return
        detail = {**_describe_row(row), "error": f"{type(error).__name__}: {str(error)[:300]}"}
        self._try_insert(
            EventRow(run_id=run_id, kind=kind, detail_json=json.dumps(detail, ensure_ascii=True))
        )

    def close(self) -> None:
        self.connection.close()


def answered_calls(rows: Sequence[Row]) -> int:
    return sum(1 for row in rows if isinstance(row, CallRow) and row.status in ("ok", "length"))
