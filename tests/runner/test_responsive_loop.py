"""A sweep hands the GIL over every 0.5 ms and keeps the objects alive at its start out of the garbage
collector's passes while it runs, and leaves the interpreter as it found it."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import pytest

from helpers.sweeps import make_config
from rcarun.backends import BackendSettings, create_backend
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.runner.scheduler import _collector_tuned_for_sweeps, _responsive_loop


async def test_the_switch_interval_is_short_during_the_sweep_and_restored_after(tmp_path: Path) -> None:
    seen: list[float] = []
    frozen: list[int] = []
    thresholds: list[tuple[int, int, int]] = []

    def factory(settings: BackendSettings):  # type: ignore[no-untyped-def]
        seen.append(sys.getswitchinterval())
        frozen.append(gc.get_freeze_count())
        thresholds.append(gc.get_threshold())
        return create_backend(settings)

    before = sys.getswitchinterval()
    collector_before = gc.get_threshold()
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        await run_sweep(
            config, db_path=tmp_path / "r.db", run_name="x", show_progress=False, backend_factory=factory
        )
    assert seen == [pytest.approx(0.0005, rel=0.02)]
    assert sys.getswitchinterval() == before
    # The objects of the interpreter, pytest and rcarun's imports were frozen during the sweep, and are not now.
    assert frozen[0] > 10_000
    assert gc.get_freeze_count() == 0
    # The young generation is collected every 10,000 net allocations during the sweep, as before after it.
    assert thresholds == [(10_000, *collector_before[1:])]
    assert gc.get_threshold() == collector_before


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


def test_objects_someone_else_froze_stay_frozen_after_a_sweep() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with _collector_tuned_for_sweeps():
            assert gc.get_freeze_count() == before
        assert gc.get_freeze_count() == before  # not unfrozen: this sweep did not freeze them
    finally:
        gc.unfreeze()


def test_garbage_made_during_a_sweep_is_still_collected() -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    with _collector_tuned_for_sweeps():
        cycle = Cycle()
        ref = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert ref() is None


def test_a_collector_setting_someone_chose_is_kept_and_a_change_meanwhile_is_not_undone() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(50_000, 10, 10)  # higher than a sweep's: kept
        with _collector_tuned_for_sweeps():
            assert gc.get_threshold() == (50_000, 10, 10)
        gc.set_threshold(0)  # the collector switched off by its threshold: kept off
        with _collector_tuned_for_sweeps():
            assert gc.get_threshold()[0] == 0
        gc.set_threshold(700, 10, 10)
        with _collector_tuned_for_sweeps():
            assert gc.get_threshold() == (10_000, 10, 10)
            gc.set_threshold(2_000, 10, 10)  # changed by someone else while the sweep ran
        assert gc.get_threshold() == (2_000, 10, 10)
    finally:
        gc.set_threshold(*before)
