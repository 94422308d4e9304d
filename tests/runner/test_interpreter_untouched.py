"""`run_sweep` is a library call: it leaves the process-wide switch interval and garbage collector as its caller
set them, during the sweep and after (`rcarun sweep --tune-interpreter` is where tuning them is asked for)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from helpers.sweeps import make_config
from rcarun.backends import BackendSettings, create_backend
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep


async def test_run_sweep_leaves_the_switch_interval_and_the_collector_as_they_were(tmp_path: Path) -> None:
    before = (sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count())
    during: list[tuple[float, tuple[int, int, int], int]] = []

    def factory(settings: BackendSettings):  # type: ignore[no-untyped-def]
        during.append((sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count()))
        return create_backend(settings)

    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        outcome = await run_sweep(
            config, db_path=tmp_path / "r.db", run_name="x", show_progress=False, backend_factory=factory
        )

    assert outcome.status == "finished"
    assert during == [before]
    assert (sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count()) == before
