"""results.db's schema as an append-only list of numbered migrations, and the one way to open the file.

A results.db outlives the code that wrote it (a sweep is resumed weeks later, an old file is re-analysed), so
the schema only ever grows by appending a migration here; an applied migration is never edited.
`open_connection` applies what is missing on every open and records each step in the ``migrations`` table.

Connection settings, for every connection the store opens:
    - ``journal_mode=WAL``: readers (the `Store`, `rcarun report`) never block the writer, nor it them;
    - ``synchronous=NORMAL``: with WAL a killed process loses nothing committed; only a power loss or OS crash
      can lose the last few commits, and never leaves a half-written transaction;
    - ``busy_timeout`` (10 s by default): the writer and a reader's occasional write wait for each other;
    - ``foreign_keys=OFF``: the REFERENCES clauses document the relations, but checking them on every insert
      would slow the append-heavy ``calls`` table for no gain (only the writer inserts, from checked rows).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rcarun.errors import StoreError
from rcarun.store.rows import utc_timestamp

__all__ = ["DEFAULT_BUSY_TIMEOUT_S", "MIGRATIONS", "Migration", "apply_migrations", "open_connection"]

DEFAULT_BUSY_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: its number (1, 2, ... with no gaps), a short name and the statements it runs."""

    version: int
    name: str
    statements: tuple[str, ...]


_CALL_STATUS_CHECK = "status IN ('ok', 'length', 'rate_limited', 'error', 'cached', 'cancelled')"
_ITEM_STATUS_CHECK = "status IN ('done', 'failed', 'skipped_budget', 'interrupted')"
_RUN_STATUS_CHECK = "status IN ('running', 'finished', 'stopped', 'failed')"

MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        version=1,
        name="initial schema",
        statements=(
            f"""
            CREATE TABLE runs (
                run_id INTEGER PRIMARY KEY,
                name TEXT NOT NULL UNIQUE,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                config_json TEXT NOT NULL DEFAULT '{{}}',
                status TEXT NOT NULL DEFAULT 'running' CHECK ({_RUN_STATUS_CHECK})
            )
            """,
            f"""
            CREATE TABLE calls (
                call_id INTEGER PRIMARY KEY,
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                item_id TEXT NOT NULL,
                backbone TEXT NOT NULL,
                model TEXT NOT NULL,
                method TEXT NOT NULL,
                qid TEXT NOT NULL,
                realization INTEGER NOT NULL CHECK (realization >= 0),
                stage TEXT NOT NULL,
                attempt INTEGER NOT NULL CHECK (attempt >= 1),
                max_tokens INTEGER,
                status TEXT NOT NULL CHECK ({_CALL_STATUS_CHECK}),
                finish_reason TEXT,
                prompt_tokens INTEGER NOT NULL DEFAULT 0,
                completion_tokens INTEGER NOT NULL DEFAULT 0,
                reasoning_tokens INTEGER NOT NULL DEFAULT 0,
                cached_tokens INTEGER NOT NULL DEFAULT 0,
                cost_usd REAL NOT NULL DEFAULT 0,
                latency_ms REAL,
                error TEXT,
                error_kind TEXT,
                http_status INTEGER,
                cache_key TEXT,
                request_sha256 TEXT,
                response_sha256 TEXT,
                response_text_sha256 TEXT,
                reasoning_text_sha256 TEXT,
                endpoint TEXT,
                started_at TEXT NOT NULL,
                ended_at TEXT
            )
            """,
            "CREATE INDEX calls_cache_key ON calls (cache_key)",
            "CREATE INDEX calls_run_backbone ON calls (run_id, backbone)",
            "CREATE INDEX calls_run_item ON calls (run_id, item_id)",
            """
            CREATE TABLE blobs (
                sha256 TEXT PRIMARY KEY,
                zlib_data BLOB NOT NULL,
                size INTEGER NOT NULL
            )
            """,
            """
            CREATE TABLE predictions (
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                item_id TEXT NOT NULL,
                backbone TEXT NOT NULL,
                method TEXT NOT NULL,
                qid TEXT NOT NULL,
                realization INTEGER NOT NULL,
                pred_role TEXT,
                pred_step INTEGER,
                role_valid INTEGER NOT NULL CHECK (role_valid IN (0, 1)),
                step_valid INTEGER NOT NULL CHECK (step_valid IN (0, 1)),
                abstained INTEGER NOT NULL CHECK (abstained IN (0, 1)),
                output_json TEXT,
                error TEXT,
                created_at TEXT NOT NULL,
                UNIQUE (run_id, backbone, method, qid, realization)
            )
            """,
            f"""
            CREATE TABLE items (
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                item_id TEXT NOT NULL,
                backbone TEXT NOT NULL,
                method TEXT NOT NULL,
                qid TEXT NOT NULL,
                realization INTEGER NOT NULL,
                status TEXT NOT NULL CHECK ({_ITEM_STATUS_CHECK}),
                error TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                updated_at TEXT NOT NULL,
                UNIQUE (run_id, backbone, method, qid, realization)
            )
            """,
            """
            CREATE TABLE trajectories (
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                qid TEXT NOT NULL,
                source TEXT NOT NULL,
                n_steps INTEGER NOT NULL,
                roles_json TEXT NOT NULL,
                ref_role TEXT,
                ref_step INTEGER,
                sha256 TEXT NOT NULL,
                UNIQUE (run_id, qid)
            )
            """,
            """
            CREATE TABLE run_events (
                event_id INTEGER PRIMARY KEY,
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                at TEXT NOT NULL,
                kind TEXT NOT NULL,
                detail_json TEXT NOT NULL DEFAULT '{}'
            )
            """,
            "CREATE INDEX run_events_run ON run_events (run_id, at)",
        ),
    ),
)

