"""`rcarun show`, `rcarun merge` and `rcarun db fts` on real sweeps against the simulator."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils

from helpers.sweeps import make_config
from rcarun.cli import main
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, narrow_sweep, run_sweep

_BACKBONES = ("sim-a", "sim-b")


async def _sweep(db: Path, *, backbones: tuple[str, ...] = _BACKBONES, model: str = "sim-model") -> None:
    async with (
        MockServer(MockConfig(latency_s=0.001, seed=3)) as one,
        MockServer(MockConfig(latency_s=0.001, seed=4, reasoning_tokens=40)) as two,
    ):
        config: SweepConfig = make_config(
            {
                "sim-a": {"base_url": one.base_url, "model": model},
                "sim-b": {"base_url": two.base_url},
            },
            methods=[{"name": "all-at-once"}, {"name": "binary-search"}],
        )
        await run_sweep(
            narrow_sweep(config, backbones=backbones), db_path=db, run_name="split", show_progress=False
        )


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same sweep whole, and in two halves (one backbone each) in two files."""
    root = tmp_path_factory.mktemp("sweeps")
    paths = {"whole": root / "whole.db", "a": root / "a.db", "b": root / "b.db"}
    asyncio.run(_sweep(paths["whole"]))
    asyncio.run(_sweep(paths["a"], backbones=("sim-a",)))
    asyncio.run(_sweep(paths["b"], backbones=("sim-b",)))
    return paths


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _without_timing(value: Any) -> Any:
    """The report apart from when things happened and which file it read."""
    if isinstance(value, dict):
        return {
            key: _without_timing(item)
            for key, item in value.items()
            if not (key.endswith(("_at", "_s", "_per_s")) or "latency" in key or key in ("run_id", "db"))
        }
    if isinstance(value, list):
        return [_without_timing(item) for item in value]
    return value


# -- show -----------------------------------------------------------------------------------------------------


