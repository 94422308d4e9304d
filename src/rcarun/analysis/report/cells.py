"""The report's per-cell parts: outcomes and status, metrics with their intervals, and the cells left out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ..protocol import Protocol
from ..results import Cell, Outcome, RunScores
from ..scoring import METRIC_BY_NAME, METRICS, ItemScore, Metrics, Summary, summarize
from ..stats import stratified_interval
from .model import OUTCOME_COUNTS, Bounds, CellMetrics, CellOutcome, Excluded, Message, Scores
from .options import _CAUSES, METRIC_NAMES, MIN_READABLE_SHARE, ReportOptions


def cell_status(outcome: Outcome) -> tuple[str, bool]:
    """A cell's status word and whether its number is shown (docs/analysis.md).

    ``"complete"``: every expected trajectory has a readable prediction; ``"partial"``: shown, with some
    unanswered or unreadable; otherwise the largest cause among ``"failed"``, ``"skipped"``, ``"interrupted"``,
    ``"not run"`` and ``"unreadable"`` (``"n/a"`` when two causes tie or nothing was expected).
    """
    if outcome.expected == 0:
        return "n/a", False
    if outcome.readable == outcome.expected:
        return "complete", True
    if outcome.readable >= MIN_READABLE_SHARE * outcome.expected:
        return "partial", True
    counts = {word: getattr(outcome, name) for name, word in _CAUSES}
    top = max(counts.values())
    leaders = [word for word, count in counts.items() if count == top]
    return (leaders[0] if len(leaders) == 1 else "n/a"), False


def _outcome_json(cell: Cell, outcome: Outcome) -> CellOutcome:
    status, shown = cell_status(outcome)
    counts = {name: getattr(outcome, name) for name in OUTCOME_COUNTS}  # the same names on both
    messages = {kind: Message(message, count) for kind, (message, count) in outcome.messages.items()}
    return CellOutcome(
        cell.backbone, cell.method, cell.realization, **counts, status=status, shown=shown, messages=messages
    )


def _shown(scores: RunScores, cell: Cell) -> bool:
    outcome = scores.outcomes.get(cell)
    return outcome is not None and cell_status(outcome)[1]


def metrics_json(metrics: Metrics) -> dict[str, Any]:
    """A `Metrics` as the report's metric dict (fractions; ``root_mae`` in steps)."""
    return {"n": metrics.n, **{name: getattr(metrics, name) for name in METRIC_NAMES}}


def _excluded(scores: RunScores) -> tuple[Excluded, ...]:
    """Realization-0 cells left out of paired comparisons and complementarity: their number is not shown."""
    return tuple(
        Excluded(cell.backbone, cell.method, cell_status(outcome)[0])
        for cell, outcome in sorted(scores.outcomes.items())
        if cell.realization == 0 and not cell_status(outcome)[1]
    )


def _scored(scores: RunScores, cell: Cell) -> bool:
    """The cell has at least one prediction: there is something to score (docs/analysis.md)."""
    outcome = scores.outcomes.get(cell)
    return outcome is None or outcome.predictions > 0


def _coverage_rule(items: Sequence[ItemScore]) -> str | None:
    """Whose checks decided coverage: the method's stored verdict, the scorer's validity rule, or both."""
    predicted = [item for item in items if item.predicted]
    if not predicted:
        return None
    by_method = sum(item.covered_by_method for item in predicted)
    return "method" if by_method == len(predicted) else "validity" if by_method == 0 else "mixed"


def _scores(metrics: Metrics) -> Scores:
    return Scores(metrics.n, **{name: getattr(metrics, name) for name in METRIC_NAMES})


def _metrics(scores: RunScores, protocol: Protocol, options: ReportOptions) -> list[CellMetrics]:
    entries = []
    for cell, items in scores.scores.items():
        if not items:
            continue
        outcome = scores.outcomes.get(cell)
        status, shown = cell_status(outcome) if outcome is not None else ("complete", True)
        if not _scored(scores, cell):  # nothing answered: not 0.0 as if it had
            blank = Scores(0)
            entries.append(
                CellMetrics(cell.backbone, cell.method, cell.realization, blank, blank, status, shown)
            )
            continue
        summary = summarize(items, populations=options.populations)
        entries.append(
            CellMetrics(
                cell.backbone,
                cell.method,
                cell.realization,
                pooled=_scores(summary.pooled),
                macro=_scores(summary.macro),
                status=status,
                shown=shown,
                pooled_intervals=_cell_intervals(summary.pooled, summary, "pooled", options.confidence),
                macro_intervals=_cell_intervals(summary.macro, summary, "macro", options.confidence),
                per_source={source: _scores(m) for source, m in sorted(summary.per_source.items())},
                post_stratified=_scores(summary.post_stratified) if summary.post_stratified else None,
                coverage_rule=_coverage_rule(items),
            )
        )
    return entries


def _cell_intervals(
    headline: Metrics, summary: Summary, weighting: Literal["pooled", "macro"], confidence: float
) -> dict[str, Bounds]:
    """The interval of each Table 3 metric of one cell's headline, from its per-source counts."""
    found = {}
    for metric in (m.name for m in METRICS if m.interval):
        strata = [(float(m.n), float(getattr(m, metric))) for m in summary.per_source.values()]
        interval = stratified_interval(
            getattr(headline, metric), strata, weighting=weighting, confidence=confidence
        )
        found[metric] = (interval.low, interval.high)
    return found


def _outcomes(items: Sequence[ItemScore], metric: str) -> list[bool]:
    hit = METRIC_BY_NAME[metric].hit
    return [hit(item) for item in items]


def _headline(summary: Summary, protocol: Protocol) -> Metrics:
    return summary.macro if protocol.aggregate == "macro" else summary.pooled
