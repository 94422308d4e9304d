"""Sensitivity of root-step scores to which human label is the reference (LongRCA App. K.1, Table 22).

Annotators disagree on the root step, so a lead in Step Acc could depend on which annotation became the final
label. `label_sensitivity` re-scores fixed predictions against observed annotations drawn at random;
`load_annotations` reads them. Only root steps are resampled (Agent Acc does not enter), and the intervals
describe label sensitivity on fixed samples, not population confidence. Protocol: docs/analysis.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rcarun.data import parse_step
from rcarun.errors import DataError

from .fidelity import require_draws_over
from .scoring import METRICS, STEP_TOLERANCE, Expected, ItemScore
from .submission import table_rows

__all__ = ["ANNOTATION_SEED", "label_sensitivity", "load_annotations"]

ANNOTATION_SEED = 20260918  # App. K.1
_METRICS = tuple(m.name for m in METRICS if m.label_sensitive)


def load_annotations(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Observed root steps per qid, in file order (docs/analysis.md).

    Raises:
        DataError: an unreadable file, an unknown extension, a missing column, a row without a ``question_ID``
            or with a step that is not an integer, or no rows at all.
    """
    file = Path(path)
    found: dict[str, list[int]] = {}
    for label, row in table_rows(file, ("question_ID", "step"), "annotations"):
        qid = row.get("question_ID")
        if not isinstance(qid, str) or not qid.strip():
            raise DataError(
                f"expected a non-empty string, got {qid!r}", path=str(file), record=label, field="question_ID"
            )
        step = parse_step(row.get("step"))
        if step is None:
            raise DataError(
                f"expected an integer step, got {row.get('step')!r}",
                path=str(file),
                record=label,
                field="step",
            )
        found.setdefault(qid.strip(), []).append(step)
    if not found:
        raise DataError("no annotations found", path=str(file))
    return {qid: tuple(steps) for qid, steps in found.items()}


def _subset(
    expected: Sequence[Expected], annotations: Mapping[str, Sequence[int]]
) -> tuple[list[int], list[tuple[int, ...]]]:
    """Positions in ``expected`` of the multiply annotated trajectories, and their annotations.

    Raises:
        DataError: an annotation's step is outside its trajectory.
    """
    positions, labels = [], []
    for position, item in enumerate(expected):
        steps = tuple(annotations.get(item.qid, ()))
        for step in steps:
            if not 0 <= step < item.n_steps:
                raise DataError(
                    f"annotated step {step} is outside the trajectory's {item.n_steps} steps (0-based)",
                    record=item.qid,
                    field="step",
                )
        if len(steps) >= 2:
            positions.append(position)
            labels.append(steps)
    return positions, labels


def _draw_labels(
    labels: Sequence[tuple[int, ...]], draws: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """(draws × trajectories) root steps, one observed annotation chosen uniformly per trajectory and draw."""
    counts = np.array([len(steps) for steps in labels])
    choice = np.minimum((rng.random((draws, len(labels))) * counts).astype(np.int64), counts - 1)
    table = np.full((len(labels), int(counts.max())), -1, dtype=np.int64)
    for i, steps in enumerate(labels):
        table[i, : len(steps)] = steps
    drawn: npt.NDArray[np.int64] = table[np.arange(len(labels)), choice]
    return drawn


def _hits(
    predicted: npt.NDArray[np.int64], reference: npt.NDArray[np.int64], metric: str
) -> npt.NDArray[np.bool_]:
    """Correctness against ``reference`` (any shape ending in trajectories); -1 is an invalid prediction."""
    valid = predicted >= 0
    close = (
        predicted == reference if metric == "step_acc" else np.abs(predicted - reference) <= STEP_TOLERANCE
    )
    hits: npt.NDArray[np.bool_] = valid & close
    return hits


def _summary(final: float, values: npt.NDArray[np.float64], confidence: float) -> dict[str, float]:
    low, high = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"final": final, "mean": float(values.mean()), "low": float(low), "high": float(high)}


