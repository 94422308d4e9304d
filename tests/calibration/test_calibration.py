"""The estimate against several draws of the demo's sweep (harness.py): the arithmetic, and three real draws.

``scripts/estimate_calibration.py --draws 30`` runs the full comparison the closing notes quote.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.harness import MethodCalibration, render_table, run_calibration


def test_calibration_arithmetic() -> None:
    row = MethodCalibration("m", expected=110, chance_range=(90, 130), measured=(100, 120, 140, 80))
    assert row.mean == 110
    assert row.error_against_mean == 0.0
    assert row.standard_error == pytest.approx(25.8199 / 2, rel=1e-4)
    assert row.inside_range == 2  # 100 and 120
    assert row.within_15_percent == 2  # |110 - 100| <= 15, |110 - 120| <= 18; 140 and 80 are further
    assert MethodCalibration("m", 5, None, (1, 9)).inside_range == 2  # no range, nothing to miss


@pytest.mark.slow
def test_renamed_simulated_models_are_independent_draws_of_the_same_sweep(tmp_path: Path) -> None:
    rows, items = run_calibration(tmp_path, draws=3, methods=["step-by-step"], samples=4)
    assert (
        items == 4 * 10 * 2
    )  # every draw finished the sweep: 4 backbones x 10 trajectories x 2 realizations
    (walk,) = rows
    # Other model names, other answers, so other places where the walks stop.
    assert len(set(walk.measured)) == 3
    assert walk.chance_range is not None
    assert "step-by-step" in render_table(rows)
