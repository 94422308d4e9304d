"""Paired statistics: hand-worked cases, the paper's Table 12 numbers, and cross-checks against scipy/statsmodels."""

from __future__ import annotations

import inspect
import math
import random
from itertools import pairwise
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from rcarun.analysis.stats import (
    Agreement,
    BootstrapInterval,
    Complementarity,
    PairedComparison,
    adjust_family,
    cluster_paired_bootstrap,
    complementarity,
    holm,
    leave_one_source_out,
    mcnemar_exact,
    mean_pairwise_agreement,
    newcombe_difference,
    paired_comparison,
    pairwise_agreement,
    spread,
    stratified_interval,
    stratified_paired_bootstrap,
    union_complementarity,
    wilson_interval,
)

# --- McNemar ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a_only", "b_only", "expected"),
    [
        (0, 5, 2 * 0.5**5),  # 0.0625
        (5, 0, 2 * 0.5**5),
        (1, 4, 2 * (1 + 5) / 2**5),  # 0.375
        (2, 10, 2 * (1 + 12 + 66) / 2**12),
        (3, 3, 1.0),  # doubled tail exceeds 1 and is capped
        (2, 3, 1.0),
        (0, 0, 1.0),  # no discordant pairs
        (0, 1, 1.0),
    ],
)
def test_mcnemar_hand_worked(a_only: int, b_only: int, expected: float) -> None:
    assert mcnemar_exact(a_only, b_only) == pytest.approx(expected, rel=1e-15)


def test_mcnemar_reproduces_paper_table_12_at_the_implied_holm_ranks() -> None:
    # Table 12 reports only Holm-adjusted p-values; each equals the exact McNemar p of its W/L counts times an
    # integer Holm multiplier, to all five printed digits.
    assert round(mcnemar_exact(36, 16) * 1, 5) == 0.00779  # Holm-20, largest of the family
    assert round(mcnemar_exact(40, 17) * 2, 5) == 0.00640  # Holm-20
    assert round(mcnemar_exact(39, 11) * 8, 5) == 0.00072  # Holm-20
    assert round(mcnemar_exact(39, 11) * 24, 5) == 0.00217  # Holm-40
    assert round(mcnemar_exact(40, 17) * 13, 5) == 0.04162  # Holm-40
    assert round(mcnemar_exact(31, 9) * 17, 5) == 0.01155  # Holm-40


_GRID = [0, 1, 2, 3, 7, 10, 25, 60, 200, 1000, 2500]


@pytest.mark.parametrize("b", _GRID)
def test_mcnemar_matches_statsmodels_and_scipy(b: int) -> None:
    for c in _GRID:
        ours = mcnemar_exact(b, c)
        reference = mcnemar([[11, b], [c, 13]], exact=True).pvalue
        assert ours == pytest.approx(reference, rel=1e-9, abs=1e-300), (b, c)
        if b + c > 0:  # scipy refuses n = 0
            assert ours == pytest.approx(scipy_stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9, abs=1e-300)


def test_mcnemar_is_symmetric_and_stable_for_thousands_of_pairs() -> None:
    p = mcnemar_exact(1500, 1800)
    assert p == mcnemar_exact(1800, 1500)
    assert p == pytest.approx(scipy_stats.binomtest(1500, 3300, 0.5).pvalue, rel=1e-9)
    assert 1e-7 < p < 1e-6


def test_mcnemar_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        mcnemar_exact(-1, 3)


# --- Holm ------------------------------------------------------------------------------------------------------


def test_holm_hand_worked() -> None:
    # sorted 0.01, 0.03, 0.04 -> 3*0.01, 2*0.03, max(0.06, 1*0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], rel=1e-12)
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped
    assert holm([0.2]) == [0.2]
    assert holm([]) == []
    assert holm([0.01, 0.01, 0.5]) == pytest.approx([0.03, 0.03, 0.5], rel=1e-12)  # ties


def test_holm_rejects_invalid_p_values() -> None:
    with pytest.raises(ValueError, match=r"p_values\[1\]"):
        holm([0.1, 1.5])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        holm([math.nan])


