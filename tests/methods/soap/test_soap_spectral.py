"""SOAP's spectral reference and base score (§3.1): band projection energy on hand-computed spectra."""

from __future__ import annotations

import numpy as np
import pytest

from rcarun.methods.soap.spectral import (
    Band,
    band_energy,
    fit_reference,
    leading_band,
    spectral_scores,
    tail_band,
)

# Centred already; right singular vectors e1, e2, e3 with singular values sqrt(8), sqrt(2), 0.
REFERENCE = np.array([[2.0, 0, 0], [-2.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0]])


def test_the_spectrum_is_the_reference_directions_by_decreasing_singular_value() -> None:
    reference = fit_reference(REFERENCE)
    assert reference.rank == 3
    np.testing.assert_allclose(reference.singular_values, [np.sqrt(8), np.sqrt(2), 0.0], atol=1e-12)
    np.testing.assert_allclose(np.abs(reference.components), np.eye(3), atol=1e-12)
    np.testing.assert_allclose(reference.mean, 0.0, atol=1e-12)


def test_leading_band_and_tail_give_the_hand_computed_energies() -> None:
    reference = fit_reference(REFERENCE)
    x = np.array([[3.0, 2.0, 1.0]])  # squared norm 14
    assert band_energy(reference, x, Band(0, 1)) == pytest.approx([9 / 14])
    assert band_energy(reference, x, Band(1, 2)) == pytest.approx([4 / 14])
    assert band_energy(reference, x, Band(2, 3)) == pytest.approx([1 / 14])
    assert band_energy(reference, x, Band(0, 2)) == pytest.approx([13 / 14])
    assert spectral_scores(reference, x, Band(0, 1)) == pytest.approx([5 / 14])
    assert spectral_scores(reference, x, Band(1, 2)) == pytest.approx([10 / 14])
    assert spectral_scores(reference, x, Band(2, 3)) == pytest.approx([13 / 14])
    assert spectral_scores(reference, x, Band(1, 2), form="reciprocal") == pytest.approx([14 / 4])


def test_the_band_decides_which_step_is_most_anomalous() -> None:
    reference = fit_reference(REFERENCE)
    steps = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    # Leading band: what is not along e1 is anomalous; band [1, 2): what is not along e2; tail: not along e3.
    assert spectral_scores(reference, steps, leading_band(1)).tolist() == [0.0, 1.0, 1.0]
    assert spectral_scores(reference, steps, Band(1, 2)).tolist() == [1.0, 0.0, 1.0]
    assert spectral_scores(reference, steps, tail_band(1, reference.rank)).tolist() == [1.0, 1.0, 0.0]


def test_query_rows_are_centred_by_the_reference_mean() -> None:
    shift = np.array([10.0, 10.0, 10.0])
    reference = fit_reference(REFERENCE + shift)
    np.testing.assert_allclose(reference.mean, shift)
    x = np.array([[3.0, 2.0, 1.0]]) + shift
    assert band_energy(reference, x, Band(1, 2)) == pytest.approx([4 / 14])
    uncentred = fit_reference(REFERENCE + shift, center=False)
    # Without centring the leading direction is the mean's, and the energy is no longer 4/14.
    assert band_energy(uncentred, x, Band(1, 2))[0] != pytest.approx(4 / 14, abs=1e-3)


def test_row_normalisation_applies_to_reference_and_query() -> None:
    # Unit rows [1,0,0], [-1,0,0], [0,1,0]: mean [0, 1/3, 0]; centred spectrum e1 (variance 2) then e2 (6/9).
    reference = fit_reference(np.array([[2.0, 0, 0], [-3.0, 0, 0], [0, 5.0, 0]]), normalize=True)
    np.testing.assert_allclose(reference.mean, [0, 1 / 3, 0])
    np.testing.assert_allclose(reference.singular_values[:2], [np.sqrt(2), np.sqrt(6 / 9)])
    x = np.array([[0, 10.0, 0]])  # unit [0, 1, 0], centred [0, 2/3, 0]
    assert band_energy(reference, x, Band(0, 1)) == pytest.approx([0.0])
    assert band_energy(reference, x, Band(1, 2)) == pytest.approx([1.0])
    raw = fit_reference(np.array([[2.0, 0, 0], [-3.0, 0, 0], [0, 5.0, 0]]))
    assert band_energy(raw, x, Band(1, 2))[0] != pytest.approx(1.0, abs=1e-3)


def test_a_step_at_the_reference_mean_is_ordinary() -> None:
    reference = fit_reference(REFERENCE + 1.0)
    assert band_energy(reference, np.array([1.0, 1.0, 1.0]), Band(0, 1)).tolist() == [1.0]
    assert spectral_scores(reference, np.array([1.0, 1.0, 1.0]), Band(0, 1)).tolist() == [0.0]


def test_bands_are_checked() -> None:
    reference = fit_reference(REFERENCE[:2])  # two rows: rank 2
    with pytest.raises(ValueError, match="rank 2"):
        band_energy(reference, np.zeros((1, 3)), Band(1, 3))
    with pytest.raises(ValueError, match="lo < hi"):
        Band(2, 2)
    with pytest.raises(ValueError, match="non-empty"):
        fit_reference(np.zeros((0, 3)))
    assert tail_band(4, 10) == Band(6, 10)
