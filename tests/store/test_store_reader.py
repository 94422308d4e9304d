"""The read side: run bookkeeping, resume keys, call-cache lookups and per-backbone totals on hand-made rows."""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcarun.errors import StoreError
from rcarun.store import BackboneSummary, CachedCall, EventRow, Store, StoreWriter, blob_sha256, open_store

RowMaker = Callable[..., Any]


def test_get_or_create_run_resumes_an_existing_name(store: Store) -> None:
    first = store.get_or_create_run("sweep-a", '{"seed": 1}')
    other = store.get_or_create_run("sweep-b", "{}")
    store.set_run_status(first, "stopped")

    again = store.get_or_create_run("sweep-a", '{"seed": 2}')

    assert again == first and other != first
    run = store.run_by_name("sweep-a")
    assert run is not None
    assert (run.run_id, run.status, run.config_json) == (first, "running", '{"seed": 2}')
    assert run.created_at <= run.updated_at
    assert run.created_at.endswith("Z") and len(run.created_at) == len("2025-01-01T00:00:00.000Z")
    events = store.events(first)
    assert [event.kind for event in events] == ["resumed"]
    assert json.loads(events[0].detail_json) == {
        "config_changed": True,
        "previous_config_json": '{"seed": 1}',
    }
    assert [r.name for r in store.runs()] == ["sweep-a", "sweep-b"]
    assert store.run_by_name("missing") is None


def test_set_run_status_refuses_unknown_statuses_and_runs(store: Store, run_id: int) -> None:
    store.set_run_status(run_id, "finished")
    run = store.run_by_name("test-run")
    assert run is not None and run.status == "finished"
    with pytest.raises(StoreError, match="'paused'"):
        store.set_run_status(run_id, "paused")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="no run with run_id 999"):
        store.set_run_status(999, "failed")


async def test_finished_item_keys_are_predictions_and_done_or_failed_items(
    db_path: Path, store: Store, run_id: int, make_prediction: RowMaker, make_item: RowMaker
) -> None:
    other_run = store.get_or_create_run("other", "{}")
    async with StoreWriter(db_path) as writer:
        writer.add_prediction(make_prediction(run_id, qid="predicted"))  # prediction, no item row
        writer.set_item(make_item(run_id, qid="done", status="done"))
        writer.set_item(make_item(run_id, qid="failed", status="failed", error="bad request"))
        writer.set_item(make_item(run_id, qid="interrupted", status="interrupted"))
        writer.set_item(make_item(run_id, qid="skipped", status="skipped_budget"))
        writer.set_item(make_item(run_id, qid="done", realization=1, backbone="bb-b", status="done"))
        writer.add_prediction(make_prediction(run_id, qid="done"))  # both: still one key
        writer.set_item(make_item(other_run, qid="elsewhere", status="done"))

    assert store.finished_item_keys(run_id) == {
        ("bb-a", "all-at-once", "predicted", 0),
        ("bb-a", "all-at-once", "done", 0),
        ("bb-a", "all-at-once", "failed", 0),
        ("bb-b", "all-at-once", "done", 1),
    }
    assert store.finished_item_keys(other_run) == {("bb-a", "all-at-once", "elsewhere", 0)}


async def test_finished_items_are_counted_and_read_per_trajectory_by_the_same_rule(
    db_path: Path, store: Store, run_id: int, make_prediction: RowMaker, make_item: RowMaker
) -> None:
    """Resume reads finished items one trajectory at a time from SQLite instead of holding every key."""
    other_run = store.get_or_create_run("other", "{}")
    async with StoreWriter(db_path) as writer:
        writer.add_prediction(make_prediction(run_id, qid="q1"))  # prediction, no item row
        writer.set_item(make_item(run_id, qid="q1", realization=1, status="done"))
        writer.set_item(make_item(run_id, qid="q1", realization=2, status="failed", error="bad request"))
        writer.set_item(make_item(run_id, qid="q1", realization=3, status="interrupted"))
        writer.set_item(make_item(run_id, qid="q1", realization=4, status="skipped_budget"))
        writer.set_item(make_item(run_id, qid="q1", realization=5, status="done"))
        writer.add_prediction(make_prediction(run_id, qid="q1", realization=5))  # both: still one item
        writer.set_item(make_item(run_id, qid="q2", status="done"))
        writer.set_item(make_item(run_id, qid="q1", backbone="bb-b", status="done"))
        writer.set_item(make_item(other_run, qid="q1", realization=7, status="done"))

    assert store.finished_realizations(run_id, "bb-a", "all-at-once", "q1") == {0, 1, 2, 5}
    assert store.finished_realizations(run_id, "bb-a", "all-at-once", "q1", include_failed=False) == {0, 1, 5}
    assert store.finished_realizations(run_id, "bb-a", "all-at-once", "q2") == {0}
    assert store.finished_realizations(run_id, "bb-a", "other-method", "q1") == frozenset()
    assert store.finished_realizations(run_id, "bb-b", "all-at-once", "q1") == {0}
    assert store.finished_realizations(other_run, "bb-a", "all-at-once", "q1") == {7}
    assert [store.count_finished_items(run_id, name) for name in ("bb-a", "bb-b", "bb-c")] == [5, 1, 0]
    assert store.count_finished_items(run_id, "bb-a", include_failed=False) == 4
    # The same items as the one-set rule, key for key.
    for include_failed in (True, False):
        keys = store.finished_item_keys(run_id, include_failed=include_failed)
        assert store.count_finished_items(run_id, "bb-a", include_failed=include_failed) == sum(
            1 for key in keys if key[0] == "bb-a"
        )
        for backbone, method, qid in {key[:3] for key in keys}:
            assert store.finished_realizations(
                run_id, backbone, method, qid, include_failed=include_failed
            ) == {key[3] for key in keys if key[:3] == (backbone, method, qid)}


