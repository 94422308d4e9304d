"""results.db's schema as an append-only list of numbered migrations, and the one way to open the file.

A results.db outlives the code that wrote it (a sweep is resumed weeks later, an old file is re-analysed), so
the schema only ever grows by appending a migration here; an applied migration is never edited.
`open_connection` applies what is missing on every open and records each step in the ``migrations`` table.

It opens only what can be a results.db, and says why otherwise before anything is written: an existing empty
file (a resume would silently start over and pay for everything again), another application's SQLite database
(tables but no ``migrations`` table: rcarun would add its tables and switch the file to WAL), or a file or
directory it cannot write (a read-only mount or missing permission; SQLite alone says only "unable to open").

`open_read_only` is the other way in, for commands that only read (report, cost, export, estimate --against): it
never writes the file, never migrates it and never leaves WAL files behind where there were none, so an archived
file, a read-only mount or another user's results work. A file at an older schema is read as the current one
(what later migrations add shows as the value they would have filled in); rules at `plan_read_only`.

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
import functools
import os
import re
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from rcarun.errors import StoreError
from rcarun.store.rows import utc_timestamp

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "MIGRATIONS",
    "Migration",
    "ReadMode",
    "ReadOnlyConnection",
    "ReadPlan",
    "apply_migrations",
    "directory_writable",
    "open_connection",
    "open_read_only",
    "plan_read_only",
]

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


# -- migration 4: readable text and the views over it ---------------------------------------------------------
# Built once from these constants; like any applied migration, never edited (a later change is a new migration).

_WS = "char(32, 9, 10, 13)"  # what Python's str.strip() removes in practice: space, tab, newline, return


def _normal_role(column: str) -> str:
    """SQL for the scorer's role normal form as far as SQLite can go: trimmed, one trailing ``(-> X)`` or
    ``(→ X)`` handoff suffix dropped, ASCII letters lower-cased (no NFKC, no Unicode casefold, inner
    whitespace not collapsed)."""
    trimmed = f"trim({column}, {_WS})"
    branches = " ".join(
        f"WHEN {trimmed} LIKE '%)' AND instr({trimmed}, '({arrow}') > 0 "
        f"THEN trim(substr({trimmed}, 1, instr({trimmed}, '({arrow}') - 1), {_WS})"
        for arrow in ("->", "→")
    )
    return f"lower(CASE {branches} ELSE {trimmed} END)"


def _stated_reason(column: str) -> str:
    """SQL for the reason a prediction's output states, where `rcarun.analysis.viewer` looks for it: the first
    non-blank string under ``reason``, ``rationale``, ``explanation`` or ``reasoning``, at the top level, then in
    ``answer``, then in ``diagnostics``."""
    paths = [
        f"$.{place}{key}"
        for place in ("", "answer.", "diagnostics.")
        for key in ("reason", "rationale", "explanation", "reasoning")
    ]
    picks = ", ".join(
        f"CASE WHEN json_type({column}, '{path}') = 'text' THEN nullif(trim(json_extract({column}, '{path}'), "
        f"{_WS}), '') END"
        for path in paths
    )
    return f"CASE WHEN json_valid({column}) THEN coalesce({picks}) END"


def _json_text(body: str, *paths: str) -> str:
    picks = [f"json_extract({body}, '{path}')" for path in paths]
    found = picks[0] if len(picks) == 1 else f"coalesce({', '.join(picks)})"
    return f"CASE WHEN json_valid({body}) THEN {found} END"


_CALLS_TEXT_VIEW = f"""
CREATE VIEW calls_text AS
SELECT c.call_id, r.name AS run, c.run_id, c.item_id, c.backbone, c.model, c.method, c.qid, c.realization,
       c.stage, c.attempt, c.status, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.reasoning_tokens,
       c.cached_tokens, c.cost_usd, c.latency_ms, c.error, c.error_kind, c.http_status, c.started_at, c.ended_at,
       CASE WHEN json_valid(rq.text) THEN coalesce(
           (SELECT group_concat(coalesce(json_extract(m.value, '$.role'), '?') || ': '
                                || coalesce(json_extract(m.value, '$.content'), ''), char(10) || char(10))
            FROM json_each(rq.text, '$.messages') AS m),
           (SELECT group_concat(s.value, char(10) || char(10)) FROM json_each(rq.text, '$.segments') AS s)
       ) ELSE rq.text END AS prompt,
       coalesce(answer.text, {_json_text("rs.text", "$.choices[0].message.content")}) AS answer,
       coalesce(
           thinking.text,
           {_json_text("rs.text", "$.choices[0].message.reasoning_content", "$.choices[0].message.reasoning")}
       ) AS reasoning,
       rq.text AS request_json,
       rs.text AS response_body,
       (c.request_sha256 IS NOT NULL AND rq.text IS NULL)
           OR (c.response_sha256 IS NOT NULL AND rs.text IS NULL)
           OR (c.response_text_sha256 IS NOT NULL AND answer.text IS NULL)
           OR (c.reasoning_text_sha256 IS NOT NULL AND thinking.text IS NULL) AS text_compressed
