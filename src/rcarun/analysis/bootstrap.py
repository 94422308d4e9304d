"""Source-stratified paired bootstraps (App. B, H): per trajectory, per task cluster, and leaving one source out.

Each resample draws within each source (stratum sizes kept) and keeps a trajectory's two outcomes together;
the interval is percentile, pointwise. Settings and formulas: docs/analysis.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Aggregate = Literal["pooled", "macro"]

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 20260820  # the paper's ablation seed (Appendix H, "Ablation statistical protocol")
# Resample indices are drawn in blocks of about this many elements (8 bytes each), so that 20,000 resamples of
# 1,140 trajectories need ~10 MB at a time instead of ~180 MB. The block size depends only on the number of
# trajectories, so the result for a given seed does not depend on the machine.
_BLOCK_ELEMENTS = 1 << 20


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

    Args as `stratified_paired_bootstrap`, and ``clusters``: each trajectory's cluster label (its task); give a
    trajectory without one a label of its own.

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
