"""GPU time of managed replicas in `cost_rows` and `served_by`, on hand-built runs whose every number is known: the
charge is price × GPUs × held hours per session, split over the backbone's rows by tokens, and 0 without a price."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from rcarun.analysis.cost import cost_rows, served_by
from rcarun.store import CallRow, EventRow, StoreWriter, open_store

_URLS = ("http://127.0.0.1:8101/v1", "http://127.0.0.1:8102/v1")


def _started(price: float | None, urls: tuple[str, ...] = _URLS, tp: int = 2) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "backbone": "qwen",
        "vllm_version": "0.11.0",
        "served_model": "qwen3",
        "replicas": [
            {
                "index": index,
                "gpus": list(range(index * tp, index * tp + tp)),
                "base_url": url,
                "startup_s": 30.0,
                "argv": ["vllm", "serve", "Qwen/Qwen3-32B", "--port", url.rsplit(":", 1)[1][:4]],
            }
            for index, url in enumerate(urls)
        ],
        "gpus": len(urls) * tp,
    }
    if price is not None:
        detail["gpu_hour_usd"] = price
    return detail


def _stopped(held_s: float, up_s: float, price: float) -> dict[str, Any]:
    return {
        "backbone": "qwen",
        "replicas": 2,
        "gpus": 4,
        "held_s": held_s,
        "up_s": up_s,
        "gpu_hour_usd": price,
    }


def _call(
    run_id: int, method: str, at: str, prompt: int, completion: int, endpoint: str, **more: Any
) -> CallRow:
    return CallRow(
        run_id=run_id,
        item_id=f"qwen|{method}|q|r0",
        backbone="qwen",
        model="qwen3",
        method=method,
        qid="q",
        realization=0,
        stage="attribution",
        attempt=1,
        max_tokens=1024,
        status=more.pop("status", "ok"),
        started_at=at,
        ended_at=more.pop("ended_at", at),
        prompt_tokens=prompt,
        completion_tokens=completion,
        endpoint=endpoint,
        **more,
    )


def _build(db: Path, events: list[tuple[str, str, dict[str, Any]]], calls: list[CallRow], config: Any) -> int:
    store = open_store(db)
    try:
        run_id = store.get_or_create_run("r", json.dumps(config))
    finally:
        store.close()

    async def write() -> None:
        async with StoreWriter(db) as writer:
            for kind, at, detail in events:
                writer.add_event(EventRow(run_id=run_id, kind=kind, detail_json=json.dumps(detail), at=at))
            for call in calls:
                writer.add_call(call)

    asyncio.run(write())
    return run_id


def _report(db: Path, run_id: int) -> tuple[dict[tuple[str, str], Any], list[Any]]:
    with open_store(db) as store:
        rows = {(row.backbone, row.method): row for row in cost_rows(store, run_id)}
        return rows, served_by(store, run_id)


def _two_methods(run_id: int) -> list[CallRow]:
    # 3,000 tokens for all-at-once, 1,000 for step-by-step; a cache hit's tokens are never counted.
    return [
        _call(run_id, "all-at-once", "2025-01-01T00:00:10.000Z", 2000, 500, _URLS[0]),
        _call(run_id, "all-at-once", "2025-01-01T00:00:11.000Z", 400, 100, _URLS[1]),
        _call(run_id, "step-by-step", "2025-01-01T00:00:12.000Z", 800, 200, _URLS[1]),
        _call(run_id, "step-by-step", "2025-01-01T00:00:13.000Z", 9999, 9999, _URLS[1], status="cached"),
    ]


def test_the_charge_is_price_times_gpu_hours_split_by_tokens(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    run_id = _build(
        db,
        [
            ("replicas_started", "2025-01-01T00:00:00.000Z", _started(2.0)),
            ("replicas_stopped", "2025-01-01T01:00:00.000Z", _stopped(held_s=1800.0, up_s=1770.0, price=2.0)),
        ],
        _two_methods(1),
        {"backbones": {"qwen": {"prices": {"gpu_hour_usd": 2.0}}}},
    )
    rows, (served,) = _report(db, run_id)
    # 4 GPUs × 0.5 h × $2 = $4, by tokens 3,000 : 1,000.
    assert served.gpu_hours == pytest.approx(2.0) and served.gpu_usd == pytest.approx(4.0)
    assert rows[("qwen", "all-at-once")].gpu_usd == pytest.approx(3.0)
    assert rows[("qwen", "step-by-step")].gpu_usd == pytest.approx(1.0)
    assert rows[("qwen", "step-by-step")].total_usd == pytest.approx(1.0)  # no token prices: cost_usd is 0
    assert served.replicas == 2 and served.gpus == 4 and served.vllm_version == "0.11.0"
    assert served.commands[0] == "vllm serve Qwen/Qwen3-32B --port 8101"
    # Tokens per second per replica: replica 0 served 2,500 tokens, replica 1 1,500, each up 1,770 s.
    assert [(r.index, r.attempts, r.tokens) for r in served.per_replica] == [(0, 1, 2500), (1, 2, 1500)]
    assert served.per_replica[1].tokens_per_s == pytest.approx(1500 / 1770)
    assert served.tokens_per_s_per_replica == pytest.approx(4000 / (2 * 1770))


def test_no_price_charges_nothing_but_still_says_what_served(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    run_id = _build(
        db,
        [
            ("replicas_started", "2025-01-01T00:00:00.000Z", _started(0.0)),
            ("replicas_stopped", "2025-01-01T01:00:00.000Z", _stopped(held_s=1800.0, up_s=1770.0, price=0.0)),
        ],
        _two_methods(1),
        {"backbones": {"qwen": {}}},
    )
    rows, (served,) = _report(db, run_id)
    assert served.gpu_usd == 0 and served.gpu_hours == pytest.approx(2.0)
    assert all(row.gpu_usd == 0 for row in rows.values())


def test_a_run_without_managed_replicas_has_no_gpu_charge(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    run_id = _build(db, [], _two_methods(1), {"backbones": {"qwen": {}}})
    rows, served = _report(db, run_id)
    assert served == [] and all(row.gpu_usd == 0 and row.total_usd == row.cost_usd for row in rows.values())


def test_each_session_of_a_resumed_run_pays_its_own_price_and_a_killed_one_is_charged_to_its_last_call(
    tmp_path: Path,
) -> None:
    db = tmp_path / "results.db"
    second = ("http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1")
    run_id = _build(
        db,
        [
            # Session 1 was killed: no stop event; its last call ended 570 s after the start event.
            ("replicas_started", "2025-01-01T00:00:00.000Z", _started(2.0)),
            ("replicas_started", "2025-01-01T02:00:00.000Z", _started(4.0, second)),
            ("replicas_stopped", "2025-01-01T03:00:00.000Z", _stopped(held_s=900.0, up_s=870.0, price=4.0)),
        ],
        [
            _call(
                1,
                "all-at-once",
                "2025-01-01T00:09:00.000Z",
                100,
                0,
                _URLS[0],
                ended_at="2025-01-01T00:09:30.000Z",
            ),
            _call(1, "all-at-once", "2025-01-01T02:01:00.000Z", 300, 0, second[1]),
        ],
        {"backbones": {"qwen": {"prices": {"gpu_hour_usd": 4.0}}}},
    )
    rows, (served,) = _report(db, run_id)
    # Session 1: (570 s + 30 s start-up) × 4 GPUs × $2/h = $1.3333; session 2: 900 s × 4 × $4/h = $4.
    assert served.sessions == 2 and served.unclosed_sessions == 1
    assert served.gpu_usd == pytest.approx(600 * 4 * 2 / 3600 + 900 * 4 * 4 / 3600)
    assert rows[("qwen", "all-at-once")].gpu_usd == pytest.approx(served.gpu_usd)
    # Each call counted on the replica of its own session, though the two sessions' ports differ.
    assert [(r.index, r.tokens, r.up_s) for r in served.per_replica] == [(0, 100, 1440.0), (1, 300, 1440.0)]


def test_sessions_of_a_merged_run_interleave_and_are_paired_by_their_ids(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    machine_b = ("http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1")
    run_id = _build(
        db,
        [
            ("replicas_started", "2025-01-01T00:00:00.000Z", {**_started(1.0), "session": "a"}),
            ("replicas_started", "2025-01-01T00:00:05.000Z", {**_started(3.0, machine_b), "session": "b"}),
            (
                "replicas_stopped",
                "2025-01-01T00:30:00.000Z",
                {**_stopped(1800.0, 1770.0, 1.0), "session": "a"},
            ),
            (
                "replicas_stopped",
                "2025-01-01T01:00:00.000Z",
                {**_stopped(3595.0, 3565.0, 3.0), "session": "b"},
            ),
        ],
        _two_methods(1),
        {"backbones": {"qwen": {"prices": {"gpu_hour_usd": 1.0}}}},
    )
    _, (served,) = _report(db, run_id)
    # Paired by order alone, a's stop would close b (the latest open) and b's a: $9.99 instead of $13.99.
    assert served.unclosed_sessions == 0
    assert served.gpu_usd == pytest.approx(1800 * 4 * 1.0 / 3600 + 3595 * 4 * 3.0 / 3600)
