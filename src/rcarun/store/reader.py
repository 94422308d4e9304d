"""The read side of results.db: resume keys, the call cache lookup, run bookkeeping and per-backbone totals.

Its own connection reads a live run beside the writer (WAL). Its few writes (creating a run, setting its status)
are small transactions outside the writer's queue, as they come before the writer starts or after it ends.
Commands that only read open it with ``read_only=True`` (`open_read_only`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from rcarun.errors import StoreError
from rcarun.store.blobs import stored_bytes
from rcarun.store.connect import (
    DEFAULT_BUSY_TIMEOUT_S,
    ReadOnlyConnection,
    open_connection,
    open_read_only,
)
from rcarun.store.lease import DEFAULT_LEASE_STALE_S, LeaseHolder, claim_lease
from rcarun.store.rows import (
    RUN_STATUSES,
    BackboneSummary,
    CachedCall,
    EventRow,
    ItemRow,
    PredictionRow,
    RunRow,
    RunStatus,
    TrajectoryRow,
    WorkKey,
    WorkNames,
    utc_timestamp,
)

__all__ = ["BackboneSummary", "CachedCall", "RunRow", "Store", "WorkKey", "WorkNames", "open_store"]


_T = TypeVar("_T")


def _finished_statuses(include_failed: bool) -> str:
    """The item statuses (an SQL list) that make an item finished for resume; a prediction always does."""
    return "('done', 'failed')" if include_failed else "('done')"


_SUMMARY_COUNTS = tuple(
    name for name in BackboneSummary.__dataclass_fields__ if name not in ("backbone", "cost_usd")
)


_BACKBONE_CALLS_SQL = """
SELECT backbone,
       sum(attempt = 1) AS calls,
       count(*) AS attempts,
       sum(status = 'cached') AS cached_calls,
       sum(status = 'error') AS errors,
       sum(status = 'rate_limited') AS rate_limited,
       sum(status = 'length') AS length_retries,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE prompt_tokens END) AS prompt_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE completion_tokens END) AS completion_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE reasoning_tokens END) AS reasoning_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE cached_tokens END) AS cached_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE cost_usd END) AS cost_usd
FROM calls WHERE run_id = ? GROUP BY backbone
"""

_BACKBONE_ITEMS_SQL = """
SELECT backbone,
       sum(status = 'done') AS items_done,
       sum(status = 'failed') AS items_failed,
       sum(status = 'skipped_budget') AS items_skipped,
       sum(status = 'interrupted') AS items_interrupted
FROM items WHERE run_id = ? GROUP BY backbone
"""

_BACKBONE_PREDICTIONS_SQL = (
    "SELECT backbone, count(*) AS predictions FROM predictions WHERE run_id = ? GROUP BY backbone"
)

_LOOKUP_CALL_SQL = """
SELECT call_id, run_id, status, finish_reason, model, max_tokens, prompt_tokens, completion_tokens,
       reasoning_tokens, cached_tokens, request_sha256, response_sha256, response_text_sha256,
       reasoning_text_sha256
FROM calls
WHERE cache_key = ? AND status IN ('ok', 'length')
  AND (response_text_sha256 IS NOT NULL OR response_sha256 IS NOT NULL) {run_filter}
