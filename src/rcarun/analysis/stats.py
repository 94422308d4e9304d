"""Paired statistics in the LongRCA paper's conventions (App. B, F.1, H; Table 13; Fig. 8).

Exact McNemar, Holm, the source-stratified and task-cluster paired bootstraps, leave-one-source-out, Wilson,
Newcombe and stratified proportion intervals, complementarity and repeatability. Outcomes are per trajectory and
paired; the caller builds the vectors and nothing here drops an item, so an abstained or missing prediction stays
an error in its fixed denominator. Formulas and the paper's settings: docs/analysis.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from .agreement import (
    Agreement,
    Complementarity,
    Spread,
    complementarity,
    mean_pairwise_agreement,
    pairwise_agreement,
    spread,
    union_complementarity,
)
from .bootstrap import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Aggregate,
    BootstrapInterval,
    LeftOut,
    _aggregate,
    _grouping,
    cluster_paired_bootstrap,
    leave_one_source_out,
    stratified_paired_bootstrap,
)

__all__ = [
    "DEFAULT_RESAMPLES",
    "DEFAULT_SEED",
    "Aggregate",
    "Agreement",
    "BootstrapInterval",
    "Complementarity",
    "LeftOut",
    "PairedComparison",
    "ProportionInterval",
    "Spread",
    "adjust_family",
    "cluster_paired_bootstrap",
    "complementarity",
    "holm",
    "leave_one_source_out",
    "mcnemar_exact",
    "mean_pairwise_agreement",
    "newcombe_difference",
    "paired_comparison",
    "pairwise_agreement",
    "spread",
    "stratified_interval",
    "stratified_paired_bootstrap",
    "union_complementarity",
    "wilson_interval",
]


# --- McNemar and Holm ------------------------------------------------------------------------------------------


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs.

    Args:
        a_only: Trajectories that A got right and B got wrong.
        b_only: Trajectories that B got right and A got wrong.

    Returns:
        ``min(1, 2 * P(X <= min(a_only, b_only)))`` with ``X ~ Bin(a_only + b_only, 1/2)``; 1.0 when there are
        no discordant pairs. The tail is summed in exact integers and divided once, so the only rounding is the
        final one (values below ~1e-308 underflow to 0.0).

    Raises:
        ValueError: If a count is negative.
    """
    if a_only < 0 or b_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got a_only={a_only}, b_only={b_only}")
    n = a_only + b_only
    if n == 0:
        return 1.0
    smaller = min(a_only, b_only)
    tail = 0
    term = 1  # C(n, 0), then C(n, k) by the recurrence C(n, k+1) = C(n, k) * (n - k) / (k + 1)
    for k in range(smaller + 1):
        tail += term
        term = term * (n - k) // (k + 1)
    twice_tail = 2 * tail
    total = 1 << n
    if twice_tail >= total:
        return 1.0
    return twice_tail / total  # int / int is correctly rounded in Python, even for huge ints


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the order given.

    With the p-values sorted ascending as p(1) <= ... <= p(m), the adjusted value of p(i) is
    ``min(1, max_{j <= i} (m - j + 1) * p(j))``: monotone in the raw p-values and capped at 1. Reject at level
    alpha exactly those hypotheses whose adjusted value is <= alpha.

    Args:
        p_values: Raw p-values of one family, each in [0, 1].

    Returns:
        The adjusted p-values, position by position; empty for an empty family.

    Raises:
        ValueError: If a p-value is outside [0, 1] or NaN.
    """
    for i, p in enumerate(p_values):
        if not 0.0 <= p <= 1.0:  # also false for NaN
            raise ValueError(f"p-values must be in [0, 1]; p_values[{i}] = {p!r}")
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# --- Intervals for proportions (App. F.1) -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProportionInterval:
    """A proportion (or a difference of two) and its interval.

    Attributes:
        estimate: The observed proportion, or difference of proportions.
        low: Lower endpoint.
        high: Upper endpoint.
    """

    estimate: float
    low: float
    high: float


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    return statistics.NormalDist().inv_cdf((1.0 + confidence) / 2.0)


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> ProportionInterval:
    """Wilson score interval of ``successes / n``.

    ``(x + z²/2 ± z·sqrt(x(n − x)/n + z²/4)) / (n + z²)``; the endpoint is exactly 0 at x = 0 and 1 at x = n,
    where rounding would leave it a hair inside and the interval would miss its own estimate.

    Raises:
        ValueError: ``n < 1``, ``successes`` outside ``[0, n]``, or confidence outside (0, 1).
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got successes={successes}, n={n}")
    z = _z(confidence)
    centre = successes + z * z / 2
    half = z * math.sqrt(successes * (n - successes) / n + z * z / 4)
    scale = n + z * z
    return ProportionInterval(
        estimate=successes / n,
        low=0.0 if successes == 0 else (centre - half) / scale,
        high=1.0 if successes == n else (centre + half) / scale,
    )


