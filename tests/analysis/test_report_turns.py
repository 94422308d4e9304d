"""Per-turn accuracy and evidence of multi-turn methods, recomputed from the stored turn records."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from helpers.sweeps import make_config
from rcarun.analysis import ReportOptions, build_report, render_text
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.store import open_store


async def test_turn_rows_agree_with_the_stored_turn_records(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.001, seed=5)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url}},
            methods=[
                {"name": "continual-search", "options": {"turns": 3}},
                {"name": "passive-continuation", "options": {"turns": 3}},
            ],
        )
        await run_sweep(config, db_path=db, run_name="turns", show_progress=False)

    store = open_store(db)
    try:
        report = build_report(store, 1, ReportOptions(aggregate="pooled", resamples=100))
    finally:
        store.close()
    rows = {(r["method"], r["turn"]): r for r in report.turns}
    assert set(rows) == {(m, t) for m in ("continual-search", "passive-continuation") for t in (1, 2, 3)}

    with sqlite3.connect(db) as connection:
        references = {
            qid: (role, step)
            for qid, role, step in connection.execute("SELECT qid, ref_role, ref_step FROM trajectories")
        }
        stored = connection.execute("SELECT method, qid, output_json FROM predictions").fetchall()
    for method, turn in rows:
        records = [(qid, json.loads(out)["turns"]) for m, qid, out in stored if m == method]
        picked = [(qid, turns[min(turn, len(turns)) - 1]) for qid, turns in records]
        step_hits = sum(t["pred_step"] == references[qid][1] for qid, t in picked)
        role_hits = sum(t["pred_role"] == references[qid][0] for qid, t in picked)
        row = rows[(method, turn)]
        assert row["n"] == len(references) == 10
        assert row["step_acc"] == step_hits / 10
        assert row["agent_acc"] == role_hits / 10
        assert row["changed"] == sum(bool(t["changed_from_prev"]) for _, t in picked) / 10
        assert row["evidence_total"] == sum(t["evidence_total"] for _, t in picked) / 10
    # Turn 1 is the same (shared) answer under both conditions.
    assert rows[("continual-search", 1)]["step_acc"] == rows[("passive-continuation", 1)]["step_acc"]
    text = render_text(report)
    assert "Turns" in text and "Evidence read (tokens)" in text
