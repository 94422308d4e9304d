"""A resume with settings that decide answers changed is refused, not mixed in; the rest may change freely."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

from faults.conftest import backbone, item_statuses, run_cli, sweep_args, write_sweep
from faults.hostile import HostileServer, ok
from rcarun.demo import demo_sweep_config, simulated_backbones
from rcarun.runner import run_sweep


def _config(tmp_path: Path, data: Path, url: str, **changes: object) -> Path:
    return write_sweep(
        tmp_path / "sweep.toml",
        dataset=data,
        backbones={"fx": backbone(url, **changes)},  # type: ignore[arg-type]
    )


def test_a_changed_model_is_refused_with_the_change_and_both_ways_forward(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok(latency_s=0.05))
    data = dataset(4)
    db = tmp_path / "results.db"
    first = run_cli(
        sweep_args(_config(tmp_path, data, server.base_url), db, "r", "--limit", "2"), cwd=tmp_path
    )
    assert first.returncode == 0, first.describe()
    sent = len(server.chat_log())

    changed = _config(tmp_path, data, server.base_url, model="another-model", extra_body={"temperature": 0.9})
    refused = run_cli(sweep_args(changed, db, "r"), cwd=tmp_path)
    assert refused.returncode == 2, refused.describe()
    [line] = refused.stderr_lines()
    assert "backbones.fx.model: 'hostile-model' -> 'another-model'" in line
    assert 'backbones.fx.extra_body: {} -> {"temperature": 0.9}' in line
    assert "--run ANOTHER_NAME" in line and "--accept-config-change" in line
    assert len(server.chat_log()) == sent, "nothing was sent"
    stored = sqlite3.connect(db).execute("SELECT config_json FROM runs").fetchone()[0]
    assert json.loads(stored)["backbones"]["fx"]["model"] == "hostile-model", "the run is as it was"

    accepted = run_cli(sweep_args(changed, db, "r", "--accept-config-change"), cwd=tmp_path)
    assert accepted.returncode == 0, accepted.describe()
    assert item_statuses(db) == {"done": 4}
    detail = json.loads(
        sqlite3.connect(db)
        .execute("SELECT detail_json FROM run_events WHERE kind = 'resumed'")
        .fetchall()[-1][0]
    )
    assert detail["config_changed"] is True and len(detail["answer_changes"]) == 2


def test_limits_prices_and_timeouts_may_change_freely(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok())
    data = dataset(3)
    db = tmp_path / "results.db"
    assert (
        run_cli(sweep_args(_config(tmp_path, data, server.base_url), db, "r"), cwd=tmp_path).returncode == 0
    )
    relaxed = _config(
        tmp_path,
        data,
        server.base_url,
        timeout_s=30,
        limits={"concurrency": 9, "rpm": 500},
        prices={"input_per_mtok": 0.5, "output_per_mtok": 1.5},
        retry={"max_attempts": 5},
    )
    again = run_cli(sweep_args(relaxed, db, "r"), cwd=tmp_path)
    assert again.returncode == 0, again.describe()


async def test_the_demo_resumes_without_reporting_a_change(demo_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    shutil.copy(demo_db, db)
    async with simulated_backbones() as backbones:  # new loopback ports, as every `make demo` gets
        outcome = await run_sweep(
            demo_sweep_config(backbones), db_path=db, run_name="demo", show_progress=False
        )
    assert outcome.status == "finished"
    detail = json.loads(
        sqlite3.connect(db)
        .execute("SELECT detail_json FROM run_events WHERE kind = 'resumed'")
        .fetchall()[-1][0]
    )
    assert detail == {"config_changed": False}
