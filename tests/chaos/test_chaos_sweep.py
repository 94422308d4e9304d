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
import sys
import time
import zlib
from pathlib import Path

import pytest

from chaos.harness import (
    METHODS,
    REALIZATIONS,
    BackboneReconciliation,
    ChaosBackbone,
    ChaosReport,
    _columns,
    _final_phase,
    _reconcile,
    _tokens_out_of_range,
    chaos_backbones,
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
    assert len(report.kills) == 5 and report.integrity == "ok"
    # The final run went to the end: 0, or 4 exactly when items failed for good (retries exhausted on faults).
    failed = sum(backbone.items_failed for backbone in report.backbones)
    assert report.final_exit_code == (4 if failed else 0)
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
    # Every fault kind was met, so every recovery path ran (a long pause is rarer: met in most seeds, not all).
    assert {"ok", "length", "error_500", "error_503", "timeout", "reset", "malformed", "rate_limit"} <= (
        served_outcomes
    )
    # The hostile answers come at 1% each, a huge step only where an answer has an integer step field: which of
    # them a seed meets depends on timing, so the test asks for at least one (the harness checks each one met).
    assert {"huge_step", "surrogate", "bad_usage"} & served_outcomes
    # Bare 429s (3 % of requests) are met and the sweep still ends in its time (they teach no rate limit); what
    # `rcarun show` prints of every trajectory holds no control character (the harness counts them).
    assert "bare_rate_limit" in served_outcomes and set(report.terminal_controls) and report.problems() == []
    # Streams cut halfway are stored with what arrived, and charged (the harness checks each one it finds).
    assert sum(backbone.cuts_stored for backbone in report.backbones) > 0
    assert report.usage_source_column and report.calls_tokens_out_of_range == 0
    stopped_runs = sum(1 for run in report.runs if run == "3")
    assert report.extra_resumes == stopped_runs and report.runs[-1] in ("0", "4")


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

    def add_usage_source(self) -> None:
        """The column the engine adds for estimated usage, where this rcarun does not have it yet."""
        if "usage_source" not in _columns(self.connection, "calls"):
            self.connection.execute("ALTER TABLE calls ADD COLUMN usage_source TEXT")

    def call(
        self,
        cache_key: str,
        prompt: str,
        status: str,
        *,
        http_status: int | None = None,
        completion_id: str | None = None,
        prompt_tokens: float = 0,
    ) -> int:
        request = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 100})
        response = json.dumps({"id": completion_id}).encode() if completion_id else None
        cursor = self.connection.execute(
            "INSERT INTO calls (run_id, item_id, backbone, model, method, qid, realization, stage, attempt, "
            "status, http_status, cache_key, request_sha256, response_sha256, started_at, prompt_tokens) "
            "VALUES (1, 'i', 'b', 'm', 'all-at-once', 'q', 0, 's', 1, ?, ?, ?, ?, ?, '', ?)",
            (
                status,
                http_status,
                cache_key,
                self.blob(request.encode()),
                self.blob(response) if response else None,
                prompt_tokens,
            ),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def set_usage_source(self, call_id: int, source: str) -> None:
        self.connection.execute("UPDATE calls SET usage_source = ? WHERE call_id = ?", (source, call_id))


def _entry(
    seq: int, at: float, prompt: str, outcome: str, completion_id: str | None = None
) -> RequestLogEntry:
    status = {"error_500": 500, "long_pause": 429}.get(outcome, 200)
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


# ------------------------------------------------------------------------------- the campaign's fault kinds


def test_the_chaos_backbones_serve_the_campaigns_kinds_and_cap_client_pauses() -> None:
    for backbone in chaos_backbones(11):
        server = backbone.server
        assert server.huge_step_rate == server.surrogate_rate == server.bad_usage_rate == 0.01
        assert server.control_rate == 0.01 and server.bare_rate_limit_rate == 0.03
        assert 0 < server.long_pause_rate < 0.01
        assert backbone.client["retry"]["max_pause_s"] == 2


def test_hostile_answers_join_by_completion_id_and_a_long_pause_by_digest(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    db.add_usage_source()
    db.call("k1", "p1", "ok", completion_id="c1")
    db.call("k2", "p2", "ok", completion_id="c2")
    usage = db.call("k3", "p3", "ok", completion_id="c3")
    db.set_usage_source(usage, "estimated")
    db.call("k4", "p4", "rate_limited", http_status=429)
    entries = [
        _entry(1, 1.0, "p1", "huge_step", "c1"),
        _entry(2, 2.0, "p2", "surrogate", "c2"),
        _entry(3, 3.0, "p3", "bad_usage", "c3"),
        _entry(4, 4.0, "p4", "long_pause"),
    ]
    result = _reconciled(db, entries, [])
    assert (result.served, result.matched, result.lost, result.recorded_not_served) == (4, 4, 0, 0)
    assert result.hostile_stored == {"huge_step": 1, "surrogate": 1, "bad_usage": 1}
    assert result.problems() == []


def test_a_stream_cut_halfway_joins_its_row_by_the_partial_answers_id_and_must_be_charged(
    tmp_path: Path,
) -> None:
    db = _Db(tmp_path / "results.db")
    db.add_usage_source()
    charged = db.call("k1", "p1", "error", completion_id="c1")
    db.set_usage_source(charged, "estimated")
    db.call("k2", "p2", "error", completion_id="c2")  # stored, but not charged
    entries = [_entry(1, 1.0, "p1", "stream_stall", "c1"), _entry(2, 2.0, "p2", "stream_drop", "c2")]
    result = _reconciled(db, entries, [])
    assert (result.served, result.lost, result.cuts_stored, result.cut_not_charged) == (2, 0, 2, 1)
    assert result.problems() == ["b: cut_not_charged = 1"]


def test_a_long_pause_that_no_row_records_is_a_loss(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    result = _reconciled(db, [_entry(1, 4.0, "p4", "long_pause")], [])
    assert result.lost_unexplained == 1 and "#1 long_pause" in result.problems()[-1]


def test_a_stored_bad_usage_answer_must_say_its_usage_was_estimated(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    entries = [_entry(1, 1.0, "p1", "bad_usage", "c1")]
    db.call("k1", "p1", "ok", completion_id="c1")
    if "usage_source" not in _columns(db.connection, "calls"):
        # Without the column the report says so once (below); a backbone does not count what it cannot see.
        assert _reconciled(db, entries, []).bad_usage_not_estimated == 0
        db.add_usage_source()
    result = _reconciled(db, entries, [])
    assert result.bad_usage_not_estimated == 1
    assert "b: bad_usage_not_estimated = 1" in result.problems()


def test_a_results_db_without_usage_source_is_a_problem_of_the_report() -> None:
    report = ChaosReport(seed=1, kills_requested=0, final_exit_code=0, integrity="ok")
    report.backbones.append(BackboneReconciliation("b", 2))
    assert report.problems() == [
        "calls has no usage_source column: estimated usage cannot be told from billed"
    ]
    report.usage_source_column = True
    assert report.problems() == []


def test_token_counts_past_two_to_the_53_negative_or_not_integers_are_counted(tmp_path: Path) -> None:
    db = _Db(tmp_path / "results.db")
    db.call("k1", "p1", "ok", completion_id="c1", prompt_tokens=1_000)
    db.call("k2", "p2", "ok", completion_id="c2", prompt_tokens=2**53)
    db.call("k3", "p3", "ok", completion_id="c3", prompt_tokens=2**53 + 1)
    db.call("k4", "p4", "ok", completion_id="c4", prompt_tokens=1e20)  # kept as REAL by SQLite
    db.call("k5", "p5", "ok", completion_id="c5", prompt_tokens=-3)
    db.call("k6", "p6", "ok", completion_id="c6", prompt_tokens=float("inf"))
    assert _tokens_out_of_range(db.connection, _columns(db.connection, "calls")) == 4


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(body)
    return [sys.executable, str(path)]


def test_the_final_phase_resumes_after_each_stop_until_a_run_finishes(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    command = _script(
        tmp_path,
        f"import pathlib, sys\np = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\nsys.exit(3 if n < 3 else 0)\n",
    )
    report = ChaosReport(seed=1, kills_requested=0)
    _final_phase(report, command, time.monotonic() + 30, max_extra_resumes=6)
    assert report.runs == ["3", "3", "0"] and report.extra_resumes == 2 and report.final_exit_code == 0
    assert report.child_failures == []


def test_the_final_phase_gives_up_after_its_extra_resumes(tmp_path: Path) -> None:
    report = ChaosReport(seed=1, kills_requested=0)
    _final_phase(
        report, _script(tmp_path, "raise SystemExit(3)\n"), time.monotonic() + 30, max_extra_resumes=2
    )
    assert report.runs == ["3", "3", "3"] and report.extra_resumes == 2 and report.final_exit_code == 3
    assert "the final resume exited with 3 after 2 extra resumes" in report.problems()


def test_a_hung_run_is_killed_at_its_wall_clock_limit_and_reported(tmp_path: Path) -> None:
    command = _script(
        tmp_path,
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('draining', file=sys.stderr, flush=True)\ntime.sleep(60)\n",
    )
    report = ChaosReport(seed=1, kills_requested=0)
    started = time.monotonic()
    _final_phase(report, command, started + 0.5, max_extra_resumes=6, min_wait_s=0.5)
    assert time.monotonic() - started < 10
    assert report.runs == ["hung"] and report.final_exit_code is None
    assert report.child_failures == ["run 1 hung: SIGKILLed after 0.5 s; draining"]
