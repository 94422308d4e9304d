"""Outcomes in the report: failed, skipped, unreadable and fallback-decided items counted, and never ranked.

A small results.db is written row by row through the store (no sweep), so every count is known in advance:

- ``bb`` · ``alpha``: 10 readable predictions, 6 right (complete); a second realization, also complete.
- ``bb`` · ``beta``: every item skipped for budget (the walkthrough's method that never ran).
- ``bb`` · ``gamma``: 10 predictions, every answer unreadable and decided by a fallback; 8 happen to be right.
- ``bb`` · ``delta``: 7 predictions (1 unreadable, 2 by a fallback, 4 right), 2 failed, 1 never run.
- ``bb`` · ``eps``: 3 predictions, 4 failed, 2 interrupted, 1 never run.
- ``down`` · ``alpha`` and ``down`` · ``gamma``: every item failed (the walkthrough's server that was down).

One more trajectory is unlabelled: it is in no count.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rcarun.analysis import ReportOptions, build_report, render_html, render_text
from rcarun.store import ItemRow, ItemStatus, PredictionRow, StoreWriter, TrajectoryRow, open_store

QIDS = [f"q{i}" for i in range(10)]
ROLES = ["Planner", "Coder", "Planner", "Verifier", "Coder", "Planner"]
REF_ROLE, REF_STEP = "Planner", 2
DOWN = "TransportError: down: http://127.0.0.1:18499/v1/chat/completions: Cannot connect to host"


def _keys(run_id: int, backbone: str, method: str, qid: str, realization: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "item_id": f"{backbone}|{method}|{qid}|r{realization}",
        "backbone": backbone,
        "method": method,
        "qid": qid,
        "realization": realization,
    }


class _Cell:
    """Writes one backbone × method × realization's rows."""

    def __init__(self, writer: StoreWriter, run_id: int, backbone: str, method: str, realization: int = 0):
        self.writer, self.run_id = writer, run_id
        self.backbone, self.method, self.realization = backbone, method, realization

    def predict(
        self, qid: str, *, right: bool, error: str | None = None, fallback: str | None = None
    ) -> None:
        keys = _keys(self.run_id, self.backbone, self.method, qid, self.realization)
        step = REF_STEP if right else 5
        role = REF_ROLE if right else "Coder"
        self.writer.set_item(ItemRow(**keys, status="done", attempts=1))
        self.writer.add_prediction(
            PredictionRow(
                **keys,
                pred_role=role,
                pred_step=step,
                role_valid=True,
                step_valid=True,
                abstained=False,
                output_json="{}",
                error=error,
                fallback=fallback,
            )
        )

    def item(self, qid: str, status: ItemStatus, error: str | None = None) -> None:
        keys = _keys(self.run_id, self.backbone, self.method, qid, self.realization)
        self.writer.set_item(ItemRow(**keys, status=status, error=error, attempts=6))


async def _write(db: Path) -> int:
    store = open_store(db)
    try:
        run_id = store.get_or_create_run("outcomes", "{}")
    finally:
        store.close()
    async with StoreWriter(db) as writer:
        for i, qid in enumerate([*QIDS, "unlabelled"]):
            labelled = qid != "unlabelled"
            writer.add_trajectory(
                TrajectoryRow(
                    run_id=run_id,
                    qid=qid,
                    source="hand" if i % 2 else "algo",
                    n_steps=len(ROLES),
                    roles_json=json.dumps(ROLES),
                    ref_role=REF_ROLE if labelled else None,
                    ref_step=REF_STEP if labelled else None,
                    sha256=f"{i:064x}",
                )
            )
        for realization in (0, 1):
            alpha = _Cell(writer, run_id, "bb", "alpha", realization)
            for i, qid in enumerate(QIDS):
                alpha.predict(qid, right=i < 6)
        beta = _Cell(writer, run_id, "bb", "beta")
        for qid in QIDS:
            beta.item(qid, "skipped_budget", "budget reached: max_usd 0.003")
        gamma = _Cell(writer, run_id, "bb", "gamma")
        for i, qid in enumerate(QIDS):
            gamma.predict(
                qid,
                right=i < 8,
                error="no bisect answer was clear (3 of 3); first: not JSON: Expecting value",
                fallback="binary search: unclear verdict at 3 of 3 halvings, half chosen at random (published rule)",
            )
        delta = _Cell(writer, run_id, "bb", "delta")
        for i, qid in enumerate(QIDS[:7]):
            delta.predict(
                qid,
                right=i < 4,
                error="not JSON: Expecting value" if i == 6 else None,
                fallback="step-by-step: unreadable verdict at 1 of 3 checked steps" if i in (4, 5) else None,
            )
        delta.item(QIDS[7], "failed", DOWN)
        delta.item(QIDS[8], "failed", DOWN)  # QIDS[9]: no row at all, never run
        eps = _Cell(writer, run_id, "bb", "eps")
        for qid in QIDS[:3]:
            eps.predict(qid, right=True)
        for qid in QIDS[3:7]:
            eps.item(qid, "failed", "FatalCallError: HTTP 401: Incorrect API key provided")
        for qid in QIDS[7:9]:
            eps.item(qid, "interrupted", "stopped before the item finished")
        for method in ("alpha", "gamma"):
            down = _Cell(writer, run_id, "down", method)
            for qid in QIDS:
                down.item(qid, "failed", DOWN)
    return run_id


