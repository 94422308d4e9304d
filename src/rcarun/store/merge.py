"""Merging results.db files: a sweep split across machines or people becomes one file, so one report covers it.

Nothing is lost or overwritten: runs match by name and must agree on what decides answers, blobs by hash, items
keep the first prediction (a differing later one is a listed conflict), and a run a live sweep holds is not
merged into. Rules: docs/reliability.md ("Merging results.db files").
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rcarun.errors import StoreError
from rcarun.store.blobs import blob_columns, stored_bytes
from rcarun.store.connect import open_connection, open_read_only
from rcarun.store.lease import DEFAULT_LEASE_STALE_S, live_holder
from rcarun.store.rows import WorkKey

__all__ = ["MergeConflict", "MergeSummary", "Reconcile", "merge_databases"]

Reconcile = Callable[[str, str], tuple[list[str], str]]
"""``(kept config JSON, incoming config JSON) -> (answer-deciding differences, config JSON the run keeps)``."""

_KEY: Final = ("backbone", "method", "qid", "realization")
_PREDICTION_VALUES: Final = (
    "pred_role",
    "pred_step",
    "role_valid",
    "step_valid",
    "abstained",
    "output_json",
    "error",
    "fallback",
)
_CALL_IDENTITY: Final = (
    "item_id",
    "stage",
    "attempt",
    "started_at",
    "request_sha256",
    "response_sha256",
    "status",
)
_RUN_ORDER: Final = {"failed": 0, "stopped": 1, "running": 2, "finished": 3}


@dataclass(frozen=True, slots=True)
class MergeConflict:
    """A later file's row (``source``) that disagrees with the one kept; ``key`` is ``backbone/method/qid/rN``
    of a prediction or ``trajectory qid``."""

    run: str
    key: str
    source: Path
    kept: str
    refused: str


@dataclass(slots=True)
class MergeSummary:
    """What a merge did, counted over every source file."""

    into: Path
    runs_created: list[str] = field(default_factory=list)
    runs_matched: list[str] = field(default_factory=list)
    blobs_added: int = 0
    calls_added: int = 0
    predictions_added: int = 0
    items_added: int = 0
    trajectories_added: int = 0
    events_added: int = 0
    duplicates: int = 0
    calls_not_copied: int = 0
    conflicts: list[MergeConflict] = field(default_factory=list)


def _rows(connection: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Iterator[sqlite3.Row]:
    cursor = connection.execute(sql, tuple(params))
    while batch := cursor.fetchmany(500):
        yield from batch


def _work_key(row: sqlite3.Row) -> WorkKey:
    return WorkKey(str(row["backbone"]), str(row["method"]), str(row["qid"]), int(row["realization"]))


def _shown(key: WorkKey) -> str:
    return f"{key.backbone}/{key.method}/{key.qid}/r{key.realization}"


def _prediction_text(values: tuple[Any, ...]) -> str:
    role, step, _, _, abstained, _, error = values[:7]
    text = f"role {role!r}, step {step}" + (", abstained" if abstained else "")
    return text + (f", error {str(error)[:60]!r}" if error else "")


def _insert(connection: sqlite3.Connection, table: str, values: dict[str, Any]) -> None:
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    connection.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", tuple(values.values()))


def _columns(connection: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in connection.execute(f'PRAGMA table_info("{table}")')]


def _check_configs(
    target: sqlite3.Connection,
    sources: Sequence[tuple[Path, sqlite3.Connection]],
    into: Path,
    reconcile: Reconcile,
) -> dict[str, str]:
    """The configuration each run name keeps; refuses (before any write) a name swept two ways."""
    kept: dict[str, tuple[str, Path]] = {
        str(row["name"]): (str(row["config_json"]), into) for row in target.execute("SELECT * FROM runs")
    }
    for path, connection in sources:
        for row in connection.execute("SELECT name, config_json FROM runs ORDER BY run_id"):
            name, config = str(row["name"]), str(row["config_json"])
            if name not in kept:
                kept[name] = (config, path)
                continue
            differences, merged = reconcile(kept[name][0], config)
            if differences:
                more = f" and {len(differences) - 1} more" if len(differences) > 1 else ""
                raise StoreError(
                    f"run {name!r} of {path} was swept with other answer-deciding settings than in "
                    f"{kept[name][1]} ({differences[0]}{more}); merge only parts of one configuration"
                )
            kept[name] = (merged, kept[name][1])
    return {name: config for name, (config, _) in kept.items()}


class _Merger:
    """Copies one source file into the target inside the caller's transaction."""

    def __init__(self, target: sqlite3.Connection, configs: dict[str, str], summary: MergeSummary) -> None:
        self.target = target
        self.configs = configs
        self.summary = summary
        self.call_columns = [c for c in _columns(target, "calls") if c != "call_id"]

    def merge(self, path: Path, source: sqlite3.Connection) -> None:
        self._blobs(source)
        for run in source.execute("SELECT * FROM runs ORDER BY run_id").fetchall():
            run_id = self._run(run)
            self._trajectories(path, source, run, run_id)
            copied = self._work(path, source, run, run_id)
            self._calls(source, run, run_id, copied)
            self._events(source, run, run_id)

    def _blobs(self, source: sqlite3.Connection) -> None:
        for row in _rows(source, "SELECT sha256, zlib_data, text FROM blobs"):
            sha = str(row["sha256"])
            if self.target.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (sha,)).fetchone():
                continue
            compressed = row["zlib_data"]
            data = stored_bytes(sha, None if compressed is None else bytes(compressed), row["text"])
            zlib_data, text = blob_columns(data)
            self.target.execute(
                "INSERT INTO blobs (sha256, zlib_data, text, size) VALUES (?, ?, ?, ?)",
                (sha, zlib_data, text, len(data)),
            )
            self.summary.blobs_added += 1

    def _run(self, run: sqlite3.Row) -> int:
        name = str(run["name"])
        found = self.target.execute("SELECT * FROM runs WHERE name = ?", (name,)).fetchone()
        if found is None:
            cursor = self.target.execute(
                "INSERT INTO runs (name, created_at, updated_at, config_json, status) VALUES (?, ?, ?, ?, ?)",
                (name, run["created_at"], run["updated_at"], self.configs[name], run["status"]),
            )
            self.summary.runs_created.append(name)
            assert cursor.lastrowid is not None
            return cursor.lastrowid
        # A merged run is as finished as its least finished part, and spans both parts' times.
        status = min((str(found["status"]), str(run["status"])), key=lambda s: _RUN_ORDER.get(s, 0))
        self.target.execute(
            "UPDATE runs SET created_at = min(created_at, ?), updated_at = max(updated_at, ?), config_json = ?, "
            "status = ? WHERE run_id = ?",
            (run["created_at"], run["updated_at"], self.configs[name], status, found["run_id"]),
        )
        if name not in self.summary.runs_matched and name not in self.summary.runs_created:
            self.summary.runs_matched.append(name)
        return int(found["run_id"])

    def _trajectories(self, path: Path, source: sqlite3.Connection, run: sqlite3.Row, run_id: int) -> None:
        for row in _rows(source, "SELECT * FROM trajectories WHERE run_id = ?", (run["run_id"],)):
            kept = self.target.execute(
                "SELECT sha256 FROM trajectories WHERE run_id = ? AND qid = ?", (run_id, row["qid"])
            ).fetchone()
            if kept is None:
                _insert(self.target, "trajectories", {**dict(row), "run_id": run_id})
                self.summary.trajectories_added += 1
            elif kept["sha256"] != row["sha256"]:
                self.summary.conflicts.append(
                    MergeConflict(
                        str(run["name"]),
                        f"trajectory {row['qid']}",
                        path,
                        f"sha256 {kept['sha256'][:12]}",
                        f"sha256 {str(row['sha256'])[:12]}",
                    )
                )

    def _work(self, path: Path, source: sqlite3.Connection, run: sqlite3.Row, run_id: int) -> set[str]:
        """Copy the run's predictions and items; return the item ids whose calls stay behind."""
        source_run = run["run_id"]
        kept_predictions = {
            _work_key(row): tuple(row[c] for c in _PREDICTION_VALUES)
            for row in _rows(self.target, "SELECT * FROM predictions WHERE run_id = ?", (run_id,))
        }
        kept_items = {
            _work_key(row) for row in _rows(self.target, "SELECT * FROM items WHERE run_id = ?", (run_id,))
        }
        copied: set[str] = set()
        skipped: set[str] = set()
        predicted: set[WorkKey] = set()
        for row in _rows(source, "SELECT * FROM predictions WHERE run_id = ?", (source_run,)):
            key = _work_key(row)
            predicted.add(key)
            values = tuple(row[c] for c in _PREDICTION_VALUES)
            kept = kept_predictions.get(key)
            if kept is not None:
                skipped.add(str(row["item_id"]))
                if kept == values:
                    self.summary.duplicates += 1
                else:
                    self.summary.conflicts.append(
                        MergeConflict(
                            str(run["name"]),
                            _shown(key),
                            path,
                            _prediction_text(kept),
                            _prediction_text(values),
                        )
                    )
                continue
            _insert(self.target, "predictions", {**dict(row), "run_id": run_id})
            self.summary.predictions_added += 1
            copied.add(str(row["item_id"]))
        for row in _rows(source, "SELECT * FROM items WHERE run_id = ?", (source_run,)):
            key = _work_key(row)
            item_id = str(row["item_id"])
            if item_id in copied:
                # The prediction is new here: its item row replaces a failed or interrupted attempt's.
                self.target.execute(
                    "DELETE FROM items WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? "
                    "AND realization = ?",
                    (run_id, *key),
                )
            elif key in kept_items or key in kept_predictions or key in predicted:
                skipped.add(item_id)
                continue
            else:
                copied.add(item_id)
            _insert(self.target, "items", {**dict(row), "run_id": run_id})
            self.summary.items_added += 1
        return skipped - copied

    def _calls(self, source: sqlite3.Connection, run: sqlite3.Row, run_id: int, skipped: set[str]) -> None:
        present = set(_columns(source, "calls"))
        columns = [c for c in self.call_columns if c in present]
        identity = " AND ".join(f"{c} IS ?" for c in _CALL_IDENTITY)
        for row in _rows(
            source,
            f"SELECT {', '.join(columns)} FROM calls WHERE run_id = ? ORDER BY call_id",
            (run["run_id"],),
        ):
            if row["item_id"] in skipped:
                self.summary.calls_not_copied += 1
                continue
            same = self.target.execute(
                f"SELECT 1 FROM calls WHERE run_id = ? AND {identity} LIMIT 1",
                (run_id, *(row[c] for c in _CALL_IDENTITY)),
            ).fetchone()
            if same is not None:
                continue
            _insert(self.target, "calls", {**{c: row[c] for c in columns}, "run_id": run_id})
            self.summary.calls_added += 1

    def _events(self, source: sqlite3.Connection, run: sqlite3.Row, run_id: int) -> None:
        for row in _rows(
            source,
            "SELECT at, kind, detail_json FROM run_events WHERE run_id = ? ORDER BY event_id",
            (run["run_id"],),
        ):
            same = self.target.execute(
                "SELECT 1 FROM run_events WHERE run_id = ? AND at = ? AND kind = ? AND detail_json = ? LIMIT 1",
                (run_id, row["at"], row["kind"], row["detail_json"]),
            ).fetchone()
            if same is None:
                _insert(self.target, "run_events", {**dict(row), "run_id": run_id})
                self.summary.events_added += 1


