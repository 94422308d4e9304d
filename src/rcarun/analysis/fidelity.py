"""LongRCA-Mini against Full (App. A): how far a method's Mini scores sit from its Full scores.

`mini_fidelity` sets a Mini run's Macro, per-source and original-mixture scores beside a Full run's (Tables 6, 9
and 10; deviations as fractions, not pp); `sample_size_calibration` measures, per candidate size, the error of
equal-quota samples of a Full run (Table 5). Both take `ItemScore` lists (realization 0), so they follow the
report's scoring rule. The protocol in detail: docs/analysis.md ("Mini against Full").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rcarun.data import allocate_quotas
from rcarun.errors import ConfigError

from .scoring import METRIC_BY_NAME, METRICS, Expected, ItemScore, Metrics, Summary, summarize

__all__ = [
    "CALIBRATION_METRICS",
    "CALIBRATION_SIZES",
    "MEDIAN_CRITERION",
    "P95_CRITERION",
    "mini_fidelity",
    "sample_size_calibration",
]

CALIBRATION_METRICS = tuple(m.name for m in METRICS if m.calibrated)
# App. A's candidate sizes (Table 5).
CALIBRATION_SIZES = (75, 100, 125, 150, 175, 200, 225, 250, 300, 400, 600)
# App. A's pass criteria, as fractions: max. median <= 2 pp and max. p95 <= 6 pp.
MEDIAN_CRITERION = 0.02
P95_CRITERION = 0.06
_CHUNK = 1_000  # draws built at a time (memory: chunk × largest source)

Key = tuple[str, str]  # (backbone, method)


def _sources(expected: Sequence[Expected]) -> Counter[str]:
    return Counter(item.source for item in expected)


def _deviation(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else abs(a - b)


def _value(metrics: Metrics | None, metric: str) -> float | None:
    return None if metrics is None else float(getattr(metrics, metric))


def mini_fidelity(
    mini_expected: Sequence[Expected],
    mini: Mapping[Key, Sequence[ItemScore]],
    full_expected: Sequence[Expected],
    full: Mapping[Key, Sequence[ItemScore]],
) -> dict[str, Any]:
    """Mini and Full scores side by side (docs/analysis.md).

    Args:
        mini_expected: the Mini run's expected trajectories.
        mini: its item scores per (backbone, method), every list over ``mini_expected``.
        full_expected: the Full run's expected trajectories.
        full: its item scores per (backbone, method), every list over ``full_expected``.

    Returns:
        ``{"sources", "cached", "rows", "summary"}``; rows are sorted by backbone, method and metric order.

    Raises:
        ConfigError: the two runs do not cover the same sources (a Macro over different sources compares
            nothing).
    """
    mini_sources, full_sources = _sources(mini_expected), _sources(full_expected)
    if set(mini_sources) != set(full_sources):
        raise ConfigError(
            f"--calibrate-against: the Mini run's sources ({', '.join(sorted(mini_sources)) or 'none'}) differ "
            f"from the Full run's ({', '.join(sorted(full_sources)) or 'none'})"
        )
    mini_qids = {item.qid for item in mini_expected}
    cached = mini_qids <= {item.qid for item in full_expected}
    populations = dict(full_sources)
    rows: list[dict[str, Any]] = []
    for key in sorted(set(mini) & set(full)):
        full_summary = summarize(full[key], populations=populations)
        mini_summary = summarize(mini[key], populations=populations)
        subset = [item for item in full[key] if item.qid in mini_qids] if cached else []
        cached_summary = summarize(subset, populations=populations) if subset else None
        rows += [
            _fidelity_row(key, metric, full_summary, mini_summary, cached_summary, sorted(full_sources))
            for metric in CALIBRATION_METRICS
        ]
    return {
        "sources": {
            source: {"full": full_sources[source], "mini": mini_sources[source]}
            for source in sorted(full_sources)
        },
        "cached": cached,
        "rows": rows,
        "summary": _summary(rows),
    }


def _fidelity_row(
    key: Key,
    metric: str,
    full_summary: Summary,
    mini_summary: Summary,
    cached_summary: Summary | None,
    sources: Sequence[str],
) -> dict[str, Any]:
    """One backbone × method × metric: Macro, per source and original mixture, Full against Mini."""
    full_value = _value(full_summary.macro, metric)
    mini_value = _value(mini_summary.macro, metric)
    cached_value = _value(cached_summary.macro if cached_summary else None, metric)
    full_mixture = _value(full_summary.pooled, metric)
    mini_mixture = _value(mini_summary.post_stratified, metric)
    cached_mixture = _value(cached_summary.post_stratified if cached_summary else None, metric)
    return {
        "backbone": key[0],
        "method": key[1],
        "metric": metric,
        "full": full_value,
        "mini": mini_value,
        "abs_dev": _deviation(mini_value, full_value),
        "mini_cached": cached_value,
        "abs_dev_cached": _deviation(cached_value, full_value),
        "per_source": {
            source: {
                "full": _value(full_summary.per_source.get(source), metric),
                "mini": _value(mini_summary.per_source.get(source), metric),
                "mini_cached": _value(
                    cached_summary.per_source.get(source) if cached_summary else None, metric
                ),
            }
            for source in sources
        },
        "post_stratified": {
            "full": full_mixture,
            "mini": mini_mixture,
            "abs_dev": _deviation(mini_mixture, full_mixture),
            "mini_cached": cached_mixture,
            "abs_dev_cached": _deviation(cached_mixture, full_mixture),
        },
    }


def _summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    summary = []
    for backbone in sorted({row["backbone"] for row in rows}):
        mine = [row for row in rows if row["backbone"] == backbone]
        entry: dict[str, Any] = {"backbone": backbone, "pairs": len(mine)}
        for key in ("abs_dev", "abs_dev_cached"):
            values = [row[key] for row in mine if row[key] is not None]
            suffix = key.removeprefix("abs_dev")
            entry[f"mean_abs_dev{suffix}"] = sum(values) / len(values) if values else None
            entry[f"max_abs_dev{suffix}"] = max(values) if values else None
        summary.append(entry)
    return summary


def _nearest_rank_p95(sorted_errors: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The nearest-rank 95th percentile of each column of an ascending-sorted (draws × pairs) array."""
    rank = math.ceil(0.95 * sorted_errors.shape[0])
    p95: npt.NDArray[np.float64] = sorted_errors[rank - 1]
    return p95


