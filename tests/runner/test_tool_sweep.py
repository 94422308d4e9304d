"""Tool calls end to end: All-at-once's agentic reading over the simulator, its resume from the call cache, and
the dry-run estimate of the same sweep."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from helpers.sweeps import make_config, rows
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.runner.estimate import estimate_sweep

AGENTIC = [{"name": "all-at-once", "options": {"reading": "agentic", "max_tool_calls": 8}}]


def outputs(db: Path) -> dict[str, dict[str, object]]:
    return {qid: json.loads(text) for qid, text in rows(db, "SELECT qid, output_json FROM predictions")}


async def test_agentic_sweep_records_every_round_and_resumes_from_the_cache(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.005)) as server:
        config = make_config({"sim": {"base_url": server.base_url}}, methods=AGENTIC)
        outcome = await run_sweep(config, db_path=db, run_name="tools", show_progress=False)
        assert outcome.status == "finished"
        paid = server.stats().accepted

        first = outputs(db)
        assert len(first) == 10
        calls_per_item = dict(rows(db, "SELECT qid, count(*) FROM calls WHERE status = 'ok' GROUP BY qid"))
        for qid, output in first.items():
            assert output["reading"] == "agentic"
            assert output["capped"] is False
            # One call per tool round plus the answer; every call the model asked for is in the tool log.
            assert output["calls"] == calls_per_item[qid]
            assert output["tool_calls"] == len(output["tool_log"])  # type: ignore[arg-type]
        assert sum(calls_per_item.values()) == paid
        rounds = rows(db, "SELECT count(*) FROM calls WHERE finish_reason = 'tool_calls'")[0][0]
        assert rounds == paid - 10 > 0  # the simulator called tools on some items, and every item answered
        assert {r for (r,) in rows(db, "SELECT DISTINCT stage FROM calls")} == {"attribution"}
        # The simulator answers from the schema's enum and bounds, so every field is valid.
        assert rows(db, "SELECT count(*) FROM predictions WHERE role_valid AND step_valid")[0][0] == 10

        # As if the process died after the calls were committed and before the predictions were.
        rows(db, "DELETE FROM predictions")
        rows(db, "DELETE FROM items")
        outcome = await run_sweep(config, db_path=db, run_name="tools", show_progress=False)
        assert server.stats().accepted == paid  # every round was served from the stored bodies

    assert outcome.counters["sim"].cached_calls == paid
    assert outputs(db) == first  # same tool calls replayed, so the same tool logs, evidence and answers
    paid_requests = rows(db, "SELECT request_sha256 FROM calls WHERE status = 'ok' ORDER BY request_sha256")
    cached_requests = rows(
        db, "SELECT request_sha256 FROM calls WHERE status = 'cached' ORDER BY request_sha256"
    )
    assert paid_requests == cached_requests


async def test_estimate_predicts_the_simulators_tool_rounds(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.005)) as server:
        config = make_config({"sim": {"base_url": server.base_url}}, methods=AGENTIC)
        await run_sweep(config, db_path=db, run_name="tools", show_progress=False)
    estimate = await asyncio.to_thread(estimate_sweep, config, samples=1)  # it runs its own event loop
    (row,) = estimate.rows
    calls, prompt_tokens = rows(db, "SELECT count(*), sum(prompt_tokens) FROM calls WHERE status = 'ok'")[0]
    assert row.calls_expected == calls
    # The estimate reserves by characters with a margin; the simulator counts per message plus overhead.
    assert abs(row.prompt_tokens_expected - prompt_tokens) / prompt_tokens < 0.15
