"""The report's sections about its studies and cost: length groups, clusters, fidelity, sensitivity, calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..scoring import metric_label
from .model import (
    DASH,
    _aggregate_label,
    _confidence,
    _count,
    _has_gpu,
    _num,
    _pct,
    _protocol,
    _Row,
    _row,
    _rows,
    _rule_note,
    _Section,
    _Table,
    _text,
    _totals,
    _unique,
    _usd,
)
from .sections import (
    _accuracy_section,
    _complementarity_section,
    _components_section,
    _delta_interval,
    _full_metrics_section,
    _outcomes_section,
    _paired_section,
    _per_source_section,
    _recall_section,
    _repeatability_section,
    _span,
    _turns_section,
    _with_interval,
)


def _length_section(report: Mapping[str, Any]) -> _Section | None:
    rows_in = _rows(report, "length_groups")
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
    for row in _rows(report, "length_contrasts"):
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


def _task_cluster_section(report: Mapping[str, Any]) -> _Section | None:
    found = report.get("task_clusters")
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


def _source_out_section(report: Mapping[str, Any]) -> _Section | None:
    found = report.get("leave_one_source_out")
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


_COUNTS = ("calls", "attempts", "length_retries", "rate_limited")
_TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
_MONEY = ("cost_usd", "usd_per_trajectory", "budget_use")


def _sum(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [v for v in (_num(r, key) for r in rows) if v is not None]
    return sum(values) if values else None


def _cost_cells(row: Mapping[str, Any], gpu: bool = False) -> tuple[list[str], list[str]]:
    usage = [_count(_num(row, k)) for k in ("items", *_COUNTS, *_TOKENS)]
    budget = _num(row, "budget_use")
    money = [
        _usd(_num(row, "cost_usd")),
        *((_usd(_num(row, "gpu_usd")),) if gpu else ()),
        _usd(_num(row, "usd_per_trajectory")),
        _count(_num(row, "latency_p50_ms")),
        _count(_num(row, "latency_p95_ms")),
        DASH if budget is None else f"{budget * 100:.1f}%",
    ]
    return usage, money


def _cost_section(report: Mapping[str, Any]) -> _Section:
    cost = _rows(report, "cost")
    title = "Cost"
    if not cost:
        return _Section("cost", title, notes=("No cost rows in this report (no recorded calls).",))
    gpu = _has_gpu(report)
    usage_rows: list[_Row] = []
    money_rows: list[_Row] = []
    for backbone in _unique(_text(r, "backbone") for r in cost):
        mine = [r for r in cost if _text(r, "backbone") == backbone]
        for row in mine:
            labels = (backbone, _text(row, "method"), _text(row, "stage"))
            usage, money = _cost_cells(row, gpu)
            usage_rows.append(_row(*labels, *usage))
            money_rows.append(_row(*labels, *money))
        # Stage rows of one backbone × method add up to its USD per trajectory, so the sum over methods is the
        # cost of running every method once on one trajectory. Items and latencies do not add up.
        totals = {k: _sum(mine, k) for k in (*_COUNTS, *_TOKENS, *_MONEY, "gpu_usd")}
        usage, money = _cost_cells(totals, gpu)
        usage[0] = ""
        latency = 3 if gpu else 2
        money[latency : latency + 2] = ["", ""]
        usage_rows.append(_row(backbone, "total", "", *usage, total=True))
        money_rows.append(_row(backbone, "total", "", *money, total=True))
    labels = ("Backbone", "Method", "Stage")
    usage_table = _Table(
        columns=(
            *labels,
            *("Items", "Calls", "Attempts", "Length retries", "Rate limited"),
            *("Prompt", "Cached", "Completion", "Reasoning"),
        ),
        rows=tuple(usage_rows),
        label_columns=3,
        groups=(("", 5), ("Tokens", 4)),
        caption="Calls and tokens (prompt tokens include cached ones, completion tokens include reasoning).",
    )
    money_table = _Table(
        columns=(
            *labels,
            "USD",
            *(("GPU USD",) if gpu else ()),
            "USD / traj.",
            "p50 ms",
            "p95 ms",
            "Budget use",
        ),
        rows=tuple(money_rows),
        label_columns=3,
        caption="Money and time (budget use: share of the backbone's USD budget).",
    )
    notes = (
        "A backbone's total USD / traj. is the sum over its methods: running every method once on one trajectory.",
        *(
            (
                "GPU USD: the self-hosted replicas' GPU time, charged to the calls they served; USD and USD / traj. "
                "are the API's.",
            )
            if gpu
            else ()
        ),
    )
    return _Section("cost", title, (usage_table, money_table), notes)


def _call_timing_section(report: Mapping[str, Any]) -> _Section | None:
    """Per backbone: streamed answers, time to first token, decode rate and cut generations (``call_timing``,
    in newer report dicts only)."""
    timing = _rows(report, "call_timing")
    if not timing:
        return None
    rows = tuple(
        _row(
            _text(row, "backbone"),
            _count(_num(row, "attempts")),
            _count(_num(row, "streamed_calls")),
            _seconds(_num(row, "ttft_p50_s")),
            _seconds(_num(row, "ttft_p95_s")),
            _rate(_num(row, "decode_p50_tokens_per_s")),
            _rate(_num(row, "decode_p95_tokens_per_s")),
            _count(_num(row, "cut_calls")),
            _usd(_num(row, "cut_usd")),
        )
        for row in timing
    )
    table = _Table(
        columns=(
            *("Backbone", "Attempts", "Streamed", "TTFT p50 s", "TTFT p95 s"),
            *("Decode p50 tok/s", "Decode p95 tok/s", "Cut", "Cut USD"),
        ),
        rows=rows,
        caption="How the answers came, over attempts sent (cache hits left out).",
    )
    notes = (
        "Streamed: answers that came as a server-sent-event stream. TTFT: time to first token, from sending the "
        "request to the first chunk of answer, thinking or tool-call text; decode: completion tokens after the "
        "first over the seconds from the first token to the last. Nearest-rank percentiles over the attempts that "
        "have them; – where unknown (no streamed answer, or a file from before they were recorded).",
        "Cut: generations cut short (silence timeout, disconnect, size cap, call deadline, Ctrl-C) and charged an "
        "estimate of what they generated; their USD is in the cost above too.",
    )
    return _Section("call-timing", "Call timing", (table,), notes)


def _seconds(value: float | None) -> str:
    return DASH if value is None else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}"


def _pp(value: float | None) -> str:
    """A difference of fractions in percentage points, two decimals (App. A reports 1.665, 3.771)."""
    return DASH if value is None else f"{value * 100:.2f}"


def _fidelity_section(report: Mapping[str, Any]) -> _Section | None:
    found = report.get("fidelity")
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


def _calibration_section(report: Mapping[str, Any]) -> _Section | None:
    found = report.get("calibration")
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


def _sensitivity_section(report: Mapping[str, Any]) -> _Section | None:
    found = report.get("label_sensitivity")
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


def _sections(report: Mapping[str, Any]) -> list[_Section]:
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


def _header_lines(report: Mapping[str, Any]) -> tuple[str, list[str]]:
    found = report.get("run")
    run: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    title = f"rcarun report: {_text(run, 'name') or 'unnamed run'}"
    details = [
        f"run {_text(run, 'run_id') or DASH}, status {_text(run, 'status') or DASH}, "
        f"created {_text(run, 'created_at') or DASH}",
        f"database: {_text(report, 'db') or DASH}",
    ]
    protocol = _protocol(report)
    if protocol.get("name"):
        reason = _text(protocol, "reason")
        details.append(f"protocol: {_text(protocol, 'name')}{f' ({reason})' if reason else ''}")
        details.append(f"scoring: {_text(protocol, 'scoring_rule')}")
    aggregate_reason = _text(protocol, "aggregate_reason")
    details.append(
        f"aggregate: {_aggregate_label(report)}{f' ({aggregate_reason})' if aggregate_reason else ''}"
    )
    resamples = _num(protocol, "resamples")
    if protocol.get("name") and resamples is not None:
        why = _text(protocol, "resamples_reason")
        family = _text(protocol, "holm_family")
        details.append(
            f"paired statistics: {_count(resamples)} bootstrap resamples{f' ({why})' if why else ''}, seed "
            f"{_text(protocol, 'seed')}; Holm families: "
            f"{_HOLM_WORDS.get(_text(protocol, 'name') if family == 'paper' else family, family)}"
        )
    totals = _totals(report)
    if totals:
        details.append(totals)
    reference = report.get("reference_method")
    if reference:
        details.append(f"reference method for paired comparisons: {reference}")
    return title, details
