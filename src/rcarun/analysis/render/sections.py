"""Every section of the report in reading order, the header, and the repeatability, recall and turns sections."""

from __future__ import annotations

from ..report.model import Report
from ..scoring import metric_label
from .cells import _accuracy_section, _full_metrics_section, _outcomes_section, _per_source_section
from .cost import _call_timing_section, _cost_section
from .model import (
    _METRICS,
    DASH,
    _aggregate_label,
    _Columns,
    _count,
    _finite,
    _is_fraction,
    _keyed_row,
    _listed,
    _num,
    _pct,
    _protocol,
    _Row,
    _row,
    _rule_note,
    _run,
    _Section,
    _steps,
    _Table,
    _totals,
)
from .paired import _complementarity_section, _components_section, _paired_section
from .studies import (
    _calibration_section,
    _fidelity_section,
    _length_section,
    _sensitivity_section,
    _source_out_section,
    _task_cluster_section,
)


def _sections(report: Report) -> list[_Section]:
    sections = [
        _accuracy_section(report),
        _outcomes_section(report),
        _full_metrics_section(report),
        _per_source_section(report),
        _paired_section(report),
        _task_cluster_section(report),
        _source_out_section(report),
        _components_section(report),
        _complementarity_section(report),
        _repeatability_section(report),
        _recall_section(report),
        _turns_section(report),
        _length_section(report),
        _fidelity_section(report),
        _calibration_section(report),
        _sensitivity_section(report),
        _cost_section(report),
        _call_timing_section(report),
    ]
    return [s for s in sections if s is not None]


_HOLM_WORDS = {
    "main": "App. B's: full RCTA against the paper's baselines, per metric (Holm-20) and over both metrics "
    "(Holm-40); any other comparison in a family of its own per metric",
    "ablation": "App. H's: the component conditions against full RCTA, per backbone",
    "metric": "every comparison of a metric together (--holm-family metric)",
    "all": "every comparison of the report together (--holm-family all)",
}


def _header_lines(report: Report) -> tuple[str, list[str]]:
    run = _run(report)
    title = f"rcarun report: {run.name or 'unnamed run'}"
    details = [
        f"run {run.run_id or DASH}, status {run.status or DASH}, created {run.created_at or DASH}",
        f"database: {report.db or DASH}",
    ]
    protocol = _protocol(report)
    if protocol.name:
        reason = protocol.reason or ""
        details.append(f"protocol: {protocol.name}{f' ({reason})' if reason else ''}")
        details.append(f"scoring: {protocol.scoring_rule or ''}")
    aggregate_reason = protocol.aggregate_reason or ""
    details.append(
        f"aggregate: {_aggregate_label(report)}{f' ({aggregate_reason})' if aggregate_reason else ''}"
    )
    resamples = protocol.resamples
    if protocol.name and resamples is not None:
        why = protocol.resamples_reason or ""
        family = protocol.holm_family or ""
        seed = "" if protocol.seed is None else str(protocol.seed)
        details.append(
            f"paired statistics: {_count(float(resamples))} bootstrap resamples{f' ({why})' if why else ''}, "
            f"seed {seed}; Holm families: "
            f"{_HOLM_WORDS.get(protocol.name if family == 'paper' else family, family)}"
        )
    totals = _totals(report)
    if totals:
        details.append(totals)
    reference = report.reference_method
    if reference:
        details.append(f"reference method for paired comparisons: {reference}")
    return title, details


def _repeatability_section(report: Report) -> _Section:
    rows_in = report.repeatability
    title = "Repeatability"
    if not rows_in:
        return _Section("repeatability", title, notes=("No repeated realizations in this report.",))
    spread_rows: list[_Row] = []
    agreement_rows: list[_Row] = []
    for row in rows_in:
        backbone, method = row.backbone, row.method
        names = ", ".join(str(r) for r in row.realizations)
        metrics = row.metrics
        ordered = [m for m in _METRICS if m in metrics] + [m for m in metrics if m not in _METRICS]
        for metric in ordered:
            stats = metrics[metric]
            fmt = _pct if _is_fraction(metric) else _steps
            spread_rows.append(
                _row(
                    backbone,
                    method,
                    metric_label(metric),
                    _count(float(stats.n)),
                    f"{fmt(_finite(stats.mean))} ± {fmt(_finite(stats.sd))}",
                    f"{fmt(_finite(stats.min))}–{fmt(_finite(stats.max))}",
                    fmt(_finite(stats.range)),
                )
            )
        pairs = [f"{a.first} vs {a.second}: {_pct(_finite(a.rate))}" for a in row.agreement]
        agreement_rows.append(
            _row(backbone, method, names, "; ".join(pairs) or DASH, _pct(_finite(row.mean_agreement)))
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


_RECALL_KEYS = ("base_candidate", "excerpt", "evidence")
_TURN_COLUMNS: _Columns = (
    *(("backbone", None), ("method", None), ("turn", _count), ("n", _count)),
    *((key, _pct) for key in ("agent_acc", "step_acc", "step_pm5", "changed")),
    *(("evidence_tokens", _count), ("evidence_total", _count)),
)


def _recall_section(report: Report) -> _Section | None:
    rows_in = _listed(report.recall)
    if not rows_in:
        return None
    columns = (("backbone", None), ("method", None), ("n", _count))
    rows = tuple(_keyed_row(row, (*columns, *((k, _pct) for k in _RECALL_KEYS))) for row in rows_in)
    table = _Table(
        columns=("Backbone", "Method", "n", "Base candidates", "Excerpts", "Cited evidence"),
        rows=rows,
        label_columns=2,
        caption="Reference-root retention (%): trajectories whose reference root step is in each stage's set, "
        "first realization.",
    )
    return _Section("recall", "Recall diagnostics", (table,))


def _turns_section(report: Report) -> _Section | None:
    rows_in = [row for row in _listed(report.turns) if _num(row, "realization") == 0]
    if not rows_in:
        return None
    rows = tuple(_keyed_row(row, _TURN_COLUMNS) for row in rows_in)
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