def _lease_stale_s(config_json: str) -> float:
    """The run's own ``sweep.lease_stale_s`` (how old its sweep's heartbeat may grow), or the default."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        value = json.loads(config_json).get("sweep", {}).get("lease_stale_s")
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return DEFAULT_LEASE_STALE_S


def _refuse_live_runs(target: sqlite3.Connection, names: set[str], into: Path, untouched: str) -> None:
    """Refuse to merge into a run of ``names`` that a live sweep holds in the target (``untouched``: what the
    refusal leaves unmerged, for its message)."""
    for row in target.execute("SELECT run_id, name, config_json FROM runs ORDER BY run_id").fetchall():
        if str(row["name"]) not in names:
            continue
        stale_s = _lease_stale_s(str(row["config_json"]))
        holder = live_holder(target, run_id=int(row["run_id"]), stale_after_s=stale_s)
        if holder is not None:
            raise StoreError(
                f"run {row['name']!r} of {into} is being swept by {holder}; merge into it once that sweep "
                f"has ended ({untouched})"
            )


def _run_names(source: sqlite3.Connection) -> set[str]:
    return {str(row["name"]) for row in source.execute("SELECT name FROM runs")}


def _remove_new_database(path: Path) -> None:
    """Remove a results.db this merge created (and SQLite's files beside it)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).unlink()


def merge_databases(sources: Sequence[Path], into: Path, reconcile: Reconcile) -> MergeSummary:
    """Merge ``sources`` (read only) into ``into`` (created if new), in order, one transaction each.

    Raises:
        StoreError: a source is the target or missing or not a results.db, a run name was swept with two
            configurations, or a live sweep holds a run to merge into (nothing is written then).
    """
    resolved = into.resolve()
    for path in sources:
        if path.resolve() == resolved:
            raise StoreError(f"{path} is both a source and --into; merge into a new file")
    opened = [(path, open_read_only(path)) for path in sources]
    summary = MergeSummary(into=into)
    created = not into.exists()
    merged = False
    try:
        target = open_connection(into)
        try:
            configs = _check_configs(
                target, [(path, read.connection) for path, read in opened], into, reconcile
            )
            names = set().union(*(_run_names(read.connection) for _, read in opened))
            _refuse_live_runs(target, names, into, "nothing was merged")
            merger = _Merger(target, configs, summary)
            for path, read in opened:
                target.execute("BEGIN IMMEDIATE")
                try:
                    # Again under the write lock: a sweep that claimed a run since the check above is seen now.
                    _refuse_live_runs(
                        target, _run_names(read.connection), into, f"nothing of {path} was merged"
                    )
                    merger.merge(path, read.connection)
                    target.execute("COMMIT")
                except BaseException:
                    if target.in_transaction:
                        target.execute("ROLLBACK")
                    raise
            merged = True
        except sqlite3.Error as error:
            raise StoreError(f"merging into {into} failed: {error}") from error
        finally:
            target.close()
    finally:
        for _, read in opened:
            read.connection.close()
        if created and not merged:
            _remove_new_database(into)
    return summary
