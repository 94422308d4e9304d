"""Waits have a ceiling: a provider asking for a day's pause stops its backbone, loudly, and nothing else.

Backbone ``bad`` answers its first 2 requests, then 429s asking for a pause far above its ``max_pause_s = 2``
(Retry-After of a day, a date in 2099, ``1e400``, or x-ratelimit headers saying the quota resets in 99999 s);
backbone ``good`` is healthy. The sweep must end (exit 3, one stderr line naming ``bad``, the 429 and what was
asked for), record a 'backbone_stopped' event, finish every item of ``good``, fail none of ``bad``, and a resume
against a healthy server must finish everything. Garbage Retry-After values mean ordinary backoff; a pause shorter
than the ceiling is taken and recorded as 'backbone_paused'.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from faults.conftest import (
    backbone,
    item_statuses,
    run_cli,
    sweep_args,
    write_sweep,
)
from faults.hostile import HostileServer, Reply, Request, db_rows, ok, status

ITEMS = 6
RUN = "pauses"
_RATE_LIMITED = {"error": {"message": "Rate limit reached for requests", "type": "rate_limit_error"}}


def _events(db: Path, kind: str) -> list[dict[str, object]]:
    rows = db_rows(db, "SELECT detail_json FROM run_events WHERE kind = ?", (kind,))
    return [json.loads(row[0]) for row in rows]


def _after_two_answers(headers: Mapping[str, str]) -> Callable[[Request], Reply]:
    def policy(request: Request) -> Reply:
        return ok() if request.seq <= 2 else status(429, headers, _RATE_LIMITED)

    return policy


def _says(raw: str, seconds: float) -> Callable[[str], bool]:
    """Whether a line states what the provider asked for: its raw value, or that many seconds (separators such as
    "86,400" allowed, within 1%; "forever" or "inf" for an infinite wait)."""

    def check(line: str) -> bool:
        if raw in line:
            return True
        if math.isinf(seconds):
            return "forever" in line.lower() or "inf" in line.lower()
        numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", re.sub(r"(?<=\d)[,_ ](?=\d{3})", "", line))]
        return any(abs(n - seconds) <= 0.01 * seconds for n in numbers)

    return check


_2099 = datetime(2099, 10, 21, 7, 28, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"Retry-After": "86400"}, _says("86400", 86400)),
        (
            {"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"},
            _says("2099", (_2099 - datetime.now(UTC)).total_seconds()),
        ),
        ({"Retry-After": "1e400"}, _says("1e400", math.inf)),
        (
            {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "99999s"},
            _says("99999", 99999),
        ),
    ],
    ids=["seconds", "http-date-2099", "1e400", "x-ratelimit-reset"],
)
def test_a_pause_above_the_ceiling_stops_only_that_backbone(
    headers: dict[str, str],
    says: Callable[[str], bool],
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
) -> None:
    good = serve(ok(latency_s=0.02))
    bad = serve(_after_two_answers(headers))
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={
            "good": backbone(good.base_url),
            "bad": backbone(bad.base_url, retry={"max_pause_s": 2}),
        },
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)

    assert result.returncode == 3, result.describe()
    told = [line for line in result.stderr_lines() if "bad" in line and "429" in line]
    assert len(told) == 1, f"expected one stderr line naming 'bad' and 429:\n{result.stderr}"
    assert says(told[0]), f"the line does not say what the provider asked for ({headers}): {told[0]}"
    stopped = [event for event in _events(db, "backbone_stopped") if "bad" in json.dumps(event)]
    assert stopped, (
        f"no 'backbone_stopped' event for 'bad': {[tuple(r) for r in db_rows(db, 'SELECT kind, detail_json FROM run_events')]}"
    )
    assert item_statuses(db, "good") == {"done": ITEMS}, f"good: {dict(item_statuses(db, 'good'))}"
    bad_statuses = item_statuses(db, "bad")
    assert set(bad_statuses) <= {"done", "interrupted"}, f"bad: {dict(bad_statuses)}"

    bad.policy = ok()
    again = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert again.returncode == 0, again.describe()
    assert item_statuses(db) == {"done": 2 * ITEMS}, f"after resume: {dict(item_statuses(db))}"


@pytest.mark.parametrize(
    "retry_after", ["-5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"], ids=["negative", "garbage", "past-date"]
)
def test_a_meaningless_retry_after_means_ordinary_backoff(
    retry_after: str,
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
) -> None:
    def policy(request: Request) -> Reply:
        return status(429, {"Retry-After": retry_after}, _RATE_LIMITED) if request.seq % 3 == 0 else ok()

    server = serve(policy)
    config = write_sweep(
        tmp_path / "sweep.toml", dataset=dataset(ITEMS), backbones={"fx": backbone(server.base_url)}
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)

    assert result.returncode == 0, result.describe()
    assert sum(entry.status == 429 for entry in server.chat_log()) >= 2, (
        "the server sent too few 429s to test"
    )
    assert item_statuses(db) == {"done": ITEMS}, f"items: {dict(item_statuses(db))}"


def test_a_pause_below_the_ceiling_is_taken_and_recorded(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    def policy(request: Request) -> Reply:
        return status(429, {"Retry-After": "1"}, _RATE_LIMITED) if request.seq == 3 else ok()

    server = serve(policy)
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"fx": backbone(server.base_url, retry={"max_pause_s": 2})},
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)

    assert result.returncode == 0, result.describe()
    assert item_statuses(db) == {"done": ITEMS}, f"items: {dict(item_statuses(db))}"
    paused = _events(db, "backbone_paused")
    assert len(paused) >= 1, "the 1 s pause left no 'backbone_paused' event"