@pytest.mark.slow
def test_holm_matches_statsmodels_on_random_families() -> None:
    rng = random.Random(7)
    for _ in range(40):  # multipletests costs ~20 ms a call
        m = rng.randint(1, 40)
        p = [rng.random() ** 3 for _ in range(m)]  # skewed towards small p, where the adjustment matters
        if m > 2:
            p[1] = p[0]  # a tie
        ours = holm(p)
        reference = multipletests(p, method="holm")[1]
        assert ours == pytest.approx(list(reference), rel=1e-12, abs=1e-15)
        ranked = sorted(zip(p, ours, strict=True))
        assert all(x[1] <= y[1] for x, y in pairwise(ranked))  # monotone in raw p


# --- Bootstrap -------------------------------------------------------------------------------------------------


def _scipy_rng_kwargs(seed: int) -> dict[str, Any]:
    # scipy >= 1.15 takes `rng`; older versions only `random_state`.
    if "rng" in inspect.signature(scipy_stats.bootstrap).parameters:
        return {"rng": np.random.default_rng(seed)}
    return {"random_state": np.random.default_rng(seed)}


def test_single_stratum_pooled_bootstrap_agrees_with_scipy_paired_percentile() -> None:
    # 200 trajectories: 20 A-only, 10 B-only, 90 both, 80 neither, shuffled. Pairing matters here: an unpaired
    # interval would be about twice as wide (~0.19 vs ~0.10), far outside the tolerance.
    rng = np.random.default_rng(3)
    pairs = [(1.0, 0.0)] * 20 + [(0.0, 1.0)] * 10 + [(1.0, 1.0)] * 90 + [(0.0, 0.0)] * 80
    order = rng.permutation(len(pairs))
    a = np.array([pairs[i][0] for i in order])
    b = np.array([pairs[i][1] for i in order])

    ours = stratified_paired_bootstrap(a.tolist(), b.tolist(), ["only"] * 200, resamples=20_000, seed=11)
    reference = scipy_stats.bootstrap(
        (a, b),
        lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        paired=True,
        vectorized=True,
        method="percentile",
        n_resamples=20_000,
        **_scipy_rng_kwargs(12),
    ).confidence_interval

    assert ours.delta == pytest.approx(0.05, abs=1e-15)
    assert ours.low == pytest.approx(reference.low, abs=0.01)
    assert ours.high == pytest.approx(reference.high, abs=0.01)
    assert 0.08 < ours.high - ours.low < 0.12


def test_two_valued_stratum_has_a_percentile_interval_worked_by_hand() -> None:
    # One stratum of two trajectories with differences 0 and 1: a replicate's mean is 0, 1/2 or 1 with
    # probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles are exactly 0 and 1.
    interval = stratified_paired_bootstrap([1.0, 1.0], [1.0, 0.0], ["s", "s"], resamples=2_000, seed=1)
    assert (interval.delta, interval.low, interval.high) == (0.5, 0.0, 1.0)


def test_identical_methods_give_a_zero_width_interval_because_pairs_stay_together() -> None:
    values = [float(i % 3 == 0) for i in range(60)] + [0.25 * (i % 5) for i in range(40)]
    strata = [f"src{i % 4}" for i in range(100)]
    for aggregate in ("pooled", "macro"):
        interval = stratified_paired_bootstrap(values, values, strata, aggregate=aggregate, resamples=500)
        assert (interval.delta, interval.low, interval.high) == (0.0, 0.0, 0.0)


def _one_stratum_differs() -> tuple[list[float], list[float], list[str]]:
    """Four interleaved strata of sizes 7, 9, 11, 13; A beats B on every trajectory of "x" and ties elsewhere."""
    sizes = {"x": 7, "y": 9, "z": 11, "w": 13}
    queue = [label for label, size in sizes.items() for _ in range(size)]
    strata = [queue[i] for i in np.random.default_rng(5).permutation(len(queue))]  # interleaved, not grouped
    same = np.random.default_rng(6).integers(0, 2, size=len(strata)).astype(float)
    a = [1.0 if s == "x" else float(v) for s, v in zip(strata, same, strict=True)]
    b = [0.0 if s == "x" else float(v) for s, v in zip(strata, same, strict=True)]
    return a, b, strata


