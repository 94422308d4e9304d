"""End-to-end sweeps against the simulator on loopback: predictions, calls, resume, length retries, failures."""

from __future__ import annotations

from pathlib import Path

from helpers.sweeps import make_config, rows
from rcarun.data import bundled_sample_path, iter_dataset, task_key
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep


async def test_one_prediction_per_item_and_every_attempt_recorded(
    tmp_path: Path, sample_qids: list[str]
) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01, reasoning_tokens=50)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url, "limits": {"concurrency": 4}}}, realizations=2
        )
        outcome = await run_sweep(config, db_path=db, run_name="t", show_progress=False)
        accepted = server.stats().accepted

    assert outcome.status == "finished"
    assert outcome.trajectories == len(sample_qids) == 10
    predictions = rows(db, "SELECT qid, realization, role_valid, step_valid FROM predictions")
    assert sorted((q, r) for q, r, _, _ in predictions) == sorted((q, r) for q in sample_qids for r in (0, 1))
    # The simulator answers from the schema's enum and bounds, so every field is valid.
    assert all(role_valid and step_valid for _, _, role_valid, step_valid in predictions)
    paid = rows(db, "SELECT count(*) FROM calls WHERE status IN ('ok', 'length')")[0][0]
    assert paid == accepted == 20
    assert rows(db, "SELECT count(*) FROM trajectories")[0][0] == 10
    # Each trajectory's task is stored as its key, so the report can keep repeated attempts together.
    tasks = {
        record.trajectory.qid: task_key(record.trajectory.task)
        for record in iter_dataset(bundled_sample_path())
    }
    assert dict(rows(db, "SELECT qid, task_sha256 FROM trajectories")) == tasks
    assert all(tasks.values())
    assert rows(db, "SELECT count(*) FROM items WHERE status = 'done'")[0][0] == 20
    # Prompts are stored once each: both realizations send the same request, so 20 calls share 10 prompt blobs.
    assert rows(db, "SELECT count(DISTINCT request_sha256) FROM calls")[0][0] == 10
    assert (
        rows(db, "SELECT count(*) FROM blobs WHERE sha256 IN (SELECT request_sha256 FROM calls)")[0][0] == 10
    )


async def test_rerun_resumes_without_paying_or_predicting_twice(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        await run_sweep(config, db_path=db, run_name="again", show_progress=False)
        first = server.stats().accepted
        outcome = await run_sweep(config, db_path=db, run_name="again", show_progress=False)
        assert server.stats().accepted == first  # nothing sent the second time

    assert outcome.status == "finished"
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == 10
    assert rows(db, "SELECT count(*) FROM runs")[0][0] == 1


async def test_length_stop_retries_with_double_budget_up_to_the_cap(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # 1,500 thinking tokens: 1,024 stops on length with empty content, 2,048 is enough.
    async with MockServer(MockConfig(latency_s=0.01, reasoning_tokens=1500)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url}},
            stages={"attribution": {"max_tokens": 1024, "length_retries": 1}},
        )
        await run_sweep(config, db_path=db, run_name="len", show_progress=False)

    attempts = rows(
        db, "SELECT qid, attempt, max_tokens, status, finish_reason FROM calls ORDER BY qid, attempt"
    )
    by_qid: dict[str, list[tuple[int, int, str]]] = {}
    for qid, attempt, max_tokens, status, _ in attempts:
        by_qid.setdefault(qid, []).append((attempt, max_tokens, status))
    assert len(by_qid) == 10
    for sequence in by_qid.values():
        assert sequence == [(1, 1024, "length"), (2, 2048, "ok")]
    assert rows(db, "SELECT DISTINCT attempts FROM items") == [(2,)]
    assert rows(db, "SELECT count(*) FROM predictions WHERE role_valid AND step_valid")[0][0] == 10


async def test_length_budget_is_clamped_and_a_final_length_stop_is_an_invalid_answer(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01, reasoning_tokens=5000)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url, "max_output_tokens": 1500}},
            stages={"attribution": {"max_tokens": 1024, "length_retries": 3, "length_cap": 65536}},
        )
        await run_sweep(config, db_path=db, run_name="clamp", show_progress=False)

    budgets = rows(db, "SELECT DISTINCT attempt, max_tokens, status FROM calls ORDER BY attempt")
    # 1024 → min(2048, model max 1500) = 1500 → no further growth possible: the item ends on a length stop.
    assert budgets == [(1, 1024, "length"), (2, 1500, "length")]
    predictions = rows(db, "SELECT role_valid, step_valid, output_json FROM predictions")
    assert len(predictions) == 10
    assert all(not role_valid and not step_valid for role_valid, step_valid, _ in predictions)
    assert all("finish_reason=length" in output for _, _, output in predictions)