def test_show_prints_prediction_reference_and_each_calls_texts(
    sweeps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(sweeps["whole"])
    status, out, _ = _run(
        [
            "show",
            "--db",
            db,
            "--qid",
            "algorithm_generated/1",
            "--backbone",
            "sim-a",
            "--method",
            "all-at-once",
        ],
        capsys,
    )
    assert status == 0
    with sqlite3.connect(db) as connection:
        ref_role, ref_step = connection.execute(
            "SELECT ref_role, ref_step FROM trajectories WHERE qid = 'algorithm_generated/1'"
        ).fetchone()
        role, step = connection.execute(
            "SELECT pred_role, pred_step FROM predictions WHERE qid = 'algorithm_generated/1' "
            "AND backbone = 'sim-a' AND method = 'all-at-once'"
        ).fetchone()
    assert f"reference: role {ref_role!r}, step {ref_step}" in out
    assert f"prediction: role {role!r}" in out and f"step {step} (valid" in out
    assert "── sim-a / all-at-once / r0 · item done" in out
    assert "call " in out and "· attribution · attempt 1 · ok (stop)" in out and "$0." in out
    assert "── system ──" in out and "=== LOG START ===" in out  # the prompt, read from its blob
    assert '"root_step"' in out  # the answer
    assert "more characters; --full shows all" in out

    status, full, _ = _run(
        ["show", "--db", db, "--qid", "algorithm_generated/1", "--backbone", "sim-a", "--method", "all-at-once",
         "--full"],
        capsys,
    )  # fmt: skip
    assert status == 0 and "--full shows all" not in full and "=== LOG END ===" in full


def test_show_json_holds_whole_texts_and_one_call(
    sweeps: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(sweeps["whole"])
    status, out, _ = _run(["show", "--db", db, "--qid", "algorithm_generated/1", "--json"], capsys)
    document = json.loads(out)
    assert status == 0 and document["run"] == "split"
    assert {(i["backbone"], i["method"]) for i in document["items"]} == {
        (b, m) for b in _BACKBONES for m in ("all-at-once", "binary-search")
    }
    call = document["items"][0]["calls"][0]
    assert "=== LOG END ===" in call["prompt"] and call["prompt_tokens"] > 0 and call["answer"]

    status, out, _ = _run(["show", "--db", db, "--call", str(call["call_id"]), "--json"], capsys)
    assert status == 0 and json.loads(out)["call"] == call


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--run", "nope", "--qid", "x"], "no run named 'nope' (runs: 'split')"),
        (["--qid", "nope"], "--qid: run 'split' has no qid 'nope' (10 qids: 'algorithm_generated/1'"),
        (
            ["--qid", "algorithm_generated/1", "--backbone", "gpt"],
            "has no backbone 'gpt' (backbones: 'sim-a', 'sim-b')",
        ),
        (
            ["--qid", "algorithm_generated/1", "--method", "x"],
            "has no method 'x' (methods: 'all-at-once', 'binary",
        ),
        (["--call", "99999"], "--call: run 'split' has no call 99999 ("),
        ([], "show: give --qid Q"),
    ],
)
def test_show_refuses_unknown_names_in_one_line(
    sweeps: dict[str, Path], capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    status, out, err = _run(["show", "--db", str(sweeps["whole"]), *flags], capsys)
    assert status == 2 and out == ""
    assert message in err and err.count("\n") == 1


# -- merge ----------------------------------------------------------------------------------------------------


def test_two_halves_merged_give_the_report_of_the_whole(
    sweeps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    merged = tmp_path / "merged.db"
    status, out, err = _run(["merge", str(sweeps["a"]), str(sweeps["b"]), "--into", str(merged)], capsys)
    assert status == 0, err
    assert "runs 'split'" in out and "0 identical predictions skipped" in out

    reports = []
    for db in (sweeps["whole"], merged):
        status, out, _ = _run(["report", "--db", str(db), "--run", "split", "--json"], capsys)
        assert status == 0
        reports.append(_without_timing(json.loads(out)))
    assert reports[0] == reports[1]
    with sqlite3.connect(merged) as connection:
        counts = connection.execute(
            "SELECT (SELECT count(*) FROM predictions), (SELECT count(*) FROM trajectories), "
            "(SELECT count(*) FROM blobs), (SELECT count(DISTINCT sha256) FROM blobs)"
        ).fetchone()
    assert counts[:2] == (40, 10) and counts[2] == counts[3]

    # Merging the same file again adds nothing: every row is an identical duplicate.
    status, out, _ = _run(["merge", str(sweeps["a"]), "--into", str(merged), "--json"], capsys)
    summary = json.loads(out)
    assert status == 0 and summary["duplicates_skipped"] == 20
    assert summary["calls_added"] == summary["predictions_added"] == summary["blobs_added"] == 0


def test_a_conflicting_prediction_is_listed_and_never_written(
    sweeps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.db"
    shutil.copyfile(sweeps["a"], other)
    with sqlite3.connect(other) as connection:
        connection.execute(
            "UPDATE predictions SET pred_step = pred_step + 1 WHERE qid = 'algorithm_generated/1' "
            "AND method = 'all-at-once'"
        )
    merged = tmp_path / "merged.db"
    status, _, err = _run(["merge", str(sweeps["a"]), str(other), "--into", str(merged)], capsys)
    assert status == 1
    assert "conflict: run 'split' sim-a/all-at-once/algorithm_generated/1/r0: kept role" in err
    assert f"not written from {other}" in err
    with sqlite3.connect(merged) as connection, sqlite3.connect(sweeps["a"]) as original:
        query = (
            "SELECT pred_step FROM predictions WHERE qid = 'algorithm_generated/1' AND method = 'all-at-once'"
        )
        assert connection.execute(query).fetchall() == original.execute(query).fetchall()
        assert connection.execute("SELECT count(*) FROM predictions").fetchone()[0] == 20


def test_the_same_run_swept_with_another_model_is_refused_before_writing(
    sweeps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other-model.db"
    asyncio.run(_sweep(other, backbones=("sim-a",), model="another-model"))
    merged = tmp_path / "merged.db"
    status, _, err = _run(["merge", str(sweeps["a"]), str(other), "--into", str(merged)], capsys)
    assert status == 2
    assert err.startswith(
        f"rcarun: run 'split' of {other} was swept with other answer-deciding settings than in"
    )
    assert "backbones.sim-a.model: 'sim-model' -> 'another-model'" in err
    assert not merged.exists(), "a refused merge left a file at --into"


# -- db fts ---------------------------------------------------------------------------------------------------


def test_db_fts_makes_answers_and_reasons_searchable_with_sqlite_utils(
    sweeps: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.db"
    shutil.copyfile(sweeps["whole"], db)
    status, out, _ = _run(["db", "fts", "--db", str(db)], capsys)
    assert status == 0 and "table search_texts (FTS5)" in out
    with sqlite3.connect(db) as connection:
        calls = connection.execute("SELECT count(*) FROM calls WHERE status IN ('ok', 'length')").fetchone()[
            0
        ]
        reason = connection.execute(
            "SELECT reason FROM predictions_scored WHERE method = 'all-at-once' AND reason IS NOT NULL LIMIT 1"
        ).fetchone()[0]
    database = sqlite_utils.Database(db)
    try:
        table = database.table("search_texts")
        assert table.detect_fts() == "search_texts_fts"
        kinds = dict(database.execute("SELECT kind, count(*) FROM search_texts GROUP BY kind").fetchall())
        assert kinds["answer"] == calls and kinds["reason"] == 20 and kinds["reasoning"] > 0
        word = max(reason.split(), key=len).strip(".,;:")
        found = list(table.search(word, columns=["kind", "method", "text"]))
        assert any(row["kind"] == "reason" and word in row["text"] for row in found)
        assert all(word.lower()[:4] in row["text"].lower() for row in found)
    finally:
        database.close()
    # Again (after more rows, say): rebuilt, not doubled.
    status, _, _ = _run(["db", "fts", "--db", str(db)], capsys)
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT count(*) FROM search_texts").fetchone()[0] == sum(kinds.values())
