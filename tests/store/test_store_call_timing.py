"""How each answer came (issue 34): ``calls.streamed``, ``ttft_ms`` and ``decode_tokens_per_s`` written by the
writer, added by migration 5 to a schema-4 file, read from a schema-4 file opened read-only, shown by
``calls_text`` and carried by a merge."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcarun.store import MIGRATIONS, CallRow, StoreWriter, open_read_only, open_store
from rcarun.store.merge import merge_databases

RowMaker = Callable[..., Any]

_TIMING = ("streamed", "ttft_ms", "decode_tokens_per_s")
_CALLS_4 = (
    "INSERT INTO calls (run_id, item_id, backbone, model, method, qid, realization, stage, attempt, status, "
    "prompt_tokens, completion_tokens, cost_usd, latency_ms, usage_source, started_at) "
    "VALUES (1, 'bb|all-at-once|q1|r0', 'bb', 'm', 'all-at-once', 'q1', 0, 'attribution', 1, ?, 100, 20, ?, "
    "?, ?, '2025-06-01T00:00:00.000Z')"
)


def _version_4_file(path: Path) -> Path:
    """A results.db as rcarun wrote it at schema 4: a run with an answered call and a cut one."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute(
            "CREATE TABLE migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for migration in MIGRATIONS[:4]:
            for statement in migration.statements:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO migrations VALUES (?, ?, '2025-06-01T00:00:00.000Z')",
                (migration.version, migration.name),
            )
        connection.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('old', '2025', '2025')")
        connection.execute(_CALLS_4, ("ok", 0.5, 1200.0, "reported"))
        connection.execute(_CALLS_4, ("error", 0.25, 30000.0, "estimated"))
    finally:
        connection.close()
    return path


def _calls(connection: sqlite3.Connection, table: str = "calls") -> list[tuple[object, ...]]:
    return [
        tuple(row)
        for row in connection.execute(
            f"SELECT status, cost_usd, latency_ms, {', '.join(_TIMING)} FROM {table} ORDER BY call_id"
        )
    ]


_OLD_ROWS = [("ok", 0.5, 1200.0, None, None, None), ("error", 0.25, 30000.0, None, None, None)]


def test_migration_5_adds_the_columns_to_a_schema_4_file_and_keeps_its_rows(tmp_path: Path) -> None:
    db = _version_4_file(tmp_path / "results.db")
    assert MIGRATIONS[4].version == 5

    open_store(db).close()

    connection = sqlite3.connect(db)
    try:
        assert (
            connection.execute("SELECT max(version) FROM migrations").fetchone()[0] == MIGRATIONS[-1].version
        )
        columns = {row[1]: row[2] for row in connection.execute("PRAGMA table_info(calls)")}
        assert (columns["streamed"], columns["ttft_ms"], columns["decode_tokens_per_s"]) == (
            "INTEGER",
            "REAL",
            "REAL",
        )
        assert _calls(connection) == _OLD_ROWS
        assert _calls(connection, "calls_text") == _OLD_ROWS  # the view was recreated with them
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            connection.execute("UPDATE calls SET streamed = 2 WHERE call_id = 1")  # 0, 1 or NULL only
    finally:
        connection.close()


def test_a_schema_4_file_read_only_shows_the_new_columns_as_null_and_stays_at_4(tmp_path: Path) -> None:
    db = _version_4_file(tmp_path / "results.db")
    before = db.read_bytes()

    opened = open_read_only(db)
    try:
        assert opened.schema_version == 4
        assert {"calls.streamed", "calls.ttft_ms", "calls.decode_tokens_per_s", "calls_text"} <= set(
            opened.filled_in
        )
        assert _calls(opened.connection) == _OLD_ROWS
        # The file's own calls_text (migration 4's) is shadowed by the current one.
        assert _calls(opened.connection, "calls_text") == _OLD_ROWS
    finally:
        opened.connection.close()

    assert db.read_bytes() == before
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT max(version) FROM migrations").fetchone()[0] == 4


def test_a_current_file_read_only_fills_in_nothing(db_path: Path) -> None:
    open_store(db_path).close()
    opened = open_read_only(db_path)
    try:
        assert opened.schema_version == MIGRATIONS[-1].version
        assert opened.filled_in == ()
    finally:
        opened.connection.close()


def _timed_calls(run_id: int, make_call: RowMaker) -> list[CallRow]:
    return [
        make_call(run_id, qid="streamed", streamed=True, ttft_ms=412.5, decode_tokens_per_s=38.25),
        make_call(run_id, qid="one-body", streamed=False),
        make_call(run_id, qid="cached", status="cached"),
        make_call(
            run_id,
            qid="cut",
            status="error",
            error_kind="stalled",
            usage_source="estimated",
            cost_usd=0.0125,
            completion_tokens=900,
            streamed=True,
            ttft_ms=950.0,
            decode_tokens_per_s=21.0,
        ),
    ]


def _stored(db: Path) -> dict[str, tuple[object, ...]]:
    connection = sqlite3.connect(db)
    try:
        return {
            str(row[0]): tuple(row[1:])
            for row in connection.execute(f"SELECT qid, {', '.join(_TIMING)} FROM calls ORDER BY call_id")
        }
    finally:
        connection.close()


_WRITTEN = {
    "streamed": (1, 412.5, 38.25),
    "one-body": (0, None, None),
    "cached": (None, None, None),
    "cut": (1, 950.0, 21.0),
}


def test_the_writer_stores_how_each_answer_came(db_path: Path, run_id: int, make_call: RowMaker) -> None:
    async def write() -> None:
        async with StoreWriter(db_path, run_id) as writer:
            for call in _timed_calls(run_id, make_call):
                writer.add_call(call)

    asyncio.run(write())

    assert _stored(db_path) == _WRITTEN
    with sqlite3.connect(db_path) as connection:
        row = connection.execute(
            "SELECT streamed, ttft_ms, decode_tokens_per_s FROM calls_text WHERE qid = 'streamed'"
        ).fetchone()
    assert tuple(row) == (1, 412.5, 38.25)


def _keep_first(kept: str, incoming: str) -> tuple[list[str], str]:
    return [], kept


def test_a_merge_carries_the_timing_of_current_files_and_nulls_from_schema_4_ones(
    tmp_path: Path, make_call: RowMaker
) -> None:
    new = tmp_path / "new.db"
    with open_store(new) as store:
        run_id = store.get_or_create_run("timed", "{}")

    async def write() -> None:
        async with StoreWriter(new, run_id) as writer:
            for call in _timed_calls(run_id, make_call):
                writer.add_call(call)

    asyncio.run(write())
    old = _version_4_file(tmp_path / "old.db")
    into = tmp_path / "merged.db"

    summary = merge_databases([new, old], into, _keep_first)

    assert summary.calls_added == 6
    assert _stored(into) == {**_WRITTEN, "q1": (None, None, None)}
    with sqlite3.connect(into) as connection:
        merged_old = connection.execute(
            "SELECT count(*) FROM calls JOIN runs USING (run_id) WHERE name = 'old' AND streamed IS NULL"
        ).fetchone()[0]
    assert merged_old == 2
