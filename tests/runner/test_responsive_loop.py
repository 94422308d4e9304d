"""A sweep hands the GIL over every 0.5 ms while it runs, and leaves the interpreter as it found it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.sweeps import make_config
from rcarun.backends import BackendSettings, create_backend
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.runner.scheduler import _responsive_loop


async def test_the_switch_interval_is_short_during_the_sweep_and_restored_after(tmp_path: Path) -> None:
    seen: list[float] = []

    def factory(settings: BackendSettings):  # type: ignore[no-untyped-def]
        seen.append(sys.getswitchinterval())
        return create_backend(settings)

    before = sys.getswitchinterval()
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        await run_sweep(
            config, db_path=tmp_path / "r.db", run_name="x", show_progress=False, backend_factory=factory
        )
    assert seen == [pytest.approx(0.0005, rel=0.02)]
    assert sys.getswitchinterval() == before


def test_a_shorter_interval_someone_set_is_kept_and_a_change_meanwhile_is_not_undone() -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.0001)
        with _responsive_loop():
            assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.02)
        sys.setswitchinterval(0.005)
        with _responsive_loop():
            sys.setswitchinterval(0.002)  # changed by someone else while the sweep ran
        assert sys.getswitchinterval() == pytest.approx(0.002, rel=0.02)
    finally:
        sys.setswitchinterval(before)