def test_macro_bootstrap_preserves_stratum_sizes() -> None:
    # Difference 1 on every "x" trajectory, 0 elsewhere: with each stratum resampled within itself, every
    # replicate's macro difference is exactly 1/4. Resampling across strata would move it (and could empty "x").
    a, b, strata = _one_stratum_differs()
    interval = stratified_paired_bootstrap(a, b, strata, aggregate="macro", resamples=3_000, seed=2)
    assert interval.delta == pytest.approx(0.25, abs=1e-12)
    assert interval.low == pytest.approx(0.25, abs=1e-12)
    assert interval.high == pytest.approx(0.25, abs=1e-12)


def test_pooled_bootstrap_preserves_stratum_sizes() -> None:
    a, b, strata = _one_stratum_differs()
    interval = stratified_paired_bootstrap(a, b, strata, aggregate="pooled", resamples=3_000, seed=2)
    for value in (interval.delta, interval.low, interval.high):
        assert value == pytest.approx(7 / 40, abs=1e-12)


def test_pooled_and_macro_observed_differences_weigh_trajectories_and_sources() -> None:
    # Source p: 2 trajectories, A wins both; source q: 4 ties. Pooled 2/6, macro (1 + 0) / 2.
    a = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    b = [0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    strata = ["p", "p", "q", "q", "q", "q"]
    pooled = stratified_paired_bootstrap(a, b, strata, aggregate="pooled", resamples=10)
    macro = stratified_paired_bootstrap(a, b, strata, aggregate="macro", resamples=10)
    assert pooled.delta == pytest.approx(1 / 3, abs=1e-15)
    assert macro.delta == pytest.approx(0.5, abs=1e-15)
    assert (pooled.low, pooled.high) == pytest.approx((1 / 3, 1 / 3), abs=1e-15)
    assert (macro.low, macro.high) == pytest.approx((0.5, 0.5), abs=1e-15)


def test_bootstrap_is_deterministic_per_seed() -> None:
    rng = np.random.default_rng(9)
    a = rng.normal(size=150).tolist()
    b = rng.normal(size=150).tolist()
    strata = [f"s{i % 3}" for i in range(150)]
    first = stratified_paired_bootstrap(a, b, strata, resamples=1_000, seed=42)
    again = stratified_paired_bootstrap(a, b, strata, resamples=1_000, seed=42)
    other = stratified_paired_bootstrap(a, b, strata, resamples=1_000, seed=43)
    assert first == again
    assert first == BootstrapInterval(
        delta=first.delta,
        low=first.low,
        high=first.high,
        resamples=1_000,
        seed=42,
        confidence=0.95,
        aggregate="pooled",
    )
    assert other.delta == first.delta
    assert (other.low, other.high) != (first.low, first.high)


def test_bootstrap_interval_narrows_with_confidence() -> None:
    rng = np.random.default_rng(10)
    a = rng.normal(size=80).tolist()
    b = rng.normal(size=80).tolist()
    strata = ["s"] * 80
    wide = stratified_paired_bootstrap(a, b, strata, confidence=0.95, resamples=2_000)
    narrow = stratified_paired_bootstrap(a, b, strata, confidence=0.5, resamples=2_000)
    assert wide.low < narrow.low < wide.delta < narrow.high < wide.high


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([1.0, 0.0], [1.0], ["s", "s"]), {}, "equal lengths, got 2, 1 and 2"),
        (([], [], []), {}, "empty"),
        (([1.0], [0.0], ["s"]), {"confidence": 1.0}, "confidence must be strictly between 0 and 1"),
        (([1.0], [0.0], ["s"]), {"confidence": 0.0}, "confidence must be strictly between 0 and 1"),
        (([1.0], [0.0], ["s"]), {"resamples": 0}, "resamples must be >= 1, got 0"),
        (([1.0], [0.0], ["s"]), {"aggregate": "median"}, "aggregate must be 'pooled' or 'macro'"),
        (([1.0, math.nan], [0.0, 0.0], ["s", "s"]), {}, r"a must be finite; a\[1\]"),
    ],
)
def test_bootstrap_rejects_bad_input_and_says_why(
    args: tuple[list[float], list[float], list[str]], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        stratified_paired_bootstrap(*args, **kwargs)


# --- Paired comparison -----------------------------------------------------------------------------------------


def _table_12_like() -> tuple[list[bool], list[bool], list[str]]:
    """200 trajectories, 40 per source, 39 A-only and 11 B-only spread evenly (like DS-V4-Flash in Table 12)."""
    wins, losses = [8, 8, 8, 8, 7], [3, 2, 2, 2, 2]
    a: list[bool] = []
    b: list[bool] = []
    strata: list[str] = []
    for source in range(5):
        for i in range(40):
            if i < wins[source]:
                a_right, b_right = True, False
            elif i < wins[source] + losses[source]:
                a_right, b_right = False, True
            else:
                a_right = b_right = i < 30
            a.append(a_right)
            b.append(b_right)
            strata.append(f"source{source}")
    return a, b, strata


def test_paired_comparison_counts_scores_and_tests() -> None:
    a, b, strata = _table_12_like()
    result = paired_comparison(a, b, strata, resamples=20_000)
    assert (result.n, result.wins, result.losses) == (200, 39, 11)
    assert result.score_a == pytest.approx(139 / 200, abs=1e-15)
    assert result.score_b == pytest.approx(111 / 200, abs=1e-15)
    assert result.delta == pytest.approx(0.14, abs=1e-12)
    assert result.delta == result.score_a - result.score_b
    assert result.p_mcnemar == mcnemar_exact(39, 11)
    assert result.p_holm is None
    # The paper prints [7.5, 20.5] for these W/L counts; its split over sources is not published, so allow one
    # grid step (1/200) either way.
    assert result.ci_low == pytest.approx(0.075, abs=0.005)
    assert result.ci_high == pytest.approx(0.205, abs=0.005)


def test_paired_comparison_macro_weighs_sources_equally() -> None:
    # Source u (1 trajectory): A right, B wrong. Source v (3): both wrong. Pooled 1/4, macro 1/2.
    a, b, strata = [True, False, False, False], [False, False, False, False], ["u", "v", "v", "v"]
    pooled = paired_comparison(a, b, strata, resamples=100)
    macro = paired_comparison(a, b, strata, aggregate="macro", resamples=100)
    assert (pooled.score_a, pooled.delta) == (0.25, 0.25)
    assert (macro.score_a, macro.score_b, macro.delta) == (0.5, 0.0, 0.5)
    assert macro.p_mcnemar == pooled.p_mcnemar == 1.0  # the test counts trajectories either way


def test_adjust_family_fills_holm_in_order_and_leaves_inputs_alone() -> None:
    def comparison(p: float) -> PairedComparison:
        return PairedComparison(
            n=200,
            score_a=0.3,
            score_b=0.2,
            delta=0.1,
            ci_low=0.0,
            ci_high=0.2,
            wins=30,
            losses=10,
            p_mcnemar=p,
        )

    family = [comparison(0.01), comparison(0.04), comparison(0.03)]
    adjusted = adjust_family(family)
    assert [c.p_holm for c in adjusted] == pytest.approx([0.03, 0.06, 0.06], rel=1e-12)
    assert [c.p_mcnemar for c in adjusted] == [0.01, 0.04, 0.03]
    assert all(c.p_holm is None for c in family)
    readjusted = adjust_family(adjusted[:1])  # a family of one: its own p
    assert readjusted[0].p_holm == 0.01


# --- Complementarity -------------------------------------------------------------------------------------------


def test_complementarity_counts() -> None:
    a = [True, True, False, False, True, False]
    b = [True, False, True, False, False, False]
    result = complementarity(a, b)
    assert result == Complementarity(a_only=2, b_only=1, both=1, neither=2)
    assert result.n == 6


def test_union_complementarity_counts_any_other_method() -> None:
    a = [True, True, False, False, False]
    others = [
        [True, False, True, False, False],
        [False, False, False, True, False],
    ]
    # union = [T, F, T, T, F]
    assert union_complementarity(a, others) == Complementarity(a_only=1, b_only=2, both=1, neither=1)


def test_complementarity_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="equal lengths, got 2 and 1"):
        complementarity([True, False], [True])
    with pytest.raises(ValueError, match=r"others\[1\] has length 1"):
        union_complementarity([True, False], [[True, True], [False]])
    with pytest.raises(ValueError, match="others is empty"):
        union_complementarity([True], [])