FROM calls AS c
LEFT JOIN runs AS r ON r.run_id = c.run_id
LEFT JOIN blobs AS rq ON rq.sha256 = c.request_sha256
LEFT JOIN blobs AS rs ON rs.sha256 = c.response_sha256
LEFT JOIN blobs AS answer ON answer.sha256 = c.response_text_sha256
LEFT JOIN blobs AS thinking ON thinking.sha256 = c.reasoning_text_sha256
"""

_PREDICTIONS_SCORED_VIEW = f"""
CREATE VIEW predictions_scored AS
SELECT run_id, run, item_id, backbone, method, qid, realization, source, n_steps, pred_role, pred_step,
       ref_role, ref_step, role_valid, step_valid, abstained, fallback, error, reason,
       CASE WHEN ref_role IS NULL THEN NULL
            ELSE coalesce(pred_normal <> '' AND pred_normal = ref_normal, 0) END AS role_correct,
       CASE WHEN ref_step IS NULL THEN NULL
            ELSE coalesce(step_valid = 1 AND pred_step = ref_step, 0) END AS step_exact,
       CASE WHEN ref_step IS NULL THEN NULL
            ELSE coalesce(step_valid = 1 AND abs(pred_step - ref_step) <= 5, 0) END AS step_pm5,
       CASE WHEN ref_role IS NULL OR ref_step IS NULL THEN NULL
            ELSE coalesce(pred_normal <> '' AND pred_normal = ref_normal AND step_valid = 1
                          AND pred_step = ref_step, 0) END AS joint_exact,
       output_json
FROM (
    SELECT p.run_id, r.name AS run, p.item_id, p.backbone, p.method, p.qid, p.realization, t.source, t.n_steps,
           p.pred_role, p.pred_step, t.ref_role, t.ref_step, p.role_valid, p.step_valid, p.abstained, p.fallback,
           p.error, {_stated_reason("p.output_json")} AS reason,
           {_normal_role("p.pred_role")} AS pred_normal, {_normal_role("t.ref_role")} AS ref_normal,
           p.output_json
    FROM predictions AS p
    LEFT JOIN runs AS r ON r.run_id = p.run_id
    LEFT JOIN trajectories AS t ON t.run_id = p.run_id AND t.qid = p.qid
)
"""

_RUN_SUMMARY_VIEW = """
CREATE VIEW run_summary AS
SELECT r.run_id, r.name AS run, r.status, r.created_at, r.updated_at,
       coalesce(t.trajectories, 0) AS trajectories,
       coalesce(i.backbones, 0) AS backbones, coalesce(i.methods, 0) AS methods,
       coalesce(i.items, 0) AS items, coalesce(i.done, 0) AS items_done, coalesce(i.failed, 0) AS items_failed,
       coalesce(i.skipped_budget, 0) AS items_skipped_budget, coalesce(i.interrupted, 0) AS items_interrupted,
       coalesce(p.predictions, 0) AS predictions, coalesce(p.role_correct, 0) AS role_correct,
       coalesce(p.step_exact, 0) AS step_exact,
       coalesce(c.calls, 0) AS calls, coalesce(c.attempts, 0) AS attempts, coalesce(c.cached, 0) AS cached_calls,
       coalesce(c.errors, 0) AS errors, coalesce(c.rate_limited, 0) AS rate_limited,
       coalesce(c.prompt_tokens, 0) AS prompt_tokens, coalesce(c.completion_tokens, 0) AS completion_tokens,
       coalesce(c.cost_usd, 0) AS cost_usd, c.first_call_at, c.last_call_at
