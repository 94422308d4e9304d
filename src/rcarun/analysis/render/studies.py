"""The report's sections of its studies: length groups, task clusters, leave-one-source-out, fidelity, calibration,
label sensitivity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..report.model import Report
from ..scoring import metric_label
from .model import (
    DASH,
    _confidence,
    _count,
    _delta_interval,
    _listed,
    _num,
    _pct,
    _row,
    _rows,
    _rule_note,
    _Section,
    _span,
    _Table,
    _text,
    _unique,
    _with_interval,
)


def _length_section(report: Report) -> _Section | None:
    rows_in = _listed(report.length_groups)
    if not rows_in:
        return None

    def cell(row: Mapping[str, Any], metric: str) -> str:
        intervals = row.get("intervals")
        return _with_interval(
            _num(row, metric), intervals.get(metric) if isinstance(intervals, Mapping) else None
        )

    rows = tuple(
        _row(
            _text(row, "backbone"),
            _text(row, "method"),
            f"{_count(_num(row, 'low'))}–{_count(_num(row, 'high'))}",
            _count(_num(row, "n")),
            cell(row, "step_acc"),
            cell(row, "step_pm5"),
            cell(row, "agent_acc"),
        )
        for row in rows_in
    )
    level = f"{_confidence(report):.0%}"
    tables = [
        _Table(
            columns=("Backbone", "Method", "Steps", "n", "Step", "Step ±5", "Agent"),
            rows=rows,
            label_columns=2,
            caption="Accuracy (%) by recorded trajectory length (shared partition, bounds inclusive), first "
            f"realization, with Wilson {level} intervals.",
        )
    ]
    # One row per cell, a column per metric: "Δ [low, high]".
    contrasts: dict[tuple[str, str, str, str], dict[str, str]] = {}
    for row in _listed(report.length_contrasts):
        key = (
            _text(row, "backbone"),
            _text(row, "method"),
            _span(row.get("longest")),
            _span(row.get("shortest")),
        )
        contrasts.setdefault(key, {})[_text(row, "metric")] = " ".join(_delta_interval(row))
    if contrasts:
        tables.append(
            _Table(
                columns=("Backbone", "Method", "Longest", "Shortest", "Step", "Step ±5", "Agent"),
                rows=tuple(
                    _row(*key, *(by.get(m, DASH) for m in ("step_acc", "step_pm5", "agent_acc")))
                    for key, by in contrasts.items()
                ),
                label_columns=2,
                caption=f"Longest group minus shortest (pp), with Newcombe's {level} interval (hybrid score, "
                "independent groups; App. F.1).",
            )
        )
    notes = (
        *_rule_note(report),
        "Intervals are pointwise and conditional on the fixed groups (App. F.1); a group's interval counts its "
        "scored trajectories.",
    )
    return _Section("length-groups", "Length groups", tuple(tables), notes)


def _task_cluster_section(report: Report) -> _Section | None:
    found = report.task_clusters
    if not isinstance(found, Mapping) or not _rows(found, "rows"):
        return None
    rows = tuple(
        _row(
            _text(row, "backbone"),
            f"{_text(row, 'method_a')} vs {_text(row, 'method_b')}",
            _count(_num(row, "n")),
            _count(_num(row, "tasks")),
            *_delta_interval(row),
        )
        for row in _rows(found, "rows")
    )
    level = f"{_confidence(report):.0%}"
    table = _Table(
        columns=("Backbone", "A vs B", "n", "Tasks", "Δ Step Acc", "Interval"),
        rows=rows,
        label_columns=2,
        caption=f"Paired Step Acc differences A − B (pp) with the pointwise {level} interval of a source-stratified "
        "bootstrap over tasks, first realization.",
    )
    trajectories, tasks = _num(found, "trajectories"), _num(found, "tasks")
    without = _num(found, "without_task") or 0
    notes = [
        *_rule_note(report),
        f"{_count(trajectories)} trajectories in {_count(tasks)} tasks. Each resample draws, within each source, "
        "tasks with replacement, a task bringing all its attempts (trajectories with the same task instruction, "
        "`trajectories.task_sha256`), as App. B's check that keeps repeated attempts together; the aggregate, "
        "resamples and seed are the paired comparisons'.",
    ]
    if without:
        notes.append(
            f"{_count(without)} trajectories have no stored task (no task instruction, or a results.db written "
            "before schema 6): each counts as a task of its own."
        )
    if trajectories is not None and trajectories == tasks:
        notes.append("No task has two attempts here, so the intervals are the paired comparisons' own.")
    return _Section("task-clusters", "Task-cluster bootstrap (App. B)", (table,), tuple(notes))


def _source_out_section(report: Report) -> _Section | None:
    found = report.leave_one_source_out
    if not isinstance(found, Mapping) or not _rows(found, "rows"):
        return None
    rows_in = _rows(found, "rows")
    left_out = _unique(_text(row, "excluded") for row in rows_in if row.get("excluded") is not None)
    # One row per comparison, one column per source left out ("none": every source kept).
    cells: dict[tuple[str, str], dict[str, str]] = {}
    kept: dict[str, str] = {}
    for row in rows_in:
        key = (
            f"{_text(row, 'method_a')} vs {_text(row, 'method_b')}",
            ", ".join(map(str, row.get("backbones") or ())),
        )
        delta, interval = _delta_interval(row)
        column = _text(row, "excluded") or "none"
        cells.setdefault(key, {})[column] = f"{delta} {interval}"
        kept.setdefault(column, _count(_num(row, "n")))
    columns = ["none", *left_out]
    rows = tuple(
        _row(pair, backbones, *(by.get(c, DASH) for c in columns)) for (pair, backbones), by in cells.items()
    )
    level = f"{_confidence(report):.0%}"
    table = _Table(
        columns=("A vs B", "Backbones", "None left out", *(f"Without {source}" for source in left_out)),
        rows=rows,
        label_columns=2,
        caption=f"Step Acc gain A − B (pp) averaged over the backbones within each trajectory, with the pointwise "
        f"{level} interval, every source kept and each left out in turn; first realization.",
    )
    notes = (
        *_rule_note(report),
        f"Trajectories kept: {kept['none']} with every source; "
        + ", ".join(f"{kept[c]} without {c}" for c in left_out)
        + ". As the paper's Table 13: each "
        "trajectory's outcomes are averaged over App. B's backbones on which both methods' numbers are shown, then "
        "aggregated over the retained sources; the source-stratified bootstrap keeps a trajectory's backbone "
        "outcomes together and the retained sources' sizes. The columns are sensitivities of the observed "
        "aggregate to source composition, not simultaneous intervals.",
    )
    return _Section("leave-one-source-out", "Leave one source out (Table 13)", (table,), notes)


def _pp(value: float | None) -> str:
    """A difference of fractions in percentage points, two decimals (App. A reports 1.665, 3.771)."""
    return DASH if value is None else f"{value * 100:.2f}"


def _fidelity_section(report: Report) -> _Section | None:
    found = report.fidelity
    if not isinstance(found, Mapping):
        return None
    title = "Mini against Full (App. A)"
    rows_in = _rows(found, "rows")
    full_run, mini_run = _text(found, "full_run"), _text(found, "mini_run")
    notes = [
        f"Full run: {full_run} ({_text(found, 'full_db')}); Mini run: {mini_run}.",
        *_rule_note(report),
    ]
    excluded = _rows(found, "excluded")
    if excluded:
        notes.append(
            "Left out: "
            + "; ".join(
                f"{_text(r, 'backbone')} · {_text(r, 'method')} ({_text(r, 'why')})" for r in excluded
            )
            + "."
        )
    if not rows_in:
        return _Section(
            "fidelity", title, notes=("No backbone × method has a shown number in both runs.", *notes)
        )
    cached = found.get("cached") is True
    rows = []
    for row in rows_in:
        mixture = row.get("post_stratified")
        mix: Mapping[str, Any] = mixture if isinstance(mixture, Mapping) else {}
        rows.append(
            _row(
                _text(row, "backbone"),
                _text(row, "method"),
                metric_label(_text(row, "metric")),
                _pct(_num(row, "full")),
                *((_pct(_num(row, "mini_cached")), _pp(_num(row, "abs_dev_cached"))) if cached else ()),
                _pct(_num(row, "mini")),
                _pp(_num(row, "abs_dev")),
                _pct(_num(mix, "full")),
                _pct(_num(mix, "mini_cached" if cached else "mini")),
                _pp(_num(mix, "abs_dev_cached" if cached else "abs_dev")),
            )
        )
    macro_heads = ("Full", *(("Mini (Full preds)", "|Δ| pp") if cached else ()), "Mini run", "|Δ| pp")
    macro = _Table(
        columns=("Backbone", "Method", "Metric", *macro_heads, "Full", "Mini", "|Δ| pp"),
        rows=tuple(rows),
        label_columns=3,
        groups=(("Macro over sources (Table 6)", len(macro_heads)), ("Original mixture (Table 10)", 3)),
        caption="Fidelity of the Mini run to the Full run: accuracy (%) and absolute difference (pp).",
    )
    notes += _fidelity_notes(found, cached)
    return _Section("fidelity", title, (macro, _fidelity_per_source(found, rows_in, cached)), tuple(notes))


def _fidelity_per_source(
    found: Mapping[str, Any], rows_in: Sequence[Mapping[str, Any]], cached: bool
) -> _Table:
    """Full/Mini accuracy per source (Table 9's layout)."""
    sources = [str(s) for s in found.get("sources", {})] if isinstance(found.get("sources"), Mapping) else []
    key = "mini_cached" if cached else "mini"
    per_source_rows = []
    for row in rows_in:
        per_source = row.get("per_source")
        cells: Mapping[str, Any] = per_source if isinstance(per_source, Mapping) else {}
        values = []
        for source in sources:
            entry = cells.get(source)
            entry = entry if isinstance(entry, Mapping) else {}
            values.append(f"{_pct(_num(entry, 'full'))}/{_pct(_num(entry, key))}")
        per_source_rows.append(
            _row(_text(row, "backbone"), _text(row, "method"), metric_label(_text(row, "metric")), *values)
        )
    return _Table(
        columns=("Backbone", "Method", "Metric", *sources),
        rows=tuple(per_source_rows),
        label_columns=3,
        caption=f"Per source, Full/Mini accuracy (%; Mini from {'the Full run’s predictions' if cached else 'the Mini run'}"
        "), Table 9 layout.",
    )


def _fidelity_notes(found: Mapping[str, Any], cached: bool) -> list[str]:
    """Each backbone's mean and max deviation, and what the comparison can and cannot say."""
    notes = []
    for entry in _rows(found, "summary"):
        text = (
            f"{_text(entry, 'backbone')}: over {_count(_num(entry, 'pairs'))} method–metric pairs, mean |Δ| "
            f"{_pp(_num(entry, 'mean_abs_dev'))} pp and max {_pp(_num(entry, 'max_abs_dev'))} pp for the Mini run"
        )
        if cached:
            text += (
                f"; {_pp(_num(entry, 'mean_abs_dev_cached'))} and {_pp(_num(entry, 'max_abs_dev_cached'))} pp with "
                "the Full run's own predictions on the Mini trajectories (the paper's fidelity: subset selection "
                "alone)"
            )
        notes.append(text + ".")
    if not cached:
        notes.append(
            "Some Mini trajectories are not in the Full run, so the Full run's predictions cannot stand in for "
            "the Mini side: the Mini run's own predictions add run-to-run variance to subset selection."
        )
    notes.append(
        "Both sides of the Macro comparison weight sources equally (Sec. 5.1); the original-mixture columns "
        "compare Full pooled with Mini post-stratified to the Full run's source sizes, a separate estimand."
    )
    return notes


def _pp3(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.3f}"


def _pair_name(pair: object) -> str:
    """``method metric`` of a calibration pair."""
    if not isinstance(pair, Mapping):
        return DASH
    return f"{_text(pair, 'method')} {metric_label(_text(pair, 'metric'))}"


def _calibration_section(report: Report) -> _Section | None:
    found = report.calibration
    if not isinstance(found, Mapping):
        return None
    title = "Sample-size calibration (App. A, Table 5)"
    rows = []
    for row in _rows(found, "rows"):
        quotas = row.get("quotas")
        shares = "/".join(str(v) for v in quotas.values()) if isinstance(quotas, Mapping) else DASH
        rows.append(
            _row(
                _text(row, "backbone"),
                _count(_num(row, "size")),
                shares,
                _pp3(_num(row, "max_median")),
                _pair_name(row.get("max_median_pair")),
                _pp3(_num(row, "max_p95")),
                _pair_name(row.get("max_p95_pair")),
                "Yes" if row.get("passes") is True else "No",
            )
        )
    criteria = found.get("criteria")
    limits: Mapping[str, Any] = criteria if isinstance(criteria, Mapping) else {}
    notes = [
        *_rule_note(report),
        f"{_count(_num(found, 'draws'))} equal-quota simple random samples per size (seed {_text(found, 'seed')}), "
        "shared by every method; each sample scored by the Macro over sources, against the Full Macro. Max. median "
        "and max. p95 (nearest rank): the largest per method–metric median and 95th-percentile absolute error "
        f"(pp). Pass: max. median ≤ {_pp(_num(limits, 'max_median'))} pp and max. p95 ≤ "
        f"{_pp(_num(limits, 'max_p95'))} pp. The draws follow the protocol, not the authors' generator.",
    ]
    skipped = found.get("skipped")
    if isinstance(skipped, Sequence) and skipped:
        notes.append(
            f"Sizes above the run's trajectory count, skipped: {', '.join(str(s) for s in skipped)}."
        )
    if not rows:
        return _Section("calibration", title, notes=("No size could be drawn from this run.", *notes))
    sources = ""
    first = _rows(found, "rows")[0].get("quotas")
    if isinstance(first, Mapping):
        sources = " (" + "/".join(str(s) for s in first) + ")"
    table = _Table(
        columns=("Backbone", "Size", f"Quotas{sources}", "Max. median", "pair", "Max. p95", "pair", "Pass"),
        rows=tuple(rows),
        label_columns=1,
        caption="Absolute score errors of equal-quota samples against Full, summarised over draws (pp).",
    )
    return _Section("calibration", title, (table,), tuple(notes))


def _tiers(order: object) -> str:
    """``a > b = c`` from tiers of tied names, best first."""
    tiers = order if isinstance(order, list) else []
    return " > ".join(" = ".join(str(m) for m in tier) for tier in tiers if isinstance(tier, list))


def _sensitivity_section(report: Report) -> _Section | None:
    found = report.label_sensitivity
    if not isinstance(found, Mapping):
        return None
    title = "Label sensitivity (App. K.1, Table 22)"
    confidence = _num(found, "confidence") or 0.95
    low, high = (1 - confidence) / 2 * 100, (1 + confidence) / 2 * 100
    notes = [
        *_rule_note(report),
        f"{_count(_num(found, 'n'))} trajectories with two or more observed annotations "
        f"({_count(_num(found, 'annotated'))} annotated qids in the file, {_count(_num(found, 'unknown'))} not in "
        f"this run, {_count(_num(found, 'single'))} with a single annotation). Each of "
        f"{_count(_num(found, 'draws'))} draws (seed {_text(found, 'seed')}) takes one observed annotation per "
        "trajectory uniformly and uses its root step for every method; predictions stay fixed and trajectories "
        "weigh equally. Cells: final-label score → mean over draws "
        f"[{low:g}th, {high:g}th percentiles] (%). Rank 1: the share of draws in which the method strictly "
        "leads every other (ties are no wins). Full ordering retained: the share of draws in which every pair of "
        "methods compares as under the final labels (a tie only where they tie). Intervals describe label "
        "sensitivity on fixed samples, not population confidence intervals.",
    ]

    def cell(row: Mapping[str, Any], scale: float = 100) -> str:
        final, mean = _num(row, "final"), _num(row, "mean")
        lo, hi = _num(row, "low"), _num(row, "high")
        if final is None or mean is None or lo is None or hi is None:
            return DASH
        return f"{final * scale:.1f} → {mean * scale:.1f} [{lo * scale:.1f}, {hi * scale:.1f}]"

    rows = [
        _row(
            _text(row, "backbone"),
            _text(row, "method"),
            metric_label(_text(row, "metric")),
            cell(row),
            _pct(_num(row, "rank1")),
        )
        for row in _rows(found, "rows")
    ]
    rows += [
        _row(
            _text(row, "backbone"),
            f"gap: {_text(row, 'method')} − strongest other",
            metric_label(_text(row, "metric")),
            cell(row) + " pp",
            "",
        )
        for row in _rows(found, "gaps")
    ]
    rows += [
        _row(
            _text(row, "backbone"),
            f"full ordering retained: {_tiers(row.get('order'))}",
            metric_label(_text(row, "metric")),
            _pct(_num(row, "retained")),
            "",
        )
        for row in _rows(found, "orderings")
    ]
    if not rows:
        return _Section(
            "label-sensitivity", title, notes=("No multiply annotated trajectory to draw from.", *notes)
        )
    table = _Table(
        columns=("Backbone", "Method", "Metric", "Final → mean [interval]", "Rank 1 (%)"),
        rows=tuple(rows),
        label_columns=3,
        caption="Root-step scores under observed human labels (%; gap rows in pp), first realization.",
    )
    return _Section("label-sensitivity", title, (table,), tuple(notes))
