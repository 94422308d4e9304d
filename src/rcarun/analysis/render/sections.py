"""The report's sections about the run's cells: accuracy, outcomes, metrics, paired tests, repeatability."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..scoring import metric_label
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
    _int,
    _interval,
    _is_fraction,
    _metric_value,
    _min_share,
    _num,
    _outcome_notes,
    _outcomes,
    _p,
    _pct,
    _per_source,
    _presets,
    _protocol,
    _Row,
    _row,
    _rows,
    _rule_note,
    _Section,
    _sources,
    _steps,
    _Table,
    _text,
    _totals,
    _unique,
)

# --- sections ----------------------------------------------------------------------------------------------------


def _accuracy_cell(
    failure: _Failure | None, value: float | None, best: bool, *, partial: bool = False, interval: str = ""
) -> _Cell:
    """A headline number, or the status word of a cell whose number is not to be read (module docstring)."""
    if failure is not None:
        return _Cell(failure.word, muted=True, reason=failure.reason)
    if value is None:
        return _Cell(DASH)
    return _Cell(_pct(value) + (_PARTIAL if partial else ""), best, interval=interval)


def _accuracy_section(report: Mapping[str, Any]) -> _Section:
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
        grid[backbone, method] = [_num(headline, "agent_acc"), _num(headline, "step_acc")]
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
                partial = found is not None and _text(found, "status") == "partial"
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
    if _rows(report, "outcomes"):
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
        keys = [(b, m, round(_num(r, "realization") or 0)) for (b, m), r in first.items()]
        notes += _outcome_notes(report, keys)
    return _Section("accuracy", title, (table,), tuple(notes))


def _outcomes_section(report: Mapping[str, Any]) -> _Section:
    rows_in = _rows(report, "outcomes")
    title = "Outcomes"
    if not rows_in:
        return _Section("outcomes", title, notes=("No items or predictions in this report.",))
    realizations = any(_int(r, "realization") for r in rows_in)
    shown = [r for r in rows_in if not _clean(r)]
    rows = []
    for row in shown:
        labels = [_text(row, "backbone"), _text(row, "method")]
        if realizations:
            labels.append(str(_int(row, "realization")))
        counts = [f"{_int(row, k):,}" for k in _OUTCOME_KEYS]
        rows.append(_row(*labels, *counts, _text(row, "status")))
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


def _reason_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The most frequent failure, unreadable-answer and fallback message of each cell, capped."""
    notes = []
    for row in rows:
        found = row.get("messages")
        messages: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        for kind, word in _REASON_WORDS.items():
            entry = messages.get(kind)
            if not isinstance(entry, Mapping):
                continue
            message = _text(entry, "message")
            if len(message) > _REASON_CHARS:
                message = message[: _REASON_CHARS - 1] + "…"
            label = f"{_text(row, 'backbone')} · {_text(row, 'method')} r{_int(row, 'realization')}"
            notes.append(f"{label}, most frequent {word} ({_int(entry, 'count')}×): {message}")
    if len(notes) > _MAX_OUTCOME_NOTES:
        more = len(notes) - _MAX_OUTCOME_NOTES
        notes = [
            *notes[:_MAX_OUTCOME_NOTES],
            f"… and {more} more (every message is in --json under outcomes).",
        ]
    return notes


def _full_metrics_section(report: Mapping[str, Any]) -> _Section:
    first = _first_realizations(report)
    title = "Full metrics"
    if not first:
        return _Section("full-metrics", title, notes=("No accuracy metrics in this report.",))
    with_status = bool(_rows(report, "outcomes"))  # a report dict from before outcomes has no statuses
    rows = []
    for (backbone, method), row in first.items():
        headline = _headline(report, row)
        values = [_metric_value(m, _num(headline, m)) for m in _METRICS]
        status = (_text(row, "status") or DASH,) if with_status else ()
        rows.append(_row(backbone, method, *status, _count(_num(headline, "n")), *values))
    metrics = ("Agent", "Step", "Step ±5", "Joint exact", "Joint ±5", "Root MAE", "Coverage")
    labels = ("Backbone", "Method", *(("Status",) if with_status else ()))
    table = _Table(
        columns=(*labels, "n", *metrics),
        rows=tuple(rows),
        label_columns=len(labels),
        caption=f"All metrics (%; Root MAE in steps), {_aggregate_label(report)}; first realization.",
    )
    notes = [*_rule_note(report), *_coverage_notes(first.values())]
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