# --- Repeatability ---------------------------------------------------------------------------------------------


def test_pairwise_agreement_treats_two_nones_as_missing_not_agreement() -> None:
    predictions: dict[int, dict[str, object]] = {
        2: {"q1": 5, "q2": 7, "q3": None, "q4": None, "q5": 3},
        1: {"q1": 5, "q2": 8, "q3": None, "q4": 4, "q6": 9},
        3: {"q1": 5, "q2": 7, "q3": 1, "q4": None, "q5": 3},
    }
    result = pairwise_agreement(predictions)
    assert result == [
        # shared q1..q4: q1 agrees, q3 both None
        Agreement(first=1, second=2, n=4, agree=1, both_missing=1),
        Agreement(first=1, second=3, n=4, agree=1, both_missing=0),
        # shared q1..q5: q1, q2, q5 agree; q4 both None; q3 None vs 1
        Agreement(first=2, second=3, n=5, agree=3, both_missing=1),
    ]
    assert [x.rate for x in result] == [0.25, 0.25, 0.6]
    assert mean_pairwise_agreement(predictions) == pytest.approx((0.25 + 0.25 + 0.6) / 3, rel=1e-15)


def test_pairwise_agreement_needs_shared_trajectories_and_two_realizations() -> None:
    assert pairwise_agreement({1: {"q1": 1}}) == []
    with pytest.raises(ValueError, match="at least two realizations, got 1"):
        mean_pairwise_agreement({1: {"q1": 1}})
    with pytest.raises(ValueError, match="realizations 1 and 2 share no trajectory"):
        pairwise_agreement({1: {"q1": 1}, 2: {"q2": 1}})