def sample_size_calibration(
    expected: Sequence[Expected],
    cells: Mapping[Key, Sequence[ItemScore]],
    sizes: Sequence[int],
    *,
    draws: int,
    seed: int,
) -> dict[str, Any]:
    """App. A's sample-size calibration over a Full run's scores (docs/analysis.md).

    Args:
        expected: the run's expected trajectories; every list of ``cells`` is over them, in their order.
        cells: item scores per (backbone, method).
        sizes: candidate sample sizes; a size above the run's trajectory count is skipped (``skipped``).
        draws: samples per size.
        seed: the master seed; size ``s`` draws from ``numpy.random.default_rng((seed, s))``.

    Returns:
        ``{"sizes": [...], "skipped": [...], "rows": [...]}``: per backbone and size the quotas, the maximum
        per-pair median and p95 error, the pairs that reach them, ``passes``, and every pair's median and p95.

    Raises:
        ValueError: ``draws`` below 1, or a cell's scores are not over ``expected``.
    """
    require_draws_over(draws, expected, cells)
    populations = _sources(expected)
    members = {
        source: np.array([i for i, item in enumerate(expected) if item.source == source])
        for source in populations
    }
    keys = sorted(cells)
    pairs = [(key, metric) for key in keys for metric in CALIBRATION_METRICS]
    correct = np.array(
        [[METRIC_BY_NAME[metric].hit(item) for item in cells[key]] for key, metric in pairs],
        dtype=np.float64,
    ).reshape(len(pairs), len(expected))
    full_scores = _macro(correct, members)
    total = len(expected)
    chosen = [size for size in sizes if 0 < size <= total]
    rows: list[dict[str, Any]] = []
    for size in chosen:
        quotas = allocate_quotas(dict(populations), size)
        errors = _draw_errors(
            correct, members, quotas, full_scores, draws=draws, rng=np.random.default_rng((seed, size))
        )
        errors.sort(axis=0)
        medians = np.median(errors, axis=0)
        p95 = _nearest_rank_p95(errors)
        for backbone in sorted({key[0] for key in keys}):
            index = [i for i, (key, _) in enumerate(pairs) if key[0] == backbone]
            rows.append(
                _calibration_row(
                    backbone, size, quotas, [pairs[i] for i in index], medians[index], p95[index]
                )
            )
    return {
        "sizes": chosen,
        "skipped": [size for size in sizes if size not in chosen],
        "draws": draws,
        "seed": seed,
        "criteria": {"max_median": MEDIAN_CRITERION, "max_p95": P95_CRITERION},
        "rows": rows,
    }