def _store_call(writer: StoreWriter, make_call: RowMaker, run_id: int, text: str, **fields: Any) -> None:
    text_sha = writer.put_blob(text.encode())
    writer.add_call(make_call(run_id, response_text_sha256=text_sha, **fields))


async def test_lookup_call_returns_the_newest_usable_attempt_within_the_scope(
    db_path: Path, store: Store, run_id: int, make_call: RowMaker
) -> None:
    other_run = store.get_or_create_run("other", "{}")
    async with StoreWriter(db_path) as writer:
        raw_sha = writer.put_blob(b'{"choices": []}')
        thinking_sha = writer.put_blob("first think, then answer ✓".encode())
        _store_call(writer, make_call, run_id, "old answer", cache_key="k1", prompt_tokens=10)
        _store_call(
            writer,
            make_call,
            run_id,
            '{"role": "coder"}',
            cache_key="k1",
            status="length",
            finish_reason="length",
            max_tokens=1024,
            prompt_tokens=100,
            completion_tokens=1024,
            reasoning_tokens=900,
            cached_tokens=64,
            model="model-y",
            response_sha256=raw_sha,
            reasoning_text_sha256=thinking_sha,
        )
        # Not replayable: failed, cache-served, or without a stored answer text.
        _store_call(writer, make_call, run_id, "error page", cache_key="k1", status="error")
        _store_call(writer, make_call, run_id, "served", cache_key="k1", status="cached")
        writer.add_call(make_call(run_id, cache_key="k1"))
        _store_call(writer, make_call, other_run, "other run's answer", cache_key="k1")

    within = store.lookup_call("k1", run_id)
    assert within == CachedCall(
        call_id=within.call_id if within else -1,
        run_id=run_id,
        status="length",
        text='{"role": "coder"}',
        reasoning_text="first think, then answer ✓",
        finish_reason="length",
        model="model-y",
        max_tokens=1024,
        prompt_tokens=100,
        completion_tokens=1024,
        reasoning_tokens=900,
        cached_tokens=64,
        request_sha256=None,
        response_sha256=raw_sha,
        response_text_sha256=blob_sha256(b'{"role": "coder"}'),
        reasoning_text_sha256=thinking_sha,
    )
    anywhere = store.lookup_call("k1", None)
    assert anywhere is not None
    assert (anywhere.run_id, anywhere.text, anywhere.reasoning_text) == (other_run, "other run's answer", "")
    other = store.lookup_call("k1", other_run)
    assert other is not None and other.call_id == anywhere.call_id
    assert store.lookup_call("k2", None) is None
    assert store.lookup_call("k1", 999) is None