def test_spread_of_paper_repeatability_scores() -> None:
    # Full RCTA Step Acc over three realizations (paper Appendix B): 26.7 / 30.0 / 43.3 %.
    result = spread({1: 8 / 30, 2: 9 / 30, 3: 13 / 30})
    assert result.n == 3
    assert result.mean == pytest.approx(1 / 3, rel=1e-12)
    assert (result.min, result.max) == (8 / 30, 13 / 30)
    assert result.range == pytest.approx(5 / 30, rel=1e-12)
    # deviations -2/30, -1/30, 3/30: sum of squares 14/900, over n - 1 = 2
    assert result.sd == pytest.approx(math.sqrt(7 / 900), rel=1e-12)


def test_spread_of_one_realization_and_bad_input() -> None:
    single = spread({4: 0.5})
    assert (single.n, single.mean, single.min, single.max, single.sd, single.range) == (
        1,
        0.5,
        0.5,
        0.5,
        0.0,
        0.0,
    )
    with pytest.raises(ValueError, match="at least one realization"):
        spread({})
    with pytest.raises(ValueError, match="realization 2 has nan"):
        spread({1: 0.5, 2: math.nan})


# --- Task-cluster bootstrap and leave-one-source-out ------------------------------------------------------------


def _outcomes(n: int, seed: int) -> tuple[list[float], list[float], list[str]]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2, n).astype(float).tolist()
    b = rng.integers(0, 2, n).astype(float).tolist()
    return a, b, [f"s{i % 3}" for i in range(n)]