@pytest.fixture(scope="module")
def outcomes_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("outcomes") / "results.db"
    asyncio.run(_write(db))
    return db


def _report(db: Path) -> dict[str, Any]:
    store = open_store(db)
    try:
        run = store.run_by_name("outcomes")
        assert run is not None
        return build_report(store, run.run_id, ReportOptions(aggregate="pooled", resamples=200))
    finally:
        store.close()


@pytest.fixture(scope="module")
def report(outcomes_db: Path) -> dict[str, Any]:
    return _report(outcomes_db)


COUNTS = (
    "expected",
    "predictions",
    "invalid",
    "fallback",
    "failed",
    "skipped_budget",
    "interrupted",
    "not_run",
)
EXPECTED_OUTCOMES = {
    # (backbone, method, realization): (counts in COUNTS order, status, shown)
    ("bb", "alpha", 0): ((10, 10, 0, 0, 0, 0, 0, 0), "complete", True),
    ("bb", "alpha", 1): ((10, 10, 0, 0, 0, 0, 0, 0), "complete", True),
    ("bb", "beta", 0): ((10, 0, 0, 0, 0, 10, 0, 0), "skipped", False),
    ("bb", "gamma", 0): ((10, 10, 10, 10, 0, 0, 0, 0), "unreadable", False),
    ("bb", "delta", 0): ((10, 7, 1, 2, 2, 0, 0, 1), "partial", True),
    ("bb", "eps", 0): ((10, 3, 0, 0, 4, 0, 2, 1), "failed", False),
    ("down", "alpha", 0): ((10, 0, 0, 0, 10, 0, 0, 0), "failed", False),
    ("down", "gamma", 0): ((10, 0, 0, 0, 10, 0, 0, 0), "failed", False),
}


def test_outcomes_count_every_expected_trajectory_once(report: dict[str, Any]) -> None:
    assert report.expected == 10 and report.unlabelled == 1
    rows = {(r.backbone, r.method, r.realization): r.to_json() for r in report.outcomes}
    assert set(rows) == set(EXPECTED_OUTCOMES)
    for key, (counts, status, shown) in EXPECTED_OUTCOMES.items():
        row = rows[key]
        assert tuple(row[name] for name in COUNTS) == counts, key
        assert (row["status"], row["shown"]) == (status, shown), key
        assert (
            row["predictions"] + row["failed"] + row["skipped_budget"] + row["interrupted"] + row["not_run"]
            == 10
        )
        assert row["readable"] == row["predictions"] - row["invalid"]
        assert row["unanswered"] == 10 - row["predictions"]
    assert rows["bb", "delta", 0]["messages"] == {
        "failed": {"message": DOWN, "count": 2},
        "fallback": {"message": "step-by-step: unreadable verdict at 1 of 3 checked steps", "count": 2},
        "invalid": {"message": "not JSON: Expecting value", "count": 1},
    }
    assert rows["bb", "eps", 0]["messages"]["failed"]["count"] == 4
    assert report.protocol.min_readable_share == 0.5