FROM runs AS r
LEFT JOIN (SELECT run_id, count(*) AS trajectories FROM trajectories GROUP BY run_id) AS t
    ON t.run_id = r.run_id
LEFT JOIN (
    SELECT run_id, count(DISTINCT backbone) AS backbones, count(DISTINCT method) AS methods, count(*) AS items,
           sum(status = 'done') AS done, sum(status = 'failed') AS failed,
           sum(status = 'skipped_budget') AS skipped_budget, sum(status = 'interrupted') AS interrupted
    FROM items GROUP BY run_id
) AS i ON i.run_id = r.run_id
LEFT JOIN (
    SELECT run_id, count(*) AS predictions, sum(role_correct) AS role_correct, sum(step_exact) AS step_exact
    FROM predictions_scored GROUP BY run_id
) AS p ON p.run_id = r.run_id
LEFT JOIN (
    SELECT run_id, sum(attempt = 1) AS calls, count(*) AS attempts, sum(status = 'cached') AS cached,
           sum(status = 'error') AS errors, sum(status = 'rate_limited') AS rate_limited,
           sum(CASE WHEN status = 'cached' THEN 0 ELSE prompt_tokens END) AS prompt_tokens,
           sum(CASE WHEN status = 'cached' THEN 0 ELSE completion_tokens END) AS completion_tokens,
           sum(CASE WHEN status = 'cached' THEN 0 ELSE cost_usd END) AS cost_usd,
           min(started_at) AS first_call_at, max(coalesce(ended_at, started_at)) AS last_call_at
    FROM calls GROUP BY run_id
) AS c ON c.run_id = r.run_id
"""

# -- migration 5: how each answer came over HTTP, and calls_text with it --------------------------------------
# The view of migration 4 with the three columns beside latency_ms; migration 5 drops that view and creates this.

_CALLS_TEXT_TIMING = "c.latency_ms, c.streamed, c.ttft_ms, c.decode_tokens_per_s,"
_CALLS_TEXT_VIEW_5 = _CALLS_TEXT_VIEW.replace("c.latency_ms,", _CALLS_TEXT_TIMING, 1)

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
    Migration(
        version=3,
        name="which published fallback, if any, decided a prediction",
        statements=("ALTER TABLE predictions ADD COLUMN fallback TEXT",),
    ),
    Migration(
        version=4,
        name="blob text SQLite can read; views calls_text, predictions_scored, run_summary",
        statements=(
            # Rows written before stay compressed and valid: `stored_bytes` reads both forms.
            "ALTER TABLE blobs ADD COLUMN text TEXT",
            _CALLS_TEXT_VIEW,
            _PREDICTIONS_SCORED_VIEW,
            _RUN_SUMMARY_VIEW,
        ),
    ),
    Migration(
        version=5,
        name="how each answer came: streamed or one body, time to first token, decode rate; in calls_text too",
        statements=(
            "ALTER TABLE calls ADD COLUMN streamed INTEGER CHECK (streamed IN (0, 1))",
            "ALTER TABLE calls ADD COLUMN ttft_ms REAL",
            "ALTER TABLE calls ADD COLUMN decode_tokens_per_s REAL",
            "DROP VIEW calls_text",
            _CALLS_TEXT_VIEW_5,
        ),
    ),
    Migration(
        version=6,
        name="the task each trajectory attempts, as a hash: repeated attempts at one task share it",
        statements=("ALTER TABLE trajectories ADD COLUMN task_sha256 TEXT",),
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


# -- reading without writing ----------------------------------------------------------------------------------

ReadMode = Literal["ro", "immutable"]


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """How `open_read_only` opens a file: SQLite's ``mode=ro`` or ``immutable=1``.

    Attributes:
        mode: ``"ro"`` reads through the write-ahead log (a live sweep's newest rows included) and needs the
            ``-wal`` and ``-shm`` files beside the database, creating them where missing; ``"immutable"`` reads
            the database file alone and creates nothing.
        unread_wal_bytes: bytes of an existing ``-wal`` that an immutable open cannot see (rows committed since
            the last checkpoint); 0 when nothing is left out.
    """

    mode: ReadMode
    unread_wal_bytes: int = 0


def directory_writable(directory: Path) -> bool:
    """Whether this process may create files in ``directory`` (where SQLite keeps a database's WAL files)."""
    return os.access(directory, os.W_OK | os.X_OK)


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _size_or_none(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def plan_read_only(path: Path, *, writable: Callable[[Path], bool] = directory_writable) -> ReadPlan:
    """Choose how to read ``path`` without writing to it; ``writable`` is asked about its directory.

    - Nothing beside it (no ``-wal``, ``-shm`` or ``-journal``): no process has it open and the file alone is the
      whole database, so it is read ``immutable`` and nothing is created. (``mode=ro`` would create a ``-wal``
      and a ``-shm`` that a read-only connection can never remove.) A sweep that starts on it meanwhile and
      checkpoints into it is caught by `ReadOnlyConnection.changed`.
    - WAL files there and a directory it may write: ``mode=ro``, which reads a live sweep's newest rows through
      them (SQLite adds the one that is missing).
    - A directory it may not write: ``mode=ro`` only when both ``-wal`` and ``-shm`` exist (SQLite can create
      neither there); otherwise ``immutable``, leaving out what a left-over ``-wal`` holds (``unread_wal_bytes``).
    """
    wal = _size_or_none(_sidecar(path, "-wal"))
    shm = _sidecar(path, "-shm").exists()
    if wal is None and not shm and not _sidecar(path, "-journal").exists():
        return ReadPlan("immutable")
    if (wal is not None and shm) or writable(path.parent):
        return ReadPlan("ro")
    return ReadPlan("immutable", unread_wal_bytes=wal or 0)


_Fingerprint = tuple[int, int, int, int] | None


def _fingerprint(path: Path) -> _Fingerprint:
    """What changes when anything writes the file itself (a checkpoint does; a WAL append does not)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class ReadOnlyConnection:
    """A results.db opened by `open_read_only`.

    Attributes:
        connection: autocommit, rows as `sqlite3.Row`, ``query_only``.
        path: the file.
        plan: how it was opened.
        schema_version: the file's own schema version (never above the code's).
        filled_in: the parts of the current schema the file predates (``calls.usage_source``, ``run_leases``,
            ``calls_text``, ``calls.ttft_ms``), read as what their migration would have filled in: the column's
            default, an empty table, the view (a view the file holds in an older definition, too).
        opened_as: the file's identity, size and mtime when opened (`changed`).
    """

    connection: sqlite3.Connection
    path: Path
    plan: ReadPlan
    schema_version: int
    filled_in: tuple[str, ...]
    opened_as: _Fingerprint

    @property
    def notice(self) -> str | None:
        """One line worth telling whoever reads the results, or None when there is nothing to say."""
        if not self.plan.unread_wal_bytes:
            return None
        return (
            f"{self.path}: read without its write-ahead log: the directory is read-only, so the "
            f"{self.plan.unread_wal_bytes:,} bytes of {_sidecar(self.path, '-wal').name} (rows committed since "
            "the last checkpoint) are left out; copy the file with its -wal to a writable directory to read them"
        )

    def changed(self) -> bool:
        """Whether the file itself changed since it was opened: only an immutable read can be misled by that."""
        return self.plan.mode == "immutable" and _fingerprint(self.path) != self.opened_as


@dataclass(frozen=True, slots=True)
class _Table:
    name: str
    sql: str
    columns: tuple[tuple[str, str | None], ...]  # (name, DEFAULT as SQL text or None) in table order


@functools.cache
def _current_schema() -> tuple[_Table, ...]:
    """The tables every migration builds, read off a migrated in-memory database."""
    connection = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_migrations(connection)
        tables = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' ESCAPE '!' "
            "ORDER BY name"
        ).fetchall()
        return tuple(
            _Table(
                name=str(name),
                sql=str(sql),
                columns=tuple(
                    (str(row[1]), row[4]) for row in connection.execute(f'PRAGMA table_info("{name}")')
                ),
            )
            for name, sql in tables
        )
    finally:
        connection.close()


@functools.cache
def _current_views() -> tuple[tuple[str, str], ...]:
    """(name, CREATE VIEW statement) of every view the migrations create, in creation order."""
    connection = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_migrations(connection)
        rows = connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY rowid")
        return tuple((str(name), str(sql)) for name, sql in rows)
    finally:
        connection.close()


_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\b", re.IGNORECASE)
_CREATE_VIEW = re.compile(r"^\s*CREATE\s+VIEW\b", re.IGNORECASE)


def _fill_in_later_schema(connection: sqlite3.Connection) -> tuple[str, ...]:
    """Show an older file as the current schema, in the connection's TEMP schema (which shadows ``main``).

    A table a later migration adds becomes an empty TEMP table; a table missing columns becomes a TEMP view of
    it with each missing column as its default (NULL without one); a view a later migration adds or redefines
    becomes a TEMP view: exactly what migrating the file would have filled in, so every read query runs
    unchanged. Nothing reaches the file.
    """
    filled: list[str] = []
    for table in _current_schema():
        present = {str(row[1]) for row in connection.execute(f'PRAGMA main.table_info("{table.name}")')}
        if not present:
            connection.execute(_CREATE_TABLE.sub("CREATE TEMP TABLE", table.sql, count=1))
            filled.append(table.name)
            continue
        missing = [(name, default) for name, default in table.columns if name not in present]
        if missing:
            added = ", ".join(
                f'{"NULL" if default is None else default} AS "{name}"' for name, default in missing
            )
            connection.execute(
                f'CREATE TEMP VIEW "{table.name}" AS SELECT *, {added} FROM main."{table.name}"'
            )
            filled.extend(f"{table.name}.{name}" for name, _ in missing)
    # The views read the tables by name, so over the filled-in ones they read old files too (older blobs as
    # compressed: their text NULL). A view a later migration redefined (calls_text in migration 5) is stored in
    # the file as it was: the current definition shadows it, as the migration's DROP and CREATE would have.
    for name, sql in _current_views():
        found = connection.execute("SELECT sql FROM main.sqlite_master WHERE name = ?", (name,)).fetchone()
        if found is None or found[0] != sql:
            connection.execute(_CREATE_VIEW.sub("CREATE TEMP VIEW", sql, count=1))
            filled.append(name)
    return tuple(filled)


def _schema_version_of_results_db(connection: sqlite3.Connection, where: str) -> int:
    """The file's schema version, once it is known to be a results.db this code can read."""
    try:
        names = [
            str(row[0])
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite!_%' "
                "ESCAPE '!' ORDER BY name"
            )
        ]
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error):
            raise StoreError(f"{where} is not a results database (not SQLite: {error})") from error
        raise
    columns = (
        {str(row[1]) for row in connection.execute("PRAGMA table_info(migrations)")}
        if "migrations" in names
        else set()
    )
    if not _MIGRATIONS_COLUMNS.issubset(columns):
        shown = ", ".join(names[:_TABLES_NAMED]) + (", …" if len(names) > _TABLES_NAMED else "")
        which = "its migrations table is not rcarun's" if columns else "it has no migrations table"
        raise StoreError(
            f"{where} is not a results database: {which} ({f'tables: {shown}' if names else 'no tables at all'})"
        )
    version = _applied_version(connection)
    latest = MIGRATIONS[-1].version
    if version > latest:
        raise StoreError(
            f"{where}: results.db is at schema version {version}, newer than this rcarun knows ({latest}); "
            "upgrade rcarun"
        )
    return version