@pytest.mark.parametrize("aggregate", ["pooled", "macro"])
def test_clusters_of_one_draw_exactly_the_stratified_bootstrap(aggregate: Any) -> None:
    a, b, strata = _outcomes(61, 5)
    single = cluster_paired_bootstrap(a, b, strata, list(range(61)), aggregate=aggregate, resamples=3000)
    assert single == stratified_paired_bootstrap(a, b, strata, aggregate=aggregate, resamples=3000)


@pytest.mark.parametrize("aggregate", ["pooled", "macro"])
def test_repeated_attempts_kept_together_do_not_narrow_the_interval(aggregate: Any) -> None:
    # Every trajectory attempted twice with the same outcomes: drawn as one task, the copies add nothing and the
    # interval is the one of the originals; drawn apart, they pretend to twice the evidence.
    a, b, strata = _outcomes(60, 6)
    twice = (
        [x for x in a for _ in (0, 1)],
        [x for x in b for _ in (0, 1)],
        [s for s in strata for _ in (0, 1)],
    )
    tasks = [f"task{i}" for i in range(60) for _ in (0, 1)]
    kept = cluster_paired_bootstrap(*twice, tasks, aggregate=aggregate, resamples=4000, seed=3)
    original = stratified_paired_bootstrap(a, b, strata, aggregate=aggregate, resamples=4000, seed=3)
    apart = stratified_paired_bootstrap(*twice, aggregate=aggregate, resamples=4000, seed=3)
    assert (kept.delta, kept.low, kept.high) == pytest.approx((original.delta, original.low, original.high))
    assert apart.high - apart.low < 0.8 * (kept.high - kept.low)


def test_one_stratum_cluster_bootstrap_agrees_with_scipy_over_tasks() -> None:
    # 40 tasks of 1 to 4 attempts: the replicate is the ratio (sum of drawn differences) / (attempts drawn),
    # which scipy resamples as paired per-task (sum, size) vectors.
    rng = np.random.default_rng(8)
    sizes = rng.integers(1, 5, 40)
    tasks = np.repeat(np.arange(40), sizes)
    a = (rng.random(tasks.size) < 0.6).astype(float)
    b = (rng.random(tasks.size) < 0.4).astype(float)
    ours = cluster_paired_bootstrap(
        a.tolist(), b.tolist(), ["s"] * tasks.size, tasks.tolist(), resamples=20_000
    )
    task_sums = np.bincount(tasks, weights=a - b)
    reference = scipy_stats.bootstrap(
        (task_sums, sizes.astype(float)),
        lambda s, z, axis: s.sum(axis=axis) / z.sum(axis=axis),
        paired=True,
        vectorized=True,
        method="percentile",
        n_resamples=20_000,
        **_scipy_rng_kwargs(4),
    ).confidence_interval
    assert ours.delta == pytest.approx(float((a - b).mean()))
    assert ours.low == pytest.approx(reference.low, abs=0.015)
    assert ours.high == pytest.approx(reference.high, abs=0.015)


def test_cluster_labels_nest_in_strata_and_must_match_the_trajectories() -> None:
    a, b, strata = [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], ["x", "x", "y", "y"]
    # One label across two strata is two clusters: the same as four distinct labels would be with two per stratum.
    shared = cluster_paired_bootstrap(a, b, strata, ["t", "t", "t", "t"], resamples=500)
    apart = cluster_paired_bootstrap(a, b, strata, ["t1", "t1", "t2", "t2"], resamples=500)
    assert shared == apart
    with pytest.raises(ValueError, match="clusters has length 3"):
        cluster_paired_bootstrap(a, b, strata, ["t", "t", "t"])


def test_leave_one_source_out_rows_are_the_bootstrap_of_the_retained_sources() -> None:
    a, b, strata = _outcomes(45, 9)
    rows = leave_one_source_out(a, b, strata, aggregate="macro", resamples=2000, seed=7)
    assert [(row.source, row.n) for row in rows] == [("s0", 30), ("s1", 30), ("s2", 30)]
    for row in rows:
        kept = [i for i, s in enumerate(strata) if s != row.source]
        means = [
            np.mean([a[i] - b[i] for i in kept if strata[i] == s]) for s in sorted({strata[i] for i in kept})
        ]
        assert row.interval.delta == pytest.approx(float(np.mean(means)))
        assert row.interval == stratified_paired_bootstrap(
            [a[i] for i in kept],
            [b[i] for i in kept],
            [strata[i] for i in kept],
            aggregate="macro",
            resamples=2000,
            seed=7,
        )
    assert leave_one_source_out(a, b, ["one"] * 45) == []