async def test_backbone_summary_counts_hand_made_rows(
    db_path: Path,
    store: Store,
    run_id: int,
    make_call: RowMaker,
    make_prediction: RowMaker,
    make_item: RowMaker,
) -> None:
    other_run = store.get_or_create_run("other", "{}")
    async with StoreWriter(db_path) as writer:
        # bb-a, item q1: a 429, a length stop, then ok (one call, three attempts); item q2: a cache hit.
        writer.add_call(make_call(run_id, qid="q1", attempt=1, status="rate_limited", http_status=429))
        writer.add_call(
            make_call(
                run_id,
                qid="q1",
                attempt=2,
                status="length",
                prompt_tokens=1000,
                completion_tokens=512,
                reasoning_tokens=500,
                cached_tokens=200,
                cost_usd=0.25,
            )
        )
        writer.add_call(
            make_call(
                run_id,
                qid="q1",
                attempt=3,
                prompt_tokens=1000,
                completion_tokens=800,
                reasoning_tokens=600,
                cached_tokens=1000,
                cost_usd=0.5,
            )
        )
        # A cache hit carries the original's counts, but nothing was spent on it in this run.
        writer.add_call(
            make_call(
                run_id, qid="q2", status="cached", prompt_tokens=1000, completion_tokens=800, cost_usd=0.5
            )
        )
        writer.add_prediction(make_prediction(run_id, qid="q1"))
        writer.add_prediction(make_prediction(run_id, qid="q2"))
        writer.set_item(make_item(run_id, qid="q1", status="done"))
        writer.set_item(make_item(run_id, qid="q2", status="done"))
        writer.set_item(make_item(run_id, qid="q3", status="skipped_budget"))
        # bb-b: one failed call and a failed item; one interrupted item with no calls yet.
        writer.add_call(make_call(run_id, backbone="bb-b", status="error", error="HTTP 400", prompt_tokens=5))
        writer.set_item(make_item(run_id, backbone="bb-b", status="failed"))
        writer.set_item(make_item(run_id, backbone="bb-b", qid="q2", status="interrupted"))
        # Another run's rows never leak in.
        writer.add_call(make_call(other_run, cost_usd=5.0))
        writer.add_event(EventRow(run_id, "backbone_paused", '{"backbone": "bb-a", "retry_after_s": 2}'))

    summaries = store.backbone_summary(run_id)
    assert summaries == [
        BackboneSummary(
            backbone="bb-a",
            items_done=2,
            items_failed=0,
            items_skipped=1,
            items_interrupted=0,
            calls=2,
            attempts=4,
            cached_calls=1,
            errors=0,
            rate_limited=1,
            length_retries=1,
            prompt_tokens=2000,
            completion_tokens=1312,
            reasoning_tokens=1100,
            cached_tokens=1200,
            cost_usd=0.75,  # binary-exact sums, so == is fair
            predictions=2,
        ),
        BackboneSummary(
            backbone="bb-b",
            items_done=0,
            items_failed=1,
            items_skipped=0,
            items_interrupted=1,
            calls=1,
            attempts=1,
            cached_calls=0,
            errors=1,
            rate_limited=0,
            length_retries=0,
            prompt_tokens=5,
            completion_tokens=0,
            reasoning_tokens=0,
            cached_tokens=0,
            cost_usd=0.0,
            predictions=0,
        ),
    ]
    assert [summary.total_tokens for summary in summaries] == [3312, 5]
    assert store.backbone_summary(999) == []
    assert [event.kind for event in store.events(run_id)] == ["backbone_paused"]


def test_read_blob_reports_missing_and_corrupt_blobs(db_path: Path, store: Store) -> None:
    with pytest.raises(StoreError, match="no blob abc"):
        store.read_blob("abc")
    connection = sqlite3.connect(db_path)
    connection.execute("INSERT INTO blobs (sha256, zlib_data, size) VALUES ('bad', ?, 3)", (b"not zlib",))
    connection.execute(
        "INSERT INTO blobs (sha256, zlib_data, size) VALUES ('wrong', ?, 3)", (zlib.compress(b"abc"),)
    )
    connection.commit()
    connection.close()
    with pytest.raises(StoreError, match="blob bad is corrupt"):
        store.read_blob("bad")
    with pytest.raises(StoreError, match="does not match"):
        store.read_blob("wrong")


def test_has_calls_by_run_and_for_the_whole_file(tmp_path: Path) -> None:
    store = open_store(tmp_path / "results.db")
    first = store.get_or_create_run("a", "{}")
    second = store.get_or_create_run("b", "{}")
    assert not store.has_calls() and not store.has_calls(first)
    store.connection.execute(
        "INSERT INTO calls (run_id, item_id, backbone, model, method, qid, realization, stage, attempt, status,"
        " started_at) VALUES (?, 'i', 'b', 'm', 'x', 'q', 0, 's', 1, 'ok', '2026-01-01T00:00:00.000Z')",
        (first,),
    )
    store.connection.commit()
    assert store.has_calls() and store.has_calls(first) and not store.has_calls(second)
    store.close()


async def test_lookup_call_hands_back_the_raw_body_when_no_text_blob_was_stored(
    db_path: Path, store: Store, run_id: int, make_call: RowMaker
) -> None:
    body = b'{"choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}]}'
    async with StoreWriter(db_path) as writer:
        raw_sha = writer.put_blob(body)
        writer.add_call(make_call(run_id, cache_key="raw", response_sha256=raw_sha))
        writer.add_call(make_call(run_id, cache_key="nothing"))  # neither text nor body: not replayable
    cached = store.lookup_call("raw", run_id)
    assert cached is not None
    assert (cached.text, cached.raw_body, cached.response_text_sha256) == (None, body, None)
    assert store.lookup_call("nothing", run_id) is None


async def test_finished_item_keys_can_leave_failed_items_out_for_a_retry(
    db_path: Path, store: Store, run_id: int, make_item: RowMaker
) -> None:
    async with StoreWriter(db_path) as writer:
        writer.set_item(make_item(run_id, qid="q1", status="done"))
        writer.set_item(make_item(run_id, qid="q2", status="failed"))
    keys = {key[2] for key in store.finished_item_keys(run_id)}
    retry = {key[2] for key in store.finished_item_keys(run_id, include_failed=False)}
    assert (keys, retry) == ({"q1", "q2"}, {"q1"})
