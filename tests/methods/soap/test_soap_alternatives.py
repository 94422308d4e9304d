"""SOAP's ablation alternatives (Tables 3/4, A.3, B.5): base scores and rescorings by name, the tie rule."""

from __future__ import annotations

import numpy as np
import pytest

from rcarun.methods.soap.alternatives import base_scores, rank_order, rank_with
from rcarun.methods.soap.config import SoapConfig
from rcarun.methods.soap.features import TrajectoryFeatures
from rcarun.methods.soap.spectral import Band, fit_reference

REFERENCE = fit_reference(np.array([[2.0, 0, 0], [-2.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0]]), layer=1)


def _features(rows: list[list[float]], *, nll: list[float] | None = None, tokens: list[int] | None = None):
    pooled = np.array([rows], dtype=np.float32)  # one kept layer: hidden_states index 1
    n = len(rows)
    return TrajectoryFeatures(
        qid="t",
        layers=(1,),
        pooled=pooled,
        attention=np.zeros((1, n, n), dtype=np.float32),
        retained=np.tri(n, k=-1, dtype=bool),
        task_attention=np.zeros((1, n), dtype=np.float32),
        nll=np.array(nll or [0.0] * n, dtype=np.float32),
        n_tokens=tuple(tokens or [1] * n),
        passes=1,
        tokens=0,
    )


def _config(**kwargs: object) -> SoapConfig:
    return SoapConfig(layer=1, band=Band(1, 2), attention_layers=(0,), **kwargs)  # type: ignore[arg-type]


def test_ties_rank_the_earlier_step_first_and_nan_last() -> None:
    assert rank_order(np.array([0.5, 0.9, 0.9, np.nan, 0.1])) == (1, 2, 0, 4, 3)


def test_other_subspaces_have_the_bands_width_at_the_top_and_the_bottom() -> None:
    features = _features([[3.0, 2.0, 1.0]])  # energies 9/14, 4/14, 1/14 along e1, e2, e3
    assert base_scores(features, REFERENCE, _config(base="spectral")) == pytest.approx([10 / 14])
    assert base_scores(features, REFERENCE, _config(base="leading")) == pytest.approx([5 / 14])
    assert base_scores(features, REFERENCE, _config(base="tail")) == pytest.approx([13 / 14])


def test_perplexity_norm_unit_norm_and_length() -> None:
    features = _features([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]], nll=[1.5, 0.5], tokens=[7, 30])
    assert base_scores(features, None, _config(base="perplexity")).tolist() == [1.5, 0.5]
    assert base_scores(features, None, _config(base="norm")).tolist() == [5.0, 2.0]
    assert base_scores(features, None, _config(base="length")).tolist() == [7.0, 30.0]
    shifted = fit_reference(np.array([[1.0, 0, 0], [3.0, 0, 0]]), layer=1)  # mean [2, 0, 0], unit [1, 0, 0]
    # unit rows [0.6, 0.8, 0] and [0, 0, 1]: distances to [1, 0, 0] are sqrt(0.16 + 0.64) and sqrt(2)
    assert base_scores(features, shifted, _config(base="unit-norm")) == pytest.approx(
        [np.sqrt(0.8), np.sqrt(2)]
    )


def test_reference_scores_refuse_to_run_without_a_reference_or_at_another_layer() -> None:
    features = _features([[1.0, 0, 0]])
    with pytest.raises(ValueError, match="needs a fitted reference"):
        base_scores(features, None, _config(base="spectral"))
    at_two = fit_reference(np.eye(3), layer=2)
    with pytest.raises(ValueError, match="layer 2"):
        base_scores(features, at_two, _config())


BASE = np.array([0.1, 0.9, 0.3, 0.8, 0.7, 0.95])


def test_no_rescoring_ranks_by_the_base_score() -> None:
    ranking = rank_with(_features([[0.0, 0, 0]] * 6), BASE, _config(rescoring="none"))
    assert ranking.order == (5, 1, 3, 4, 2, 0)
    assert ranking.prediction == 5


def test_earliest_of_top_k_puts_the_k_best_first_in_step_order() -> None:
    ranking = rank_with(
        _features([[0.0, 0, 0]] * 6), BASE, _config(rescoring="earliest-of-top-k", earliest_k=3)
    )
    assert ranking.order == (1, 3, 5, 4, 2, 0)
    assert ranking.prediction == 1
    np.testing.assert_array_equal(ranking.scores, BASE)
    default = rank_with(_features([[0.0, 0, 0]] * 6), BASE, _config(rescoring="earliest-of-top-k"))
    assert default.prediction == 1  # k = 5: steps 1, 2, 3, 4, 5


def test_temporal_bias_penalises_later_positions_by_its_strength() -> None:
    features = _features([[0.0, 0, 0]] * 3)
    base = np.array([0.5, 0.55, 0.3])
    weak = rank_with(features, base, _config(rescoring="temporal", temporal_strength=0.05))
    assert weak.scores == pytest.approx([0.5, 0.525, 0.25])
    assert weak.prediction == 1
    strong = rank_with(features, base, _config(rescoring="temporal", temporal_strength=0.1))
    assert strong.scores == pytest.approx([0.5, 0.5, 0.2])
    assert strong.prediction == 0  # tie: the earlier step


def test_configuration_values_are_checked() -> None:
    with pytest.raises(ValueError, match=r"window must be >= 1.*gamma must be >= 0"):
        SoapConfig(layer=1, band=Band(0, 1), attention_layers=(0,), gamma=-1, window=0)
    with pytest.raises(ValueError, match="rescoring must be one of"):
        _config(rescoring="magic")
    with pytest.raises(ValueError, match="needs at least one attention layer"):
        SoapConfig(layer=1, band=Band(0, 1), attention_layers=())
