"""The schema: migrating a blank file, re-opening a migrated one, refusing unusable files, and docs in sync."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from rcarun.errors import StoreError
from rcarun.store import (
    MIGRATIONS,
    CallRow,
    EventRow,
    ItemRow,
    PredictionRow,
    TrajectoryRow,
    open_connection,
    open_store,
)
from rcarun.store.schema import COLUMN_NOTES, TABLE_NOTES, render_markdown

REPO = Path(__file__).resolve().parents[2]
EXPECTED_TABLES = {
    "migrations",
    "runs",
    "calls",
    "blobs",
    "predictions",
    "items",
    "trajectories",
    "run_events",
    "run_leases",
}


def _columns(connection: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]


def _indexed_columns(connection: sqlite3.Connection, table: str) -> set[tuple[tuple[str, ...], bool]]:
    indexes = set()
    for index in connection.execute(f"PRAGMA index_list({table})").fetchall():
        columns = tuple(info[2] for info in connection.execute(f"PRAGMA index_info({index[1]})"))
        indexes.add((columns, bool(index[2])))
    return indexes


def test_blank_file_is_migrated_to_the_latest_version(db_path: Path) -> None:
    connection = open_connection(db_path)
    try:
        tables = {
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not row[0].startswith("sqlite_")
        }
        assert tables == EXPECTED_TABLES
        versions = [row[0] for row in connection.execute("SELECT version FROM migrations ORDER BY version")]
        assert versions == [migration.version for migration in MIGRATIONS]
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert connection.execute("PRAGMA foreign_keys").fetchone()[0] == 0
        assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
        assert (("cache_key",), False) in _indexed_columns(connection, "calls")
        assert (("run_id", "backbone"), False) in _indexed_columns(connection, "calls")
        assert (("run_id", "item_id"), False) in _indexed_columns(connection, "calls")
        work_key = ("run_id", "backbone", "method", "qid", "realization")
        assert (work_key, True) in _indexed_columns(connection, "predictions")
        assert (work_key, True) in _indexed_columns(connection, "items")
        assert (("run_id", "qid"), True) in _indexed_columns(connection, "trajectories")
    finally:
        connection.close()


def test_row_dataclasses_mirror_their_tables(db_path: Path) -> None:
    connection = open_connection(db_path)
    try:
        # Database-assigned ids are the only columns a row does not carry.
        assert {f.name for f in fields(CallRow)} == set(_columns(connection, "calls")) - {"call_id"}
        assert {f.name for f in fields(PredictionRow)} == set(_columns(connection, "predictions"))
        assert {f.name for f in fields(ItemRow)} == set(_columns(connection, "items"))
        assert {f.name for f in fields(TrajectoryRow)} == set(_columns(connection, "trajectories"))
        assert {f.name for f in fields(EventRow)} == set(_columns(connection, "run_events")) - {"event_id"}
    finally:
        connection.close()


def test_reopening_a_migrated_file_changes_nothing_and_keeps_data(db_path: Path) -> None:
    with open_store(db_path) as store:
        run_id = store.get_or_create_run("kept", "{}")
    schema_before = sqlite3.connect(db_path).execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()

    with open_store(db_path) as store:
        run = store.run_by_name("kept")
        assert run is not None and run.run_id == run_id
    connection = sqlite3.connect(db_path)
    try:
        assert connection.execute("SELECT count(*) FROM migrations").fetchone()[0] == len(MIGRATIONS)
        assert connection.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema_before
    finally:
        connection.close()


def test_migrations_are_numbered_without_gaps() -> None:
    assert [migration.version for migration in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))


def test_a_file_from_a_newer_rcarun_is_refused(db_path: Path) -> None:
    open_connection(db_path).close()
    connection = sqlite3.connect(db_path)
    connection.execute("INSERT INTO migrations VALUES (999, 'from the future', '2030-01-01T00:00:00.000Z')")
    connection.commit()
    connection.close()
    with pytest.raises(StoreError, match="schema version 999"):
        open_store(db_path)


def test_a_file_that_is_not_sqlite_is_refused_with_store_error(tmp_path: Path) -> None:
    not_a_db = tmp_path / "results.db"
    not_a_db.write_bytes(b"this is not a database, just text " * 100)
    with pytest.raises(StoreError, match=r"results\.db"):
        open_store(not_a_db)


def test_every_table_and_column_is_documented(db_path: Path) -> None:
    connection = open_connection(db_path)
    try:
        for table in EXPECTED_TABLES:
            assert TABLE_NOTES.get(table), table
            for column in _columns(connection, table):
                assert COLUMN_NOTES[table].get(column), f"{table}.{column} has no note in schema.py"
    finally:
        connection.close()


def test_checked_in_schema_doc_matches_the_live_schema() -> None:
    checked_in = (REPO / "docs" / "schema.md").read_text(encoding="utf-8")
    assert render_markdown() == checked_in, (
        "regenerate: python -m rcarun.store.schema --markdown > docs/schema.md"
    )


def test_schema_module_prints_the_doc_from_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rcarun.store.schema", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == render_markdown()
    assert "## `calls`" in result.stdout and "| `cache_key` | TEXT |" in result.stdout
    assert result.stderr == ""


# ------------------------------------------------------------------------------ files that are not a results.db


def _foreign_db(path: Path, *tables: str) -> bytes:
    """Another application's SQLite file (rollback journal, its own tables); returns its bytes."""
    connection = sqlite3.connect(path)
    for table in tables:
        connection.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT)")
    connection.execute(f"INSERT INTO {tables[0]} (name) VALUES ('alice')")
    connection.commit()
    connection.close()
    return path.read_bytes()


