"""The embedded demo (`make demo`): four simulated backbones with different limit styles, end to end; sim-qwen's two
replicas started, checked, stopped and charged by the runner (the managed path, with the fake vllm command)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from rcarun.demo import DEMO_LOCAL_BACKBONE, DEMO_REALIZATIONS
from rcarun.methods import registered_methods


def test_demo_sweep_runs_every_backbone_and_exercises_each_limit_style(demo_db: Path) -> None:
    db = demo_db
    with sqlite3.connect(db) as connection:
        status = connection.execute("SELECT status FROM runs WHERE name = 'demo'").fetchone()[0]
        backbones = {row[0] for row in connection.execute("SELECT DISTINCT backbone FROM items")}
    assert status == "finished"
    assert backbones == {"sim-deepseek", "sim-gpt", "sim-kimi", "sim-qwen", DEMO_LOCAL_BACKBONE}
    with sqlite3.connect(db) as connection:
        per_backbone = dict(
            connection.execute("SELECT backbone, count(*) FROM predictions GROUP BY backbone")
        )
        length = dict(
            connection.execute(
                "SELECT backbone, count(*) FROM calls WHERE status = 'length' GROUP BY backbone"
            )
        )
        endpoints = connection.execute(
            "SELECT count(DISTINCT endpoint) FROM calls WHERE backbone = 'sim-qwen'"
        )
        distinct_endpoints = endpoints.fetchone()[0]
        priced = dict(connection.execute("SELECT backbone, sum(cost_usd) > 0 FROM calls GROUP BY backbone"))
        short_budget_calls = connection.execute(
            "SELECT count(*) FROM calls WHERE backbone = 'sim-qwen' AND attempt = 1 AND max_tokens = 1024 "
            "AND status != 'cached'"  # a shared turn 1 (Continual Search's, Passive Continuation's) is paid once
        ).fetchone()[0]
        retried_at_double = connection.execute(
            "SELECT count(*) FROM calls WHERE backbone = 'sim-qwen' AND attempt = 2 AND max_tokens = 2048 "
            "AND status = 'ok'"
        ).fetchone()[0]
    methods = [name for name in registered_methods() if name != "soap"]
    assert set(methods) >= {"all-at-once", "step-by-step", "binary-search", "echo", "falat"}
    # Every chat method on every simulated backbone, except the judge panel: one item per trajectory, under its
    # first judge. SOAP runs on the local backbone alone, on its test split: 3 of the 6 algorithm-generated
    # and 2 of the 4 hand-crafted trajectories per realization (50%, rounded per source).
    home = "sim-deepseek"
    assert per_backbone == {
        **{
            name: 10 * DEMO_REALIZATIONS * (len(methods) - (name != home))
            for name in backbones - {DEMO_LOCAL_BACKBONE}
        },
        DEMO_LOCAL_BACKBONE: 5 * DEMO_REALIZATIONS,
    }
    # sim-qwen thinks for 1,500 tokens: every call whose first budget is 1,024 (all-at-once's attribution as the
    # demo configures it, step-by-step's and binary search's checks) stops on length once and is retried at 2,048.
    assert length == {"sim-qwen": short_budget_calls}
    assert short_budget_calls >= 10 * DEMO_REALIZATIONS and retried_at_double == short_budget_calls
    assert distinct_endpoints == 2  # both vLLM-style replicas served calls
    assert priced == {"sim-deepseek": 1, "sim-gpt": 1, "sim-kimi": 1, "sim-qwen": 0, DEMO_LOCAL_BACKBONE: 0}


def test_the_demos_qwen_is_served_by_managed_replicas_that_are_recorded_and_charged(demo_db: Path) -> None:
    with sqlite3.connect(demo_db) as connection:
        events = connection.execute(
            "SELECT kind, detail_json FROM run_events WHERE kind LIKE 'replica%'"
        ).fetchall()
        endpoints = {
            row[0]
            for row in connection.execute(
                "SELECT DISTINCT endpoint FROM calls WHERE backbone = 'sim-qwen' AND status != 'cached'"
            )
        }
    assert [kind for kind, _ in events] == ["replicas_started", "replicas_stopped"]  # no death, no restart
    started, stopped = (json.loads(detail) for _, detail in events)
    assert started["backbone"] == "sim-qwen" and started["vllm_version"] == "0.0.0+rcarun.fake"
    assert started["model_root"] == "sim/Qwen3.5-35B-A3B" and started["gpu_hour_usd"] == 2.5
    # Every qwen call went to one of the replicas the runner started, and the logs sit beside the db.
    assert endpoints == {replica["base_url"] for replica in started["replicas"]}
    assert sorted(path.name for path in (demo_db.parent / "results.db.serve-logs").iterdir()) == [
        "sim-qwen-0.log",
        "sim-qwen-1.log",
    ]
    assert stopped["gpus"] == 2 and 0 < stopped["up_s"] < stopped["held_s"]