# --- Wilson and Newcombe --------------------------------------------------------------------------------------


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_wilson_matches_statsmodels_on_every_count(confidence: float) -> None:
    for n in (1, 2, 7, 40, 161):
        for x in range(n + 1):
            ours = wilson_interval(x, n, confidence=confidence)
            low, high = proportion_confint(x, n, alpha=1 - confidence, method="wilson")
            assert ours.estimate == x / n
            assert (ours.low, ours.high) == pytest.approx((low, high), abs=1e-12)
            assert 0.0 <= ours.low <= x / n <= ours.high <= 1.0


def test_newcombe_reproduces_the_papers_example_and_statsmodels() -> None:
    # Newcombe (1998), Table II, example (a): 56/70 against 48/80, method 10: 0.0524 to 0.3339.
    found = newcombe_difference(56, 70, 48, 80)
    assert found.estimate == pytest.approx(0.2)
    assert (round(found.low, 4), round(found.high, 4)) == (0.0524, 0.3339)
    rng = random.Random(2)
    for _ in range(300):
        n_a, n_b = rng.randint(1, 80), rng.randint(1, 80)
        x_a, x_b = rng.randint(0, n_a), rng.randint(0, n_b)
        ours = newcombe_difference(x_a, n_a, x_b, n_b, confidence=0.9)
        low, high = confint_proportions_2indep(
            x_a, n_a, x_b, n_b, method="newcomb", compare="diff", alpha=0.1
        )
        assert (ours.low, ours.high) == pytest.approx((low, high), abs=1e-12)


def test_proportion_intervals_refuse_impossible_counts() -> None:
    with pytest.raises(ValueError, match="successes=3, n=2"):
        wilson_interval(3, 2)
    with pytest.raises(ValueError, match="n=0"):
        newcombe_difference(0, 0, 1, 2)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)


def test_stratified_interval_has_agresti_coulls_width_on_one_source_and_weights_sources() -> None:
    confidence = 2 * NormalDist().cdf(2) - 1  # z = 2: Agresti–Coull adds exactly two successes and failures
    for n in (20, 40, 161):
        for x in range(n // 4, 3 * n // 4):
            ours = stratified_interval(x / n, [(n, x / n)], weighting="pooled", confidence=confidence)
            low, high = proportion_confint(x, n, alpha=1 - confidence, method="agresti_coull")
            assert ours.high - ours.low == pytest.approx(high - low, abs=1e-12)
            assert ours.estimate == x / n and ours.low < x / n < ours.high
    # Two sources: pooled weighs them 30/40 and 10/40, macro 1/2 each; each variance is a(1 - a)/(n + 4).
    strata = [(30.0, 0.5), (10.0, 0.0)]
    var = {
        "pooled": (0.75**2) * (17 / 34) * (17 / 34) / 34 + (0.25**2) * (2 / 14) * (12 / 14) / 14,
        "macro": 0.25 * (17 / 34) * (17 / 34) / 34 + 0.25 * (2 / 14) * (12 / 14) / 14,
    }
    for weighting in ("pooled", "macro"):
        found = stratified_interval(0.3, strata, weighting=weighting, confidence=0.9)
        half = NormalDist().inv_cdf(0.95) * math.sqrt(var[weighting])
        assert (found.low, found.high) == pytest.approx((max(0.0, 0.3 - half), 0.3 + half))
    assert stratified_interval(0.0, [(5.0, 0.0)], weighting="macro").low == 0.0
    with pytest.raises(ValueError, match="stratum"):
        stratified_interval(0.5, [], weighting="pooled")
