"""A bare 429 never throttles a sweep for good (issue 35, N6), and a rate learned from many is said and recorded.

A bare 429 states no limit: no Retry-After, no ``x-ratelimit-*`` headers. Through ``rcarun sweep`` against the
hostile loopback server:

- The very first request is refused with a bare 429, answered after the first completions (as a real server's
  refusal is when the refused request was not the first one answered). The sweep goes on at full speed: in the
  second after the 429 the server sees far more requests than a rate learned from that near-empty window (a
  handful a minute) would let out, and no rate is learned, said or recorded.
- Every other one of the first 40 requests is refused with a bare 429: half of a window with more than 20
  answers is a limit, so a rate is learned once, said in one line and recorded as a ``rate_learned`` event; the
  window here is 3 s (``limits.window_s``) so that the held rate is raised and released within the test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, item_statuses, run_cli, sweep_args, write_sweep
from faults.hostile import HostileServer, Reply, Request, db_rows, ok, slow, status

RUN = "bare"
_RATE_LIMITED = {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}
_LATENCY_S = 0.01


def _events(db: Path, prefix: str) -> list[tuple[str, dict[str, object]]]:
    rows = db_rows(
        db, "SELECT kind, detail_json FROM run_events WHERE kind LIKE ? ORDER BY event_id", (prefix,)
    )
    return [(str(row[0]), json.loads(row[1])) for row in rows]


@pytest.mark.slow
def test_one_bare_429_on_the_first_request_leaves_the_sweep_at_full_speed(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    def policy(request: Request) -> Reply:
        if request.seq == 1:
            return status(429, body=_RATE_LIMITED, latency_s=3 * _LATENCY_S)
        return slow(_LATENCY_S, ok())

    server = serve(policy)
    items = 1_500
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(items),
        backbones={"b": backbone(server.base_url, limits={"concurrency": 16})},
    )
    db = tmp_path / "r.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert result.returncode == 0, result.describe()
    assert item_statuses(db) == {"done": items}
    log = server.chat_log()
    refused = [entry for entry in log if entry.status == 429]
    assert len(refused) == 1 and refused[0].seq == 1 and refused[0].answered_at is not None
    after = [
        entry for entry in log if refused[0].answered_at < entry.arrived_at <= refused[0].answered_at + 1.0
    ]
    # A rate learned from the few answers before the 429 would allow a handful a minute; the sweep sends on at
    # 16 in flight (or finishes first).
    assert len(after) >= min(100, items - len([e for e in log if e.arrived_at <= refused[0].answered_at]))
    assert _events(db, "rate_%") == []
    assert not any("holding it to" in line for line in result.stderr_lines()), result.describe()


@pytest.mark.slow
def test_a_rate_learned_from_many_bare_429s_is_said_once_and_recorded(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    def policy(request: Request) -> Reply:
        if request.seq <= 40 and request.seq % 2 == 0:
            return status(429, body=_RATE_LIMITED, latency_s=_LATENCY_S)
        return slow(_LATENCY_S, ok())

    server = serve(policy)
    items = 40
    settings = {"limits": {"concurrency": 4, "window_s": 3.0, "burst_s": 1.0}, "retry": {"max_attempts": 20}}
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(items),
        backbones={"b": backbone(server.base_url, **settings)},
    )
    db = tmp_path / "r.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert result.returncode == 0, result.describe()
    assert item_statuses(db) == {"done": items}
    events = _events(db, "rate_%")
    learned = [detail for kind, detail in events if kind == "rate_learned"]
    assert len(learned) == 1, events
    detail = learned[0]
    assert detail["backbone"] == "b"
    assert isinstance(detail["refused"], int) and isinstance(detail["accepted"], int)
    assert detail["refused"] >= 0.1 * (detail["accepted"] + detail["refused"]) and detail["accepted"] > 0
    # Held to what the 3-s window accepted, as a rate per minute.
    assert detail["rpm"] == detail["accepted"] * 20
    said = [line for line in result.stderr_lines() if "holding it to" in line]
    assert len(said) == 1 and "'b'" in said[0], result.describe()
