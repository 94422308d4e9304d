"""`rcarun sweep --tune-interpreter`: a short switch interval and a rare collector while the sweep runs, off
unless asked, and the interpreter left as it was found, with what someone else chose kept."""

from __future__ import annotations

import argparse
import gc
import sys
import weakref

import pytest

from rcarun.cli import _run_sweep_loop
from rcarun.cli.tuning import _collector_tuned_for_sweeps, _responsive_loop


async def _settings() -> tuple[float, tuple[int, int, int], int]:
    return sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count()


def test_the_flag_tunes_the_interpreter_for_the_sweep_only() -> None:
    before = (sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count())
    assert before[2] == 0  # nothing frozen by pytest or rcarun's imports

    untuned = _run_sweep_loop(_settings(), argparse.Namespace(tune_interpreter=False))
    tuned = _run_sweep_loop(_settings(), argparse.Namespace(tune_interpreter=True))

    assert untuned == before
    switch_interval, threshold, frozen = tuned
    assert switch_interval == pytest.approx(0.0005, rel=0.02)
    assert threshold == (10_000, *before[1][1:])
    assert frozen > 10_000  # the interpreter's, pytest's and rcarun's objects, out of every pass
    assert (sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count()) == before


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
