"""The read side of results.db: resume keys, the call cache lookup, run bookkeeping and per-backbone totals.

It has its own connection, separate from the writer's, so the runner can look up cached calls and the report
can read a live run while the writer appends (WAL lets readers and the one writer proceed together). The few
writes here — creating a run, setting its status — are single small transactions that wait on the writer's
lock via the busy timeout rather than going through its queue, because they must be done before the writer
starts or after it has finished.

Commands that only read (report, cost, export, estimate --against) open it with ``read_only=True``
(`open_read_only`): nothing is written, migrated or created beside the file, so archived, shared and read-only
results work, and an older file reads as the current schema.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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
    EventRow,
    ItemRow,
    PredictionRow,
    RunStatus,
    TrajectoryRow,
    utc_timestamp,
)

__all__ = ["BackboneSummary", "CachedCall", "RunRow", "Store", "WorkKey", "WorkNames", "open_store"]

# (backbone, method, qid, realization): what identifies one work item within a run.
WorkKey = tuple[str, str, str, int]

_T = TypeVar("_T")


def _finished_statuses(include_failed: bool) -> str:
    """The item statuses (an SQL list) that make an item finished for resume; a prediction always does."""
    return "('done', 'failed')" if include_failed else "('done')"


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: int
    name: str
    created_at: str
    updated_at: str
    config_json: str
    status: RunStatus


@dataclass(frozen=True, slots=True)
class CachedCall:
    """Everything needed to answer a chat call again from an earlier attempt without sending it.

    The answer is kept one of two ways. Usually only the raw response body is stored (``response_sha256``):
    then ``text`` is None and ``raw_body`` holds the body, which the runner parses again with the backbone's
    preset (the store knows no wire formats). When the extracted text was stored as blobs of its own
    (``response_text_sha256``, ``reasoning_text_sha256``), ``text`` and ``reasoning_text`` hold it. The blob
    keys are returned too, so a ``cached`` call row can point at the same blobs without storing them again.
    """

    call_id: int
    run_id: int
    status: str
    text: str | None
    reasoning_text: str
    finish_reason: str | None
    model: str
    max_tokens: int | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    request_sha256: str | None
    response_sha256: str | None
    response_text_sha256: str | None
    reasoning_text_sha256: str | None
    raw_body: bytes | None = None


@dataclass(frozen=True, slots=True)
class BackboneSummary:
    """One backbone's totals within one run.

    ``calls`` counts logical calls (rows with ``attempt == 1``), ``attempts`` every row. Token and USD sums
    count attempts actually sent to a provider: rows with status ``cached`` (served by the call cache) count
    only in ``cached_calls``. ``rate_limited`` and ``length_retries`` count attempts with status
    ``rate_limited`` (429s) and ``length`` (cut off by max_tokens, hence retried with a larger budget or given
    up); ``errors`` counts status ``error``.
    """

    backbone: str
    items_done: int
    items_failed: int
    items_skipped: int
    items_interrupted: int
    calls: int
    attempts: int
    cached_calls: int
    errors: int
    rate_limited: int
    length_retries: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost_usd: float
    predictions: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens (reasoning and provider-cached tokens are already inside them)."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class WorkNames:
    """The names a run's work items carry (items and predictions alike), each sorted: what flags may name."""

    backbones: tuple[str, ...]
    methods: tuple[str, ...]


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
    """Synchronous read queries (and run bookkeeping) on results.db; see `open_store`.

    One instance may be used from any thread, one call at a time (calls are serialised by a lock).

    Attributes:
        path: the file.
        read_only: opened by `open_read_only`; run bookkeeping then raises `StoreError`.
        notice: with ``read_only``, one line worth telling the user (rows a read had to leave out), else None.
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
        """Close the connection.

        Raises:
            StoreError: read without the WAL (immutable), the file changed meanwhile: a sweep checkpointed into
                it, so what was read may mix two states.
        """
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
        """The run_id of the run called ``name``, created if new.

        An existing run is resumed: its status goes back to ``running``, its config becomes ``config_json``,
        and a ``resumed`` event records whether the config changed (with the previous config when it did). When
        the caller says which changes decide answers (``answer_changes``, accepted by the user), the event's
        ``config_changed`` is whether there were any, and lists them; otherwise any difference in the text counts.
        With ``lease``, the run's lease is claimed in the same transaction (`claim_lease`), so a process that
        is refused changes nothing.

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
        """Set a run's status (running | finished | stopped | failed).

        Raises:
            StoreError: unknown status or run.
        """
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
        """(backbone, method, qid, realization) of the run's items that resume must skip.

        An item is finished when it has a prediction or its status is ``done`` or ``failed``; ``interrupted``
        and ``skipped_budget`` items are run again. With ``include_failed=False`` failed items (without a
        prediction) are run again too, e.g. after a wrong key or a provider outage was fixed.
        """
        rows = self._fetch(
            "SELECT backbone, method, qid, realization FROM predictions WHERE run_id = ? "
            "UNION SELECT backbone, method, qid, realization FROM items "
            f"WHERE run_id = ? AND status IN {_finished_statuses(include_failed)}",
            (run_id, run_id),
        )
        return {(row[0], row[1], row[2], int(row[3])) for row in rows}

    def count_finished_items(self, run_id: int, backbone: str, *, include_failed: bool = True) -> int:
        """How many of the run's items on ``backbone`` resume must skip (the rule of `finished_item_keys`).

        Counted in SQLite, without a key per item in memory: the predictions, plus the finished items that
        have none (both tables hold one row per work key, so no key is counted twice).
        """
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
        """The realizations of one trajectory, method and backbone that resume must skip (`finished_item_keys`).

        Resume asks this once per trajectory as its producer reaches it, instead of holding every finished key
        of the run in memory for the whole sweep (about 300 bytes a key: 30 MB for 100,000 items). Both tables
        have a unique index on (run_id, backbone, method, qid, realization), so each ask reads only the rows
        of that trajectory.
        """
        rows = self._fetch(
            "SELECT realization FROM predictions WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? "
            "UNION SELECT realization FROM items WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? "
            f"AND status IN {_finished_statuses(include_failed)}",
            (run_id, backbone, method, qid) * 2,
        )
        return frozenset(int(row[0]) for row in rows)

    def lookup_call(self, cache_key: str, run_id: int | None = None) -> CachedCall | None:
        """The newest ``ok`` or ``length`` attempt stored under ``cache_key``, or None.

        Args:
            cache_key: the runner's key for a request (what makes two calls interchangeable).
            run_id: look only within this run; None looks across every run in the file.

        Attempts with neither the answer text nor the raw body stored cannot be replayed and are skipped.
        """
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
        """The bytes stored under ``sha256``, from either stored form (text, or compressed before migration 4
        and above `BLOB_TEXT_MAX_BYTES`).

        Raises:
            StoreError: no such blob, or it is corrupt.
        """
        rows = self._fetch("SELECT zlib_data, text FROM blobs WHERE sha256 = ?", (sha256,))
        if not rows:
            raise StoreError(f"{self.path}: no blob {sha256}")
        compressed = rows[0]["zlib_data"]
        return stored_bytes(sha256, None if compressed is None else bytes(compressed), rows[0]["text"])

    # -- totals and rows for analysis -----------------------------------------------------------------------

    def backbone_summary(self, run_id: int) -> list[BackboneSummary]:
        """Per-backbone totals of the run, sorted by backbone name (see `BackboneSummary` for definitions)."""
        calls = {row["backbone"]: row for row in self._fetch(_BACKBONE_CALLS_SQL, (run_id,))}
        items = {row["backbone"]: row for row in self._fetch(_BACKBONE_ITEMS_SQL, (run_id,))}
        predictions = {row["backbone"]: row for row in self._fetch(_BACKBONE_PREDICTIONS_SQL, (run_id,))}

        def count(table: dict[str, sqlite3.Row], backbone: str, column: str) -> int:
            row = table.get(backbone)
            return int(row[column] or 0) if row is not None else 0

        summaries = []
        for backbone in sorted(calls.keys() | items.keys() | predictions.keys()):
            call_row = calls.get(backbone)
            summaries.append(
                BackboneSummary(
                    backbone=backbone,
                    items_done=count(items, backbone, "items_done"),
                    items_failed=count(items, backbone, "items_failed"),
                    items_skipped=count(items, backbone, "items_skipped"),
                    items_interrupted=count(items, backbone, "items_interrupted"),
                    calls=count(calls, backbone, "calls"),
                    attempts=count(calls, backbone, "attempts"),
                    cached_calls=count(calls, backbone, "cached_calls"),
                    errors=count(calls, backbone, "errors"),
                    rate_limited=count(calls, backbone, "rate_limited"),
                    length_retries=count(calls, backbone, "length_retries"),
                    prompt_tokens=count(calls, backbone, "prompt_tokens"),
                    completion_tokens=count(calls, backbone, "completion_tokens"),
                    reasoning_tokens=count(calls, backbone, "reasoning_tokens"),
                    cached_tokens=count(calls, backbone, "cached_tokens"),
                    cost_usd=float(call_row["cost_usd"] or 0.0) if call_row is not None else 0.0,
                    predictions=count(predictions, backbone, "predictions"),
                )
            )
        return summaries

    def work_names(self, run_id: int) -> WorkNames:
        """The backbones and methods of the run's work items (those with an item row or a prediction)."""
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
        """How many predictions of each (backbone, method) hold each value of the top-level ``key`` of their output
        JSON (a method's recorded settings, e.g. RCTA's ``preset``); a missing key counts as ``""``."""
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
    ``read_only`` for reading alone: an existing file, never written, migrated or created (`open_read_only`).

    Raises:
        StoreError: the file cannot be opened or migrated; with ``read_only``, it does not exist, is not a
            results database or is newer than this code.
    """
    return Store(path, read_only=read_only)