def label_sensitivity(
    expected: Sequence[Expected],
    cells: Mapping[str, Sequence[ItemScore]],
    annotations: Mapping[str, Sequence[int]],
    *,
    reference: str | None,
    draws: int,
    seed: int = ANNOTATION_SEED,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """App. K.1's root-step label sensitivity for one backbone's methods (docs/analysis.md).

    Args:
        expected: the run's expected trajectories; every list of ``cells`` is over them, in their order.
        cells: item scores per method (realization 0 of one backbone).
        annotations: observed root steps per qid (`load_annotations`); qids the run lacks are ignored.
        reference: the method whose gap to the strongest other method is summarised (skipped when None or
            absent).
        draws: label draws.
        seed: ``numpy.random.default_rng(seed)``.
        confidence: the central share of the draws the interval covers.

    Returns:
        ``{"n", "rows": [{"method", "metric", "final", "mean", "low", "high", "rank1"}], "gaps": [{"method",
        "metric", "final", "mean", "low", "high"}], "orderings": [{"metric", "order", "retained"}]}`` where
        ``order`` lists the methods from best to worst under the final labels in tiers (a list of tied methods
        each, sorted by name); ``n`` 0 and empty lists without a multiply annotated trajectory, no ordering rows
        with a single method.

    Raises:
        DataError: an annotated step is outside its trajectory.
        ValueError: ``draws`` below 1, or a cell's scores are not over ``expected``.
    """
    require_draws_over(draws, expected, cells)
    positions, labels = _subset(expected, annotations)
    methods = sorted(cells)
    if not positions or not methods:
        return {"n": len(positions), "rows": [], "gaps": [], "orderings": []}
    final_roots = np.array([expected[p].ref_step for p in positions], dtype=np.int64)
    drawn = _draw_labels(labels, draws, np.random.default_rng(seed))
    predicted = {
        method: np.array(
            [-1 if (step := cells[method][p].step) is None else step for p in positions], dtype=np.int64
        )
        for method in methods
    }
    rows, gaps, orderings = [], [], []
    for metric in _METRICS:
        final = {m: float(_hits(predicted[m], final_roots, metric).mean()) for m in methods}
        scores = {m: _hits(predicted[m], drawn, metric).mean(axis=1) for m in methods}
        stacked = np.stack([scores[m] for m in methods])  # (methods × draws)
        for i, method in enumerate(methods):
            others = np.delete(stacked, i, axis=0)
            leads = stacked[i] > others.max(axis=0) if len(methods) > 1 else np.ones(draws, dtype=bool)
            rows.append(
                {
                    "method": method,
                    "metric": metric,
                    **_summary(final[method], scores[method], confidence),
                    "rank1": float(leads.mean()),
                }
            )
        if reference is not None and reference in cells and len(methods) > 1:
            rivals = [m for m in methods if m != reference]
            strongest = np.stack([scores[m] for m in rivals]).max(axis=0)
            final_gap = final[reference] - max(final[m] for m in rivals)
            gaps.append(
                {
                    "method": reference,
                    "metric": metric,
                    **_summary(final_gap, scores[reference] - strongest, confidence),
                }
            )
        if len(methods) > 1:
            orderings.append({"metric": metric, **_ordering(methods, final, stacked)})
    return {"n": len(positions), "rows": rows, "gaps": gaps, "orderings": orderings}


def _ordering(
    methods: Sequence[str], final: Mapping[str, float], draws: npt.NDArray[np.float64]
) -> dict[str, Any]:
    """The final labels' ordering of ``methods`` in tiers, and the share of draws (rows of ``draws``, in
    ``methods`` order) that keep every pairwise comparison of it (docs/analysis.md)."""
    finals = np.array([final[m] for m in methods])
    expected = np.sign(finals[:, None] - finals[None, :])
    found = np.sign(draws[:, None, :] - draws[None, :, :])  # (methods × methods × draws)
    retained = (found == expected[:, :, None]).all(axis=(0, 1))
    order = [
        [m for m in methods if final[m] == score]
        for score in sorted({final[m] for m in methods}, reverse=True)
    ]
    return {"order": order, "retained": float(retained.mean())}
