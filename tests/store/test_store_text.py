"""Readable results.db (issue 19): blobs SQLite can read, the views over them, old files kept readable."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import zlib
from pathlib import Path

import pytest

from helpers.sweeps import make_config
from rcarun.data.roles import role_matches
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.store import MIGRATIONS, StoreWriter, open_read_only, open_store
from rcarun.store.blobs import BLOB_TEXT_MAX_BYTES, blob_sha256
from rcarun.store.schema import RECIPES, VIEW_NOTES, view_column_note


async def _put(db: Path, *blobs: bytes) -> list[str]:
    async with StoreWriter(db) as writer:
        return [writer.put_blob(blob) for blob in blobs]


def test_text_up_to_the_threshold_is_stored_readable_and_the_rest_compressed(db_path: Path) -> None:
    small = "réponse → step 3".encode()
    at_limit = b"a" * BLOB_TEXT_MAX_BYTES
    too_big = b"b" * (BLOB_TEXT_MAX_BYTES + 1)
    binary = b"\xff\xfe not utf-8"
    with_nul = b"text\x00with a NUL"
    keys = asyncio.run(_put(db_path, small, at_limit, too_big, binary, with_nul))
    with sqlite3.connect(db_path) as connection:
        stored = {
            sha: (text, len(data))
            for sha, text, data in connection.execute("SELECT sha256, text, zlib_data FROM blobs")
        }
    assert stored[keys[0]] == ("réponse → step 3", 0)
    assert stored[keys[1]] == ("a" * BLOB_TEXT_MAX_BYTES, 0)
    for key in keys[2:]:
        text, compressed = stored[key]
        assert text is None and compressed > 0
    with open_store(db_path, read_only=True) as store:
        for key, blob in zip(keys, (small, at_limit, too_big, binary, with_nul), strict=True):
            assert store.read_blob(key) == blob


def _version_3_file(path: Path) -> tuple[str, bytes]:
    """A results.db as rcarun wrote it before migration 4: one call whose prompt is a compressed blob."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute(
        "CREATE TABLE migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    for migration in MIGRATIONS[:3]:
        for statement in migration.statements:
            connection.execute(statement)
        connection.execute(
            "INSERT INTO migrations VALUES (?, ?, '2025')", (migration.version, migration.name)
        )
    prompt = json.dumps({"messages": [{"role": "user", "content": "old prompt"}]}).encode()
    sha = blob_sha256(prompt)
    connection.execute("INSERT INTO blobs VALUES (?, ?, ?)", (sha, zlib.compress(prompt), len(prompt)))
    connection.execute("INSERT INTO runs (name, created_at, updated_at) VALUES ('old', '2025', '2025')")
    connection.execute(
        "INSERT INTO calls (run_id, item_id, backbone, model, method, qid, realization, stage, attempt, status, "
        "started_at, request_sha256) VALUES (1, 'i', 'bb', 'm', 'all-at-once', 'q1', 0, 'attribution', 1, 'ok', "
        "'2025', ?)",
        (sha,),
    )
    connection.close()
    return sha, prompt


