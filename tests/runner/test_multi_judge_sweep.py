"""Multi-call methods through the real runner: a judge panel's item on several backbones, numbered draws, turns."""

from __future__ import annotations

import contextlib
import json
import zlib
from pathlib import Path

import pytest

from helpers.sweeps import make_config, rows
from rcarun.errors import ConfigError
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.runner.estimate import estimate_sweep

_PRICES = {
    "a": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
    "b": {"input_per_mtok": 10.0, "output_per_mtok": 20.0},
    "c": {"input_per_mtok": 100.0, "output_per_mtok": 200.0},
}


async def test_panel_item_runs_once_under_its_home_and_each_judge_pays_on_its_own_backbone(
    tmp_path: Path,
) -> None:
    db = tmp_path / "results.db"
    async with contextlib.AsyncExitStack() as stack:
        servers = {
            name: await stack.enter_async_context(MockServer(MockConfig(latency_s=0.01, seed=i)))
            for i, name in enumerate("abc")
        }
        config = make_config(
            {
                name: {"base_url": server.base_url, "limits": {"concurrency": 4}, "prices": _PRICES[name]}
                for name, server in servers.items()
            },
            methods=[
                {"name": "judge-panel", "label": "panel", "options": {"judges": ["b", "a"]}},
                {"name": "self-consistency", "label": "sc", "options": {"samples": 3}},
            ],
            realizations=2,
        )
        outcome = await run_sweep(config, db_path=db, run_name="panel", show_progress=False)
        served = {name: server.stats().accepted for name, server in servers.items()}

    assert outcome.status == "finished"
    trajectories = 10
    # The panel is one item per trajectory x realization, stored under its home backbone (the first judge).
    assert rows(db, "SELECT backbone, count(*) FROM predictions WHERE method = 'panel' GROUP BY 1") == [
        ("b", trajectories * 2)
    ]
    assert outcome.counters["b"].items_total == trajectories * 2 * 2  # panel + sc
    assert outcome.counters["a"].items_total == trajectories * 2  # sc only
    # Each judge's call is recorded under the backbone it went to, inside the home item.
    calls = rows(
        db,
        "SELECT backbone, count(*), count(DISTINCT item_id), min(item_id LIKE 'b|panel|%') FROM calls "
        "WHERE method = 'panel' AND status = 'ok' GROUP BY backbone ORDER BY backbone",
    )
    assert calls == [
        ("a", trajectories * 2, trajectories * 2, 1),
        ("b", trajectories * 2, trajectories * 2, 1),
    ]
    # ... and priced at that backbone's prices.
    for backbone, scale in (("a", 1.0), ("b", 10.0)):
        ((prompt, completion, cost),) = rows(
            db,
            "SELECT sum(prompt_tokens), sum(completion_tokens), sum(cost_usd) FROM calls "
            "WHERE method = 'panel' AND backbone = ?",
            (backbone,),
        )
        assert cost == pytest.approx(scale * (prompt * 1.0 + completion * 2.0) / 1e6)
    # Self-consistency: 3 paid draws per item, none served from another draw's cache.
    assert rows(
        db, "SELECT count(*), sum(status = 'cached') FROM calls WHERE method = 'sc' AND backbone = 'c'"
    ) == [(trajectories * 2 * 3, 0)]
    # Every attempt the servers answered is a row; c served only self-consistency.
    assert served["c"] == trajectories * 2 * 3
    assert served["a"] == trajectories * 2 * (1 + 3)
    attempts = dict(rows(db, "SELECT item_id, attempts FROM items WHERE method = 'panel'"))
    assert set(attempts.values()) == {2}  # one call on each judge, counted in the home item


def test_estimate_charges_each_judge_to_its_backbone() -> None:
    config = make_config(
        {name: {"base_url": "http://127.0.0.1:9", "prices": _PRICES[name]} for name in "abc"},
        methods=[{"name": "judge-panel", "label": "panel", "options": {"judges": ["b", "a"]}}],
    )
    estimate = estimate_sweep(config, samples=1)
    by_backbone = {row.backbone: row for row in estimate.rows}
    assert set(by_backbone) == {"a", "b"}  # c is no judge: no row
    assert by_backbone["a"].calls_expected == by_backbone["b"].calls_expected == 10
    assert by_backbone["b"].usd_expected > by_backbone["a"].usd_expected


