"""SOAP's seeded splits and two-stage hyperparameter selection (§4.1, §4.3, A.3) on hand-built features."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rcarun.methods.soap.features import TrajectoryFeatures
from rcarun.methods.soap.selection import (
    LabelledFeatures,
    SelectionGrid,
    default_grid,
    select_hyperparameters,
    split_trajectories,
)
from rcarun.methods.soap.spectral import Band

IDS = [f"q{i:02d}" for i in range(10)]


def test_the_split_is_pinned_by_ids_seed_and_fractions() -> None:
    split = split_trajectories(IDS, seed=7, reference_fraction=1 / 3)
    # Pinned: a stored split must come out the same from the same inputs in every later version.
    assert split.reference == ("q09",)
    assert split.unused == ("q01", "q02")
    assert split.validation == ("q03", "q05")
    assert split.test == ("q00", "q04", "q06", "q07", "q08")
    shuffled = IDS[:]
    random.Random(1).shuffle(shuffled)
    assert split_trajectories(shuffled, seed=7, reference_fraction=1 / 3) == split


def test_splits_are_disjoint_cover_every_id_and_have_the_fractions_sizes() -> None:
    ids = [f"t{i}" for i in range(57)]
    split = split_trajectories(ids, seed=3)
    parts = [split.reference, split.unused, split.validation, split.test]
    assert sorted(qid for part in parts for qid in part) == sorted(ids)
    assert sum(len(p) for p in parts) == len(ids)
    assert (len(split.reference), len(split.unused), len(split.validation), len(split.test)) == (
        17,
        0,
        11,
        29,
    )
    assert split_trajectories(ids, seed=4).test != split.test


def test_a_smaller_reference_fraction_takes_a_subset_of_the_same_training_split() -> None:
    full = split_trajectories(IDS * 1 + [f"x{i}" for i in range(20)], seed=11)
    third = split_trajectories(IDS * 1 + [f"x{i}" for i in range(20)], seed=11, reference_fraction=1 / 3)
    assert len(full.reference) == 9 and len(third.reference) == 3
    assert set(third.reference) < set(full.reference)
    assert set(third.reference) | set(third.unused) == set(full.reference)
    assert (third.validation, third.test) == (full.validation, full.test)
    assert split_trajectories(IDS[:2], seed=0, reference_fraction=0.1).reference != ()


def test_split_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="distinct"):
        split_trajectories(["a", "a"], seed=0)
    with pytest.raises(ValueError, match="exceed 1"):
        split_trajectories(IDS, seed=0, train_fraction=0.6, validation_fraction=0.5)
    assert split_trajectories(IDS, seed=0).as_output()["seed"] == 0


def _features(
    qid: str, layer1: list[list[float]], layer2: list[list[float]], attention=None
) -> TrajectoryFeatures:
    n = len(layer1)
    return TrajectoryFeatures(
        qid=qid,
        layers=(1, 2),
        pooled=np.array([layer1, layer2], dtype=np.float32),
        attention=np.zeros((2, n, n), dtype=np.float32)
        if attention is None
        else np.asarray(attention, np.float32),
        retained=np.tri(n, k=-1, dtype=bool),
        task_attention=np.zeros((2, n), dtype=np.float32),
        nll=np.zeros(n, dtype=np.float32),
        n_tokens=(1,) * n,
        passes=1,
        tokens=0,
    )


# Reference at both layers: e1 (singular value sqrt 8), e2 (sqrt 2), e3 (0).
REFERENCE = [
    _features("r1", [[2, 0, 0], [0, 1, 0]], [[2, 0, 0], [0, 1, 0]]),
    _features("r2", [[-2, 0, 0], [0, -1, 0]], [[-2, 0, 0], [0, -1, 0]]),
]
FLAT = [1.0, 1.0, 0.0]
# Gold step 1 is the only one with no energy along e2: only layer 2 with band [1, 2) finds it.
EASY = LabelledFeatures(_features("a", [FLAT] * 3, [[0, 1, 0], [1, 0, 0], [0, 1, 1]]), step=1)
EASY_TOO = LabelledFeatures(_features("b", [FLAT] * 3, [[0, 1, 0], [1, 0, 0], [0, 1, 1]]), step=1)
# Base scores at layer 2, band [1, 2): 0, 0.5, 0, 1 -> step 3 (a symptom); gold step 1 rises only when step
# 3's heavy attention to it (decoder layer 1, two steps back) propagates with gamma 0.6 and no window limit.
ATTENTION = np.zeros((2, 4, 4))
ATTENTION[1, 1, 0] = 1.0
ATTENTION[1, 2, :2] = [0.9, 0.1]
ATTENTION[1, 3, :3] = [0.05, 0.9, 0.05]
ATTENTION[0, 1, 0] = 1.0
ATTENTION[0, 2, :2] = [0.9, 0.1]
ATTENTION[0, 3, :3] = [0.05, 0.05, 0.9]
HARD = LabelledFeatures(
    _features("c", [FLAT] * 4, [[0, 1, 0], [1, 1, 0], [0, 1, 0], [1, 0, 0]], ATTENTION), step=1
)
GRID = SelectionGrid(
    layers=(1, 2),
    bands=(Band(0, 1), Band(0, 2), Band(1, 2), Band(2, 4)),
    attention_layers=((0,), (1,)),
    windows=(1, None),
    gammas=(0.0, 0.6),
)


def test_stage_one_picks_the_layer_and_band_whose_base_score_finds_the_gold_steps() -> None:
    result = select_hyperparameters(REFERENCE, [EASY, EASY_TOO, HARD], GRID)
    assert (result.config.layer, result.config.band) == (2, Band(1, 2))
    assert result.stage1_accuracy == pytest.approx(2 / 3)
    assert {(row.layer, row.band): row.correct for row in result.stage1} == {
        (1, Band(0, 1)): 0,
        (1, Band(0, 2)): 0,
        (1, Band(1, 2)): 0,
        (2, Band(0, 1)): 0,
        (2, Band(0, 2)): 0,
        (2, Band(1, 2)): 2,
    }
    assert result.skipped_bands == 2  # [2, 4) passes rank 3 at both layers
    assert result.reference.layer == 2


def test_stage_two_picks_attention_layers_window_and_gamma_by_rescored_accuracy() -> None:
    result = select_hyperparameters(REFERENCE, [EASY, EASY_TOO, HARD], GRID)
    assert (result.config.attention_layers, result.config.window, result.config.gamma) == ((1,), None, 0.6)
    assert result.stage2_accuracy == 1.0
    winners = [row for row in result.stage2 if row.correct == 3]
    assert [(r.attention_layers, r.window, r.gamma) for r in winners] == [((1,), None, 0.6)]
    assert len(result.stage2) == 8


def test_ties_go_to_the_first_configuration_of_the_grid() -> None:
    ascending = SelectionGrid(GRID.layers, GRID.bands, ((1,),), (None,), (0.6, 0.7))
    descending = SelectionGrid(GRID.layers, GRID.bands, ((1,),), (None,), (0.7, 0.6))
    validation = [EASY, EASY_TOO, HARD]
    assert select_hyperparameters(REFERENCE, validation, ascending).config.gamma == 0.6
    assert select_hyperparameters(REFERENCE, validation, descending).config.gamma == 0.7


def test_default_grid_orders_layers_late_first_and_offers_the_attention_thirds() -> None:
    grid = default_grid(6)
    assert grid.layers == (6, 5, 4, 3, 2, 1, 0)
    assert grid.attention_layers == ((0, 1), (2, 3), (4, 5), (0, 1, 2, 3, 4, 5))
    assert grid.bands[:2] == (Band(0, 1), Band(0, 2))
    assert default_grid(2).attention_layers == ((0,), (1,), (0, 1))
    assert grid.gammas[6] == 0.6


def test_selection_needs_validation_trajectories_and_a_band_that_fits() -> None:
    with pytest.raises(ValueError, match="validation"):
        select_hyperparameters(REFERENCE, [], GRID)
    too_wide = SelectionGrid((2,), (Band(0, 8),), ((0,),))
    with pytest.raises(ValueError, match="narrower bands"):
        select_hyperparameters(REFERENCE, [EASY], too_wide)
