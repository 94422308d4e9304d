"""Managed vLLM backbones in a sweep, with the fake `vllm` command: the serve table's checks, replicas started
before the run's calls and recorded with it, a replica that dies mid-run restarted while its calls are retried
on the other (nothing lost), Ctrl-C on a real `rcarun sweep` process leaving no replica behind, and the
replicas' GPU time recorded and charged by tokens."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.sweeps import rows
from rcarun.analysis.cost import cost_rows, served_by
from rcarun.cli import main
from rcarun.data import bundled_sample_path
from rcarun.errors import ConfigError
from rcarun.runner import SweepConfig, run_sweep
from rcarun.runner.config import _SERVE_RESERVED_FLAGS, BackboneConfig
from rcarun.serving import RESERVED_FLAGS, ServeError
from rcarun.store import open_store
from serving.fake import FAKE_COMMAND, alive, recorded_pids


def _qwen(**serve: Any) -> dict[str, Any]:
    return {
        "provider": "vllm",
        "model": "qwen-test",
        "context_window": 32768,
        "limits": {"concurrency": 6},
        "retry": {"base_s": 0.05, "cap_s": 0.2},
        "serve": {
            "model": "/models/Qwen3-test",
            "gpus": [0, 1],
            "command": list(FAKE_COMMAND),
            "startup_timeout_s": 20,
            "restarts": 1,
            "grace_s": 5,
            **serve,
        },
    }


def _config(backbone: dict[str, Any], realizations: int = 1) -> SweepConfig:
    return SweepConfig.model_validate(
        {
            "sweep": {
                "dataset": str(bundled_sample_path()),
                "realizations": realizations,
                "drain_timeout_s": 2,
            },
            "methods": [{"name": "all-at-once"}],
            "backbones": {"qwen": backbone},
        }
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"base_url": "http://127.0.0.1:8000/v1"}, "gets its URLs from its replicas"),
        ({"provider": "openai"}, "provider must be 'vllm'"),
        ({"serve": {"model": "m", "gpus": [0, 1, 2], "tensor_parallel": 2}}, "do not split into replicas"),
        ({"serve": {"model": "m", "gpus": [0, 0]}}, "distinct"),
        ({"serve": {"model": "m", "gpus": [0], "extra_args": ["--port=9"]}}, "set by rcarun"),
        (
            {"serve": {"model": "m", "gpus": [0], "max_model_len": 4096}},
            r"context_window \(32768\) and serve.max_model_len",
        ),
        ({"serve": {"model": "m", "gpus": [0], "launcher": "x"}}, "Extra inputs are not permitted"),
    ],
)
def test_a_serve_table_that_cannot_work_is_refused(change: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        BackboneConfig.model_validate({**_qwen(), **change})


def test_the_config_knows_the_flags_rcarun_sets() -> None:
    assert set(_SERVE_RESERVED_FLAGS) == set(RESERVED_FLAGS)
    assert BackboneConfig.model_validate(_qwen(command="vllm --foo")).serve.command_argv == ("vllm", "--foo")  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_dying_replica_is_restarted_and_its_calls_are_retried_elsewhere_nothing_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    behaviour = {
        "pid_dir": str(pid_dir),
        "mock": {"latency_s": 0.2},
        "devices": {"0": {"die_after": 4, "die_once_file": str(tmp_path / "died")}},
    }
    monkeypatch.setenv("RCARUN_FAKE_VLLM", json.dumps(behaviour))
    db = tmp_path / "results.db"
    outcome = await run_sweep(_config(_qwen(), realizations=2), db_path=db, run_name="t", show_progress=False)

    assert outcome.status == "finished"
    assert rows(db, "SELECT count(*) FROM items WHERE status = 'done'")[0][0] == 20
    assert rows(db, "SELECT count(*) FROM predictions")[0][0] == 20
    kinds = [kind for (kind,) in rows(db, "SELECT kind FROM run_events ORDER BY event_id")]
    assert kinds[:1] == ["replicas_started"] and "replica_died" in kinds and "replica_restarted" in kinds
    (detail,) = [
        json.loads(d)
        for (d,) in rows(db, "SELECT detail_json FROM run_events WHERE kind = 'replicas_started'")
    ]
    assert detail["vllm_version"] == "0.0.0+rcarun.fake" and detail["max_model_len"] == 32768
    assert [r["gpus"] for r in detail["replicas"]] == [[0], [1]]
    assert "--max-model-len" in detail["replicas"][0]["argv"]  # the context window, passed on
    # The calls in flight on the dead replica failed without an answer and were retried; each is a row.
    failed = rows(db, "SELECT count(*) FROM calls WHERE status != 'ok'")[0][0]
    assert failed >= 1
    assert not [pid for pid in recorded_pids(pid_dir) if alive(pid)]


@pytest.mark.slow
async def test_a_replica_serving_another_window_stops_the_sweep_before_any_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RCARUN_FAKE_VLLM", json.dumps({"report_max_model_len": 8192}))
    db = tmp_path / "results.db"
    with pytest.raises(ServeError, match="max_model_len 8192, but the config says 32768"):
        await run_sweep(_config(_qwen()), db_path=db, run_name="t", show_progress=False)
    assert rows(db, "SELECT count(*) FROM calls")[0][0] == 0


@pytest.mark.slow
def test_ctrl_c_on_a_sweep_process_stops_every_replica_and_its_children(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    config = tmp_path / "sweep.toml"
    config.write_text(
        f"""