async def test_a_panel_naming_an_unknown_backbone_stops_before_any_run(tmp_path: Path) -> None:
    config = make_config(
        {"a": {"base_url": "http://127.0.0.1:9"}},
        methods=[{"name": "judge-panel", "options": {"judges": ["a", "zz"]}}],
    )
    with pytest.raises(ConfigError, match=r"names backbones the sweep does not define: \['zz'\]"):
        await run_sweep(config, db_path=tmp_path / "r.db", run_name="x", show_progress=False)
    assert not (tmp_path / "r.db").exists()


async def test_continual_and_passive_share_turn_one_and_record_every_turn(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url, "limits": {"concurrency": 4}}},
            # Inline reading: one call per turn, so the counts below are the turns (agentic reading, the
            # default, adds the simulator's tool rounds).
            methods=[
                {"name": "continual-search", "options": {"reading": "inline"}},
                {"name": "passive-continuation", "options": {"turns": 3, "reading": "inline"}},
            ],
        )
        outcome = await run_sweep(config, db_path=db, run_name="turns", show_progress=False)
        served = server.stats().accepted
    assert outcome.status == "finished"
    paid = dict(rows(db, "SELECT method || ':' || stage, count(*) FROM calls WHERE status = 'ok' GROUP BY 1"))
    cached = rows(db, "SELECT count(*) FROM calls WHERE status = 'cached' AND stage = 'attribution'")
    # Turn 1 is paid once per trajectory between the two conditions; the other is served the same answer.
    turn_one = paid.get("continual-search:attribution", 0) + paid.get("passive-continuation:attribution", 0)
    assert turn_one == 10 and cached == [(10,)]
    assert paid["continual-search:continuation"] == 10 * 3
    assert paid["passive-continuation:continuation"] == 10 * 2
    assert served == turn_one + 30 + 20
    for method, turns in (("continual-search", 4), ("passive-continuation", 3)):
        for (output,) in rows(db, "SELECT output_json FROM predictions WHERE method = ?", (method,)):
            recorded = json.loads(output)["turns"]
            assert [t["turn"] for t in recorded] == list(range(1, turns + 1))
            assert all("changed_from_prev" in t and "evidence_tokens" in t for t in recorded)


async def test_continual_search_continues_rctas_final_attribution_package(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url}},
            methods=[{"name": "continual-search", "options": {"base": "rcta", "turns": 2}}],
        )
        outcome = await run_sweep(config, db_path=db, run_name="rcta-turns", show_progress=False)
    assert outcome.status == "finished"
    stages = dict(rows(db, "SELECT stage, count(DISTINCT qid) FROM calls WHERE status = 'ok' GROUP BY stage"))
    assert stages == {"summary": 10, "outline": 10, "attribution": 10, "continuation": 10}
    # The continuation resends RCTA's last attribution request (system + package) and its answer, then one prompt.
    ((request_sha, qid),) = rows(
        db, "SELECT request_sha256, qid FROM calls WHERE stage = 'continuation' AND status = 'ok' LIMIT 1"
    )
    ((attribution_sha,),) = rows(
        db,
        "SELECT request_sha256 FROM calls WHERE stage = 'attribution' AND status = 'ok' AND qid = ? "
        "ORDER BY call_id DESC LIMIT 1",
        (qid,),
    )
    # Since migration 4 a blob under 64 KiB is kept as text, a larger one compressed.
    blobs = {
        sha: text if text is not None else zlib.decompress(data)
        for sha, data, text in rows(
            db,
            "SELECT sha256, zlib_data, text FROM blobs WHERE sha256 IN (?, ?)",
            (request_sha, attribution_sha),
        )
    }
    continuation = json.loads(blobs[request_sha])["messages"]
    package = json.loads(blobs[attribution_sha])["messages"]
    assert continuation[: len(package)] == package
    assert [m["role"] for m in continuation[len(package) :]] == ["assistant", "user"]
    assert continuation[-1]["content"].startswith("Do not stop at your first diagnosis.")