def stratified_interval(
    estimate: float,
    strata: Sequence[tuple[float, float]],
    *,
    weighting: Literal["pooled", "macro"],
    confidence: float = 0.95,
) -> ProportionInterval:
    """An interval for a weighted mean of source proportions: a report cell's headline Agent or Step Acc.

    ``strata`` holds each source's ``(n, proportion)``; the weights are ``n / N`` (pooled) or ``1 / K``
    (macro). The variance is the weighted sum of the sources' binomial variances, each with Agresti–Coull's
    two added successes and failures so that a source at 0% or 100% still has width; normal approximation
    around ``estimate``, clipped to [0, 1]. With one source and z = 2 the width is Agresti–Coull's.

    Raises:
        ValueError: no strata, a stratum with ``n <= 0``, or confidence outside (0, 1).
    """
    if not strata or any(n <= 0 for n, _ in strata):
        raise ValueError(f"need at least one stratum, each with n > 0, got {list(strata)!r}")
    z = _z(confidence)
    total = sum(n for n, _ in strata)
    variance = 0.0
    for n, p in strata:
        weight = n / total if weighting == "pooled" else 1 / len(strata)
        adjusted = (p * n + 2) / (n + 4)
        variance += weight**2 * adjusted * (1 - adjusted) / (n + 4)
    half = z * math.sqrt(variance)
    return ProportionInterval(
        estimate=estimate, low=max(0.0, estimate - half), high=min(1.0, estimate + half)
    )


def newcombe_difference(
    successes_a: int, n_a: int, successes_b: int, n_b: int, *, confidence: float = 0.95
) -> ProportionInterval:
    """Newcombe's hybrid score interval (1998, method 10) of ``p_a − p_b`` for independent groups.

    With d = p_a − p_b and the Wilson intervals [l_a, u_a], [l_b, u_b] at the same confidence:
    ``[d − sqrt((p_a − l_a)² + (u_b − p_b)²), d + sqrt((u_a − p_a)² + (p_b − l_b)²)]``.

    Raises:
        ValueError: As `wilson_interval`, for either group.
    """
    a = wilson_interval(successes_a, n_a, confidence=confidence)
    b = wilson_interval(successes_b, n_b, confidence=confidence)
    d = a.estimate - b.estimate
    return ProportionInterval(
        estimate=d,
        low=d - math.hypot(a.estimate - a.low, b.high - b.estimate),
        high=d + math.hypot(a.high - a.estimate, b.estimate - b.low),
    )


# --- Paired comparison of two methods --------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedComparison:
    """Method A against method B on the same trajectories: scores, interval, win/loss and McNemar test.

    Scores are fractions in [0, 1] (multiply by 100 for percentage points). ``p_holm`` is None until the
    comparison is adjusted as a member of a family with `adjust_family`; the family is the caller's to choose
    (the paper's Holm-20 and Holm-40 adjust the same comparisons within two different families).

    Attributes:
        n: Number of paired trajectories (the fixed denominator).
        score_a: Aggregate accuracy of A (pooled or macro, as requested).
        score_b: Aggregate accuracy of B.
        delta: score_a - score_b.
        ci_low: Lower endpoint of the pointwise stratified paired-bootstrap interval of delta.
        ci_high: Upper endpoint.
        wins: Trajectories A got right and B got wrong.
        losses: Trajectories A got wrong and B got right.
        p_mcnemar: Two-sided exact McNemar p-value on wins/losses (always over trajectories).
        p_holm: Holm-adjusted p-value within the family, or None if not adjusted.
    """

    n: int
    score_a: float
    score_b: float
    delta: float
    ci_low: float
    ci_high: float
    wins: int
    losses: int
    p_mcnemar: float
    p_holm: float | None = None


def paired_comparison(
    a_correct: Sequence[bool],
    b_correct: Sequence[bool],
    strata: Sequence[str],
    *,
    aggregate: Aggregate = "pooled",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> PairedComparison:
    """Compare two methods' per-trajectory correctness as the paper's Table 12 does.

    Invalid, abstained or missing predictions must already be ``False`` here: the denominator is every
    trajectory passed in.

    Args:
        a_correct: Whether method A is correct on each trajectory.
        b_correct: Whether method B is correct on the same trajectories, position by position.
        strata: Source label of each trajectory.
        aggregate: ``"pooled"`` or ``"macro"`` for the scores, delta and interval.
        resamples: Bootstrap resamples (the paper: 20,000 for backbones, 10,000 for ablations).
        seed: Bootstrap seed.
        confidence: Pointwise coverage of the interval.

    Returns:
        The comparison, with ``p_holm`` left as None.

    Raises:
        ValueError: As `stratified_paired_bootstrap`.
    """
    a = [1.0 if x else 0.0 for x in a_correct]
    b = [1.0 if x else 0.0 for x in b_correct]
    interval = stratified_paired_bootstrap(
        a, b, strata, aggregate=aggregate, resamples=resamples, seed=seed, confidence=confidence
    )
    counts = complementarity(a_correct, b_correct)
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    order, starts, group_sizes = _grouping(strata)
    return PairedComparison(
        n=counts.n,
        score_a=_aggregate(a_arr[order], starts, group_sizes, aggregate),
        score_b=_aggregate(b_arr[order], starts, group_sizes, aggregate),
        delta=interval.delta,
        ci_low=interval.low,
        ci_high=interval.high,
        wins=counts.a_only,
        losses=counts.b_only,
        p_mcnemar=mcnemar_exact(counts.a_only, counts.b_only),
    )


def adjust_family(comparisons: Sequence[PairedComparison]) -> list[PairedComparison]:
    """Holm-adjust a family of comparisons: copies, in the same order, with ``p_holm`` set.

    The adjustment runs over the ``p_mcnemar`` of exactly the comparisons given; any earlier ``p_holm`` is
    replaced. Call it once per family (e.g. the 20 Step Acc comparisons, then again with all 40 for Holm-40).
    """
    adjusted = holm([c.p_mcnemar for c in comparisons])
    return [replace(c, p_holm=p) for c, p in zip(comparisons, adjusted, strict=True)]
