"""Opening results.db: `open_connection` creates and migrates it for writing; `open_read_only` never writes.

Both refuse, before anything is written, what cannot be a results.db: an existing empty file (a resume would
start over and pay again), another application's SQLite database, a file or directory rcarun cannot write.
Connection settings (WAL, ``synchronous=NORMAL``, busy timeout, foreign keys off) and the read-only rules are
explained in docs/reliability.md ("Opening results.db").
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
from rcarun.store.migrations import MIGRATIONS, applied_version, apply_migrations

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "ReadMode",
    "ReadOnlyConnection",
    "ReadPlan",
    "directory_writable",
    "open_connection",
    "open_read_only",
    "plan_read_only",
]

DEFAULT_BUSY_TIMEOUT_S: Final = 10.0
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
    """Refuse, before SQLite touches it, an empty file or one rcarun cannot write; create a missing one."""
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
    """Make a new, migrated results.db at ``path``, built beside it and linked into place.

    SQLite creates a file empty and writes its header later; a kill in between would leave a 0-byte file, which
    rcarun refuses. If another process created ``path`` meanwhile, theirs is kept.
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


def _table_names(connection: sqlite3.Connection) -> list[str]:
    """The file's own tables and views, sorted."""
    rows = connection.execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite!_%' "
        "ESCAPE '!' ORDER BY name"
    )
    return [str(row[0]) for row in rows]


def _migrations_columns(connection: sqlite3.Connection, names: list[str]) -> set[str]:
    if "migrations" not in names:
        return set()
    return {str(row[1]) for row in connection.execute("PRAGMA table_info(migrations)")}


def _shown(names: list[str]) -> str:
    return ", ".join(names[:_TABLES_NAMED]) + (", …" if len(names) > _TABLES_NAMED else "")


def _foreign_tables(connection: sqlite3.Connection) -> list[str]:
    """The tables (and views) of a database that is not a results.db, [] for ours or a new file; reads only."""
    names = _table_names(connection)
    return [] if _MIGRATIONS_COLUMNS.issubset(_migrations_columns(connection, names)) else names


def open_connection(
    path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, check_same_thread: bool = True
) -> sqlite3.Connection:
    """Open (creating if needed) and migrate results.db, in autocommit mode: callers ``BEGIN IMMEDIATE`` so
    that a batch is one transaction. `StoreError` when it cannot be; nothing is written to a refused file."""
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
        raise StoreError(
            f"{where} is a SQLite database of another application (tables: {_shown(foreign)}); "
            "rcarun will not change it — pass another --db"
        )
    return connection


# -- reading without writing ----------------------------------------------------------------------------------

ReadMode = Literal["ro", "immutable"]


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """How `open_read_only` opens a file: ``mode=ro`` (through the WAL, needs ``-wal`` and ``-shm``) or
    ``immutable=1`` (the file alone, creates nothing); ``unread_wal_bytes`` of a ``-wal`` it cannot see."""

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

    No sidecar files: ``immutable`` (``mode=ro`` would leave a ``-wal`` and ``-shm`` behind). Sidecars and a
    writable directory, or both sidecars present: ``mode=ro``. Otherwise ``immutable`` without the ``-wal``.
    Reasons: docs/reliability.md ("Opening results.db").
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
    """A results.db opened by `open_read_only` (autocommit, `sqlite3.Row`, ``query_only``).

    ``filled_in`` names the parts of the current schema the file predates, read as their migration would have
    filled them in; ``opened_as`` is the file's identity, size and mtime when opened (`changed`).
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
def _current_schema() -> tuple[tuple[_Table, ...], tuple[tuple[str, str], ...]]:
    """The tables the migrations build, and (name, CREATE VIEW) of their views in creation order."""
    connection = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_migrations(connection)
        tables = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite!_%' ESCAPE '!' "
            "ORDER BY name"
        ).fetchall()
        views = connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY rowid")
        view_sql = tuple((str(name), str(sql)) for name, sql in views.fetchall())
        return tuple(
            _Table(
                name=str(name),
                sql=str(sql),
                columns=tuple(
                    (str(row[1]), row[4]) for row in connection.execute(f'PRAGMA table_info("{name}")')
                ),
            )
            for name, sql in tables
        ), view_sql
    finally:
        connection.close()


_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\b", re.IGNORECASE)
_CREATE_VIEW = re.compile(r"^\s*CREATE\s+VIEW\b", re.IGNORECASE)


def _fill_in_later_schema(connection: sqlite3.Connection) -> tuple[str, ...]:
    """Show an older file as the current schema in the TEMP schema (which shadows ``main``); nothing reaches the
    file. Missing tables become empty TEMP tables, missing columns their default in a TEMP view, missing or
    redefined views TEMP views."""
    filled: list[str] = []
    tables, views = _current_schema()
    for table in tables:
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
    # A view a later migration redefined is stored as it was: the current one shadows it, as DROP/CREATE would.
    for name, sql in views:
        found = connection.execute("SELECT sql FROM main.sqlite_master WHERE name = ?", (name,)).fetchone()
        if found is None or found[0] != sql:
            connection.execute(_CREATE_VIEW.sub("CREATE TEMP VIEW", sql, count=1))
            filled.append(name)
    return tuple(filled)


def _schema_version_of_results_db(connection: sqlite3.Connection, where: str) -> int:
    """The file's schema version, once it is known to be a results.db this code can read."""
    try:
        names = _table_names(connection)
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error):
            raise StoreError(f"{where} is not a results database (not SQLite: {error})") from error
        raise
    columns = _migrations_columns(connection, names)
    if not _MIGRATIONS_COLUMNS.issubset(columns):
        which = "its migrations table is not rcarun's" if columns else "it has no migrations table"
        tables = f"tables: {_shown(names)}" if names else "no tables at all"
        raise StoreError(f"{where} is not a results database: {which} ({tables})")
    version = applied_version(connection)
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
    """Open an existing results.db for reading only: nothing is written, migrated or created beside it where it
    was not (`plan_read_only`); an older schema reads as the current one. `StoreError` when it cannot be."""
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
                # SQLite could not make or use the WAL index after all: the file alone, saying what is left out.
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
