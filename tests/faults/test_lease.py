"""One sweep per run: a second `rcarun sweep` on the same results.db and run name is refused, naming the holder.

The lease lives in results.db (table ``run_leases``), not in a lock file beside it, so it travels with the file and
a process killed with SIGKILL leaves nothing to clean up by hand: a later sweep on the same host sees the holder's
pid is gone and takes the run over.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import Child, backbone, item_statuses, run_cli, sweep_args, write_sweep
from faults.hostile import (
    HostileServer,
    answered_twice,
    db_rows,
    ok,
    ok_rows_per_cache_key,
    resent_after_stored,
    slow,
)

ITEMS = 8
RUN = "leased"


def _setup(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path, latency_s: float
) -> tuple[HostileServer, Path, Path]:
    server = serve(slow(latency_s))
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"fx": backbone(server.base_url, limits={"concurrency": 2})},
    )
    (tmp_path / "db").mkdir()
    return server, config, tmp_path / "db" / "results.db"


@pytest.mark.slow
def test_a_second_sweep_on_the_same_run_is_refused(
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    children: list[Child],
) -> None:
    server, config, db = _setup(serve, dataset, tmp_path, latency_s=1.0)
    first = Child(sweep_args(config, db, RUN), cwd=tmp_path, name="first")
    children.append(first)
    assert server.wait_for(lambda log: len(log) >= 1, 20), "the first sweep sent nothing"

    second = Child(sweep_args(config, db, RUN), cwd=tmp_path, name="second")
    children.append(second)
    refused = second.wait(10, what="the second rcarun sweep on a leased run")
    assert refused.returncode == 2, refused.describe()
    assert str(first.pid) in refused.stderr, (
        f"stderr does not name the holder's pid {first.pid}: {refused.stderr}"
    )
    assert socket.gethostname() in refused.stderr, f"stderr does not name the host: {refused.stderr}"

    done = first.wait(what="the first rcarun sweep")
    assert done.returncode == 0, done.describe()
    assert item_statuses(db) == {"done": ITEMS}
    twice = answered_twice(server.chat_log())
    assert twice == {}, f"{len(twice)} requests answered (and paid) more than once"
    tables = {row[0] for row in db_rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "run_leases" in tables, f"no run_leases table in results.db: {sorted(tables)}"
    beside = sorted(path.name for path in db.parent.iterdir())
    assert set(beside) <= {"results.db", "results.db-wal", "results.db-shm"}, (
        f"files beside results.db: {beside}"
    )


@pytest.mark.slow
def test_a_killed_sweeps_run_is_taken_over(
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    children: list[Child],
) -> None:
    server, config, db = _setup(serve, dataset, tmp_path, latency_s=0.3)
    killed = Child(sweep_args(config, db, RUN), cwd=tmp_path, name="killed")
    children.append(killed)
    assert server.wait_for(lambda log: sum(e.served for e in log) >= 3, 20), "the sweep got no answers"
    killed.send(signal.SIGKILL)
    killed.wait(10)

    server.policy = ok()
    takeover = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert takeover.returncode == 0, takeover.describe()
    assert item_statuses(db) == {"done": ITEMS}, f"items: {dict(item_statuses(db))}"
    again = resent_after_stored(server.chat_log(), db)
    assert again == [], f"{len(again)} stored answers paid again after the takeover"


@pytest.mark.slow
def test_a_merge_into_a_run_a_live_sweep_holds_is_refused(
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    children: list[Child],
) -> None:
    server, config, db = _setup(serve, dataset, tmp_path, latency_s=0.05)
    part = tmp_path / "part.db"
    finished = run_cli(sweep_args(config, part, RUN), cwd=tmp_path)
    assert finished.returncode == 0, finished.describe()

    server.policy = slow(1.0)
    live = Child(sweep_args(config, db, RUN), cwd=tmp_path, name="live")
    children.append(live)
    assert server.wait_for(lambda log: len(log) >= ITEMS + 1, 20), "the live sweep sent nothing"

    refused = run_cli(["merge", str(part), "--into", str(db)], cwd=tmp_path)
    assert refused.returncode == 2, refused.describe()
    lines = refused.stderr_lines()
    assert len(lines) == 1 and f"pid {live.pid} on host {socket.gethostname()}" in lines[0], refused.stderr

    done = live.wait(what="the live rcarun sweep")
    assert done.returncode == 0, done.describe()
    paid_twice = {key: n for key, n in ok_rows_per_cache_key(db).items() if n > 1}
    assert paid_twice == {}, f"{len(paid_twice)} cache keys hold more than one paid answer"
    predictions = db_rows(db, "SELECT count(*) FROM predictions")[0][0]
    assert predictions == ITEMS, f"{predictions} predictions in the live run, expected {ITEMS}"

    # Once the sweep has ended the same merge goes through: the lease, nothing else, refused it.
    accepted = run_cli(["merge", str(part), "--into", str(db)], cwd=tmp_path)
    assert accepted.returncode in (0, 1), accepted.describe()