def _tables(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return [row[0] for row in connection.execute("SELECT name FROM sqlite_master ORDER BY name")]
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("tables", "listed"),
    [
        (("users",), "users"),
        (("users", "calls"), "calls, users"),  # its own `calls`: no longer "migration 1 failed"
        (("a1", "a2", "a3", "a4", "a5", "a6", "a7"), "a1, a2, a3, a4, a5, a6, …"),
    ],
)
def test_another_applications_database_is_refused_and_left_untouched(
    tmp_path: Path, tables: tuple[str, ...], listed: str
) -> None:
    path = tmp_path / "app.db"
    before = _foreign_db(path, *tables)

    for opener in (open_connection, open_store):
        with pytest.raises(StoreError) as caught:
            opener(path)
        assert str(caught.value) == (
            f"{path} is a SQLite database of another application (tables: {listed}); rcarun will not change it "
            "— pass another --db"
        )

    assert path.read_bytes() == before  # no table added, journal mode not switched to WAL
    assert sorted(_tables(path)) == sorted(tables)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["app.db"]  # no -wal or -shm left behind
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        connection.close()


def test_a_migrations_table_of_another_shape_is_not_ours(tmp_path: Path) -> None:
    path = tmp_path / "django.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE migrations (id INTEGER PRIMARY KEY, app TEXT, applied TEXT)")
    connection.commit()
    connection.close()
    with pytest.raises(StoreError, match=r"another application \(tables: migrations\)"):
        open_connection(path)


def test_a_results_db_with_a_table_of_the_users_own_still_opens(db_path: Path) -> None:
    open_connection(db_path).close()
    connection = sqlite3.connect(db_path)
    connection.execute("CREATE TABLE my_notes (note TEXT)")
    connection.commit()
    connection.close()
    open_connection(db_path).close()
    assert "my_notes" in _tables(db_path)


def test_an_empty_file_is_refused_not_started_over(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    path.write_bytes(b"")
    for opener in (open_connection, open_store):
        with pytest.raises(StoreError) as caught:
            opener(path)
        assert str(caught.value) == (
            f"{path} is empty (0 bytes), not a results database; delete it to start a new one"
        )
    assert path.read_bytes() == b""
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["results.db"]


def test_a_path_that_does_not_exist_is_a_new_results_db_with_its_directories(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "results.db"
    open_connection(path).close()
    assert path.stat().st_size > 0
    open_connection(path).close()  # and the file it made opens again as ours
    assert "migrations" in _tables(path)


def test_a_directory_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"is a directory, not a results database"):
        open_connection(tmp_path)


_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_permissions = pytest.mark.skipif(_ROOT, reason="root writes through file modes")


@needs_permissions
def test_a_read_only_directory_is_named_as_such(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(StoreError) as caught:
            open_connection(folder / "results.db")
    finally:
        folder.chmod(0o755)
    assert str(caught.value) == (
        f"cannot open {folder / 'results.db'} for writing: read-only (no write permission on directory {folder})"
    )
    assert list(folder.iterdir()) == []


@needs_permissions
def test_a_read_only_results_db_is_named_as_such(db_path: Path) -> None:
    open_connection(db_path).close()
    db_path.chmod(0o444)
    try:
        with pytest.raises(StoreError) as caught:
            open_store(db_path)
    finally:
        db_path.chmod(0o644)
    assert (
        str(caught.value)
        == f"cannot open {db_path} for writing: read-only (no write permission on {db_path})"
    )


def test_migration_6_adds_the_task_key_to_a_schema_5_file_as_null(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    connection = sqlite3.connect(db, isolation_level=None)
    try:
        connection.execute(
            "CREATE TABLE migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for migration in MIGRATIONS[:5]:
            for statement in migration.statements:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO migrations VALUES (?, ?, '2026-01-01T00:00:00.000Z')",
                (migration.version, migration.name),
            )
        connection.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('old', '2026', '2026')")
        connection.execute("INSERT INTO trajectories VALUES (1, 'q1', 'src', 3, '[]', 'a', 1, 'ff')")
    finally:
        connection.close()
    assert MIGRATIONS[5].version == 6

    with open_store(db) as store:
        assert store.trajectories(1) == [TrajectoryRow(1, "q1", "src", 3, "[]", "a", 1, "ff", None)]