[sweep]
dataset = "{bundled_sample_path()}"
realizations = 50
drain_timeout_s = 20

[[methods]]
name = "all-at-once"

[backbones.qwen]
provider = "vllm"
model = "qwen-test"
limits = {{ concurrency = 2 }}

[backbones.qwen.serve]
model = "/models/Qwen3-test"
gpus = [0, 1, 2, 3]
tensor_parallel = 2
command = {json.dumps(list(FAKE_COMMAND))}
grace_s = 1
"""
    )
    env = {
        **os.environ,
        "RCARUN_FAKE_VLLM": json.dumps(
            {"pid_dir": str(pid_dir), "spawn_child": True, "ignore_sigterm": True, "mock": {"latency_s": 0.5}}
        ),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rcarun.cli",
            "sweep",
            "--config",
            str(config),
            "--db",
            str(tmp_path / "r.db"),
            "--no-progress",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while len(recorded_pids(pid_dir)) < 4:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the replicas never started"
        time.sleep(0.1)
    time.sleep(1.0)  # calls in flight
    pids = recorded_pids(pid_dir)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 3, stderr.decode()  # stopped early, resumable
    assert "starting 2 vLLM replicas" in stderr.decode()
    # The replicas ignore SIGTERM: only the SIGKILL after grace_s, sent to each group, ends them and children.
    assert not [pid for pid in pids if alive(pid)]


@pytest.mark.gpu
async def test_a_real_vllm_serve_starts_is_checked_and_stops(tmp_path: Path) -> None:
    """On a GPU machine: RCARUN_VLLM_MODEL_DIR=/path/to/a/small/model pytest -m gpu tests/runner/test_managed_sweep.py"""
    model_dir = os.environ.get("RCARUN_VLLM_MODEL_DIR")
    if shutil.which("vllm") is None or not model_dir or not Path(model_dir).is_dir():
        pytest.skip("needs the vllm command and RCARUN_VLLM_MODEL_DIR (a small model directory)")
    from rcarun.serving import ManagedReplicas, ServeSpec

    spec = ServeSpec(
        backbone="qwen",
        served_model="gpu-test",
        model=model_dir,
        gpus=(0,),
        max_model_len=2048,
        extra_args=("--gpu-memory-utilization", "0.5", "--enforce-eager"),
        startup_timeout_s=600,
        grace_s=30,
        log_dir=tmp_path,
    )
    async with ManagedReplicas(spec) as fleet:
        record = fleet.record
        assert record.max_model_len == 2048 and record.version_source == "GET /version"
        assert record.version[0].isdigit()
        pids = fleet.pids()
    assert not [pid for pid in pids if alive(pid)]


def test_a_sweep_refuses_a_managed_backbone_whose_key_variable_is_unset(tmp_path: Path) -> None:
    import asyncio

    backbone = {**_qwen(), "api_key_env": "RCARUN_TEST_NO_SUCH_KEY"}
    with pytest.raises(ConfigError, match="RCARUN_TEST_NO_SUCH_KEY"):
        asyncio.run(
            run_sweep(_config(backbone), db_path=tmp_path / "r.db", run_name="t", show_progress=False)
        )
    assert not (tmp_path / "r.db").exists()


@pytest.mark.parametrize(
    ("backbone", "expected"),
    [
        (
            {
                "provider": "vllm",
                "model": "m",
                "base_url": "http://127.0.0.1:8000/v1",
                "prices": {"gpu_hour_usd": 2},
            },
            "gpu_hour_usd charges the GPU time of replicas rcarun runs",
        ),
        (_qwen(env={"HF_TOKEN": "x"}), "a credential in the serve environment"),
        (_qwen(env={"VLLM_X": "Bearer abcdefghijklmnop"}), "looks like a secret"),
    ],
)
def test_a_gpu_price_needs_managed_replicas_and_the_serve_environment_holds_no_key(
    backbone: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValueError, match=expected):
        BackboneConfig.model_validate(backbone)


@pytest.mark.slow
async def test_the_replicas_gpu_time_is_recorded_and_charged_by_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The serve table's env reaches the replicas: the fake's behaviour comes from there, not this process's.
    behaviour = {"mock": {"latency_s": 0.05, "seed": 3}}
    backbone = {**_qwen(env={"RCARUN_FAKE_VLLM": json.dumps(behaviour)}), "prices": {"gpu_hour_usd": 3.6}}
    db = tmp_path / "results.db"
    outcome = await run_sweep(_config(backbone), db_path=db, run_name="t", show_progress=False)
    assert outcome.status == "finished"

    events = {
        kind: json.loads(detail) for kind, detail in rows(db, "SELECT kind, detail_json FROM run_events")
    }
    started, stopped = events["replicas_started"], events["replicas_stopped"]
    assert (
        started["gpus"] == 2 and started["gpu_hour_usd"] == 3.6 and started["session"] == stopped["session"]
    )
    assert stopped["gpus"] == 2 and stopped["replicas"] == 2 and 0 < stopped["up_s"] < stopped["held_s"]
    with open_store(db) as store:
        cost = cost_rows(store, outcome.run_id)
        (served,) = served_by(store, outcome.run_id)
    # $3.6 per GPU-hour is $0.001 per GPU-second.
    assert served.gpu_usd == pytest.approx(stopped["held_s"] * 2 * 0.001)
    assert sum(row.gpu_usd for row in cost) == pytest.approx(served.gpu_usd)
    assert sum(r.attempts for r in served.per_replica) == rows(db, "SELECT count(*) FROM calls")[0][0]
    assert all(r.attempts > 0 and r.tokens_per_s for r in served.per_replica)  # both replicas served

    assert main(["cost", "--db", str(db)]) == 0
    table = capsys.readouterr().out
    assert "GPU USD" in table.splitlines()[1]
    assert "GPU time of qwen (vLLM 0.0.0+rcarun.fake, 2 replicas on 2 GPUs, 1 session(s))" in table
    assert main(["report", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["served_by"]
    assert entry["vllm_version"] == "0.0.0+rcarun.fake" and entry["replicas"] == 2
    assert "serve /models/Qwen3-test" in entry["commands"][0]
    assert sum(row["gpu_usd"] for row in report["cost"]) == pytest.approx(served.gpu_usd)