def _coverage_notes(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Which coverage rule each method's Coverage used (``coverage_rule`` of its metrics rows)."""
    rules: dict[str, set[str]] = {}
    for row in rows:
        rule = row.get("coverage_rule")
        if isinstance(rule, str):
            rules.setdefault(rule, set()).add(_text(row, "method"))
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


def _per_source_section(report: Mapping[str, Any]) -> _Section:
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
                metrics = _per_source(row, source)
                cells += [_pct(_num(metrics, "agent_acc")), _pct(_num(metrics, "step_acc"))]
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


_PAIRED_STATS = ("Metric", "Δ (pp)", "95% CI (pp)", "W/L", "p (McNemar)", "p (Holm)", "n")


def _paired_cells(row: Mapping[str, Any], joint: bool = False, family: bool = False) -> tuple[str, ...]:
    """Metric, Δ, interval, W/L, p-values and n of one paired comparison (pp; steps for the MAE), then the
    joint Holm p-value and the family when asked for."""
    metric = _text(row, "metric")
    delta, low, high = (_num(row, k) for k in ("delta", "ci_low", "ci_high"))
    scale = 100 if _is_fraction(metric) else 1
    shown = DASH if delta is None else f"{delta * scale:+.1f}"
    interval = DASH if low is None or high is None else f"[{low * scale:.1f}, {high * scale:.1f}]"
    wins, losses = _num(row, "wins"), _num(row, "losses")
    wl = DASH if wins is None or losses is None else f"{round(wins)}/{round(losses)}"
    p_values = (_p(_num(row, "p_mcnemar")), _p(_num(row, "p_holm")))
    extra = (
        *((_p(_num(row, "p_holm_joint")),) if joint else ()),
        *((_text(row, "family"),) if family else ()),
    )
    return (metric_label(metric), shown, interval, wl, *p_values, _count(_num(row, "n")), *extra)


def _family_notes(report: Mapping[str, Any]) -> list[str]:
    """The paired statistics' settings and every Holm family of the report, in words."""
    protocol = _protocol(report)
    notes = []
    resamples = _num(protocol, "resamples")
    if resamples is not None:
        why = _text(protocol, "resamples_reason")
        seed = _text(protocol, "seed")
        notes.append(
            f"Intervals from {_count(resamples)} resamples{f' ({why})' if why else ''}"
            f"{f', seed {seed}' if seed else ''}."
        )
    families = _rows(protocol, "families")
    if families:
        listed = "; ".join(
            f"{_text(f, 'family')} ({_count(_num(f, 'tests'))} tests): {_text(f, 'description')}"
            for f in families
        )
        notes.append(f"Holm families: {listed}.")
    return notes


def _not_compared_notes(report: Mapping[str, Any]) -> list[str]:
    """The methods the protocol leaves out of the paired comparisons, and why."""
    not_compared = _rows(_protocol(report), "not_compared")
    if not not_compared:
        return []
    listed = "; ".join(f"{_text(r, 'method')}: {_text(r, 'why')}" for r in not_compared)
    return [f"Not in these comparisons: {listed}."]


def _methods_table(report: Mapping[str, Any], paired: Sequence[Mapping[str, Any]], family: bool) -> _Table:
    """Paired differences between methods on one backbone (against the reference method, when there is one)."""
    reference = report.get("reference_method")
    against = f" against {reference}" if reference else ""
    joint = any(_num(r, "p_holm_joint") is not None for r in paired)
    rows = tuple(
        _row(
            _text(r, "backbone"),
            f"{_text(r, 'method_a')} vs {_text(r, 'method_b')}",
            *_paired_cells(r, joint, family),
        )
        for r in paired
    )
    caption = f"Paired differences A − B between methods{against}, first realization."
    tail = ("Family",) if family else ()
    heads = ("Backbone", "A vs B", *_PAIRED_STATS, *(("p (Holm, both)",) if joint else ()), *tail)
    return _Table(heads, rows, label_columns=3, caption=caption)


def _paired_section(report: Mapping[str, Any]) -> _Section:
    paired = _rows(report, "paired")
    across = _rows(report, "paired_backbones")  # the same method on two backbones, when the builder made them
    kinds = _rows(report, "paired_across")  # a method on a local backbone against one on a chat backbone
    title = "Paired comparisons"
    excluded = [
        f"{_text(r, 'backbone')} · {_text(r, 'method')} ({_text(r, 'status')})"
        for r in _rows(report, "excluded")
    ]
    left_out = f"Left out (no number shown, see Outcomes): {', '.join(excluded)}." if excluded else None
    if not paired and not across and not kinds:
        notes_only = (
            "No paired comparisons in this report.",
            *((left_out,) if left_out else ()),
            *_not_compared_notes(report),
        )
        return _Section("paired", title, notes=notes_only)
    family = any("family" in r for r in (*paired, *across, *kinds))
    tail = ("Family",) if family else ()
    tables = [_methods_table(report, paired, family)] if paired else []
    if across:
        rows = tuple(
            _row(
                _text(r, "method"),
                f"{_text(r, 'backbone_a')} vs {_text(r, 'backbone_b')}",
                *_paired_cells(r, False, family),
            )
            for r in across
        )
        caption = "Paired differences A − B between backbones, same method, first realization."
        tables.append(
            _Table(("Method", "A vs B", *_PAIRED_STATS, *tail), rows, label_columns=3, caption=caption)
        )
    if kinds:
        rows = tuple(
            _row(
                f"{_text(r, 'method_a')} · {_text(r, 'backbone_a')}",
                f"{_text(r, 'method_b')} · {_text(r, 'backbone_b')}",
                *_paired_cells(r, False, family),
            )
            for r in kinds
        )
        caption = (
            "Paired differences A − B between a method on a chat backbone and one on a local backbone (a model "
            "read on this machine, as SOAP's), first realization, on the trajectories both answered (SOAP: its "
            "test split); model and method differ together."
        )
        tables.append(_Table(("A", "B", *_PAIRED_STATS, *tail), rows, label_columns=3, caption=caption))
    notes = [
        *_rule_note(report),
        "Δ and its pointwise 95% source-stratified paired-bootstrap interval are in percentage points; W/L counts "
        "trajectories only A / only B gets right; p from the two-sided exact McNemar test, then Holm-adjusted "
        "within its family"
        + (
            "; p (Holm, both) adjusts App. B's family over both metrics together (the paper's Holm-40)."
            if any(_num(r, "p_holm_joint") is not None for r in paired)
            else "."
        ),
        *_family_notes(report),
        *_not_compared_notes(report),
    ]
    if any(not _is_fraction(_text(r, "metric")) for r in (*paired, *across, *kinds)):
        notes.append("Root MAE differences and intervals are in steps, not percentage points.")
    if left_out:
        notes.append(left_out)
    return _Section("paired", title, tuple(tables), tuple(notes))


def _components_section(report: Mapping[str, Any]) -> _Section | None:
    found = report.get("components")
    if not isinstance(found, Mapping):
        return None
    rows_in = _rows(found, "rows")
    title = "Component study"
    if not rows_in:
        return _Section(
            "components", title, notes=("No backbone holds full RCTA beside a component condition.",)
        )
    rows = []
    for row in rows_in:
        ablation = _text(row, "ablation")
        setting = f"w/o {ablation.removeprefix('no-').upper()}" if ablation else "all components"
        if row.get("shown") is False:
            values = [_Cell(_text(row, "status") or "n/a", muted=True)] * 5
        else:
            values = [
                _Cell(_pct(_num(row, "agent_acc"))),
                _Cell(_pct(_num(row, "step_acc"))),
                _Cell(_pct(_num(row, "step_pm5"))),
                _Cell(_steps(_num(row, "root_mae"))),
                _Cell(_pct(_num(row, "coverage"))),
            ]
        delta, low, high = (_num(row, k) for k in ("delta", "ci_low", "ci_high"))
        interval = DASH if low is None or high is None else f"[{low * 100:+.1f}, {high * 100:+.1f}]"
        wins, losses = _num(row, "wins"), _num(row, "losses")
        stats = (
            DASH if delta is None else f"{delta * 100:+.1f}",
            interval,
            DASH if wins is None or losses is None else f"{round(wins)}/{round(losses)}",
            _p(_num(row, "p_mcnemar")),
            _p(_num(row, "p_holm")),
        )
        labels = (_Cell(_text(row, "backbone")), _Cell(f"{_text(row, 'method')} ({setting})"))
        rows.append(
            _Row((*labels, *values, _Cell(_count(_num(row, "valid_step_n"))), *(_Cell(t) for t in stats)))
        )
    aggregate = "source-macro" if _text(found, "aggregate") == "macro" else "pooled"
    table = _Table(
        columns=(
            *("Backbone", "Setting", "Agent", "Step", "Step ±5", "MAE", "Cov.", "MAE n"),
            *("Δ Step (pp)", "95% CI (pp)", "W/L", "p (McNemar)", "p (Holm)"),
        ),
        rows=tuple(rows),
        label_columns=2,
        caption=f"RCTA's components (Table 25 layout; %, {aggregate}; MAE in steps), first realization.",
    )
    rule = _text(found, "scoring_rule")
    off = [
        f"{_text(cell, 'method')} on {_text(cell, 'backbone')} ran at preset "
        + ", ".join(f"{name or '(none)'!r} ({count})" for name, count in _presets(cell).items())
        for cell in _rows(found, "off_settings")
    ]
    notes = [
        *(
            (
                "NOT App. H's settings (preset 'ablation': 4,000 / 12,000 / 32,000 output tokens, reasoning off / "
                f"high / high), so these rows are not Table 25's: {'; '.join(off)}.",
            )
            if off
            else ()
        ),
        *((f"Scoring rule (component study): {rule}.",) if rule else ()),
        *_coverage_notes(rows_in),
        "MAE n: non-abstaining outputs with a parseable in-range step (the MAE's outputs). Δ: the condition's "
        "Step Acc minus full RCTA's, with its pointwise source-stratified paired-bootstrap interval "
        f"({_count(_num(found, 'resamples'))} resamples, seed {_text(found, 'seed')}); W/L: trajectories only the "
        f"condition / only full RCTA gets right; exact McNemar p, Holm over the conditions of the backbone "
        f"({_text(found, 'family')}).",
    ]
    return _Section("components", title, (table,), tuple(notes))


def _complementarity_section(report: Mapping[str, Any]) -> _Section:
    rows_in = _rows(report, "complementarity")
    title = "Complementarity"
    if not rows_in:
        return _Section("complementarity", title, notes=("No complementarity counts in this report.",))
    rows = tuple(
        _row(
            _text(row, "backbone"),
            f"{_text(row, 'method_a')} vs {_text(row, 'method_b')}",
            metric_label(_text(row, "metric") or "step_acc"),
            *(_count(_num(row, k)) for k in ("a_only", "b_only", "both", "neither")),
        )
        for row in rows_in
    )
    table = _Table(
        columns=("Backbone", "A vs B", "Metric", "A only", "B only", "Both", "Neither"),
        rows=rows,
        label_columns=3,
        caption="Trajectories each method gets right (first realization), by which of the two gets them.",
    )
    return _Section("complementarity", title, (table,), _rule_note(report))


def _repeatability_section(report: Mapping[str, Any]) -> _Section:
    rows_in = _rows(report, "repeatability")
    title = "Repeatability"
    if not rows_in:
        return _Section("repeatability", title, notes=("No repeated realizations in this report.",))
    spread_rows: list[_Row] = []
    agreement_rows: list[_Row] = []
    for row in rows_in:
        backbone, method = _text(row, "backbone"), _text(row, "method")
        realizations = row.get("realizations")
        names = ", ".join(str(r) for r in realizations) if isinstance(realizations, Sequence) else DASH
        found = row.get("metrics")
        metrics: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        ordered = [m for m in _METRICS if m in metrics] + [str(m) for m in metrics if m not in _METRICS]
        for metric in ordered:
            stats = metrics[metric] if isinstance(metrics[metric], Mapping) else {}
            fmt = _pct if _is_fraction(metric) else _steps
            mean, sd = _num(stats, "mean"), _num(stats, "sd")
            lo, hi = _num(stats, "min"), _num(stats, "max")
            spread_rows.append(
                _row(
                    backbone,
                    method,
                    metric_label(metric),
                    _count(_num(stats, "n")),
                    f"{fmt(mean)} ± {fmt(sd)}",
                    f"{fmt(lo)}–{fmt(hi)}",
                    fmt(_num(stats, "range")),
                )
            )
        pairs = [
            f"{_text(a, 'first')} vs {_text(a, 'second')}: {_pct(_num(a, 'rate'))}"
            for a in _rows(row, "agreement")
        ]
        agreement_rows.append(
            _row(backbone, method, names, "; ".join(pairs) or DASH, _pct(_num(row, "mean_agreement")))
        )
    spread = _Table(
        columns=("Backbone", "Method", "Metric", "n", "Mean ± SD", "Min–max", "Range"),
        rows=tuple(spread_rows),
        label_columns=3,
        caption="Spread of each metric over realizations (%, Root MAE in steps; SD with ddof = 1).",
    )
    agreement = _Table(
        columns=("Backbone", "Method", "Realizations", "Pairwise agreement (%)", "Mean (%)"),
        rows=tuple(agreement_rows),
        label_columns=4,
        caption="Agreement of root-step predictions between realizations.",
    )
    return _Section("repeatability", title, (spread, agreement), _rule_note(report))


def _recall_section(report: Mapping[str, Any]) -> _Section | None:
    rows_in = _rows(report, "recall")
    if not rows_in:
        return None
    rows = tuple(
        _row(
            _text(row, "backbone"),
            _text(row, "method"),
            _count(_num(row, "n")),
            _pct(_num(row, "base_candidate")),
            _pct(_num(row, "excerpt")),
            _pct(_num(row, "evidence")),
        )
        for row in rows_in
    )
    table = _Table(
        columns=("Backbone", "Method", "n", "Base candidates", "Excerpts", "Cited evidence"),
        rows=rows,
        label_columns=2,
        caption="Reference-root retention (%): trajectories whose reference root step is in each stage's set, "
        "first realization.",
    )
    return _Section("recall", "Recall diagnostics", (table,))


def _turns_section(report: Mapping[str, Any]) -> _Section | None:
    rows_in = [row for row in _rows(report, "turns") if _num(row, "realization") == 0]
    if not rows_in:
        return None
    rows = tuple(
        _row(
            _text(row, "backbone"),
            _text(row, "method"),
            _count(_num(row, "turn")),
            _count(_num(row, "n")),
            _pct(_num(row, "agent_acc")),
            _pct(_num(row, "step_acc")),
            _pct(_num(row, "step_pm5")),
            _pct(_num(row, "changed")),
            _count(_num(row, "evidence_tokens")),
            _count(_num(row, "evidence_total")),
        )
        for row in rows_in
    )
    table = _Table(
        columns=(
            *("Backbone", "Method", "Turn", "n"),
            *("Agent", "Step", "Step ±5", "Changed"),
            *("New", "Cumulative"),
        ),
        rows=rows,
        label_columns=3,
        groups=(("", 1), ("Accuracy (%)", 4), ("Evidence read (tokens)", 2)),
        caption="Multi-turn methods: the answer standing after each turn (headline aggregate), the share of "
        "trajectories whose answer changed at that turn, and the deduplicated evidence read (13-gram dedupe; "
        "mean per trajectory), first realization (every realization is in --json).",
    )
    return _Section("turns", "Turns", (table,), _rule_note(report))


def _with_interval(value: float | None, bounds: object) -> str:
    """``12.5 [5.1, 27.0]`` from a fraction and its [low, high] (percent); the bare number without bounds."""
    if value is None:
        return DASH
    if not isinstance(bounds, list | tuple) or len(bounds) != 2:
        return _pct(value)
    low, high = bounds
    return f"{value * 100:.1f} [{low * 100:.1f}, {high * 100:.1f}]"


def _delta_interval(row: Mapping[str, Any]) -> tuple[str, str]:
    """Δ and its interval in percentage points."""
    delta, low, high = (_num(row, k) for k in ("delta", "ci_low", "ci_high"))
    shown = DASH if delta is None else f"{delta * 100:+.1f}"
    interval = DASH if low is None or high is None else f"[{low * 100:.1f}, {high * 100:.1f}]"
    return shown, interval


def _span(bounds: object) -> str:
    return f"{bounds[0]}–{bounds[1]}" if isinstance(bounds, list | tuple) and len(bounds) == 2 else DASH
