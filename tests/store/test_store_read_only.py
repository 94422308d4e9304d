"""Reading results.db without writing it: `open_read_only`, `plan_read_only` and `open_store(read_only=True)`.

What is checked is what a reader can observe: the file's bytes and mtime, the files beside it, the rows read,
the one-line refusals. Where a directory's permissions matter and the tests run as root (for whom they do not
bite), the reads run in a child process as the unprivileged user ``nobody``.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.users import as_unprivileged, reachable_directory
from rcarun.errors import StoreError
from rcarun.store import (
    MIGRATIONS,
    ReadPlan,
    Store,
    open_connection,
    open_read_only,
    open_store,
    plan_read_only,
)

_SIDECARS = ("-wal", "-shm", "-journal")


def _state(path: Path) -> tuple[bytes, int, list[str]]:
    """What a read must leave as it was: the bytes, the mtime and the names in the directory."""
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(p.name for p in path.parent.iterdir())


def _results_db(path: Path, runs: tuple[str, ...] = ("first",)) -> Path:
    with open_store(path) as store:
        for name in runs:
            store.get_or_create_run(name, "{}")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # closed: checkpointed, no WAL left
    return path


# -- the plan ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("beside", "writable", "plan"),
    [
        ((), True, ReadPlan("immutable")),
        ((), False, ReadPlan("immutable")),
        (("-wal", "-shm"), True, ReadPlan("ro")),
        (("-wal", "-shm"), False, ReadPlan("ro")),
        (("-wal",), True, ReadPlan("ro")),
        (("-wal",), False, ReadPlan("immutable", unread_wal_bytes=1000)),
        (("-shm",), True, ReadPlan("ro")),
        (("-shm",), False, ReadPlan("immutable")),
        (("-journal",), True, ReadPlan("ro")),
    ],
)
def test_the_plan_reads_through_the_wal_only_where_sqlite_can_keep_its_files(
    tmp_path: Path, beside: tuple[str, ...], writable: bool, plan: ReadPlan
) -> None:
    db = _results_db(tmp_path / "results.db")
    for suffix in beside:
        Path(f"{db}{suffix}").write_bytes(b"\0" * (1000 if suffix == "-wal" else 0))
    asked: list[Path] = []

    def directory_writable(directory: Path) -> bool:
        asked.append(directory)
        return writable

    assert plan_read_only(db, writable=directory_writable) == plan
    assert asked in ([], [tmp_path])  # only ever about the file's own directory


# -- reading leaves everything as it was --------------------------------------------------------------------


def test_a_closed_results_db_is_read_immutable_and_nothing_is_written_or_created(tmp_path: Path) -> None:
    db = _results_db(tmp_path / "results.db", runs=("first", "second"))
    before = _state(db)
    with open_store(db, read_only=True) as store:
        assert [run.name for run in store.runs()] == ["first", "second"]
        assert store.read_only and store.notice is None
        with pytest.raises(StoreError, match=r"opened read-only; this needs a read-write open"):
            store.get_or_create_run("third", "{}")
        with pytest.raises(StoreError, match=r"opened read-only"):
            store.set_run_status(1, "finished")
        with pytest.raises(sqlite3.OperationalError, match=r"readonly|query_only"):
            store.connection.execute("DELETE FROM runs")
    assert _state(db) == before


def test_a_live_sweeps_uncheckpointed_rows_are_read_through_its_wal(tmp_path: Path) -> None:
    db = _results_db(tmp_path / "results.db")
    writer = open_connection(db)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")  # the new run stays in the WAL, as mid-sweep
        writer.execute(
            "INSERT INTO runs (name, created_at, updated_at) VALUES ('live', '2026-01-01', '2026-01-01')"
        )
        before = _state(db)
        opened = open_read_only(db)
        try:
            assert opened.plan == ReadPlan("ro")
            names = [
                row["name"] for row in opened.connection.execute("SELECT name FROM runs ORDER BY run_id")
            ]
            assert names == ["first", "live"]
        finally:
            opened.connection.close()
        assert _state(db) == before  # the database file itself is untouched; the WAL files were there already
    finally:
        writer.close()


def _uncheckpointed_copy(tmp_path: Path) -> Path:
    """A results.db whose last run is only in its -wal, with no -shm: what a crashed sweep leaves behind."""
    source = _results_db(tmp_path / "live" / "results.db")
    writer = open_connection(source)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute(
            "INSERT INTO runs (name, created_at, updated_at) VALUES ('in-wal', '2026-01-01', '2026-01-01')"
        )
        copy = tmp_path / "copy" / "results.db"
        copy.parent.mkdir()
        shutil.copy(source, copy)
        shutil.copy(f"{source}-wal", f"{copy}-wal")
    finally:
        writer.close()
    return copy


def test_without_a_writable_directory_a_left_over_wal_is_left_out_and_said(tmp_path: Path) -> None:
    copy = _uncheckpointed_copy(tmp_path)
    before = _state(copy)
    wal_bytes = Path(f"{copy}-wal").stat().st_size
    opened = open_read_only(copy, writable=lambda _: False)
    try:
        assert opened.plan == ReadPlan("immutable", unread_wal_bytes=wal_bytes)
        assert [row["name"] for row in opened.connection.execute("SELECT name FROM runs")] == ["first"]
        notice = opened.notice
        assert notice is not None and "\n" not in notice
        assert f"{wal_bytes:,} bytes of results.db-wal" in notice and "left out" in notice
    finally:
        opened.connection.close()
    assert _state(copy) == before  # no -shm made


def test_with_a_writable_directory_the_left_over_wal_is_read(tmp_path: Path) -> None:
    copy = _uncheckpointed_copy(tmp_path)
    with open_store(copy, read_only=True) as store:
        assert [run.name for run in store.runs()] == ["first", "in-wal"]
        assert store.notice is None


def test_a_checkpoint_during_an_immutable_read_fails_the_read(tmp_path: Path) -> None:
    db = _results_db(tmp_path / "results.db")
    store = open_store(db, read_only=True)
    assert [run.name for run in store.runs()] == ["first"]
    with open_store(db) as writer:  # a sweep starts meanwhile and checkpoints as it closes
        writer.get_or_create_run("second", "{}")
    with pytest.raises(StoreError, match=r"changed while it was being read .*; run the command again"):
        store.close()


# -- real permissions ---------------------------------------------------------------------------------------

_READER = (
    "import sys; from rcarun.store import open_store\n"
    "with open_store(sys.argv[1], read_only=True) as s: print(*[r.name for r in s.runs()], s.notice, sep='|')"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory any user can reach (pytest's tmp_path is private to its owner)."""
    with reachable_directory("rcarun-ro-") as folder:
        yield folder


