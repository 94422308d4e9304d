"""Paired statistics for comparing attribution methods, with the conventions of the LongRCA paper.

A difference of a few points in Step Acc between two methods on 200 trajectories is noise unless it comes with
an interval and a test, and the paper (Appendix B, "Paired Step Acc comparisons", and Appendix H, "Ablation
statistical protocol") reports them in one fixed way. This module reproduces that way, so that rcarun's numbers
can be set beside the paper's:

* Outcomes are per trajectory and paired: both methods are scored on the same trajectories, and an abstained,
  missing or unparseable prediction is an error (``False``/``0``) that stays in the fixed denominator. The
  caller builds the vectors; nothing here drops items.
* Intervals are pointwise percentile intervals from a *source-stratified paired bootstrap*: each resample draws
  trajectories with replacement within each source (stratum sizes preserved) and keeps a trajectory's two
  outcomes together. The statistic is the aggregate of A minus the aggregate of B, either *pooled* (every
  trajectory weighs the same) or *macro* (each source's mean, then the unweighted mean over sources:
  "Macro-5"). The endpoints are ``numpy.quantile`` (default ``method="linear"``, Hyndman-Fan type 7) of the
  replicate differences at ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``. The paper uses 20,000
  resamples for the backbone comparisons and 10,000 with seed 20260820 for the ablations; the defaults here are
  the latter (the report chooses per protocol: `rcarun.analysis.protocol`).
* Tests are two-sided *exact* McNemar tests: a binomial test of the discordant pairs against p = 1/2,
  ``p = min(1, 2 * P(X <= min(b, c)))`` with ``X ~ Bin(b + c, 1/2)``, computed in exact integer arithmetic.
  The test always counts trajectories, whatever the aggregate of the interval.
* Families of comparisons are adjusted with Holm's step-down procedure ("Holm-20", "Holm-40"); which
  comparisons form a family is the caller's choice, passed to `adjust_family`.

Three more analyses of the paper sit beside these:

* The *task-cluster* bootstrap (App. B: "a source-stratified task-cluster bootstrap that keeps repeated attempts
  together"): as above, but what is drawn within each source is a task with all its trajectories (its repeated
  attempts), and the replicate is the aggregate over the trajectories drawn; `cluster_paired_bootstrap`.
* Leave-one-source-out (Table 13): the stratified bootstrap again on the trajectories of all sources but one,
  for each source in turn; the intervals are pointwise; `leave_one_source_out`.
* Intervals for proportions (App. F.1): Wilson score intervals for a group's accuracy and Newcombe's hybrid score
  interval (1998, method 10) for the difference of two independent groups' accuracies; `wilson_interval`,
  `newcombe_difference`. The normal quantile is ``statistics.NormalDist().inv_cdf((1 + confidence) / 2)``.

Also here: complementarity counts (which trajectories only one method solves, and method A against the union of
several baselines, the paper's Figure 8) and repeatability across realizations of the same backbone and method
(pairwise agreement of predictions and the spread of scores).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Literal

import numpy as np
import numpy.typing as npt

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

Aggregate = Literal["pooled", "macro"]

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 20260820  # the paper's ablation seed (Appendix H, "Ablation statistical protocol")

# Resample indices are drawn in blocks of about this many elements (8 bytes each), so that 20,000 resamples of
# 1,140 trajectories need ~10 MB at a time instead of ~180 MB. The block size depends only on the number of
# trajectories, so the result for a given seed does not depend on the machine.
_BLOCK_ELEMENTS = 1 << 20


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


# --- Source-stratified paired bootstrap ------------------------------------------------------------------------


@dataclass(frozen=True)
class BootstrapInterval:
    """Observed difference of aggregates and its pointwise percentile bootstrap interval.

    Attributes:
        delta: Observed aggregate(a) - aggregate(b).
        low: Lower percentile endpoint of the replicate differences.
        high: Upper percentile endpoint.
        resamples: Number of bootstrap resamples.
        seed: Seed of ``numpy.random.default_rng`` that drew them.
        confidence: Nominal pointwise coverage, e.g. 0.95.
        aggregate: ``"pooled"`` or ``"macro"``.
    """

    delta: float
    low: float
    high: float
    resamples: int
    seed: int
    confidence: float
    aggregate: Aggregate


def stratified_paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    strata: Sequence[str],
    *,
    aggregate: Aggregate = "pooled",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> BootstrapInterval:
    """Source-stratified paired percentile bootstrap of aggregate(a) - aggregate(b).

    Each resample draws, independently within every stratum, as many trajectories as the stratum has, with
    replacement; a drawn trajectory contributes its a and b values together. The replicate statistic is the
    pooled mean of the differences (every trajectory weighs 1/N) or their macro mean (each stratum's mean
    difference, then the unweighted mean over strata). Endpoints are
    ``numpy.quantile(replicates, [(1 - confidence) / 2, (1 + confidence) / 2])`` with numpy's default
    ``method="linear"`` (Hyndman-Fan type 7) interpolation; no bias correction.

    The draw is ``numpy.random.default_rng(seed)``, so equal inputs (in equal order) and seed give equal
    intervals. Strata are visited in sorted label order and trajectories within a stratum in input order.

    Args:
        a: Per-trajectory outcome of method A (e.g. 1.0/0.0 for correct/incorrect).
        b: Outcome of method B on the same trajectories, position by position.
        strata: Source label of each trajectory.
        aggregate: ``"pooled"`` or ``"macro"`` (unweighted mean of per-source means).
        resamples: Number of bootstrap resamples, >= 1.
        seed: Seed for ``numpy.random.default_rng``.
        confidence: Pointwise coverage in (0, 1).

    Returns:
        The observed difference, the interval, and the settings that produced them.

    Raises:
        ValueError: On empty or unequal-length inputs, non-finite outcomes, an unknown aggregate,
            ``resamples < 1`` or confidence outside (0, 1).
    """
    # Every trajectory a cluster of its own: the cluster bootstrap draws exactly these resamples.
    return cluster_paired_bootstrap(
        a,
        b,
        strata,
        range(len(a)),
        aggregate=aggregate,
        resamples=resamples,
        seed=seed,
        confidence=confidence,
    )


def _interval(
    delta: float, replicates: npt.NDArray[np.float64], seed: int, confidence: float, aggregate: Aggregate
) -> BootstrapInterval:
    """The percentile interval of the replicates (linear quantiles, no bias correction)."""
    alpha = 1.0 - confidence
    low, high = np.quantile(replicates, [alpha / 2, 1.0 - alpha / 2])
    return BootstrapInterval(
        delta=delta,
        low=float(low),
        high=float(high),
        resamples=replicates.size,
        seed=seed,
        confidence=confidence,
        aggregate=aggregate,
    )


def _check_settings(aggregate: str, resamples: int, confidence: float) -> None:
    if aggregate not in ("pooled", "macro"):
        raise ValueError(f"aggregate must be 'pooled' or 'macro', got {aggregate!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")


def cluster_paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    strata: Sequence[str],
    clusters: Sequence[Hashable],
    *,
    aggregate: Aggregate = "pooled",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> BootstrapInterval:
    """Source-stratified paired bootstrap that draws whole clusters (tasks) of trajectories.

    Within every stratum, each resample draws as many clusters as the stratum has, with replacement; a drawn
    cluster contributes all its trajectories, each with its a and b values. The replicate is the mean difference
    over the trajectories drawn (pooled), or each stratum's mean difference over its drawn trajectories, then
    the unweighted mean over strata (macro). The observed difference and the endpoints are as in
    `stratified_paired_bootstrap`; with every trajectory a cluster of its own the two functions draw the same
    resamples and return the same interval.

    Clusters nest in strata: equal labels in two strata are two clusters. Clusters are numbered in order of
    first appearance within each stratum, strata in sorted label order.

    Args:
        a: Per-trajectory outcome of method A.
        b: Outcome of method B on the same trajectories.
        strata: Source label of each trajectory.
        clusters: Cluster label of each trajectory (its task); give a trajectory without one a label of its own.
        aggregate: ``"pooled"`` or ``"macro"``.
        resamples: Number of bootstrap resamples, >= 1.
        seed: Seed for ``numpy.random.default_rng``.
        confidence: Pointwise coverage in (0, 1).

    Raises:
        ValueError: As `stratified_paired_bootstrap`, or ``clusters`` of another length.
    """
    a_arr, b_arr = _validated_pair(a, b, strata)
    if len(clusters) != len(a_arr):
        raise ValueError(f"clusters has length {len(clusters)}, a has {len(a_arr)}")
    _check_settings(aggregate, resamples, confidence)

    order, starts, counts = _grouping(strata)
    delta = _aggregate(a_arr[order], starts, counts, aggregate) - _aggregate(
        b_arr[order], starts, counts, aggregate
    )
    diff = a_arr - b_arr
    index: dict[tuple[int, Hashable], int] = {}
    sums: list[float] = []
    sizes: list[int] = []
    cluster_starts: list[int] = []
    for stratum, (start, count) in enumerate(zip(starts, counts, strict=True)):
        cluster_starts.append(len(sums))
        for position in order[start : start + count]:
            key = (stratum, clusters[position])
            if key not in index:
                index[key] = len(sums)
                sums.append(0.0)
                sizes.append(0)
            sums[index[key]] += float(diff[position])
            sizes[index[key]] += 1
    cluster_sum = np.asarray(sums, dtype=np.float64)
    cluster_size = np.asarray(sizes, dtype=np.float64)
    first = np.asarray(cluster_starts, dtype=np.intp)
    per_stratum = np.diff(np.append(first, len(sums)))

    rng = np.random.default_rng(seed)
    k = cluster_sum.size
    offset = np.repeat(first, per_stratum)  # column j draws a cluster of its own stratum
    size = np.repeat(per_stratum, per_stratum)
    rows = max(1, _BLOCK_ELEMENTS // k)
    replicates = np.empty(resamples, dtype=np.float64)
    for block in range(0, resamples, rows):
        m = min(rows, resamples - block)
        picks = offset + rng.integers(0, size, size=(m, k))
        drawn_sums = np.add.reduceat(cluster_sum[picks], first, axis=1)  # (m, strata)
        drawn_sizes = np.add.reduceat(cluster_size[picks], first, axis=1)
        if aggregate == "pooled":
            replicates[block : block + m] = drawn_sums.sum(axis=1) / drawn_sizes.sum(axis=1)
        else:
            replicates[block : block + m] = (drawn_sums / drawn_sizes).mean(axis=1)
    return _interval(float(delta), replicates, seed, confidence, aggregate)


@dataclass(frozen=True)
class LeftOut:
    """One row of a leave-one-source-out analysis.

    Attributes:
        source: The source left out.
        n: Trajectories retained.
        interval: The difference on the retained trajectories and its pointwise interval.
    """

    source: str
    n: int
    interval: BootstrapInterval


def leave_one_source_out(
    a: Sequence[float],
    b: Sequence[float],
    strata: Sequence[str],
    *,
    aggregate: Aggregate = "pooled",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> list[LeftOut]:
    """`stratified_paired_bootstrap` on the trajectories of every source but one, for each source in turn.

    Every row is drawn with the same ``seed``: each is a pointwise analysis of its own (the paper's Table 13).

    Returns:
        One row per source, in sorted source order; empty with fewer than two sources.

    Raises:
        ValueError: As `stratified_paired_bootstrap`.
    """
    a_arr, b_arr = _validated_pair(a, b, strata)
    labels = np.asarray(strata, dtype=str)
    sources = sorted(set(labels.tolist()))
    if len(sources) < 2:
        return []
    rows = []
    for source in sources:
        kept = labels != source
        interval = stratified_paired_bootstrap(
            a_arr[kept].tolist(),
            b_arr[kept].tolist(),
            labels[kept].tolist(),
            aggregate=aggregate,
            resamples=resamples,
            seed=seed,
            confidence=confidence,
        )
        rows.append(LeftOut(source=source, n=int(kept.sum()), interval=interval))
    return rows


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


def _validated_pair(
    a: Sequence[float], b: Sequence[float], strata: Sequence[str]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    if not (len(a) == len(b) == len(strata)):
        raise ValueError(f"a, b and strata must have equal lengths, got {len(a)}, {len(b)} and {len(strata)}")
    if len(a) == 0:
        raise ValueError("a, b and strata are empty; there is nothing to compare")
    a_arr = np.asarray(a, dtype=np.float64)
    b_arr = np.asarray(b, dtype=np.float64)
    for name, arr in (("a", a_arr), ("b", b_arr)):
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ValueError(f"{name} must be finite; {name}[{int(bad[0])}] = {arr[bad[0]]!r}")
    return a_arr, b_arr


def _grouping(
    strata: Sequence[str],
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Permutation that groups trajectories by stratum (sorted labels, input order within), group starts, sizes."""
    _, inverse, counts = np.unique(np.asarray(strata, dtype=str), return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.intp)
    return order, starts, counts.astype(np.intp)


def _aggregate(
    values: npt.NDArray[np.float64],
    starts: npt.NDArray[np.intp],
    counts: npt.NDArray[np.intp],
    aggregate: Aggregate,
) -> float:
    """Pooled or macro mean of values already grouped by stratum (``starts``/``counts`` delimit the groups)."""
    if aggregate == "pooled":
        return float(values.sum() / values.size)
    return float((np.add.reduceat(values, starts) / counts).mean())


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


# --- Complementarity -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Complementarity:
    """The 2x2 table of two methods' correctness over the same trajectories.

    Attributes:
        a_only: Solved by A only.
        b_only: Solved by B only (for `union_complementarity`: by some other method but not A).
        both: Solved by both.
        neither: Solved by neither.
    """

    a_only: int
    b_only: int
    both: int
    neither: int

    @property
    def n(self) -> int:
        """Number of trajectories."""
        return self.a_only + self.b_only + self.both + self.neither


def complementarity(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> Complementarity:
    """Count the trajectories solved by A only, B only, both and neither.

    Raises:
        ValueError: If the two sequences differ in length.
    """
    if len(a_correct) != len(b_correct):
        raise ValueError(
            f"a_correct and b_correct must have equal lengths, got {len(a_correct)} and {len(b_correct)}"
        )
    a_only = b_only = both = neither = 0
    for x, y in zip(a_correct, b_correct, strict=True):
        if x and y:
            both += 1
        elif x:
            a_only += 1
        elif y:
            b_only += 1
        else:
            neither += 1
    return Complementarity(a_only=a_only, b_only=b_only, both=both, neither=neither)


def union_complementarity(a_correct: Sequence[bool], others: Sequence[Sequence[bool]]) -> Complementarity:
    """Method A against the union of several others (paper Figure 8).

    A trajectory counts as solved by the union if any of ``others`` solved it; the result's ``b_only`` is then
    "solved by some other method, not by A".

    Raises:
        ValueError: If ``others`` is empty or any of them differs in length from ``a_correct``.
    """
    if not others:
        raise ValueError("others is empty; the union of no methods solves nothing and is not a comparison")
    for i, other in enumerate(others):
        if len(other) != len(a_correct):
            raise ValueError(f"others[{i}] has length {len(other)}, a_correct has {len(a_correct)}")
    union = [any(bool(other[j]) for other in others) for j in range(len(a_correct))]
    return complementarity(a_correct, union)


# --- Repeatability across realizations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """How often two realizations of the same backbone and method predict the same value.

    Attributes:
        first: The smaller realization id.
        second: The larger realization id.
        n: Trajectories present in both realizations (the denominator, Nones included).
        agree: Trajectories where both predicted the same value and neither is None.
        both_missing: Trajectories where both have no valid prediction (None); not counted in ``agree``.
    """

    first: int
    second: int
    n: int
    agree: int
    both_missing: int

    @property
    def rate(self) -> float:
        """agree / n."""
        return self.agree / self.n


def pairwise_agreement(predictions: Mapping[int, Mapping[str, object]]) -> list[Agreement]:
    """Agreement between every unordered pair of realizations, over the trajectories both contain.

    None means "no valid prediction". Two Nones are not an agreement (two failures say nothing about whether
    the method is stable); they are counted in ``both_missing`` and stay in the denominator, as does a None
    against a value. Values are compared with ``==``.

    Args:
        predictions: realization id -> (trajectory id -> predicted value or None).

    Returns:
        One `Agreement` per pair (r1 < r2), ordered by (r1, r2); empty with fewer than two realizations.

    Raises:
        ValueError: If two realizations share no trajectory (the rate would be 0/0).
    """
    result: list[Agreement] = []
    for first, second in combinations(sorted(predictions), 2):
        left, right = predictions[first], predictions[second]
        shared = [qid for qid in left if qid in right]
        if not shared:
            raise ValueError(f"realizations {first} and {second} share no trajectory")
        agree = both_missing = 0
        for qid in shared:
            x, y = left[qid], right[qid]
            if x is None and y is None:
                both_missing += 1
            elif x is not None and y is not None and x == y:
                agree += 1
        result.append(
            Agreement(first=first, second=second, n=len(shared), agree=agree, both_missing=both_missing)
        )
    return result


def mean_pairwise_agreement(predictions: Mapping[int, Mapping[str, object]]) -> float:
    """Unweighted mean of the pairwise agreement rates.

    Raises:
        ValueError: With fewer than two realizations, or as `pairwise_agreement`.
    """
    pairs = pairwise_agreement(predictions)
    if not pairs:
        raise ValueError(f"agreement needs at least two realizations, got {len(predictions)}")
    return statistics.fmean(p.rate for p in pairs)


@dataclass(frozen=True)
class Spread:
    """Summary of one score over several realizations.

    Attributes:
        n: Number of realizations.
        mean: Arithmetic mean.
        min: Smallest value.
        max: Largest value.
        sd: Sample standard deviation (ddof=1); 0.0 for a single realization.
    """

    n: int
    mean: float
    min: float
    max: float
    sd: float

    @property
    def range(self) -> float:
        """max - min."""
        return self.max - self.min


def spread(values: Mapping[int, float]) -> Spread:
    """Mean, extremes and sample standard deviation of a score across realizations.

    Args:
        values: realization id -> score.

    Raises:
        ValueError: If ``values`` is empty or holds a non-finite score.
    """
    if not values:
        raise ValueError("spread needs at least one realization, got none")
    xs = [float(v) for v in values.values()]
    for realization, x in values.items():
        if not math.isfinite(x):
            raise ValueError(f"scores must be finite; realization {realization} has {x!r}")
    return Spread(
        n=len(xs),
        mean=statistics.fmean(xs),
        min=min(xs),
        max=max(xs),
        sd=statistics.stdev(xs) if len(xs) > 1 else 0.0,
    )