ORDER BY call_id DESC LIMIT 1
"""


class Store:
    """Synchronous read queries (and run bookkeeping) on results.db, from any thread, one call at a time.

    ``read_only``: opened by `open_read_only` (bookkeeping raises `StoreError`), with ``notice`` its one line.
    """

    def __init__(
        self, path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, read_only: bool = False
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._read: ReadOnlyConnection | None = None
        if read_only:
            self._read = open_read_only(path, busy_timeout_s=busy_timeout_s, check_same_thread=False)
            self._connection = self._read.connection
        else:
            self._connection = open_connection(path, busy_timeout_s=busy_timeout_s, check_same_thread=False)
        self.notice = self._read.notice if self._read is not None else None
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; raise `StoreError` if an immutable read saw the file change meanwhile."""
        with self._lock:
            self._connection.close()
        self._raise_if_changed()

    def _raise_if_changed(self, error: sqlite3.Error | None = None) -> None:
        if self._read is not None and self._read.changed():
            raise StoreError(
                f"{self.path} changed while it was being read (a sweep wrote to it), so what was read may mix "
                "two states; run the command again"
            ) from error

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # the exception on its way out says more than a check of the file would
            with self._lock:
                self._connection.close()

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection (rows as `sqlite3.Row`), for ad-hoc read queries in analysis code."""
        return self._connection

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only; this needs a read-write open")
        with self._lock:
            try:
                self._connection.execute("BEGIN IMMEDIATE")
                yield self._connection
                self._connection.execute("COMMIT")
            except BaseException as error:
                if self._connection.in_transaction:
                    self._connection.execute("ROLLBACK")
                if isinstance(error, sqlite3.Error):
                    raise StoreError(f"{self.path}: {error}") from error
                raise

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._connection.execute(sql, params).fetchall()
            except sqlite3.Error as error:
                self._raise_if_changed(error)
                raise StoreError(f"{self.path}: {error}") from error

    def _rows(self, sql: str, params: tuple[Any, ...], make: Callable[[sqlite3.Row], _T]) -> list[_T]:
        return [make(row) for row in self._fetch(sql, params)]

    # -- runs -----------------------------------------------------------------------------------------------

    def get_or_create_run(
        self,
        name: str,
        config_json: str,
        *,
        lease: LeaseHolder | None = None,
        lease_stale_s: float = DEFAULT_LEASE_STALE_S,
        answer_changes: Sequence[str] | None = None,
    ) -> int:
        """The run_id of the run called ``name``, created if new, else resumed: status ``running``, the new config,
        and a ``resumed`` event saying whether the config changed (by ``answer_changes`` when given, else by text;
        with the previous config). ``lease`` is claimed in the same transaction, so a refusal changes nothing.

        Raises:
            RunBusy: another live process holds the run's lease.
        """
        now = utc_timestamp()
        with self._transaction() as connection:
            found = connection.execute(
                "SELECT run_id, config_json FROM runs WHERE name = ?", (name,)
            ).fetchone()
            if found is None:
                cursor = connection.execute(
                    "INSERT INTO runs (name, created_at, updated_at, config_json, status) "
                    "VALUES (?, ?, ?, ?, 'running')",
                    (name, now, now, config_json),
                )
                assert cursor.lastrowid is not None
                if lease is not None:
                    claim_lease(
                        connection,
                        run_id=cursor.lastrowid,
                        run_name=name,
                        me=lease,
                        stale_after_s=lease_stale_s,
                    )
                return cursor.lastrowid
            run_id = int(found["run_id"])
            if lease is not None:
                claim_lease(connection, run_id=run_id, run_name=name, me=lease, stale_after_s=lease_stale_s)
            changed = (
                bool(answer_changes) if answer_changes is not None else found["config_json"] != config_json
            )
            detail: dict[str, Any] = {"config_changed": changed}
            if answer_changes:
                detail["answer_changes"] = list(answer_changes)
            if changed:
                detail["previous_config_json"] = found["config_json"]
            connection.execute(
                "UPDATE runs SET status = 'running', updated_at = ?, config_json = ? WHERE run_id = ?",
                (now, config_json, run_id),
            )
            connection.execute(
                "INSERT INTO run_events (run_id, at, kind, detail_json) VALUES (?, ?, 'resumed', ?)",
                (run_id, now, json.dumps(detail, sort_keys=True)),
            )
            return run_id

    def set_run_status(self, run_id: int, status: RunStatus) -> None:
        """Set a run's status (running | finished | stopped | failed); `StoreError` for an unknown one or run."""
        if status not in RUN_STATUSES:
            raise StoreError(f"run status {status!r} is not one of {sorted(RUN_STATUSES)}")
        with self._transaction() as connection:
            cursor = connection.execute(
                "UPDATE runs SET status = ?, updated_at = ? WHERE run_id = ?",
                (status, utc_timestamp(), run_id),
            )
            if cursor.rowcount == 0:
                raise StoreError(f"{self.path}: no run with run_id {run_id}")

    def run_by_name(self, name: str) -> RunRow | None:
        rows = self._rows("SELECT * FROM runs WHERE name = ?", (name,), _run_row)
        return rows[0] if rows else None

    def runs(self) -> list[RunRow]:
        """Every run, oldest first."""
        return self._rows("SELECT * FROM runs ORDER BY run_id", (), _run_row)

    # -- resume and the call cache --------------------------------------------------------------------------

    def has_calls(self, run_id: int | None = None) -> bool:
        """Whether any attempt is stored, in this run or (run_id None) in the whole file."""
        if run_id is None:
            rows = self._fetch("SELECT 1 FROM calls LIMIT 1", ())
        else:
            rows = self._fetch("SELECT 1 FROM calls WHERE run_id = ? LIMIT 1", (run_id,))
        return bool(rows)

    def finished_item_keys(self, run_id: int, *, include_failed: bool = True) -> set[WorkKey]:
        """The work keys resume must skip: a prediction, or status ``done`` or (``include_failed``) ``failed``."""
        rows = self._fetch(
            "SELECT backbone, method, qid, realization FROM predictions WHERE run_id = ? "
            "UNION SELECT backbone, method, qid, realization FROM items "
            f"WHERE run_id = ? AND status IN {_finished_statuses(include_failed)}",
            (run_id, run_id),
        )
        return {WorkKey(row[0], row[1], row[2], int(row[3])) for row in rows}

    def count_finished_items(self, run_id: int, backbone: str, *, include_failed: bool = True) -> int:
        """How many of the run's items on ``backbone`` resume must skip, counted in SQLite (`finished_item_keys`)."""
        rows = self._fetch(
            "SELECT (SELECT count(*) FROM predictions WHERE run_id = ? AND backbone = ?) + "
            "(SELECT count(*) FROM items AS i WHERE i.run_id = ? AND i.backbone = ? "
            f"AND i.status IN {_finished_statuses(include_failed)} AND NOT EXISTS (SELECT 1 FROM predictions AS p "
            "WHERE p.run_id = i.run_id AND p.backbone = i.backbone AND p.method = i.method AND p.qid = i.qid "
            "AND p.realization = i.realization))",
            (run_id, backbone, run_id, backbone),
        )
        return int(rows[0][0])

    def finished_realizations(
        self, run_id: int, backbone: str, method: str, qid: str, *, include_failed: bool = True
    ) -> frozenset[int]:
        """The realizations of one trajectory, method and backbone that resume must skip (`finished_item_keys`):
        asked per trajectory, so no run-wide key set is held (30 MB for 100,000 items); indexed."""
        rows = self._fetch(
            "SELECT realization FROM predictions WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? "
            "UNION SELECT realization FROM items WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? "
            f"AND status IN {_finished_statuses(include_failed)}",
            (run_id, backbone, method, qid) * 2,
        )
        return frozenset(int(row[0]) for row in rows)

    def lookup_call(self, cache_key: str, run_id: int | None = None) -> CachedCall | None:
        """The newest replayable ``ok`` or ``length`` attempt under ``cache_key``, in ``run_id`` or (None) any run."""
        if run_id is None:
            rows = self._fetch(_LOOKUP_CALL_SQL.format(run_filter=""), (cache_key,))
        else:
            rows = self._fetch(_LOOKUP_CALL_SQL.format(run_filter="AND run_id = ?"), (cache_key, run_id))
        if not rows:
            return None
        row = rows[0]
        text_sha = row["response_text_sha256"]
        reasoning_sha = row["reasoning_text_sha256"]
        return CachedCall(
            call_id=int(row["call_id"]),
            run_id=int(row["run_id"]),
            status=str(row["status"]),
            text=self.read_blob(text_sha).decode("utf-8") if text_sha else None,
            reasoning_text=self.read_blob(reasoning_sha).decode("utf-8") if reasoning_sha else "",
            finish_reason=row["finish_reason"],
            model=str(row["model"]),
            max_tokens=row["max_tokens"],
            prompt_tokens=int(row["prompt_tokens"]),
            completion_tokens=int(row["completion_tokens"]),
            reasoning_tokens=int(row["reasoning_tokens"]),
            cached_tokens=int(row["cached_tokens"]),
            request_sha256=row["request_sha256"],
            response_sha256=row["response_sha256"],
            response_text_sha256=text_sha,
            reasoning_text_sha256=reasoning_sha,
            raw_body=None if text_sha else self.read_blob(row["response_sha256"]),
        )

    def read_blob(self, sha256: str) -> bytes:
        """The bytes stored under ``sha256``, text or compressed; `StoreError` when missing or corrupt."""
        rows = self._fetch("SELECT zlib_data, text FROM blobs WHERE sha256 = ?", (sha256,))
        if not rows:
            raise StoreError(f"{self.path}: no blob {sha256}")
        compressed = rows[0]["zlib_data"]
        return stored_bytes(sha256, None if compressed is None else bytes(compressed), rows[0]["text"])

    # -- totals and rows for analysis -----------------------------------------------------------------------

    def backbone_summary(self, run_id: int) -> list[BackboneSummary]:
        """Per-backbone totals of the run, sorted by backbone name (see `BackboneSummary` for definitions)."""
        tables = [
            {row["backbone"]: row for row in self._fetch(sql, (run_id,))}
            for sql in (_BACKBONE_CALLS_SQL, _BACKBONE_ITEMS_SQL, _BACKBONE_PREDICTIONS_SQL)
        ]
        summaries = []
        for backbone in sorted(set().union(*tables)):
            values: dict[str, Any] = dict.fromkeys(_SUMMARY_COUNTS, 0) | {"cost_usd": 0.0}
            for table in tables:
                if (row := table.get(backbone)) is not None:
                    values.update((column, value or 0) for column, value in _as_dict(row).items())
            counts = {name: int(values[name]) for name in _SUMMARY_COUNTS}
            summaries.append(BackboneSummary(backbone=backbone, cost_usd=float(values["cost_usd"]), **counts))
        return summaries

    def work_names(self, run_id: int) -> WorkNames:
        """The backbones and methods of the run's work items (an item row or a prediction)."""
        rows = self._fetch(
            "SELECT backbone, method FROM items WHERE run_id = ? "
            "UNION SELECT backbone, method FROM predictions WHERE run_id = ?",
            (run_id, run_id),
        )
        return WorkNames(
            backbones=tuple(sorted({str(row[0]) for row in rows})),
            methods=tuple(sorted({str(row[1]) for row in rows})),
        )

    def output_values(self, run_id: int, key: str) -> dict[tuple[str, str], dict[str, int]]:
        """Per (backbone, method), how many predictions hold each value of the output JSON's top-level ``key``
        (e.g. RCTA's ``preset``; missing: ``""``)."""
        found: dict[tuple[str, str], dict[str, int]] = {}
        for backbone, method, value, count in self._fetch(
            "SELECT backbone, method, coalesce(json_extract(output_json, ?), ''), count(*) FROM predictions "
            "WHERE run_id = ? AND json_valid(output_json) GROUP BY 1, 2, 3",
            (f'$."{key}"', run_id),
        ):
            found.setdefault((str(backbone), str(method)), {})[str(value)] = int(count)
        return found

    def predictions(self, run_id: int) -> list[PredictionRow]:
        """The run's predictions, in key order."""
        return self._rows(
            "SELECT * FROM predictions WHERE run_id = ? ORDER BY backbone, method, qid, realization",
            (run_id,),
            _prediction_row,
        )

    def items(self, run_id: int) -> list[ItemRow]:
        """The run's item statuses, in key order."""
        return self._rows(
            "SELECT * FROM items WHERE run_id = ? ORDER BY backbone, method, qid, realization",
            (run_id,),
            _item_row,
        )

    def trajectories(self, run_id: int) -> list[TrajectoryRow]:
        """The reference facts of the trajectories the run used, by qid."""
        return self._rows(
            "SELECT * FROM trajectories WHERE run_id = ? ORDER BY qid",
            (run_id,),
            lambda row: TrajectoryRow(**_as_dict(row)),
        )

    def events(self, run_id: int) -> list[EventRow]:
        """The run's events, oldest first."""
        return self._rows(
            "SELECT run_id, kind, detail_json, at FROM run_events WHERE run_id = ? ORDER BY event_id",
            (run_id,),
            lambda row: EventRow(**_as_dict(row)),
        )


def _as_dict(row: sqlite3.Row) -> dict[str, Any]:
    # Iterating a sqlite3.Row yields its values, not its keys, so pair them explicitly.
    return dict(zip(row.keys(), row, strict=True))


def _run_row(row: sqlite3.Row) -> RunRow:
    return RunRow(**_as_dict(row))


def _prediction_row(row: sqlite3.Row) -> PredictionRow:
    values = _as_dict(row)
    for flag in ("role_valid", "step_valid", "abstained"):
        values[flag] = bool(values[flag])
    return PredictionRow(**values)


def _item_row(row: sqlite3.Row) -> ItemRow:
    return ItemRow(**_as_dict(row))


def open_store(path: str | Path, *, read_only: bool = False) -> Store:
    """Open results.db for reading and run bookkeeping (creating and migrating it if needed), or with
    ``read_only`` for reading alone (`open_read_only`); `StoreError` when it cannot."""
    return Store(path, read_only=read_only)