def _connect_read_only(
    path: Path, plan: ReadPlan, busy_timeout_s: float, check_same_thread: bool
) -> sqlite3.Connection:
    uri = path.absolute().as_uri() + ("?mode=ro&immutable=1" if plan.mode == "immutable" else "?mode=ro")
    connection = sqlite3.connect(
        uri, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=check_same_thread
    )
    connection.row_factory = sqlite3.Row
    connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    connection.execute("PRAGMA temp_store = MEMORY")  # the TEMP schema of `_fill_in_later_schema`
    return connection


def _cannot_share_wal(error: sqlite3.Error) -> bool:
    """SQLite could not create or write the WAL index a ``mode=ro`` read needs (another's -shm, a read-only mount)."""
    text = str(error)
    return "readonly" in text or "unable to open" in text


def open_read_only(
    path: str | Path,
    *,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    check_same_thread: bool = True,
    writable: Callable[[Path], bool] = directory_writable,
) -> ReadOnlyConnection:
    """Open an existing results.db for reading only: nothing is written to it, migrated or created beside it
    where it was not (rules at `plan_read_only`); an older schema reads as the current one (`ReadOnlyConnection`).

    Args:
        path: the file.
        busy_timeout_s: how long a read waits for a writer's checkpoint.
        check_same_thread: as `sqlite3.connect`.
        writable: whether a directory can take new files (injected by tests; the default asks the OS).

    Raises:
        StoreError: no such file, not a results database (empty, not SQLite, no ``migrations`` table), a schema
            newer than this code, or SQLite cannot read it.
    """
    where = str(path)
    file = Path(path)
    if file.is_dir():
        raise StoreError(f"{where} is a directory, not a results database")
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        raise StoreError(f"{where}: no such results database (run a sweep first, or pass --db)") from None
    except OSError as error:
        raise StoreError(f"cannot open {where}: {error.strerror or error}") from None
    if size == 0:
        raise StoreError(f"{where} is empty (0 bytes), not a results database")
    plan = plan_read_only(file, writable=writable)
    opened_as = _fingerprint(file)
    while True:
        try:
            connection = _connect_read_only(file, plan, busy_timeout_s, check_same_thread)
        except sqlite3.Error as error:
            raise StoreError(f"cannot open {where}: {error}") from error
        try:
            version = _schema_version_of_results_db(connection, where)
            filled_in = _fill_in_later_schema(connection)
            connection.execute("PRAGMA query_only = ON")
        except StoreError:
            connection.close()
            raise
        except sqlite3.Error as error:
            connection.close()
            if plan.mode == "ro" and _cannot_share_wal(error):
                # The directory looked writable but SQLite could not make or use the WAL index there: the file
                # alone, saying what is left out.
                plan = ReadPlan("immutable", _size_or_none(_sidecar(file, "-wal")) or 0)
                continue
            raise StoreError(f"cannot read {where} as results.db: {error}") from error
        return ReadOnlyConnection(
            connection=connection,
            path=file,
            plan=plan,
            schema_version=version,
            filled_in=filled_in,
            opened_as=opened_as,
        )
