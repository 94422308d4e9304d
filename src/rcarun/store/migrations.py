"""results.db's schema as an append-only list of numbered migrations, and the one way to open the file.

A results.db outlives the code that wrote it (a sweep is resumed weeks later, an old file is re-analysed), so
the schema only ever grows by appending a migration here; an applied migration is never edited.
`open_connection` applies what is missing on every open and records each step in the ``migrations`` table.

It opens only what can be a results.db, and says why otherwise before anything is written: an existing empty
file (a resume would silently start over and pay for everything again), another application's SQLite database
(tables but no ``migrations`` table: rcarun would add its tables and switch the file to WAL), or a file or
directory it cannot write (a read-only mount or missing permission; SQLite alone says only "unable to open").

Connection settings, for every connection the store opens:
    - ``journal_mode=WAL``: readers (the `Store`, `rcarun report`) never block the writer, nor it them;
    - ``synchronous=NORMAL``: with WAL a killed process loses nothing committed; only a power loss or OS crash
      can lose the last few commits, and never leaves a half-written transaction;
    - ``busy_timeout`` (10 s by default): the writer and a reader's occasional write wait for each other;
    - ``foreign_keys=OFF``: the REFERENCES clauses document the relations, but checking them on every insert
      would slow the append-heavy ``calls`` table for no gain (only the writer inserts, from checked rows).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import uuid
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
    Migration(
        version=2,
        name="run leases and the source of each call's usage",
        statements=(
            """
            CREATE TABLE run_leases (
                run_id INTEGER PRIMARY KEY REFERENCES runs (run_id),
                holder TEXT NOT NULL,
                pid INTEGER NOT NULL,
                host TEXT NOT NULL,
                pid_scope TEXT NOT NULL,
                started_at TEXT NOT NULL,
                heartbeat_at TEXT NOT NULL,
                heartbeat_unix REAL NOT NULL
            )
            """,
            "ALTER TABLE calls ADD COLUMN usage_source TEXT NOT NULL DEFAULT 'reported' "
            "CHECK (usage_source IN ('reported', 'estimated'))",
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


_MIGRATIONS_COLUMNS = frozenset({"version", "name", "applied_at"})
_TABLES_NAMED = 6  # how many of a foreign database's tables the refusal lists
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _read_only(where: str, reason: str) -> StoreError:
    return StoreError(f"cannot open {where} for writing: read-only ({reason})")


def _why_not_writable(target: Path) -> str | None:
    """Why ``target`` (a file, or the directory the file and its WAL sidecars live in) cannot be written."""
    if os.access(target, os.W_OK | (os.X_OK if target.is_dir() else 0)):
        return None
    try:
        read_only_mount = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_mount = False
    if read_only_mount:
        return f"{target} is on a read-only file system"
    return f"no write permission on {'directory ' if target.is_dir() else ''}{target}"


def _check_file(where: str) -> None:
    """Refuse, before SQLite touches it, an existing empty file and a file or directory rcarun cannot write.

    A path that does not exist is a new results.db: its directories are created here.
    """
    path = Path(where)
    if path.is_dir():
        raise StoreError(f"{where} is a directory, not a results database")
    try:
        size = path.stat().st_size if path.is_file() else None
        if size is None and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            _create_atomically(path)
            return
    except OSError as error:
        if error.errno in _NOT_WRITABLE:
            reason = (
                f"{error.strerror}: {error.filename}" if error.strerror and error.filename else str(error)
            )
            raise _read_only(where, reason) from error
        raise StoreError(f"cannot open {where}: {error}") from error
    if size == 0:
        # A new results.db is never left empty (the first open writes the header), so this is not one: treated
        # as new, a resume would run and pay for everything again.
        raise StoreError(f"{where} is empty (0 bytes), not a results database; delete it to start a new one")
    for target in (path, path.parent) if size is not None else (path.parent,):
        why = _why_not_writable(target)
        if why is not None:
            raise _read_only(where, why)


def _create_atomically(path: Path) -> None:
    """Make a new, migrated results.db at ``path`` without ever leaving an empty file there.

    SQLite creates a file empty and writes its header later; a process killed in between would leave a 0-byte
    results.db, which rcarun refuses (it cannot tell it from a truncated one). So the file is built under a
    temporary name beside it and linked into place; if another process created ``path`` meanwhile, theirs is kept.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
    try:
        connection = sqlite3.connect(temporary, isolation_level=None)
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            apply_migrations(connection)
        finally:
            connection.close()
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        except OSError:
            # A file system without hard links: a rename, which could only replace a file made in this instant.
            if not path.exists():
                os.replace(temporary, path)
    except sqlite3.Error as error:
        raise StoreError(f"cannot create {path}: {error}") from error
    finally:
        for leftover in (temporary, Path(f"{temporary}-wal"), Path(f"{temporary}-shm")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _foreign_tables(connection: sqlite3.Connection) -> list[str]:
    """The tables (and views) of a database that is not a results.db, [] for ours or a new file; reads only."""
    names = [
        str(row[0])
        for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite!_%' "
            "ESCAPE '!' ORDER BY name"
        )
    ]
    if "migrations" in names:
        columns = {str(row[1]) for row in connection.execute("PRAGMA table_info(migrations)")}
        if _MIGRATIONS_COLUMNS.issubset(columns):
            return []
    return names


def open_connection(
    path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, check_same_thread: bool = True
) -> sqlite3.Connection:
    """Open (creating if needed) and migrate results.db with the store's connection settings.

    The connection is in autocommit mode (``isolation_level=None``): callers open their own transactions with
    ``BEGIN IMMEDIATE`` so that a batch is exactly one transaction.

    Raises:
        StoreError: the file cannot be opened or written, is empty, is not a SQLite database, is another
            application's database, or cannot be migrated. Nothing is written to a refused file.
    """
    where = str(path)
    if where != ":memory:":
        _check_file(where)
    try:
        connection = sqlite3.connect(
            where, timeout=busy_timeout_s, isolation_level=None, check_same_thread=check_same_thread
        )
    except (sqlite3.Error, OSError) as error:
        raise StoreError(f"cannot open {where}: {error}") from error
    try:
        connection.row_factory = sqlite3.Row
        connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        # Before the first write (the WAL switch): another application's file must leave exactly as it came.
        foreign = _foreign_tables(connection)
        if not foreign:
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute("PRAGMA synchronous = NORMAL")
            connection.execute("PRAGMA foreign_keys = OFF")
            apply_migrations(connection)
    except StoreError as error:
        connection.close()
        raise StoreError(f"{where}: {error}") from error
    except sqlite3.Error as error:
        connection.close()
        if "readonly" in str(error):
            raise _read_only(where, str(error)) from error
        raise StoreError(f"cannot open {where} as results.db: {error}") from error
    if foreign:
        connection.close()
        shown = ", ".join(foreign[:_TABLES_NAMED]) + (", …" if len(foreign) > _TABLES_NAMED else "")
        raise StoreError(
            f"{where} is a SQLite database of another application (tables: {shown}); rcarun will not change "
            "it — pass another --db"
        )
    return connection
