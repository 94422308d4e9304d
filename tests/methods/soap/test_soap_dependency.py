"""SOAP's dependency weights and rescoring (§3.2, A.3, B.1) on hand-computed attention maps."""

from __future__ import annotations

import numpy as np
import pytest

from rcarun.methods.soap.dependency import attention_band, average_attention, dependency_weights, propagate

ALL = np.ones((4, 4), dtype=bool)

# Row = attending step, column = attended step. Values on and above the diagonal must be ignored.
MASS = np.array(
    [
        [0.9, 0.9, 0.9, 0.9],
        [0.3, 0.5, 0.9, 0.9],
        [0.1, 0.3, 0.5, 0.9],
        [0.2, 0.2, 0.4, 0.5],
    ]
)


def test_attention_bands_are_contiguous_thirds() -> None:
    assert attention_band(7, "early") == (0, 1, 2)
    assert attention_band(7, "middle") == (3, 4)
    assert attention_band(7, "late") == (5, 6)
    assert attention_band(6, "middle") == (2, 3)
    assert attention_band(6, "all") == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="no late third"):
        attention_band(2, "late")


def test_attention_is_averaged_over_the_selected_layers_only() -> None:
    stack = np.stack([np.full((2, 2), 0.2), np.full((2, 2), 0.4), np.full((2, 2), 9.0)])
    np.testing.assert_allclose(average_attention(stack, (0, 1)), np.full((2, 2), 0.3))


def test_layers_without_softmax_attention_are_left_out_of_the_mean() -> None:
    # a hybrid model's linear-attention layer is all NaN; an entry no layer has becomes 0
    stack = np.stack([np.full((2, 2), 0.2), np.full((2, 2), np.nan), np.array([[0.6, np.nan], [0.6, 0.6]])])
    np.testing.assert_allclose(average_attention(stack, (0, 1, 2)), [[0.4, 0.2], [0.4, 0.4]])
    np.testing.assert_array_equal(average_attention(stack, (1,)), np.zeros((2, 2)))


def test_weights_use_predecessors_only_and_each_row_sums_to_one() -> None:
    weights = dependency_weights(MASS, ALL)
    expected = np.array(
        [
            [0, 0, 0, 0],
            [1.0, 0, 0, 0],
            [0.25, 0.75, 0, 0],
            [0.25, 0.25, 0.5, 0],
        ]
    )
    np.testing.assert_allclose(weights, expected)
    np.testing.assert_allclose(weights.sum(axis=1), [0, 1, 1, 1])


def test_the_window_keeps_the_nearest_predecessors() -> None:
    np.testing.assert_allclose(dependency_weights(MASS, ALL, window=1)[3], [0, 0, 1.0, 0])
    np.testing.assert_allclose(dependency_weights(MASS, ALL, window=2)[3], [0, 1 / 3, 2 / 3, 0])
    np.testing.assert_allclose(dependency_weights(MASS, ALL, window=2)[2], [0.25, 0.75, 0, 0])


def test_steps_outside_the_targets_window_are_not_predecessors() -> None:
    retained = ALL.copy()
    retained[3, 0] = False  # step 3's pass dropped step 0
    np.testing.assert_allclose(dependency_weights(MASS, retained)[3], [0, 1 / 3, 2 / 3, 0])


def test_top_keeps_the_heaviest_predecessors_and_ties_prefer_the_nearer() -> None:
    np.testing.assert_allclose(dependency_weights(MASS, ALL, top=1)[3], [0, 0, 1.0, 0])
    # steps 0 and 1 tie at 0.2 behind step 2: the nearer, step 1, is kept
    np.testing.assert_allclose(dependency_weights(MASS, ALL, top=2)[3], [0, 1 / 3, 2 / 3, 0])


def test_a_step_with_no_mass_to_its_predecessors_has_no_dependencies() -> None:
    mass = np.zeros((3, 3))
    np.testing.assert_array_equal(dependency_weights(mass, np.ones((3, 3), dtype=bool)), np.zeros((3, 3)))


W = np.array(
    [
        [0, 0, 0, 0],
        [1.0, 0, 0, 0],
        [0.25, 0.75, 0, 0],
        [0.5, 0, 0.5, 0],
    ]
)
BASE = np.array([0.0, 0.2, 1.0, 0.4])
# into 0: 1*0.2 + 0.25*1.0 + 0.5*0.4 = 0.65 over weight 1.75 from 3 dependents
# into 1: 0.75*1.0 = 0.75 over weight 0.75; into 2: 0.5*0.4 = 0.2 over weight 0.5; into 3: nothing


@pytest.mark.parametrize(
    ("norm", "correction"),
    [
        ("capped", [0.65 / 1.75, 0.75, 0.2, 0.0]),
        ("weight", [0.65 / 1.75, 1.0, 0.4, 0.0]),
        ("count", [0.65 / 3, 0.75, 0.2, 0.0]),
        ("none", [0.65, 0.75, 0.2, 0.0]),
    ],
)
def test_rescoring_adds_gamma_times_the_normalised_downstream_base(
    norm: str, correction: list[float]
) -> None:
    rescored = propagate(BASE, W, gamma=0.5, norm=norm)  # type: ignore[arg-type]
    np.testing.assert_allclose(rescored, BASE + 0.5 * np.array(correction))


def test_gamma_zero_is_the_base_score() -> None:
    np.testing.assert_array_equal(propagate(BASE, W, gamma=0.0), BASE)


def test_many_dependents_do_not_inflate_the_correction() -> None:
    n = 11
    weights = np.zeros((n, n))
    weights[1:, 0] = 1.0  # every later step depends only on step 0
    base = np.r_[0.0, np.ones(n - 1)]
    assert propagate(base, weights, gamma=0.6, norm="none")[0] == pytest.approx(6.0)
    for norm in ("capped", "weight", "count"):
        bounded = propagate(base, weights, gamma=0.6, norm=norm)  # type: ignore[arg-type]
        assert bounded[0] == pytest.approx(0.6)


def test_capped_keeps_a_weak_single_dependency_weak() -> None:
    weights = np.array([[0, 0], [0.1, 0]])  # a row need not sum to one here: only the column matters
    base = np.array([0.0, 1.0])
    assert propagate(base, weights, gamma=1.0, norm="capped")[0] == pytest.approx(0.1)
    assert propagate(base, weights, gamma=1.0, norm="weight")[0] == pytest.approx(1.0)
