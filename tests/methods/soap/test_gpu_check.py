"""The GPU check (issue 18) on a real model: ``scripts/soap_gpu_check.py`` end to end, opt-in.

Runs only with ``-m gpu``, CUDA present and ``RCARUN_SOAP_MODEL`` naming a model directory; the data is the full
Who&When algorithm-generated when ``../shared/data/who_and_when`` is there (the paper's 126 trajectories), else
the bundled sample's six. What it asserts: the script answers exactly the test split of seed 0 (nothing SOAP
learnt from is scored), every pass it made is recorded, and the model beats choosing a step at random on that
split; with Qwen3.5-9B on the full data, Step Acc within 10 points of the paper's 47.62 (the paper's seed sds on
small subsets are 2–5 points, App. C.1).

    RCARUN_SOAP_MODEL=/models/Qwen3.5-9B pytest -m gpu -p no:xdist tests/methods/soap/test_gpu_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rcarun.data import bundled_sample_path, iter_dataset
from rcarun.methods.soap.selection import split_trajectories

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "soap_gpu_check.py"
SHARED = ROOT.parent / "shared" / "data" / "who_and_when"
PAPER_STEP_ACC = 47.62


def _model() -> Path:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    named = os.environ.get("RCARUN_SOAP_MODEL")
    if not named or not Path(named).is_dir():
        pytest.skip("RCARUN_SOAP_MODEL does not name a model directory")
    return Path(named)


def test_the_gpu_check_answers_the_test_split_and_beats_chance(tmp_path: Path) -> None:
    model = _model()
    data = SHARED if (SHARED / "algorithm_generated").is_dir() else bundled_sample_path()
    out = tmp_path / "figures.json"
    options = {"--data": data, "--seeds": 1, "--db": tmp_path / "results.db", "--json": out}
    command = [sys.executable, str(SCRIPT), "--model", str(model), "--device", "cuda"]
    done = subprocess.run(
        [*command, *(str(part) for pair in options.items() for part in pair)],
        capture_output=True,
        text=True,
        timeout=3 * 3600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(out.read_text())
    records = [r.trajectory for r in iter_dataset(data) if r.trajectory.source == "algorithm_generated"]
    split = split_trajectories([t.qid for t in records], seed=0, train_fraction=0.3, validation_fraction=0.2)
    test = [t for t in records if t.qid in set(split.test)]
    (seed,) = figures["seeds"]
    assert figures["trajectories"] == len(records)
    assert seed["n"] == len(test) and figures["passes_computed"] > 0
    chance = 100 * sum(1 / t.n_steps for t in test) / len(test)
    assert seed["step_acc"] > chance, (seed, chance)
    if len(records) == 126 and "qwen3.5-9b" in model.name.lower():
        assert abs(seed["step_acc"] - PAPER_STEP_ACC) <= 10, seed
