"""The chaos sweep (issue 7): faults of every kind, five SIGKILLs, resume, and a reconciliation that must balance.

The slow test runs one seed (``RCARUN_CHAOS_SEED``, default 7); ``scripts/chaos_sweep.py --seed N`` runs any
other. The fast tests below check that the reconciliation itself catches each kind of discrepancy it claims to,
on a results.db and server logs written by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import zlib
from pathlib import Path

import pytest

from chaos.harness import (
    METHODS,
    REALIZATIONS,
    BackboneReconciliation,
    ChaosBackbone,
    _reconcile,
    render_table,
    run_chaos_sweep,
)
from rcarun.mock import MockConfig, RequestLogEntry, request_digest
from rcarun.store import open_store

SEED = int(os.environ.get("RCARUN_CHAOS_SEED", "7"))


@pytest.mark.slow
def test_chaos_sweep_loses_nothing_duplicates_nothing_and_pays_nothing_twice(tmp_path: Path) -> None:
    report = run_chaos_sweep(tmp_path, SEED, kills=5)
    print(render_table(report))  # the numbers the lead's note quotes (pytest -s)

    assert report.problems() == []
    assert len(report.kills) == 5 and report.final_exit_code == 0 and report.integrity == "ok"
    served_outcomes: set[str] = set()
    for backbone in report.backbones:
        served_outcomes |= set(backbone.served_by_outcome)
        assert backbone.served == backbone.matched + backbone.lost
        assert backbone.lost_unexplained == backbone.recorded_not_served == 0
        assert backbone.resent_after_stored == backbone.paid_twice == 0
        assert backbone.max_in_flight_lost_at_one_kill <= backbone.concurrency
        assert backbone.items_expected == len(METHODS) * 6 * REALIZATIONS
        assert backbone.items_done + backbone.items_failed == backbone.items_expected
        assert backbone.items_missing == backbone.items_duplicated == 0
        # The resumes did their job: finished calls came back from the cache, not from the server.
        assert backbone.recorded.get("cached", 0) > 0
        assert backbone.recorded.get("length", 0) > 0
    # Every fault kind was met, so every recovery path ran.
    assert {"ok", "length", "error_500", "error_503", "timeout", "reset", "malformed", "rate_limit"} <= (
        served_outcomes
    )


# ------------------------------------------------------------------------------- the reconciliation can fail


class _Db:
    """A real results.db (migrated by rcarun) with calls written by hand."""

    def __init__(self, path: Path) -> None:
        open_store(path).close()
        self.connection = sqlite3.connect(path)
        self.connection.execute(
            "INSERT INTO runs (run_id, name, created_at, updated_at) VALUES (1, 'c', '', '')"
        )

    def blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        self.connection.execute(
            "INSERT OR IGNORE INTO blobs (sha256, zlib_data, size) VALUES (?, ?, ?)",
            (sha, zlib.compress(data), len(data)),
        )
        return sha

    def call(
        self,
        cache_key: str,
        prompt: str,
        status: str,
        *,
        http_status: int | None = None,
        completion_id: str | None = None,
    ) -> None:
        request = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 100})
        response = json.dumps({"id": completion_id}).encode() if completion_id else None
        self.connection.execute(
            "INSERT INTO calls (run_id, item_id, backbone, model, method, qid, realization, stage, attempt, "
            "status, http_status, cache_key, request_sha256, response_sha256, started_at) "
            "VALUES (1, 'i', 'b', 'm', 'all-at-once', 'q', 0, 's', 1, ?, ?, ?, ?, ?, '')",
            (
                status,
                http_status,
                cache_key,
                self.blob(request.encode()),
                self.blob(response) if response else None,
            ),
        )


def _entry(
    seq: int, at: float, prompt: str, outcome: str, completion_id: str | None = None
) -> RequestLogEntry:
    status = {"ok": 200, "error_500": 500}.get(outcome)
    digest = request_digest([{"role": "user", "content": prompt}], 100)
    return RequestLogEntry(seq, at - 0.05, at, status, outcome, digest, 100, completion_id)


def _reconciled(db: _Db, entries: list[RequestLogEntry], kills: list[float]) -> BackboneReconciliation:
    backbone = ChaosBackbone("b", MockConfig(), {"limits": {"concurrency": 2}})
    return _reconcile(db.connection, backbone, entries, kills, qids=[])


def test_a_balanced_record_reconciles_cleanly(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    db.call("k1", "p1", "error", http_status=500)
    db.call("k1", "p1", "ok", completion_id="c1")
    db.call("k1", "p1", "cached")
    result = _reconciled(db, [_entry(1, 1.0, "p1", "error_500"), _entry(2, 2.0, "p1", "ok", "c1")], [])
    assert (result.served, result.matched, result.lost, result.recorded_not_served) == (2, 2, 0, 0)
    assert result.problems() == []


def test_a_row_the_server_never_served_is_a_failure(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    db.call("k1", "p1", "ok", completion_id="c-invented")
    db.call("k2", "p2", "error", http_status=500)
    result = _reconciled(db, [], [])
    assert result.recorded_not_served == 2 and result.problems()


def test_a_loss_far_from_any_kill_is_unexplained_and_one_just_before_a_kill_is_not(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    entries = [
        _entry(1, 10.0, "p1", "ok", "c1"),
        _entry(2, 19.98, "p2", "ok", "c2"),
        _entry(3, 20.04, "p3", "ok", "c3"),  # arrived 19.99: in flight at the kill
        _entry(4, 20.2, "p4", "ok", "c4"),  # arrived 20.15, after the kill: nothing explains it
    ]
    result = _reconciled(db, entries, [20.0])
    assert (result.lost_unexplained, result.lost_uncommitted, result.lost_in_flight) == (2, 1, 1)
    assert result.oldest_uncommitted_loss_s == pytest.approx(0.02)
    assert result.problems()[0] == "b: lost_unexplained = 2"
    assert "#4 ok: arrived +0.150 s, answered +0.200 s from the nearest kill" in result.problems()[-1]


def test_more_calls_lost_in_flight_at_one_kill_than_the_concurrency_is_a_failure(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    entries = [_entry(seq, 20.04, f"p{seq}", "ok", f"c{seq}") for seq in range(1, 4)]
    result = _reconciled(db, entries, [20.0])
    assert result.lost_in_flight == 3 and result.max_in_flight_lost_at_one_kill == 3
    assert any("more than the concurrency 2" in problem for problem in result.problems())


def test_a_request_sent_again_after_its_answer_was_stored_is_a_failure(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    db.call("k1", "p1", "ok", completion_id="c1")
    db.call("k1", "p1", "ok", completion_id="c2")
    entries = [_entry(1, 1.0, "p1", "ok", "c1"), _entry(2, 5.0, "p1", "ok", "c2")]
    result = _reconciled(db, entries, [])
    assert result.resent_after_stored == 1 and result.paid_twice == 1
    assert "b: resent_after_stored = 1" in result.problems()


def test_two_realizations_sending_the_same_request_are_not_a_resend(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    db.call("k-r0", "p1", "ok", completion_id="c1")
    db.call("k-r1", "p1", "ok", completion_id="c2")
    entries = [_entry(1, 1.0, "p1", "ok", "c1"), _entry(2, 5.0, "p1", "ok", "c2")]
    result = _reconciled(db, entries, [])
    assert result.resent_after_stored == 0 and result.paid_twice == 0 and result.problems() == []
