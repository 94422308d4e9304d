"""Limits as the server measures them, 429 isolation between backbones, spend budgets and resumable stops."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

import pytest

from helpers.sweeps import make_config, rows
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep


@pytest.mark.slow  # paces real requests through a limited server for several seconds
async def test_declared_rpm_and_tpm_are_never_exceeded_in_any_server_window(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # 30 calls of 1.4k-16k prompt tokens: both limits bind (5 requests/s; 15k tokens/s, less than the largest
    # call plus its 1,000-token budget, so the oversized-request path is exercised too).
    limits = MockConfig(latency_s=0.01, rpm=300, tpm=900_000, burst_s=1.0)
    async with MockServer(limits) as server:
        config = make_config(
            {
                "sim": {
                    "base_url": server.base_url,
                    "limits": {"concurrency": 16, "rpm": 300, "tpm": 900_000, "burst_s": 1.0},
                }
            },
            realizations=3,
            stages={"attribution": {"max_tokens": 1000}},
        )
        outcome = await run_sweep(config, db_path=db, run_name="paced", show_progress=False)
        stats = server.stats()

    assert outcome.status == "finished"
    assert stats.accepted == 30
    assert stats.rejected_429 == 0
    assert stats.overshoot_requests <= 0 and stats.overshoot_tokens <= 0
    assert stats.max_requests_1s <= 5 + 5  # capacity (1 s of quota) + refill within any 1-s window


@pytest.mark.slow
async def test_a_429_pauses_only_its_own_backbone(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # "slow" serves one request at a time and refuses the rest with 429 + Retry-After (DeepSeek's style); the
    # client is told it may send 4, so it meets 429s, pauses and shrinks its concurrency. "fast" has no limit.
    async with (
        MockServer(MockConfig(latency_s=0.3, max_concurrency=1, headers="none")) as slow,
        MockServer(MockConfig(latency_s=0.1)) as fast,
    ):
        config = make_config(
            {
                "slow": {"base_url": slow.base_url, "limits": {"concurrency": 4}},
                "fast": {"base_url": fast.base_url, "limits": {"concurrency": 2}},
            },
        )
        outcome = await run_sweep(config, db_path=db, run_name="iso", show_progress=False)
        assert slow.stats().rejected_429 > 0
        assert fast.stats().rejected_429 == 0

    assert outcome.counters["slow"].rate_limited > 0
    assert outcome.counters["fast"].rate_limited == 0
    rate_limited = rows(
        db, "SELECT ended_at FROM calls WHERE backbone = 'slow' AND status = 'rate_limited' ORDER BY ended_at"
    )
    first_429 = rate_limited[0][0]
    # While "slow" sat out its first pause (at least the server's retry-after-ms of 300 ms), "fast" kept sending.
    fast_during_pause = rows(
        db,
        "SELECT count(*) FROM calls WHERE backbone = 'fast' AND started_at > ? "
        "AND julianday(started_at) < julianday(?) + 0.3 / 86400",
        (first_429, first_429),
    )[0][0]
    slow_during_pause = rows(
        db,
        "SELECT count(*) FROM calls WHERE backbone = 'slow' AND started_at > ? "
        "AND julianday(started_at) < julianday(?) + 0.3 / 86400",
        (first_429, first_429),
    )[0][0]
    assert fast_during_pause >= 3
    assert slow_during_pause == 0
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == 20


async def test_budget_stop_leaves_unstarted_items_resumable(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01)) as server:
        # At $1,000 per 1M tokens a call costs about $2; reserving prompt + 600 output tokens, $9 admits a few.
        prices = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}
        tight = make_config(
            {"sim": {"base_url": server.base_url, "prices": prices, "limits": {"concurrency": 1}}},
            budget={"max_usd": 9.0},
            stages={"attribution": {"max_tokens": 600}},
        )
        first = await run_sweep(tight, db_path=db, run_name="budget", show_progress=False)
        assert first.status == "stopped"
        done_first = rows(db, "SELECT count(*) FROM predictions")[0][0]
        skipped = rows(db, "SELECT count(*) FROM items WHERE status = 'skipped_budget'")[0][0]
        spent_first = rows(db, "SELECT sum(cost_usd) FROM calls")[0][0]
        assert 0 < done_first < 10 and skipped == 10 - done_first
        assert spent_first <= 9.0

        roomy = make_config(
            {"sim": {"base_url": server.base_url, "prices": prices, "limits": {"concurrency": 1}}},
            budget={"max_usd": 1000.0},
            stages={"attribution": {"max_tokens": 600}},
        )
        second = await run_sweep(roomy, db_path=db, run_name="budget", show_progress=False)

    assert second.status == "finished"
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == 10
    assert rows(db, "SELECT count(*) FROM items WHERE status = 'done'")[0][0] == 10
    paid_keys = rows(
        db, "SELECT cache_key, count(*) FROM calls WHERE status IN ('ok','length') GROUP BY cache_key"
    )
    assert all(count == 1 for _, count in paid_keys)


async def test_calls_started_at_are_ordered_timestamps(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01)) as server:
        await run_sweep(
            make_config({"sim": {"base_url": server.base_url}}),
            db_path=db,
            run_name="ts",
            show_progress=False,
        )
    for started, ended, latency in rows(db, "SELECT started_at, ended_at, latency_ms FROM calls"):
        start = datetime.fromisoformat(started.replace("Z", "+00:00"))
        end = datetime.fromisoformat(ended.replace("Z", "+00:00"))
        assert start <= end
        assert latency >= 10.0  # the server's 10 ms latency is inside every measured attempt


async def test_undeclared_limits_are_respected_from_the_rate_limit_headers(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # The server allows 10 requests a second (burst 1 s) and says so in x-ratelimit-* headers; the client is
    # told nothing about it. When a reply says no requests remain, admission pauses until one more fits
    # (60 / 600 = 0.1 s), not for the whole reset.
    async with MockServer(MockConfig(latency_s=0.01, rpm=600, burst_s=1.0, headers="openai")) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url, "limits": {"concurrency": 1}}}, realizations=2
        )
        outcome = await run_sweep(config, db_path=db, run_name="headers", show_progress=False)
        stats = server.stats()

    assert outcome.status == "finished"
    assert stats.accepted == 20 and stats.rejected_429 == 0
    starts = [
        datetime.fromisoformat(row[0].replace("Z", "+00:00"))
        for row in rows(db, "SELECT started_at FROM calls ORDER BY started_at")
    ]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts)]
    assert max(gaps) >= 0.09  # the pause after the burst was spent (calls otherwise start ~0.012 s apart)


@pytest.mark.parametrize("key", ["counts_refused_requests", "meters_finer_than_window"])
def test_a_retired_limits_key_is_refused_in_one_line_that_says_what_to_do(key: str) -> None:
    url = "http://127.0.0.1:9/v1"
    with pytest.raises(Exception, match=rf"limits\.{key} was removed.*declare the provider's rpm and tpm"):
        make_config({"b": {"provider": "openai", "base_url": url, "limits": {key: True}}})