def _as_other_user(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` where file modes bite: as ``nobody`` when we are root, else as ourselves."""
    return subprocess.run(as_unprivileged(argv), capture_output=True, text=True, timeout=60, check=False)


def test_a_read_only_file_in_a_read_only_directory_is_read(shared_dir: Path) -> None:
    db = _results_db(shared_dir / "results.db", runs=("archived",))
    db.chmod(0o444)
    shared_dir.chmod(0o555)
    before = _state(db)
    result = _as_other_user([sys.executable, "-c", _READER, str(db)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "archived|None"
    assert _state(db) == before


def test_a_crashed_sweeps_wal_in_a_read_only_directory_is_left_out_with_one_line(
    tmp_path: Path, shared_dir: Path
) -> None:
    copy = _uncheckpointed_copy(tmp_path)
    for path in (copy, Path(f"{copy}-wal")):
        shutil.copy(path, shared_dir / path.name)
        (shared_dir / path.name).chmod(0o444)
    shared_dir.chmod(0o555)
    db = shared_dir / "results.db"
    before = _state(db)
    result = _as_other_user([sys.executable, "-c", _READER, str(db)])
    assert result.returncode == 0, result.stderr
    runs, notice = result.stdout.strip().split("|")
    assert runs == "first" and "read without its write-ahead log" in notice
    assert _state(db) == before


# -- what is refused, in one line, untouched -----------------------------------------------------------------


def test_a_missing_path_is_refused_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "results.db"
    with pytest.raises(StoreError) as caught:
        open_store(missing, read_only=True)
    assert str(caught.value) == f"{missing}: no such results database (run a sweep first, or pass --db)"
    assert not missing.parent.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"is empty \(0 bytes\), not a results database$"),
        (
            b"not a database at all" * 100,
            r"is not a results database \(not SQLite: file is not a database\)$",
        ),
    ],
)
def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "results.db"
    path.write_bytes(content)
    before = _state(path)
    with pytest.raises(StoreError, match=message):
        open_store(path, read_only=True)
    assert _state(path) == before


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"is a directory, not a results database$"):
        open_store(tmp_path, read_only=True)


def test_another_applications_database_is_refused_with_its_tables(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    before = _state(path)
    with pytest.raises(StoreError) as caught:
        open_store(path, read_only=True)
    assert (
        str(caught.value) == f"{path} is not a results database: it has no migrations table (tables: notes)"
    )
    assert _state(path) == before


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("PRAGMA user_version = 7", "it has no migrations table (no tables at all)"),
        ("CREATE TABLE migrations (id INTEGER)", "its migrations table is not rcarun's (tables: migrations)"),
    ],
)
def test_a_sqlite_file_without_rcarun_s_migrations_is_refused(
    tmp_path: Path, schema: str, message: str
) -> None:
    path = tmp_path / "results.db"
    with sqlite3.connect(path) as connection:
        connection.execute(schema)
    with pytest.raises(StoreError) as caught:
        open_store(path, read_only=True)
    assert str(caught.value) == f"{path} is not a results database: {message}"


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = _results_db(tmp_path / "results.db")
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO migrations VALUES (99, 'from the future', '2030-01-01')")
    with pytest.raises(StoreError, match=r"schema version 99, newer than this rcarun knows \(\d+\); upgrade"):
        open_store(db, read_only=True)


# -- an older schema reads as the current one ----------------------------------------------------------------


def _version_1_db(path: Path) -> Path:
    """A results.db written by rcarun before migration 2: no run_leases, no calls.usage_source, and so on."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute(
            "CREATE TABLE migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for statement in MIGRATIONS[0].statements:
            connection.execute(statement)
        connection.execute(
            "INSERT INTO migrations VALUES (1, ?, '2025-06-01T00:00:00.000Z')", (MIGRATIONS[0].name,)
        )
        connection.execute(
            "INSERT INTO runs (name, created_at, updated_at) VALUES ('old', '2025-06-01', '2025-06-01')"
        )
        connection.execute(
            "INSERT INTO calls (run_id, item_id, backbone, model, method, qid, realization, stage, attempt, "
            "status, prompt_tokens, completion_tokens, cost_usd, started_at) "
            "VALUES (1, 'i', 'bb', 'm', 'all-at-once', 'q1', 0, 'attribution', 1, 'ok', 100, 20, 0.5, '2025')"
        )
        connection.execute(
            "INSERT INTO predictions (run_id, item_id, backbone, method, qid, realization, pred_role, pred_step, "
            "role_valid, step_valid, abstained, created_at) "
            "VALUES (1, 'i', 'bb', 'all-at-once', 'q1', 0, 'planner', 2, 1, 1, 0, '2025')"
        )
    finally:
        connection.close()
    return path


def test_an_older_schema_is_read_as_its_migration_would_fill_it_in(tmp_path: Path) -> None:
    db = _version_1_db(tmp_path / "results.db")
    before = _state(db)
    opened = open_read_only(db)
    try:
        assert opened.schema_version == 1
        assert set(opened.filled_in) >= {
            "run_leases",
            "calls.usage_source",
            "predictions.fallback",
            "calls.streamed",
            "calls.ttft_ms",
            "calls.decode_tokens_per_s",
        }
        connection = opened.connection
        assert [
            tuple(row)
            for row in connection.execute(
                "SELECT usage_source, cost_usd, streamed, ttft_ms, decode_tokens_per_s FROM calls"
            )
        ] == [("reported", 0.5, None, None, None)]
        assert connection.execute("SELECT count(*) FROM run_leases").fetchone()[0] == 0
        # Indexes of the file still serve queries through the views.
        plan = " ".join(
            str(row[3])
            for row in connection.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM calls WHERE run_id = 1 AND backbone = 'bb'"
            )
        )
        assert "USING INDEX calls_run_backbone" in plan
    finally:
        opened.connection.close()
    with open_store(db, read_only=True) as store:
        (prediction,) = store.predictions(1)
        assert (prediction.pred_role, prediction.pred_step, prediction.fallback) == ("planner", 2, None)
        assert store.backbone_summary(1)[0].cost_usd == 0.5
    assert _state(db) == before  # still version 1: nothing migrated
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT max(version) FROM migrations").fetchone()[0] == 1


def test_a_store_opened_read_write_still_migrates(tmp_path: Path) -> None:
    db = _version_1_db(tmp_path / "results.db")
    with open_store(db) as store:
        assert isinstance(store, Store) and not store.read_only
    with sqlite3.connect(db) as connection:
        assert (
            connection.execute("SELECT max(version) FROM migrations").fetchone()[0] == MIGRATIONS[-1].version
        )
