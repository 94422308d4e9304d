"""A sweep of chat methods never loads numpy: only model-reading methods (SOAP) and the analysis need it.

numpy costs a process about 10 MB of resident memory and 45 ms of start-up, which a sweep that only sends chat
requests would pay for nothing (docs/performance.md, "CPU per call"); the `rcarun` command loads the analysis
(numpy with it) only for the commands that use it. Checked in a fresh interpreter that runs a real sweep of the
bundled sample against the simulator, since this one has long since imported numpy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rcarun.data import bundled_sample_path
from rcarun.mock import MockConfig, MockProcess

_SWEEP = """
import asyncio, json, sys
from rcarun.data import bundled_sample_path
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, run_sweep

async def main():
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = SweepConfig.model_validate({
            "sweep": {"dataset": str(bundled_sample_path()), "realizations": 2},
            "methods": [{"name": "all-at-once"}, {"name": "step-by-step"}],
            "backbones": {"sim": {"provider": "simulated", "model": "sim-model", "base_url": server.base_url}},
        })
        outcome = await run_sweep(config, db_path=sys.argv[1], run_name="imports", show_progress=False)
    return outcome.status, outcome.counters["sim"].items_failed

status, failed = asyncio.run(main())
print(json.dumps({"status": status, "failed": failed, "numpy": "numpy" in sys.modules}))
"""


def test_a_sweep_of_chat_methods_runs_without_importing_numpy(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(tmp_path / "results.db")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"status": "finished", "failed": 0, "numpy": False}


_CLI_SWEEP = """
import json, sys
from rcarun.cli import main

code = main(["sweep", "--config", sys.argv[1], "--db", sys.argv[2], "--no-progress"])
loaded = sorted(name for name in sys.modules if name == "numpy" or name.startswith("rcarun.analysis"))
print(json.dumps({"code": code, "loaded": loaded}))
"""


@pytest.mark.slow
def test_the_rcarun_command_runs_a_sweep_without_loading_the_analysis(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    with MockProcess(MockConfig(latency_s=0.001)) as server:
        config.write_text(
            f"""
[sweep]
dataset = "{bundled_sample_path()}"

[[methods]]
name = "all-at-once"

[backbones.sim]
provider = "simulated"
model = "sim-model"
base_url = "{server.base_url}"
"""
        )
        done = subprocess.run(
            [sys.executable, "-c", _CLI_SWEEP, str(config), str(tmp_path / "results.db")],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"code": 0, "loaded": []}