def test_a_cell_without_predictions_is_not_scored_as_zero(report: dict[str, Any]) -> None:
    metrics = {(m.backbone, m.method, m.realization): m.to_json() for m in report.metrics}
    for key in (("bb", "beta", 0), ("down", "alpha", 0), ("down", "gamma", 0)):
        entry = metrics[key]
        assert entry["n"] == 0 and entry["agent_acc"] is None and entry["step_acc"] is None, key
        assert entry["macro"]["step_acc"] is None and entry["per_source"] == {}
        assert entry["shown"] is False
    # Cells with predictions keep the protocol: every expected trajectory in the denominator, failures wrong.
    assert metrics["bb", "delta", 0]["n"] == 10 and metrics["bb", "delta", 0]["agent_acc"] == pytest.approx(
        0.4
    )
    assert metrics["bb", "eps", 0]["agent_acc"] == pytest.approx(0.3)
    assert metrics["bb", "gamma", 0]["agent_acc"] == pytest.approx(
        0.8
    )  # the random rule's luck, still counted
    # Coverage is the paper's: fields a fallback filled in count as the method's output (Outcomes says how many).
    assert metrics["bb", "gamma", 0]["coverage"] == 1.0
    assert metrics["bb", "alpha", 0]["status"] == "complete"


def test_cells_whose_number_rests_on_nothing_are_left_out_of_comparisons(report: dict[str, Any]) -> None:
    assert report.reference_method == "alpha"
    excluded = {(e.backbone, e.method): e.status for e in report.excluded}
    assert excluded == {
        ("bb", "beta"): "skipped",
        ("bb", "gamma"): "unreadable",
        ("bb", "eps"): "failed",
        ("down", "alpha"): "failed",
        ("down", "gamma"): "failed",
    }
    assert {(p.backbone_a, p.method_b) for p in report.paired} == {("bb", "delta")}
    assert {(c["backbone"], c["method_b"]) for c in report.complementarity} == {("bb", "delta")}
    assert {(r.backbone, r.method) for r in report.repeatability} == {("bb", "alpha")}
    assert {(g["backbone"], g["method"]) for g in report.length_groups} == {
        ("bb", m) for m in ("alpha", "gamma", "delta", "eps")
    }