def test_an_older_file_reads_read_only_and_migrates_keeping_its_compressed_blobs(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    sha, prompt = _version_3_file(db)

    read = open_read_only(db)
    try:
        assert read.schema_version == 3
        assert {"blobs.text", "calls_text", "predictions_scored", "run_summary"} <= set(read.filled_in)
        row = read.connection.execute("SELECT prompt, text_compressed FROM calls_text").fetchone()
        assert tuple(row) == (None, 1)  # the view exists for the old file; its text is still compressed
    finally:
        read.connection.close()

    with open_store(db) as store:
        assert store.read_blob(sha) == prompt
        new = json.dumps({"messages": [{"role": "user", "content": "new prompt"}]}).encode()
        (new_sha,) = asyncio.run(_put(db, new))
        assert store.read_blob(new_sha) == new
    with sqlite3.connect(db) as connection:
        assert (
            connection.execute("SELECT max(version) FROM migrations").fetchone()[0] == MIGRATIONS[-1].version
        )
        assert connection.execute("SELECT text FROM blobs WHERE sha256 = ?", (sha,)).fetchone()[0] is None
        assert connection.execute("SELECT text FROM blobs WHERE sha256 = ?", (new_sha,)).fetchone()[0] == (
            new.decode()
        )


# -- the views on a demo-like sweep, read with plain sqlite3 ----------------------------------------------------


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("views") / "results.db"

    async def sweep() -> None:
        async with (
            MockServer(MockConfig(latency_s=0.001, seed=3)) as one,
            MockServer(MockConfig(latency_s=0.001, seed=4, reasoning_tokens=40)) as two,
        ):
            config = make_config(
                {"sim-a": {"base_url": one.base_url}, "sim-b": {"base_url": two.base_url}},
                methods=[{"name": "all-at-once"}, {"name": "binary-search"}],
            )
            await run_sweep(config, db_path=db, run_name="demo-like", show_progress=False)

    asyncio.run(sweep())
    return db


def test_calls_text_shows_prompts_and_answers_as_plain_text(swept: Path) -> None:
    connection = sqlite3.connect(swept)
    try:
        rows = connection.execute(
            "SELECT qid, prompt, answer, text_compressed, request_json FROM calls_text "
            "WHERE run = 'demo-like' AND method = 'all-at-once'"
        ).fetchall()
        stored = connection.execute("SELECT count(*), sum(text IS NOT NULL) FROM blobs").fetchone()
    finally:
        connection.close()
    assert len(rows) == 20  # 10 trajectories x 2 backbones, one call each
    readable = [row for row in rows if not row[3]]
    # The longest bundled trajectory's prompt is over 64 KiB: kept compressed, its text NULL here.
    assert 16 <= len(readable) < 20
    for qid, prompt, answer, _, request in readable:
        assert prompt.startswith("system: ") and "\n\nuser: " in prompt and "=== LOG START ===" in prompt
        assert json.loads(request)["messages"][-1]["content"] in prompt
        assert isinstance(json.loads(answer)["root_step"], int), qid
    for _, prompt, answer, _, request in rows:
        if prompt is None:
            assert request is None and isinstance(json.loads(answer)["root_step"], int)
    assert stored[0] - stored[1] == 20 - len(readable)


def test_predictions_scored_matches_the_scorers_role_rule_and_steps(swept: Path) -> None:
    connection = sqlite3.connect(swept)
    try:
        rows = connection.execute(
            "SELECT pred_role, ref_role, role_correct, pred_step, ref_step, step_valid, step_exact, step_pm5, "
            "joint_exact, reason, method FROM predictions_scored"
        ).fetchall()
    finally:
        connection.close()
    assert len(rows) == 40
    assert sum(row[2] for row in rows) > 0  # something is right, so the comparison below means something
    for (
        pred_role,
        ref_role,
        role_correct,
        pred_step,
        ref_step,
        valid,
        exact,
        pm5,
        joint,
        reason,
        method,
    ) in rows:
        assert role_correct == role_matches(pred_role, ref_role)
        assert exact == (valid == 1 and pred_step == ref_step)
        assert pm5 == (valid == 1 and abs(pred_step - ref_step) <= 5)
        assert joint == (role_correct and exact)
        if method == "all-at-once":
            assert reason  # the viewer's reason: the answer's `reason`


def test_role_rule_in_sql_drops_a_handoff_suffix_and_case(db_path: Path) -> None:
    with open_store(db_path) as store:
        run_id = store.get_or_create_run("r", "{}")
    cases = [
        (" Orchestrator (-> WebSurfer) ", "orchestrator", 1),
        ("Coder", "coder  ", 1),
        ("WebSurfer (→ Coder)", "WebSurfer", 1),
        ("", "", 0),
        ("Planner", "Coder", 0),
        (None, "Coder", 0),
    ]
    connection = sqlite3.connect(db_path)
    try:
        for index, (predicted, reference, _) in enumerate(cases):
            qid = f"q{index}"
            connection.execute(
                "INSERT INTO predictions (run_id, item_id, backbone, method, qid, realization, pred_role, pred_step, "
                "role_valid, step_valid, abstained, created_at) VALUES (?, ?, 'b', 'm', ?, 0, ?, 1, 1, 1, 0, '')",
                (run_id, qid, qid, predicted),
            )
            connection.execute(
                "INSERT INTO trajectories (run_id, qid, source, n_steps, roles_json, ref_role, ref_step, sha256) "
                "VALUES (?, ?, 's', 3, '[]', ?, 1, 'x')",
                (run_id, qid, reference),
            )
        found = dict(connection.execute("SELECT qid, role_correct FROM predictions_scored").fetchall())
    finally:
        connection.close()
    assert [found[f"q{i}"] for i in range(len(cases))] == [expected for *_, expected in cases]
    assert all(role_matches(p, r) == bool(e) for p, r, e in cases)


def test_run_summary_agrees_with_the_stores_totals(swept: Path) -> None:
    with open_store(swept, read_only=True) as store:
        run = store.run_by_name("demo-like")
        assert run is not None
        totals = store.backbone_summary(run.run_id)
        connection = store.connection
        summary = dict(zip(
            [d[0] for d in connection.execute("SELECT * FROM run_summary").description],
            connection.execute("SELECT * FROM run_summary WHERE run = 'demo-like'").fetchone(),
            strict=True,
        ))  # fmt: skip
    assert summary["trajectories"] == 10 and summary["backbones"] == 2 and summary["methods"] == 2
    assert summary["items"] == summary["items_done"] == summary["predictions"] == 40
    assert summary["calls"] == sum(t.calls for t in totals)
    assert summary["attempts"] == sum(t.attempts for t in totals)
    assert summary["prompt_tokens"] == sum(t.prompt_tokens for t in totals)
    assert summary["cost_usd"] == pytest.approx(sum(t.cost_usd for t in totals))


def test_every_recipe_runs_and_answers(swept: Path) -> None:
    parameters = {
        "run": "demo-like",
        "a": "sim-a",
        "b": "sim-b",
        "backbone": "sim-a",
        "method": "all-at-once",
        "qid": "algorithm_generated/1",
    }
    connection = sqlite3.connect(swept)
    try:
        for recipe in RECIPES:
            rows = connection.execute(recipe.sql, parameters).fetchall()
            assert rows, recipe.title
        (paired,) = [r for r in connection.execute(RECIPES[0].sql, parameters) if r[0] == "all-at-once"]
        assert paired[1] == 10 and sum(paired[2:]) == 10
    finally:
        connection.close()


def test_every_view_and_view_column_is_documented(db_path: Path) -> None:
    with open_store(db_path) as store:
        views = [r[0] for r in store.connection.execute("SELECT name FROM sqlite_master WHERE type = 'view'")]
        assert sorted(views) == sorted(VIEW_NOTES)
        for view in views:
            for column in store.connection.execute(f"PRAGMA table_info({view})"):
                assert view_column_note(view, column[1]), f"{view}.{column[1]} has no note in schema.py"