def _calibration_row(
    backbone: str,
    size: int,
    quotas: Mapping[str, int],
    pairs: Sequence[tuple[Key, str]],
    medians: npt.NDArray[np.float64],
    p95: npt.NDArray[np.float64],
) -> dict[str, Any]:
    """One backbone at one size: its worst median and p95 errors over its method-metric pairs, and every pair's."""
    worst_median = max(range(len(pairs)), key=lambda i: medians[i])
    worst_p95 = max(range(len(pairs)), key=lambda i: p95[i])
    return {
        "backbone": backbone,
        "size": size,
        "quotas": quotas,
        "max_median": float(medians[worst_median]),
        "max_median_pair": {"method": pairs[worst_median][0][1], "metric": pairs[worst_median][1]},
        "max_p95": float(p95[worst_p95]),
        "max_p95_pair": {"method": pairs[worst_p95][0][1], "metric": pairs[worst_p95][1]},
        "passes": bool(medians[worst_median] <= MEDIAN_CRITERION and p95[worst_p95] <= P95_CRITERION),
        "pairs": [
            {"method": key[1], "metric": metric, "median": float(medians[i]), "p95": float(p95[i])}
            for i, (key, metric) in enumerate(pairs)
        ],
    }


def _macro(
    correct: npt.NDArray[np.float64], members: Mapping[str, npt.NDArray[np.int_]]
) -> npt.NDArray[np.float64]:
    """Each pair's Macro over sources of its source means: shape (pairs,)."""
    means = [correct[:, index].mean(axis=1) for index in members.values()]
    macro: npt.NDArray[np.float64] = np.mean(np.stack(means), axis=0)
    return macro


def _draw_errors(
    correct: npt.NDArray[np.float64],
    members: Mapping[str, npt.NDArray[np.int_]],
    quotas: Mapping[str, int],
    full_scores: npt.NDArray[np.float64],
    *,
    draws: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """|sample Macro − Full Macro| of every pair in every draw: shape (draws, pairs)."""
    sampled = [source for source in sorted(members) if quotas[source] > 0]
    errors = np.empty((draws, correct.shape[0]))
    for start in range(0, draws, _CHUNK):
        count = min(_CHUNK, draws - start)
        macro = np.zeros((count, correct.shape[0]))
        for source in sampled:
            index, quota = members[source], quotas[source]
            # The `quota` smallest of i.i.d. uniform keys: a uniformly random subset, without replacement.
            keys = rng.random((count, index.size))
            chosen = np.argpartition(keys, quota - 1, axis=1)[:, :quota] if quota < index.size else None
            mask = np.ones((count, index.size)) if chosen is None else np.zeros((count, index.size))
            if chosen is not None:
                np.put_along_axis(mask, chosen, 1.0, axis=1)
            macro += (mask @ correct[:, index].T) / quota
        errors[start : start + count] = np.abs(macro / len(sampled) - full_scores)
    return errors


def require_draws_over(
    draws: int, expected: Sequence[Expected], cells: Mapping[Any, Sequence[ItemScore]]
) -> None:
    """A resampling analysis needs at least one draw and every cell's scores over the run's expected trajectories.

    Raises:
        ValueError: naming the first cell that is not, or the bad number of draws.
    """
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    qids = [item.qid for item in expected]
    for key, items in cells.items():
        if [item.qid for item in items] != qids:
            raise ValueError(f"{key}: scores are not over the run's expected trajectories")