def _accuracy_rows(text: str) -> dict[str, list[str]]:
    """Method -> the accuracy table's cells after the method name (split on runs of two spaces)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Method"))
    rows = {}
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        name, *cells = re.split(r"\s{2,}", line.strip())
        rows[name] = cells
    return rows


def test_text_shows_status_words_and_stars_only_numbers_that_rest_on_answers(report: dict[str, Any]) -> None:
    text = render_text(report, sections=("accuracy",))
    rows = _accuracy_rows(text)
    # Columns: bb Agent, bb Step, down Agent, down Step.
    assert rows["alpha"] == ["60.0*", "60.0*", "failed", "failed"]
    assert rows["beta"] == ["skipped", "skipped", "–", "–"]  # never run on down: no cell at all
    assert rows["gamma"] == ["unreadable", "unreadable", "failed", "failed"]
    assert rows["delta"] == ["40.0†", "40.0†", "–", "–"]
    assert rows["eps"] == ["failed", "failed", "–", "–"]
    assert text.count("*") - text.count("(* in text") == 2  # only alpha's two numbers are starred
    flat = " ".join(text.split())
    assert (
        "Rule: a number is shown when readable predictions cover at least 50% of the expected trajectories"
        in flat
    )
    assert (
        "Items: 80 expected over 8 backbone × method × realization cells; 40 predictions (11 unreadable, 12 "
        "decided by a fallback); 26 failed, 10 skipped for budget, 4 interrupted or not run." in flat
    )
    assert (
        "bb · delta: 7 of 10 have a prediction, 1 unreadable, 2 decided by a fallback; 2 failed, 1 interrupted or "
        "not run. Its numbers count 3 failed, skipped or unrun items and 1 unreadable answer as errors."
        in flat
    )
    assert "bb · beta: 0 of 10 have a prediction; 10 skipped for budget. Not scored (skipped)" in flat
    assert (
        "bb · gamma: 10 of 10 have a prediction, 10 unreadable, 10 decided by a fallback. Not shown (unreadable): only 0 readable answers"
        in flat
    )
    assert "down · alpha: 0 of 10 have a prediction; 10 failed. Not scored (failed)" in flat
    assert "bb · alpha:" not in flat  # a clean cell needs no footnote


def test_text_outcomes_section_lists_the_cells_with_anything_to_report(report: dict[str, Any]) -> None:
    text = render_text(report, sections=("outcomes",))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("Backbone"))
    assert re.split(r"\s{2,}", header) == [
        *("Backbone", "Method", "Real.", "Expected", "Predictions", "Unreadable", "Fallback"),
        *("Failed", "Skipped", "Interrupted", "Not run", "Status"),
    ]
    rows = {
        tuple(cells[:3]): cells[3:]
        for line in lines
        if line.startswith(("bb ", "down "))
        for cells in [re.split(r"\s{2,}", line.strip())]
    }
    assert rows[("bb", "delta", "0")] == ["10", "7", "1", "2", "2", "0", "0", "1", "partial"]
    assert rows[("down", "alpha", "0")] == ["10", "0", "0", "0", "10", "0", "0", "0", "failed"]
    assert ("bb", "alpha", "0") not in rows and ("bb", "alpha", "1") not in rows
    flat = " ".join(text.split())
    assert (
        "The other 2 backbone × method × realization cells: every expected trajectory has a readable prediction"
        in flat
    )
    assert f"down · alpha r0, most frequent failed (10×): {DOWN}" in flat
    assert "bb · gamma r0, most frequent unreadable (10×): no bisect answer was clear" in flat
    # The header says it before any table.
    full = render_text(report)
    head = full.split("Accuracy (Table 3 layout)", 1)[0]
    assert (
        "40 predictions (11 unreadable, 12 decided by a fallback); 26 failed, 10 skipped for budget" in head
    )


def test_html_never_bolds_a_failed_skipped_or_unreadable_cell(report: dict[str, Any]) -> None:
    page = render_html(report)
    accuracy = page.split('<section id="accuracy">', 1)[1].split("</section>", 1)[0]
    assert re.findall(r"<strong>([^<]*)</strong>", accuracy) == ["60.0", "60.0"]
    words = re.findall(r'<span class="na">([^<]*)</span>', accuracy)
    assert sorted(words) == sorted(["failed"] * 6 + ["skipped"] * 2 + ["unreadable"] * 2)
    assert "40.0†" in accuracy
    assert '<section id="outcomes">' in page
    outcomes = page.split('<section id="outcomes">', 1)[1].split("</section>", 1)[0]
    assert "<td>bb</td><td>delta</td><td>0</td>" in outcomes.replace("\n", "")
    assert "Cannot connect to host" in outcomes
    paired = page.split('<section id="paired">', 1)[1].split("</section>", 1)[0]
    assert "Left out (no number shown, see Outcomes): bb · beta (skipped), bb · eps (failed)" in paired


def test_every_cell_failed_marks_nothing_best(outcomes_db: Path, tmp_path: Path) -> None:
    """The walkthrough's server-down run: no cell is scored, nothing is bold, every cell says failed."""
    db = tmp_path / "down.db"
    with sqlite3.connect(outcomes_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
    with sqlite3.connect(db) as connection:
        connection.execute("DELETE FROM predictions WHERE backbone = 'bb'")
        connection.execute("DELETE FROM items WHERE backbone = 'bb'")
    report = _report(db)
    assert {r.status for r in report.outcomes} == {"failed"}
    assert report.paired == [] and report.complementarity == []
    page = render_html(report)
    assert "<strong>" not in page.split('<section id="accuracy">', 1)[1].split("</section>", 1)[0]
    assert _accuracy_rows(render_text(report, sections=("accuracy",))) == {
        "alpha": ["failed", "failed"],
        "gamma": ["failed", "failed"],
    }


def test_a_results_db_without_the_fallback_column_reads_as_no_fallback(
    outcomes_db: Path, tmp_path: Path
) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(outcomes_db) as source, sqlite3.connect(db) as copy:
        source.backup(copy)
    with sqlite3.connect(db) as connection:
        for view in ("run_summary", "predictions_scored"):  # migration 4's, which read the column
            connection.execute(f"DROP VIEW {view}")
        connection.execute("ALTER TABLE predictions DROP COLUMN fallback")
    report = _report(db)
    rows = {(r.backbone, r.method, r.realization): r.to_json() for r in report.outcomes}
    assert rows["bb", "gamma", 0]["fallback"] == 0 and rows["bb", "gamma", 0]["invalid"] == 10
    assert rows["bb", "delta", 0]["fallback"] == 0 and rows["bb", "delta", 0]["failed"] == 2
