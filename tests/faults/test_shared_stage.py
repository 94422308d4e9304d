"""RCTA's shared stages are paid once, even when their first attempt is rate-limited.

`rcta` and its ablations (`rcta/no-a1`, `rcta/no-a2`) send byte-identical Stage I requests (summary, outline),
which the runner shares between them: one item leads, the others wait for its answer. The server answers the first request of every distinct digest with a 429 (Retry-After
0.1 s) and every later one normally, with an answer built from the request's own ``response_format`` schema, so
followers that stop waiting for their rate-limited leader and send the same request themselves are caught: the
same digest answered twice. With three conditions a leader has two followers. results.db must hold at most one 'ok' row per cache key, and the demo's results.db too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, item_statuses, run_cli, sweep_args, write_sweep
from faults.hostile import HostileServer, Reply, Request, answered_twice, ok, ok_rows_per_cache_key, status

ITEMS = 4  # trajectories, each run by both conditions
RUN = "shared"


def _first_of_each_digest_is_rate_limited() -> Callable[[Request], Reply]:
    seen: set[str | None] = set()
    lock = threading.Lock()

    def policy(request: Request) -> Reply:
        with lock:
            first = request.digest not in seen
            seen.add(request.digest)
        if first:
            return status(
                429,
                {"Retry-After": "0.1"},
                {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
            )
        return ok(latency_s=0.05)

    return policy


@pytest.mark.slow
@pytest.mark.parametrize(
    "methods",
    [["rcta", "rcta/no-a1"], ["rcta", "rcta/no-a1", "rcta/no-a2"]],
    ids=["two-conditions", "three-conditions"],
)
def test_rcta_stage_one_is_paid_once_across_its_ablations(
    methods: list[str], serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(_first_of_each_digest_is_rate_limited())
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS, steps=6),
        backbones={"fx": backbone(server.base_url, retry={"max_attempts": 4})},
        methods=methods,
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)

    assert result.returncode == 0, result.describe()
    assert server.policy_errors == []
    assert item_statuses(db) == {"done": len(methods) * ITEMS}, f"items: {dict(item_statuses(db))}"
    twice = answered_twice(server.chat_log())
    assert twice == {}, (
        f"{len(twice)} request digests answered (and paid) more than once: {sorted(twice.values())}"
    )
    paid = {key: count for key, count in ok_rows_per_cache_key(db, ("ok",)).items() if count > 1}
    assert paid == {}, f"{len(paid)} cache keys with more than one 'ok' row"


@pytest.mark.slow  # builds the session's demo results.db (every method, four simulated backbones) if no test has
def test_the_demo_pays_each_cache_key_once(demo_db: Path) -> None:
    paid = {key: count for key, count in ok_rows_per_cache_key(demo_db, ("ok",)).items() if count > 1}
    assert paid == {}, f"{len(paid)} cache keys of the demo with more than one 'ok' row"
