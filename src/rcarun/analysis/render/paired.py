"""The report's paired sections: comparisons between methods and backbones, components, complementarity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..report.model import PairedRow, Report
from ..scoring import metric_label
from .cells import _coverage_notes
from .model import (
    DASH,
    _Cell,
    _count,
    _finite,
    _is_fraction,
    _listed,
    _num,
    _p,
    _pct,
    _presets,
    _protocol,
    _Row,
    _row,
    _rows,
    _rule_note,
    _Section,
    _steps,
    _Table,
    _text,
)

_PAIRED_STATS = ("Metric", "Δ (pp)", "95% CI (pp)", "W/L", "p (McNemar)", "p (Holm)", "n")


def _paired_cells(row: PairedRow, joint: bool = False, family: bool = False) -> tuple[str, ...]:
    """Metric, Δ, interval, W/L, p-values and n of one paired comparison (pp; steps for the MAE), then the
    joint Holm p-value and the family when asked for."""
    metric = row.metric
    delta, low, high = _finite(row.delta), _finite(row.ci_low), _finite(row.ci_high)
    scale = 100 if _is_fraction(metric) else 1
    shown = DASH if delta is None else f"{delta * scale:+.1f}"
    interval = DASH if low is None or high is None else f"[{low * scale:.1f}, {high * scale:.1f}]"
    wins, losses = row.wins, row.losses
    wl = DASH if wins is None or losses is None else f"{round(wins)}/{round(losses)}"
    p_values = (_p(_finite(row.p_mcnemar)), _p(_finite(row.p_holm)))
    extra = (
        *((_p(_finite(row.p_holm_joint)),) if joint else ()),
        *((row.family or "",) if family else ()),
    )
    return (metric_label(metric), shown, interval, wl, *p_values, _count(float(row.n)), *extra)


def _family_notes(report: Report) -> list[str]:
    """The paired statistics' settings and every Holm family of the report, in words."""
    protocol = _protocol(report)
    notes = []
    resamples = protocol.resamples
    if resamples is not None:
        why = protocol.resamples_reason or ""
        seed = "" if protocol.seed is None else str(protocol.seed)
        notes.append(
            f"Intervals from {_count(resamples)} resamples{f' ({why})' if why else ''}"
            f"{f', seed {seed}' if seed else ''}."
        )
    families = protocol.families
    if families:
        listed = "; ".join(f"{f.family} ({_count(float(f.tests))} tests): {f.description}" for f in families)
        notes.append(f"Holm families: {listed}.")
    return notes


def _not_compared_notes(report: Report) -> list[str]:
    """The methods the protocol leaves out of the paired comparisons, and why."""
    not_compared = _protocol(report).not_compared
    if not not_compared:
        return []
    listed = "; ".join(f"{r.method}: {r.why}" for r in not_compared)
    return [f"Not in these comparisons: {listed}."]


def _methods_table(report: Report, paired: Sequence[PairedRow], family: bool) -> _Table:
    """Paired differences between methods on one backbone (against the reference method, when there is one)."""
    reference = report.reference_method
    against = f" against {reference}" if reference else ""
    joint = any(_finite(r.p_holm_joint) is not None for r in paired)
    rows = tuple(
        _row(
            r.backbone_a,
            f"{r.method_a} vs {r.method_b}",
            *_paired_cells(r, joint, family),
        )
        for r in paired
    )
    caption = f"Paired differences A − B between methods{against}, first realization."
    tail = ("Family",) if family else ()
    heads = ("Backbone", "A vs B", *_PAIRED_STATS, *(("p (Holm, both)",) if joint else ()), *tail)
    return _Table(heads, rows, label_columns=3, caption=caption)


def _paired_section(report: Report) -> _Section:
    paired = report.paired
    across = report.paired_backbones  # the same method on two backbones, when the builder made them
    kinds = report.paired_across  # a method on a local backbone against one on a chat backbone
    title = "Paired comparisons"
    excluded = [f"{r.backbone} · {r.method} ({r.status})" for r in report.excluded]
    left_out = f"Left out (no number shown, see Outcomes): {', '.join(excluded)}." if excluded else None
    if not paired and not across and not kinds:
        notes_only = (
            "No paired comparisons in this report.",
            *((left_out,) if left_out else ()),
            *_not_compared_notes(report),
        )
        return _Section("paired", title, notes=notes_only)
    family = any(r.family is not None for r in (*paired, *across, *kinds))
    tail = ("Family",) if family else ()
    tables = [_methods_table(report, paired, family)] if paired else []
    if across:
        rows = tuple(
            _row(
                r.method_a,
                f"{r.backbone_a} vs {r.backbone_b}",
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
                f"{r.method_a} · {r.backbone_a}",
                f"{r.method_b} · {r.backbone_b}",
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
            if any(_finite(r.p_holm_joint) is not None for r in paired)
            else "."
        ),
        *_family_notes(report),
        *_not_compared_notes(report),
    ]
    if any(not _is_fraction(r.metric) for r in (*paired, *across, *kinds)):
        notes.append("Root MAE differences and intervals are in steps, not percentage points.")
    if left_out:
        notes.append(left_out)
    return _Section("paired", title, tuple(tables), tuple(notes))


def _components_section(report: Report) -> _Section | None:
    found = report.components
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
        *_coverage_notes((_text(row, "method"), row.get("coverage_rule")) for row in rows_in),
        "MAE n: non-abstaining outputs with a parseable in-range step (the MAE's outputs). Δ: the condition's "
        "Step Acc minus full RCTA's, with its pointwise source-stratified paired-bootstrap interval "
        f"({_count(_num(found, 'resamples'))} resamples, seed {_text(found, 'seed')}); W/L: trajectories only the "
        f"condition / only full RCTA gets right; exact McNemar p, Holm over the conditions of the backbone "
        f"({_text(found, 'family')}).",
    ]
    return _Section("components", title, (table,), tuple(notes))


def _complementarity_section(report: Report) -> _Section:
    rows_in = _listed(report.complementarity)
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