async def test_fatal_errors_are_stored_and_the_sweep_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # The server's context is smaller than some prompts; the client is not told, so those calls get a 400.
    # Four sample prompts are over 5,000 tokens; with a 1,000-token budget they do not fit 6,000.
    async with MockServer(MockConfig(latency_s=0.01, context_window=6000)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url}}, stages={"attribution": {"max_tokens": 1000}}
        )
        outcome = await run_sweep(config, db_path=db, run_name="fatal", show_progress=False)

    failed = rows(db, "SELECT qid, error FROM items WHERE status = 'failed'")
    done = rows(db, "SELECT count(*) FROM items WHERE status = 'done'")[0][0]
    assert len(failed) == 4 and done == 6
    assert all("ContextOverflow" in error for _, error in failed)
    errors = rows(db, "SELECT error_kind, http_status, attempt FROM calls WHERE status = 'error'")
    assert {(kind, status, attempt) for kind, status, attempt in errors} == {("context_overflow", 400, 1)}
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == done
    assert outcome.counters["sim"].items_failed == len(failed)


async def test_transient_faults_are_retried_until_they_succeed(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(
        MockConfig(latency_s=0.01, error_500_rate=0.2, error_503_rate=0.1, malformed_rate=0.1, seed=3)
    ) as server:
        config = make_config(
            {
                "sim": {
                    "base_url": server.base_url,
                    "retry": {"max_attempts": 12, "base_s": 0.01, "cap_s": 0.05},
                }
            },
            realizations=2,
        )
        outcome = await run_sweep(config, db_path=db, run_name="faults", show_progress=False)

    assert outcome.status == "finished"
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == 20
    kinds = dict(
        rows(db, "SELECT error_kind, count(*) FROM calls WHERE status = 'error' GROUP BY error_kind")
    )
    assert kinds.get("server_error", 0) > 0 and kinds.get("malformed_response", 0) > 0
    # Each failed attempt is followed by another attempt of the same call.
    assert rows(db, "SELECT count(*) FROM calls WHERE status = 'ok'")[0][0] == 20


async def test_finished_calls_of_unfinished_items_are_replayed_from_the_stored_body(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.01, reasoning_tokens=40)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        await run_sweep(config, db_path=db, run_name="replay", show_progress=False)
        before = rows(db, "SELECT qid, pred_role, pred_step FROM predictions ORDER BY qid")
        # As if the process died after the calls were committed and before the predictions were.
        rows(db, "DELETE FROM predictions")
        rows(db, "DELETE FROM items")
        accepted = server.stats().accepted
        outcome = await run_sweep(config, db_path=db, run_name="replay", show_progress=False)
        assert server.stats().accepted == accepted  # nothing was sent again

    assert outcome.counters["sim"].cached_calls == 10
    assert rows(db, "SELECT qid, pred_role, pred_step FROM predictions ORDER BY qid") == before
    cached = rows(db, "SELECT count(*), sum(cost_usd), sum(prompt_tokens) FROM calls WHERE status = 'cached'")
    assert cached == [(10, 0.0, 0)]
    # Only the raw body is stored per answer: its text is read back out of it.
    assert rows(db, "SELECT count(*) FROM calls WHERE response_text_sha256 IS NOT NULL") == [(0,)]


async def test_failed_items_stay_failed_on_resume_unless_retry_failed_is_asked(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # A server whose context is too small for any prompt: every item fails for good (400, context overflow).
    async with MockServer(MockConfig(latency_s=0.01, context_window=64)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        first = await run_sweep(config, db_path=db, run_name="retry", show_progress=False)
        assert first.counters["sim"].items_failed == 10
        tried = server.stats().requests_total

        server.config = server.config.replace(context_window=None)  # the server was given a larger model
        plain = await run_sweep(config, db_path=db, run_name="retry", show_progress=False)
        assert server.stats().requests_total == tried  # failed for good: not tried again
        assert plain.counters["sim"].items_done == 0

        retried = await run_sweep(
            config, db_path=db, run_name="retry", show_progress=False, retry_failed=True
        )

    assert retried.counters["sim"].items_done == 10
    assert rows(db, "SELECT status, count(*) FROM items GROUP BY status") == [("done", 10)]
    assert rows(db, "SELECT count(*) FROM predictions") == [(10,)]
