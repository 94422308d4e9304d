"""The report's sections per cell: the accuracy table (Table 3), outcomes, full metrics, per source."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..report.model import CellOutcome, Report
from .model import (
    _MAX_OUTCOME_NOTES,
    _METRICS,
    _OUTCOME_KEYS,
    _PARTIAL,
    DASH,
    _aggregate_label,
    _best_flags,
    _Cell,
    _clean,
    _count,
    _Failure,
    _failure,
    _first_realizations,
    _headline,
    _interval,
    _metric_value,
    _min_share,
    _outcome_notes,
    _outcomes,
    _pct,
    _Row,
    _row,
    _rule_note,
    _score,
    _Section,
    _sources,
    _Table,
    _totals,
    _unique,
)


def _accuracy_cell(
    failure: _Failure | None, value: float | None, best: bool, *, partial: bool = False, interval: str = ""
) -> _Cell:
    """A headline number, or the status word of a cell whose number is not to be read (docs/analysis.md)."""
    if failure is not None:
        return _Cell(failure.word, muted=True, reason=failure.reason)
    if value is None:
        return _Cell(DASH)
    return _Cell(_pct(value) + (_PARTIAL if partial else ""), best, interval=interval)


def _accuracy_section(report: Report) -> _Section:
    first = _first_realizations(report)
    title = "Accuracy (Table 3 layout)"
    if not first:
        return _Section("accuracy", title, notes=("No accuracy metrics in this report.",))
    backbones = _unique(b for b, _ in first)
    methods = _unique(m for _, m in first)
    outcomes = _outcomes(report)
    grid: dict[tuple[str, str], list[float | None]] = {}
    for (backbone, method), row in first.items():
        headline = _headline(report, row)
        grid[backbone, method] = [_score(headline, "agent_acc"), _score(headline, "step_acc")]
    columns: list[list[_Cell]] = []  # one list per number column, in backbone order, Agent then Step
    for backbone in backbones:
        rows_in = [first.get((backbone, m)) for m in methods]
        failures = [None if r is None else _failure(report, r, outcomes) for r in rows_in]
        for index, metric in enumerate(("agent_acc", "step_acc")):
            values = [grid.get((backbone, m), [None, None])[index] for m in methods]
            # Only numbers that rest on answers compete for "best": a failed or unreadable cell never does.
            eligible = [None if f is not None else v for v, f in zip(values, failures, strict=True)]
            flags = _best_flags(eligible, _pct)
            column = []
            for found, value, failure, best in zip(rows_in, values, failures, flags, strict=True):
                bounds = None if found is None else _interval(report, found, metric)
                interval = "" if bounds is None else f"[{_pct(bounds[0])}, {_pct(bounds[1])}]"
                partial = found is not None and found.status == "partial"
                column.append(_accuracy_cell(failure, value, best, partial=partial, interval=interval))
            columns.append(column)
    rows = tuple(
        _Row((_Cell(method), *(column[i] for column in columns))) for i, method in enumerate(methods)
    )
    table = _Table(
        columns=("Method", *(["Agent", "Step"] * len(backbones))),
        rows=rows,
        groups=tuple((b, 2) for b in backbones),
        caption=f"Agent and Step Acc (%, {_aggregate_label(report)}).",
    )
    notes = [
        *_rule_note(report, full=True),
        "First realization of each backbone × method; see Repeatability. "
        "Marked (* in text, bold in HTML): the highest shown point estimate above 0 per backbone and metric.",
    ]
    if report.outcomes:
        share = _min_share(report)
        notes.append(
            f"Rule: a number is shown when readable predictions cover at least {share:.0%} of the expected "
            "trajectories. Failed, skipped, interrupted and never-run items and unreadable answers still count "
            f"as errors in it (the protocol); {_PARTIAL} marks a number that counts some. Otherwise the cell "
            "names the main reason (failed, skipped, interrupted, not run, unreadable; n/a when mixed), is never "
            "marked best and is left out of the paired comparisons."
        )
        totals = _totals(report)
        if totals:
            notes.append(totals[0].upper() + totals[1:] + ".")
        keys = [(b, m, r.realization) for (b, m), r in first.items()]
        notes += _outcome_notes(report, keys)
    return _Section("accuracy", title, (table,), tuple(notes))


def _outcomes_section(report: Report) -> _Section:
    rows_in = report.outcomes
    title = "Outcomes"
    if not rows_in:
        return _Section("outcomes", title, notes=("No items or predictions in this report.",))
    realizations = any(r.realization for r in rows_in)
    shown = [r for r in rows_in if not _clean(r)]
    rows = []
    for row in shown:
        labels = [row.backbone, row.method]
        if realizations:
            labels.append(str(row.realization))
        counts = [f"{row.count(k):,}" for k in _OUTCOME_KEYS]
        rows.append(_row(*labels, *counts, row.status))
    clean = len(rows_in) - len(shown)
    notes = []
    if clean:
        every = "All" if not shown else "The other"
        notes.append(
            f"{every} {clean} backbone × method × realization cells: every expected trajectory has a readable "
            "prediction decided by the model (nothing failed, skipped, unreadable or decided by a fallback)."
        )
    notes.append(
        "Predictions: expected trajectories with a prediction; unreadable: the model's answer could not be read "
        "(predictions.error); fallback: a rule of the method, not the model, decided at least part of the "
        "prediction (predictions.fallback). Failed, skipped (budget), interrupted and not run: expected "
        "trajectories without a prediction, by their item's status. Status: complete, partial (shown, with "
        "errors counted), or the main reason the cell's number is not shown."
    )
    notes += _reason_notes(shown)
    tables: tuple[_Table, ...] = ()
    if rows:
        heads = ("Backbone", "Method", *(("Real.",) if realizations else ()))
        table = _Table(
            columns=(
                *heads,
                *("Expected", "Predictions", "Unreadable", "Fallback"),
                *("Failed", "Skipped", "Interrupted", "Not run", "Status"),
            ),
            rows=tuple(rows),
            label_columns=len(heads),
            caption="What became of each cell's expected trajectories (cells with anything to report).",
        )
        tables = (table,)
    return _Section("outcomes", title, tables, tuple(notes))


_REASON_WORDS = {"failed": "failed", "invalid": "unreadable", "fallback": "fallback"}
_REASON_CHARS = 160


def _reason_notes(rows: Sequence[CellOutcome]) -> list[str]:
    """The most frequent failure, unreadable-answer and fallback message of each cell, capped."""
    notes = []
    for row in rows:
        for kind, word in _REASON_WORDS.items():
            entry = row.messages.get(kind)
            if entry is None:
                continue
            message = entry.message
            if len(message) > _REASON_CHARS:
                message = message[: _REASON_CHARS - 1] + "…"
            label = f"{row.backbone} · {row.method} r{row.realization}"
            notes.append(f"{label}, most frequent {word} ({entry.count}×): {message}")
    if len(notes) > _MAX_OUTCOME_NOTES:
        more = len(notes) - _MAX_OUTCOME_NOTES
        notes = [
            *notes[:_MAX_OUTCOME_NOTES],
            f"… and {more} more (every message is in --json under outcomes).",
        ]
    return notes


def _full_metrics_section(report: Report) -> _Section:
    first = _first_realizations(report)
    title = "Full metrics"
    if not first:
        return _Section("full-metrics", title, notes=("No accuracy metrics in this report.",))
    with_status = bool(report.outcomes)  # a report without outcomes (hand-built) has no statuses
    rows = []
    for (backbone, method), row in first.items():
        headline = _headline(report, row)
        values = [_metric_value(m, _score(headline, m)) for m in _METRICS]
        status = (row.status or DASH,) if with_status else ()
        rows.append(_row(backbone, method, *status, _count(float(headline.n)), *values))
    metrics = ("Agent", "Step", "Step ±5", "Joint exact", "Joint ±5", "Root MAE", "Coverage")
    labels = ("Backbone", "Method", *(("Status",) if with_status else ()))
    table = _Table(
        columns=(*labels, "n", *metrics),
        rows=tuple(rows),
        label_columns=len(labels),
        caption=f"All metrics (%; Root MAE in steps), {_aggregate_label(report)}; first realization.",
    )
    notes = [*_rule_note(report), *_coverage_notes((row.method, row.coverage_rule) for row in first.values())]
    if with_status:
        notes.append(
            "Status and the rule behind it: see Outcomes. A cell with no prediction at all is not scored (n 0, "
            "no metric); every other number counts failed, skipped, unrun and unreadable items as errors."
        )
    return _Section("full-metrics", title, (table,), tuple(notes))


_COVERAGE_CHECKS = (
    "the method's own validation checks (App. L.1: recorded role, root-step validity, explanatory-chain "
    "structure, cited handoff evidence)"
)


def _coverage_notes(rules_of: Iterable[tuple[str, object]]) -> list[str]:
    """Which coverage rule each method's Coverage used: (method, its rows' ``coverage_rule``) pairs."""
    rules: dict[str, set[str]] = {}
    for method, rule in rules_of:
        if isinstance(rule, str):
            rules.setdefault(rule, set()).add(method)
    if not rules:
        return []
    parts = []
    if "method" in rules:
        parts.append(f"{_COVERAGE_CHECKS} for {', '.join(sorted(rules['method']))}")
    if "mixed" in rules:
        parts.append(
            f"those checks where the method stored them, else role and step validity, for "
            f"{', '.join(sorted(rules['mixed']))}"
        )
    if "validity" in rules:
        every = "every method" if len(rules) == 1 else "the others"
        parts.append(
            f"the scorer's checks (a role of the recorded role set and an in-range step) for {every}"
        )
    return [
        "Coverage: non-abstaining outputs that pass " + "; ".join(parts) + " (all expected trajectories in "
        "the denominator)."
    ]


def _per_source_section(report: Report) -> _Section:
    first = _first_realizations(report)
    sources = _sources(report)
    title = "Per source"
    if not first or not sources:
        return _Section("per-source", title, notes=("No per-source metrics in this report.",))
    tables = []
    for backbone in _unique(b for b, _ in first):
        rows = []
        for (b, method), row in first.items():
            if b != backbone:
                continue
            cells = [method]
            for source in sources:
                scores = row.per_source.get(source)
                cells += [_pct(_score(scores, "agent_acc")), _pct(_score(scores, "step_acc"))]
            rows.append(_row(*cells))
        tables.append(
            _Table(
                columns=("Method", *(["Agent", "Step"] * len(sources))),
                rows=tuple(rows),
                groups=tuple((s, 2) for s in sources),
                caption=f"{backbone}: Agent and Step Acc (%) per source, first realization.",
            )
        )
    return _Section("per-source", title, tuple(tables), _rule_note(report))