_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


def _applied_version(connection: sqlite3.Connection) -> int:
    (version,) = connection.execute("SELECT coalesce(max(version), 0) FROM migrations").fetchone()
    return int(version)


def apply_migrations(connection: sqlite3.Connection) -> int:
    """Bring the schema up to date; return the version it is at.

    Each migration runs in its own ``BEGIN IMMEDIATE`` transaction and re-checks the applied version inside
    it, so two processes opening the same new file at once apply each step exactly once.

    Raises:
        StoreError: the file is newer than this code, or a migration fails (the failed step is rolled back).
    """
    latest = MIGRATIONS[-1].version
    connection.execute(_MIGRATIONS_TABLE)
    current = _applied_version(connection)
    if current > latest:
        raise StoreError(
            f"results.db is at schema version {current}, newer than this rcarun knows ({latest}); "
            "upgrade rcarun"
        )
    for migration in MIGRATIONS[current:]:
        connection.execute("BEGIN IMMEDIATE")
        try:
            if _applied_version(connection) >= migration.version:
                connection.execute("ROLLBACK")
                continue
            for statement in migration.statements:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, utc_timestamp()),
            )
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise StoreError(f"migration {migration.version} ({migration.name}) failed: {error}") from error
    return latest


def open_connection(
    path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, check_same_thread: bool = True
) -> sqlite3.Connection:
    """Open (creating if needed) and migrate results.db with the store's connection settings.

    The connection is in autocommit mode (``isolation_level=None``): callers open their own transactions with
    ``BEGIN IMMEDIATE`` so that a batch is exactly one transaction.

    Raises:
        StoreError: the file cannot be opened, is not a SQLite database, or cannot be migrated.
    """
    where = str(path)
    try:
        if where != ":memory:":
            Path(where).parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            where, timeout=busy_timeout_s, isolation_level=None, check_same_thread=check_same_thread
        )
    except (sqlite3.Error, OSError) as error:
        raise StoreError(f"cannot open {where}: {error}") from error
    try:
        connection.row_factory = sqlite3.Row
        connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        connection.execute("PRAGMA foreign_keys = OFF")
        apply_migrations(connection)
    except StoreError as error:
        connection.close()
        raise StoreError(f"{where}: {error}") from error
    except sqlite3.Error as error:
        connection.close()
        raise StoreError(f"cannot open {where} as results.db: {error}") from error
    return connection
