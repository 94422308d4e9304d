"""The GPU check's verdict (``scripts/soap_gpu_check.py``): the mean over split seeds against a band that a SOAP
without its attention stage cannot reach, with the split noise stated. Pure arithmetic: no model, no GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "soap_gpu_check.py"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soap_gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _seeds(check: ModuleType, *hits: int) -> list[object]:
    return [check.SeedScores(seed, 63, 100 * k / 63, 0.0, 0.0, 0.0, {}) for seed, k in enumerate(hits)]


def test_three_seeds_by_default_and_the_band_separates_soap_from_its_base_score(check: ModuleType) -> None:
    assert check.DEFAULT_SEEDS == 3
    low, high = check.BAND
    assert low > check.PAPER_WITHOUT_ATTENTION and low < check.PAPER["step_acc"] < high
    # 004's 47.62 is 90/189 over three splits; its base score's 39.15 is 74/189.
    soap = check._verdict(_seeds(check, 30, 29, 31))
    base = check._verdict(_seeds(check, 25, 24, 25))
    assert soap["within"] and soap["mean"] == pytest.approx(47.62, abs=0.01)
    assert not base["within"] and base["mean"] == pytest.approx(39.15, abs=0.01)
    assert "OUTSIDE" in base["line"] and "no attention stage" in base["line"]


def test_the_split_noise_is_the_binomial_error_of_one_split_over_the_root_of_the_seeds(
    check: ModuleType,
) -> None:
    one = check._verdict(_seeds(check, 30))
    three = check._verdict(_seeds(check, 30, 30, 30))
    p = 30 / 63
    assert one["noise"] == pytest.approx(100 * (p * (1 - p) / 63) ** 0.5)
    assert three["noise"] == pytest.approx(one["noise"] / 3**0.5)
    assert check._verdict([])["within"] is False
