"""Render a report dict as terminal tables or as one self-contained HTML page with plots.

``rcarun report`` builds its numbers once, as a plain JSON-able dict (the schema is documented with the report
builder); this module only lays them out, so the text and the HTML can never disagree about a number. Both
renderers share one table model: every section is built once as `_Section` (plain-text cells) and then drawn by
`_text_table` or `_html_table`.

Conventions, as in the LongRCA paper's tables:

* Accuracies are fractions in the dict and percentages here, with one decimal; differences are percentage
  points (pp). Root MAE is in steps, one decimal. USD has four decimals, p-values three significant digits,
  token counts thousands separators. A missing number (``None``) is shown as "–".
* The headline table follows Table 3: rows are methods, columns are Agent and Step Acc per backbone, using the
  report's aggregate (``macro`` or ``pooled``) of each backbone × method's first realization. The highest point
  estimate per backbone and metric, as displayed, is marked (``*`` in text, bold in HTML); ties are all marked.
  Only numbers that rest on answers compete, and only above 0: a cell fails when the report does not show it
  (``shown`` false: readable answers for less than half the expected trajectories), when nothing of it was
  scored, or when its outcome's readable answers fall below the report's ``min_readable_share`` (checked here
  too, so that no flag alone decides). A failed cell prints its status (``failed``, ``skipped``,
  ``unreadable``, ...) instead of a number, in HTML with its most frequent message; a shown number that counts
  failed, skipped or unreadable items as errors carries ``†``. The footnotes say, per backbone × method, how
  many items each number counts as errors and why.
* The outcomes (predictions, unreadable answers, fallback decisions, failed, skipped, interrupted or never-run
  items) open the report: totals in the header, then the ``Outcomes`` section.
* The HTML page reads at a glance: a summary first (run, items and failures by cause, coverage, spend, what
  served each self-hosted backbone), then Table 3 with an interval beside each number, paired comparisons,
  repeatability and cost as compact tables with every row folded under them; the long tail (outcomes per
  cell, full metrics, per-source tables, complementarity, the protocol's settings, ...) folded in
  ``<details>``; a table of contents. Each cell's interval is the report's (`_interval`). Keys that newer
  report dicts add (``served_by``, cost rows' ``gpu_usd``, ``call_timing``) are shown when present.
* The page has no external resources and no scripts: inline CSS and three matplotlib plots embedded as base64
  PNG, drawn on `matplotlib.figure.Figure` with the Agg canvas (no pyplot, so no global state and nothing to
  close). Plots run from 0 to 100%, carry intervals as error bars, size themselves by the number of bars, and
  tell up to 16 methods apart by colour (`PALETTE`), more by hatch and marker; a failed cell is marked as one,
  never drawn as a zero. A plot without data is replaced by a sentence saying why. Every string that comes
  from the data (method, backbone and source names are user-controlled) goes through `html.escape`.
* When the report is ``simulated``, both renderers open with a banner: the backbones were rcarun's mock server,
  and the numbers exercise the engine, not any model.
"""

from __future__ import annotations

import base64
import html
import io
import math
import textwrap
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .scoring import METRIC_BY_NAME, METRICS, metric_label
from .stats import stratified_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PALETTE", "method_styles", "metric_label", "render_html", "render_text"]

DASH = "–"
_GAP = "  "  # between text columns; two spaces so that names with single spaces stay one cell
_TEXT_WIDTH = 100
_DPI = 110
_METRICS = tuple(m.name for m in METRICS)
_SIMULATED = (
    "SIMULATED BACKBONES: every backbone in this run was rcarun's mock server, or a local model with random "
    "weights (tiny). The numbers below show the engine at work (scoring, statistics, cost accounting); they are "
    "not any model's accuracy."
)


# --- number formatting ---------------------------------------------------------------------------------------


def _num(row: Mapping[str, Any] | None, key: str) -> float | None:
    """A finite number from the dict, or None (missing, null or NaN)."""
    if row is None:
        return None
    value = row.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    return "" if value is None else str(value)


def _pct(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.1f}"


def _steps(value: float | None) -> str:
    return DASH if value is None else f"{value:.1f}"


def _usd(value: float | None) -> str:
    return DASH if value is None else f"{value:.4f}"


def _p(value: float | None) -> str:
    return DASH if value is None else f"{value:#.3g}"


def _count(value: float | None) -> str:
    return DASH if value is None else f"{round(value):,}"


def _is_fraction(metric: str) -> bool:
    """A fraction is shown as a percentage, the MAE in steps; an unknown name is a fraction unless an MAE."""
    found = METRIC_BY_NAME.get(metric)
    return found.fraction if found else "mae" not in metric


def _metric_value(metric: str, value: float | None) -> str:
    return _pct(value) if _is_fraction(metric) else _steps(value)


# --- the table model -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Cell:
    text: str
    best: bool = False
    muted: bool = False  # a status word where a number would be (HTML: italic, dark red)
    interval: str = ""  # HTML only: the number's confidence interval, beside it
    reason: str = ""  # HTML only: why a muted cell has no number


@dataclass(frozen=True, slots=True)
class _Row:
    cells: tuple[_Cell, ...]
    total: bool = False


@dataclass(frozen=True, slots=True)
class _Table:
    """A table of plain-text cells.

    ``label_columns`` leading columns hold names (left-aligned); the rest hold numbers (right-aligned).
    ``groups`` are spanning headers (label, number of columns) over the number columns, as in Table 3.
    """

    columns: tuple[str, ...]
    rows: tuple[_Row, ...]
    label_columns: int = 1
    groups: tuple[tuple[str, int], ...] = ()
    caption: str = ""


@dataclass(frozen=True, slots=True)
class _Section:
    key: str
    title: str
    tables: tuple[_Table, ...] = ()
    notes: tuple[str, ...] = ()


def _row(*texts: str, total: bool = False) -> _Row:
    return _Row(tuple(_Cell(t) for t in texts), total=total)


# --- reading the report ----------------------------------------------------------------------------------------


def _rows(report: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = report.get(key)
    return [row for row in value if isinstance(row, Mapping)] if isinstance(value, Sequence) else []


def _presets(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    value = cell.get("presets")
    return value if isinstance(value, Mapping) else {}


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _aggregate(report: Mapping[str, Any]) -> str:
    return "pooled" if report.get("aggregate") == "pooled" else "macro"


def _first_realizations(report: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    """(backbone, method) -> its metrics row with the lowest realization, in the report's order."""
    chosen: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in _rows(report, "metrics"):
        key = (_text(row, "backbone"), _text(row, "method"))
        realization = _num(row, "realization") or 0.0
        if key not in chosen or realization < (_num(chosen[key], "realization") or 0.0):
            chosen[key] = row
    return chosen


def _headline(report: Mapping[str, Any], row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The metric dict of the report's aggregate: the ``macro`` sub-dict or the top-level (pooled) keys."""
    if _aggregate(report) == "pooled":
        return row
    macro = row.get("macro")
    return macro if isinstance(macro, Mapping) else None


def _sources(report: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for row in _rows(report, "metrics"):
        per_source = row.get("per_source")
        if isinstance(per_source, Mapping):
            names.extend(str(s) for s in per_source)
    return _unique(names)


def _per_source(row: Mapping[str, Any], source: str) -> Mapping[str, Any] | None:
    per_source = row.get("per_source")
    if not isinstance(per_source, Mapping):
        return None
    metrics = per_source.get(source)
    return metrics if isinstance(metrics, Mapping) else None


def _aggregate_label(report: Mapping[str, Any]) -> str:
    if _aggregate(report) == "pooled":
        return "pooled: every trajectory weighs the same"
    k = len(_sources(report))
    name = f"Macro-{k}" if k else "macro"
    return f"{name}: each source's mean, then the unweighted mean over sources"


def _protocol(report: Mapping[str, Any]) -> Mapping[str, Any]:
    found = report.get("protocol")
    return found if isinstance(found, Mapping) else {}


def _rule_note(report: Mapping[str, Any], *, full: bool = False) -> tuple[str, ...]:
    """The scoring rule a table used, as a footnote: in full, or in short (none for a dict from before
    protocols)."""
    protocol = _protocol(report)
    rule = _text(protocol, "scoring_rule")
    if not rule:
        return ()
    name = _text(protocol, "name")
    if full:
        return (f"Scoring rule{f' ({name} protocol)' if name else ''}: {rule}.",)
    abstentions = (
        "abstentions scored on their fields"
        if protocol.get("abstentions") == "fields"
        else "abstentions as errors"
    )
    suffixes = "handoff suffixes kept" if protocol.get("keep_handoff") is True else "handoff suffixes dropped"
    return (f"Scoring: {name} protocol rule ({abstentions}; {suffixes}; see the header).",)


def _has_gpu(report: Mapping[str, Any]) -> bool:
    """Whether any cost row charges self-hosted GPU time (``gpu_usd``, present in newer reports only)."""
    return any(_num(row, "gpu_usd") for row in _rows(report, "cost"))


def _usd_per_trajectory(report: Mapping[str, Any], *, with_gpu: bool = False) -> dict[tuple[str, str], float]:
    """(backbone, method) -> USD per trajectory, summed over stages (stages without a figure are skipped); with
    ``with_gpu``, plus the cell's GPU charge over its work items (the most items any of its stages saw)."""
    totals: dict[tuple[str, str], float] = {}
    gpu: dict[tuple[str, str], float] = {}
    items: dict[tuple[str, str], float] = {}
    for row in _rows(report, "cost"):
        key = (_text(row, "backbone"), _text(row, "method"))
        value = _num(row, "usd_per_trajectory")
        if value is not None:
            totals[key] = totals.get(key, 0.0) + value
        gpu[key] = gpu.get(key, 0.0) + (_num(row, "gpu_usd") or 0.0)
        items[key] = max(items.get(key, 0.0), _num(row, "items") or 0.0)
    if with_gpu:
        for key, charge in gpu.items():
            if charge and items[key]:
                totals[key] = totals.get(key, 0.0) + charge / items[key]
    return totals


def _best_flags(values: Sequence[float | None], fmt: Callable[[float | None], str]) -> list[bool]:
    """Mark the highest value as displayed (so that visible ties are all marked); nothing with < 2 values, and
    nothing when the highest is 0 (no method is best at getting nothing right). None does not compete."""
    shown = [float(fmt(v)) if v is not None else None for v in values]
    present = [v for v in shown if v is not None]
    if len(present) < 2 or max(present) <= 0:
        return [False] * len(values)
    top = max(present)
    return [v is not None and v == top for v in shown]


# --- outcomes ------------------------------------------------------------------------------------------------

_PARTIAL = "†"  # a shown number that counts failed, skipped, unrun or unreadable items as errors
_MAX_OUTCOME_NOTES = 16


def _outcomes(report: Mapping[str, Any]) -> dict[tuple[str, str, int], Mapping[str, Any]]:
    """(backbone, method, realization) -> its outcome row."""
    return {
        (_text(row, "backbone"), _text(row, "method"), round(_num(row, "realization") or 0)): row
        for row in _rows(report, "outcomes")
    }


def _int(row: Mapping[str, Any] | None, key: str) -> int:
    return round(_num(row, key) or 0)


def _clean(row: Mapping[str, Any]) -> bool:
    """Every expected trajectory has a readable prediction that the model decided."""
    return _int(row, "readable") == _int(row, "expected") and _int(row, "fallback") == 0


def _min_share(report: Mapping[str, Any]) -> float:
    found = report.get("protocol")
    share = _num(found, "min_readable_share") if isinstance(found, Mapping) else None
    return 0.5 if share is None else share


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why a cell's number must not be read as a score: its status word and, for the page, the reason."""

    word: str
    reason: str


def _failure(
    report: Mapping[str, Any],
    row: Mapping[str, Any],
    outcomes: Mapping[tuple[str, str, int], Mapping[str, Any]] | None = None,
) -> _Failure | None:
    """The failure of a backbone × method × realization cell, or None when its number rests on answers.

    A cell fails when the report does not show its number (``shown`` false in its metrics or outcome row), when
    it has no scored prediction (``n`` 0), or when its readable answers cover less of its expected trajectories
    than the report's threshold (``min_readable_share``): the last is checked here too, so a number is never
    marked best on the word of a flag alone.
    """
    key = (_text(row, "backbone"), _text(row, "method"), round(_num(row, "realization") or 0))
    outcome = (_outcomes(report) if outcomes is None else outcomes).get(key)
    expected, readable = _int(outcome, "expected"), _int(outcome, "readable")
    low = outcome is not None and (expected == 0 or readable < _min_share(report) * expected)
    hidden = row.get("shown") is False or (outcome is not None and outcome.get("shown") is False)
    if not (low or hidden or _num(row, "n") == 0):
        return None
    status = _text(row, "status") or _text(outcome or {}, "status")
    word = status if status and status not in ("complete", "partial") else "too few readable"
    found = outcome.get("messages") if outcome is not None else None
    messages: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    entry = messages.get("invalid" if word == "unreadable" else "failed")
    message = _text(entry, "message") if isinstance(entry, Mapping) else ""
    if len(message) > _WHY_CHARS:
        message = message[: _WHY_CHARS - 1] + "…"
    counts = f"{readable} of {expected} answers readable" if outcome is not None else "no answers scored"
    return _Failure(word, f"{message} ({counts})" if message else counts)


_WHY_CHARS = 72


def _confidence(report: Mapping[str, Any]) -> float:
    level = _num(_protocol(report), "confidence")
    return 0.95 if level is None or not 0 < level < 1 else level


def _interval(report: Mapping[str, Any], row: Mapping[str, Any], metric: str) -> tuple[float, float] | None:
    """The report's interval for one cell's headline Agent or Step Acc; None when the cell has no number.

    A report dict without ``intervals`` (built by hand, or by an older rcarun) gets `stratified_interval` of
    its per-source counts, which is what the report computes.
    """
    headline = _headline(report, row)
    estimate = _num(headline, metric)
    if estimate is None or headline is None:
        return None
    carried = headline.get("intervals")
    bounds = carried.get(metric) if isinstance(carried, Mapping) else None
    if isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, int | float) for b in bounds):
        return float(bounds[0]), float(bounds[1])
    strata = []
    found = row.get("per_source")
    for metrics in found.values() if isinstance(found, Mapping) else ():
        n, p = _num(metrics, "n"), _num(metrics, metric)
        if isinstance(metrics, Mapping) and n and p is not None:
            strata.append((n, p))
    if not strata:  # a dict without sources: the headline as one binomial
        n = _num(headline, "n") or _num(row, "n")
        if not n:
            return None
        strata = [(n, estimate)]
    found = stratified_interval(
        estimate,
        strata,
        weighting="pooled" if _aggregate(report) == "pooled" else "macro",
        confidence=_confidence(report),
    )
    return found.low, found.high


def _totals(report: Mapping[str, Any]) -> str | None:
    """One line over every cell: expected items, predictions, unreadable, fallback, failed, skipped, unrun."""
    rows = _rows(report, "outcomes")
    if not rows:
        return None
    total = {k: sum(_int(r, k) for r in rows) for k in _OUTCOME_KEYS}
    unrun = total["interrupted"] + total["not_run"]
    return (
        f"items: {total['expected']:,} expected over {len(rows):,} backbone × method × realization cells; "
        f"{total['predictions']:,} predictions ({total['invalid']:,} unreadable, {total['fallback']:,} decided by "
        f"a fallback); {total['failed']:,} failed, {total['skipped_budget']:,} skipped for budget, {unrun:,} "
        "interrupted or not run"
    )


_OUTCOME_KEYS = (
    "expected",
    "predictions",
    "invalid",
    "fallback",
    "failed",
    "skipped_budget",
    "interrupted",
    "not_run",
)


def _outcome_sentence(label: str, row: Mapping[str, Any]) -> str:
    """What one cell's number rests on, in words."""
    expected, predictions = _int(row, "expected"), _int(row, "predictions")
    invalid, fallback = _int(row, "invalid"), _int(row, "fallback")
    failed, skipped = _int(row, "failed"), _int(row, "skipped_budget")
    unrun = _int(row, "interrupted") + _int(row, "not_run")
    parts = [f"{predictions} of {expected} have a prediction"]
    if invalid:
        parts.append(f"{invalid} unreadable")
    if fallback:
        parts.append(f"{fallback} decided by a fallback")
    missing = [
        f"{count} {word}"
        for count, word in (
            (failed, "failed"),
            (skipped, "skipped for budget"),
            (unrun, "interrupted or not run"),
        )
        if count
    ]
    text = f"{label}: {', '.join(parts)}"
    if missing:
        text += f"; {', '.join(missing)}"
    if row.get("shown") is False:
        if predictions == 0:
            return f"{text}. Not scored ({_text(row, 'status')}): no answer to rest a number on."
        return (
            f"{text}. Not shown ({_text(row, 'status')}): only {_int(row, 'readable')} readable answers; "
            "not compared."
        )
    errors = failed + skipped + unrun
    if errors or invalid:
        text += (
            f". Its numbers count {errors} failed, skipped or unrun item{'s' if errors != 1 else ''} "
            f"and {invalid} unreadable answer{'s' if invalid != 1 else ''} as errors"
        )
    return text + "."


def _outcome_notes(report: Mapping[str, Any], keys: Iterable[tuple[str, str, int]]) -> list[str]:
    """The sentences of the cells among ``keys`` whose numbers count errors (or are not shown), capped, then a
    pointer to Outcomes. A cell whose every answer was read, some decided by a published fallback, has no note
    under the accuracy table (its number counts no error); the Outcomes section lists it."""
    outcomes = _outcomes(report)
    single = len({b for b, _, _ in outcomes}) == 1
    sentences = []
    for backbone, method, realization in keys:
        row = outcomes.get((backbone, method, realization))
        if row is None or _int(row, "readable") == _int(row, "expected"):
            continue
        label = method if single else f"{backbone} · {method}"
        sentences.append(_outcome_sentence(label, row))
    if len(sentences) > _MAX_OUTCOME_NOTES:
        more = len(sentences) - _MAX_OUTCOME_NOTES
        sentences = [
            *sentences[:_MAX_OUTCOME_NOTES],
            f"… and {more} more backbone × method cells: see Outcomes.",
        ]
    return sentences


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
    tables = []
    if paired:
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
        heads = ("Backbone", "A vs B", *_PAIRED_STATS, *(("p (Holm, both)",) if joint else ()), *tail)
        tables.append(_Table(heads, rows, label_columns=3, caption=caption))
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
    per_source_table = _Table(
        columns=("Backbone", "Method", "Metric", *sources),
        rows=tuple(per_source_rows),
        label_columns=3,
        caption=f"Per source, Full/Mini accuracy (%; Mini from {'the Full run’s predictions' if cached else 'the Mini run'}"
        "), Table 9 layout.",
    )
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
    return _Section("fidelity", title, (macro, per_source_table), tuple(notes))


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


# --- text ----------------------------------------------------------------------------------------------------------


def _text_table(table: _Table) -> list[str]:
    n = len(table.columns)
    marked = [any(r.cells[i].best for r in table.rows) for i in range(n)]
    # A marked column pads unmarked numbers with a space so that the digits stay aligned.
    body = [
        [c.text + ("*" if c.best else " " if marked[i] else "") for i, c in enumerate(r.cells)]
        for r in table.rows
    ]
    widths = [max([len(table.columns[i])] + [len(row[i]) for row in body]) for i in range(n)]
    start = table.label_columns
    for label, span in table.groups:
        have = sum(widths[start : start + span]) + len(_GAP) * (span - 1)
        if have < len(label):
            widths[start + span - 1] += len(label) - have
        start += span

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(widths[i]) if i < table.label_columns else c.rjust(widths[i]) for i, c in enumerate(cells)
        ]
        return _GAP.join(parts).rstrip()

    lines = [table.caption] if table.caption else []
    if table.groups:
        parts = [" " * w for w in widths[: table.label_columns]]
        start = table.label_columns
        for label, span in table.groups:
            parts.append(label.center(sum(widths[start : start + span]) + len(_GAP) * (span - 1)))
            start += span
        lines.append(_GAP.join(parts).rstrip())
    lines.append(line(table.columns))
    lines.append(_GAP.join("-" * w for w in widths))
    lines.extend(line(row) for row in body)
    return lines


def render_text(report: Mapping[str, Any], sections: Collection[str] | None = None) -> str:
    """Render a report as fixed-width terminal tables.

    Args:
        report: the report dict built by ``rcarun report`` (accuracies as fractions, None for "not available").
        sections: only these section keys (``accuracy``, ``outcomes``, ``full-metrics``, ``per-source``, ``paired``,
            ``components``, ``complementarity``, ``repeatability``, ``recall``, ``turns``, ``length-groups``,
            ``fidelity``, ``calibration``, ``label-sensitivity``, ``cost``, ``call-timing``); all when None.

    Returns:
        The text, ending with a newline.
    """
    title, details = _header_lines(report)
    lines = [title, "=" * len(title), *details, ""]
    if report.get("simulated"):
        banner = textwrap.wrap(_SIMULATED, _TEXT_WIDTH - 4)
        rule = "!" * _TEXT_WIDTH
        lines += [rule, *(f"!! {w}" for w in banner), rule, ""]
    for section in _sections(report):
        if sections is not None and section.key not in sections:
            continue
        lines += [section.title, "-" * len(section.title)]
        for table in section.tables:
            lines += [*_text_table(table), ""]
        for note in section.notes:
            lines += [*textwrap.wrap(note, _TEXT_WIDTH), ""]
        if not section.notes and not section.tables:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# --- plots ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plot:
    png: bytes
    alt: str
    caption: str


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    # No "Software" tEXt chunk: it would put matplotlib's URL into the page; fixed DPI for stable output.
    figure.savefig(buffer, format="png", dpi=_DPI, metadata={"Software": None})
    return buffer.getvalue()


# A qualitative palette of 16 colours that stay apart on white (tab10, then black, navy, magenta, olive, pink
# and purple, each picked as the farthest in CIELAB from those before it; the closest pair is ΔE76 ≈ 28, as
# within tab10 itself). Past 16 methods the colours repeat with a hatch (bars) or another marker (points).
PALETTE = (
    *("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"),
    *("#17becf", "#000000", "#000075", "#f032e6", "#637939", "#fabed4", "#911eb4"),
)
_HATCHES = ("", "///", "...", "xxx", "\\\\\\", "ooo")
_MARKERS = "osD^v<>ph*X"


@dataclass(frozen=True, slots=True)
class _Style:
    """How one method looks in every plot: its colour, and a hatch and marker that tell repeats apart."""

    color: str
    hatch: str
    marker: str


def method_styles(n: int) -> list[_Style]:
    """Styles for ``n`` methods: distinct colours for up to 16, then the colours again with a hatch and a
    different marker per round, so that no two methods look alike."""
    styles = []
    for i in range(n):
        round_, index = divmod(i, len(PALETTE))
        styles.append(
            _Style(
                PALETTE[index], _HATCHES[round_ % len(_HATCHES)], _MARKERS[(index + round_) % len(_MARKERS)]
            )
        )
    return styles


def _short(label: str, limit: int = 28) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _wrap(label: str, width: int = 14) -> str:
    """A tick label on at most two lines, so that neighbouring labels do not run into each other."""
    lines = textwrap.wrap(label, width, break_on_hyphens=True) or [label]
    return "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")


def _accuracy_plot(report: Mapping[str, Any]) -> _Plot | str:
    first = _first_realizations(report)
    outcomes = _outcomes(report)
    failures = {key: _failure(report, row, outcomes) for key, row in first.items()}
    values = {key: None if failures[key] else _headline(report, row) for key, row in first.items()}
    if not any(_num(v, m) is not None for v in values.values() for m in ("agent_acc", "step_acc")):
        return "Accuracy plot omitted: no Agent or Step Acc in this report."
    backbones = _unique(b for b, _ in first)
    methods = _unique(m for _, m in first)
    styles = method_styles(len(methods))
    bars = len(backbones) * len(methods)
    # Width grows with the bars (about 0.13 in each) up to the page's width at 1:1 (1280 px at _DPI), so that
    # the labels keep their size; the two metrics are stacked, each over the full width.
    figure = _figure(min(11.6, max(7.0, 2.0 + 0.13 * bars + 0.3 * len(backbones))), 7.4)
    axes = figure.subplots(2, 1, sharex=True)
    width = 0.84 / len(methods)
    for ax, metric in zip(axes, ("agent_acc", "step_acc"), strict=True):
        for j, method in enumerate(methods):
            xs, heights, low, high = [], [], [], []
            for i, backbone in enumerate(backbones):
                key = (backbone, method)
                value = _num(values.get(key), metric)
                x = i - 0.42 + width * (j + 0.5)
                if value is not None:
                    bounds = _interval(report, first[key], metric) or (value, value)
                    xs.append(x)
                    heights.append(value * 100)
                    low.append((value - bounds[0]) * 100)
                    high.append((bounds[1] - value) * 100)
                elif key in first:  # a failed cell is marked as one, never drawn as a zero score
                    failure = failures[key]
                    word = failure.word if failure else "n/a"
                    ax.plot([x], [1.5], marker="x", color="#b00020", markersize=5, linestyle="")
                    ax.text(x, 4, word, ha="center", va="bottom", fontsize=6.5, color="#b00020", rotation=90)
            style = styles[j]
            drawn = ax.bar(
                xs,
                heights,
                width * 0.9,
                color=style.color,
                hatch=style.hatch,
                edgecolor="white" if not style.hatch else "0.2",
                linewidth=0.4,
                label=_short(method),
                yerr=[low, high],
                error_kw={"elinewidth": 0.8, "capsize": 1.5 if bars > 30 else 2.5, "ecolor": "0.25"},
            )
            if bars <= 16:
                ax.bar_label(drawn, fmt="%.1f", fontsize=7, padding=2)
        ax.set_ylabel(f"{metric_label(metric)} (%)")
        ax.set_ylim(0, 100)  # zero-based and the full scale: bar heights compare across backbones and pages
        ax.set_yticks(range(0, 101, 20))
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.set_title(
            f"{metric_label(metric)} ({_aggregate(report)}), {_confidence(report):.0%} intervals",
            fontsize=10,
        )
    labels = [_wrap(b) for b in backbones]
    rotate = len(backbones) > 6 or max(len(b) for b in backbones) * len(backbones) > 90
    axes[1].set_xticks(
        range(len(backbones)), labels, rotation=30 if rotate else 0, ha="right" if rotate else "center"
    )
    axes[1].set_xlim(-0.5, len(backbones) - 0.5)
    figure.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=min(len(methods), 7),
        fontsize=8,
        frameon=False,
    )
    caption = (
        f"Agent and Step Acc per backbone (groups) and method (bars), first realization, with "
        f"{_confidence(report):.0%} intervals (error bars, as in the table); the axis runs from 0 to 100%. A red "
        "× with a word (failed, skipped, unreadable, ...) marks a cell whose number rests on too few readable "
        "answers: not a zero score (see Outcomes)."
    )
    return _Plot(
        _png(figure), "Bar chart of Agent and Step Acc per backbone and method, with intervals", caption
    )


def _cost_plot(report: Mapping[str, Any]) -> _Plot | str:
    usd = _usd_per_trajectory(report, with_gpu=True)
    if not usd:
        return "Accuracy-versus-cost plot omitted: no USD per trajectory in this report."
    first = _first_realizations(report)
    outcomes = _outcomes(report)
    points = []
    for (backbone, method), row in first.items():
        step = _num(_headline(report, row), "step_acc")
        if (backbone, method) in usd and step is not None and _failure(report, row, outcomes) is None:
            bounds = _interval(report, row, "step_acc") or (step, step)
            points.append((backbone, method, usd[backbone, method], step * 100, bounds))
    if not points:
        return "Accuracy-versus-cost plot omitted: no backbone × method has both a cost and a Step Acc."
    backbones = _unique(p[0] for p in points)
    methods = _unique(p[1] for p in points)
    styles = method_styles(len(methods))
    figure = _figure(9.0, 4.2)
    ax = figure.subplots()
    annotate = _apart([(p[2], p[3]) for p in points])
    for backbone, method, x, y, (low, high) in points:
        style = styles[methods.index(method)]
        marker = _MARKERS[backbones.index(backbone) % len(_MARKERS)] if len(backbones) > 1 else style.marker
        ax.errorbar(
            [x],
            [y],
            yerr=[[y - low * 100], [high * 100 - y]],
            fmt=marker,
            color=style.color,
            markersize=6,
            elinewidth=0.7,
            capsize=2,
            zorder=3,
        )
        if annotate:
            label = (
                _short(method) if len(backbones) == 1 else f"{_short(backbone, 16)} · {_short(method, 16)}"
            )
            ax.annotate(label, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=7)
    scale = _cost_scale(ax, [p[2] for p in points])
    gpu = _has_gpu(report)
    money = "API + GPU USD" if gpu else "USD"
    ax.set_xlabel(f"{money} per trajectory, summed over stages ({scale})")
    ax.set_ylabel(f"Step Acc (%, {_aggregate(report)})")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    _cost_legend(ax, backbones, methods, styles)
    caption = (
        f"Step Acc (with its {_confidence(report):.0%} interval) against {money} per trajectory, one point per "
        "backbone × method (first realization); colour: method, marker: backbone. Cells whose number is not "
        "shown are left out."
    )
    return _Plot(_png(figure), "Scatter plot of Step Acc against USD per trajectory", caption)


def _cost_scale(ax: Axes, xs: Sequence[float]) -> str:
    """Log x when the positive costs span more than 100×; free (zero-cost) points stay visible via symlog."""
    positive = [x for x in xs if x > 0]
    if positive and max(positive) / min(positive) > 100:
        if len(positive) < len(xs):
            ax.set_xscale("symlog", linthresh=min(positive))
            ax.set_xlim(-0.3 * min(positive), max(positive) * 2)
            return "symlog scale, linear below the cheapest paid point"
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 2)
        return "log scale"
    top = max(xs)
    ax.set_xlim(-0.05 * top if top > 0 else -1, top * 1.3 if top > 0 else 1)
    return "linear scale"


def _apart(points: Sequence[tuple[float, float]], limit: int = 12) -> bool:
    """Whether names can stand beside the points without overprinting: few points, none close to another
    (within 8% of the x range and 5 points of accuracy). Otherwise the legend alone says which is which."""
    if len(points) > limit:
        return False
    xs = [x for x, _ in points]
    width = (max(xs) - min(xs)) or 1.0
    return all(
        abs(a[0] - b[0]) / width > 0.08 or abs(a[1] - b[1]) > 5
        for i, a in enumerate(points)
        for b in points[i + 1 :]
    )


def _cost_legend(
    ax: Axes, backbones: Sequence[str], methods: Sequence[str], styles: Sequence[_Style]
) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    single = len(backbones) == 1
    handles: list[Any] = [
        Line2D([], [], linestyle="", marker=s.marker, color=s.color, label=_short(m))
        if single
        else Patch(color=s.color, label=_short(m))  # colour alone: the markers name the backbones
        for m, s in zip(methods, styles, strict=True)
    ]
    if not single:
        handles += [
            Line2D([], [], linestyle="", marker=_MARKERS[i % len(_MARKERS)], color="0.3", label=_short(b))
            for i, b in enumerate(backbones)
        ]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _source_plot(report: Mapping[str, Any]) -> _Plot | str:
    first = _first_realizations(report)
    sources = _sources(report)
    if not first or not sources:
        return "Per-source heat map omitted: no per-source metrics in this report."
    import numpy as np
    from matplotlib import colormaps

    single = len(_unique(b for b, _ in first)) == 1
    labels = [_short(m) if single else f"{_short(b, 18)} · {_short(m, 18)}" for b, m in first]
    grid = np.full((len(first), len(sources)), np.nan)
    outcomes = _outcomes(report)
    for i, row in enumerate(first.values()):
        failed = _failure(report, row, outcomes) is not None
        for j, source in enumerate(sources):
            value = None if failed else _num(_per_source(row, source), "step_acc")
            if value is not None:
                grid[i, j] = value * 100
    if np.isnan(grid).all():
        return "Per-source heat map omitted: no per-source Step Acc in this report."
    figure = _figure(min(14.0, 3.2 + 1.15 * len(sources)), min(12.0, 1.3 + 0.42 * len(first)))
    ax = figure.subplots()
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for (i, j), value in np.ndenumerate(grid):
        text = DASH if np.isnan(value) else f"{value:.1f}"
        color = "black" if np.isnan(value) or value >= 55 else "white"
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(
        range(len(sources)), [_short(s, 20) for s in sources], rotation=30 if len(sources) > 4 else 0
    )
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    figure.colorbar(image, ax=ax, label="Step Acc (%)", shrink=0.9)
    caption = (
        "Step Acc (%) per source; grey cells have no data, or a number the report does not show (see Outcomes). "
        "First realization."
    )
    return _Plot(_png(figure), "Heat map of Step Acc per source and method", caption)


# Where each plot goes: after the tables of its section.
_PLOTS: dict[str, Callable[[Mapping[str, Any]], _Plot | str]] = {
    "accuracy": _accuracy_plot,
    "per-source": _source_plot,
    "cost": _cost_plot,
}


# --- HTML ----------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1320px;
       padding: 0 16px; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 4px; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: 2px; margin-top: 28px; }
.meta { color: #555; margin: 0; }
.banner { border: 2px solid #b00020; background: #fdecee; color: #6b0012; padding: 8px 14px; margin: 12px 0;
          font-weight: 600; }
nav { font-size: 0.9em; margin: 12px 0; padding: 6px 10px; background: #f6f8fa; border: 1px solid #e1e4e8; }
nav ol { display: inline; padding: 0; margin: 0; }
nav li { display: inline-block; margin-right: 12px; white-space: nowrap; }
nav a { color: #0b4f8a; }
nav .more { color: #555; margin-right: 8px; }
table { border-collapse: collapse; margin: 0 0 12px; font-size: 0.88em; }
.scroll { overflow-x: auto; }
.caption { font-weight: 600; margin: 10px 0 4px; color: #333; font-size: 0.92em; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
th { background: #f3f5f7; text-align: left; }
th.group { text-align: center; border-left: 1px solid #d8d8d8; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.start, th.start { border-left: 1px solid #d8d8d8; }
tr.total td { font-weight: 600; background: #fafafa; border-top: 1px solid #bbb; }
table.kv th { background: none; width: 10em; vertical-align: top; }
table.kv td { white-space: normal; max-width: 70em; }
.note { color: #444; font-size: 0.9em; max-width: 60em; }
.legend { color: #333; font-size: 0.88em; max-width: 70em; margin: 4px 0 8px; }
figure { margin: 10px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88em; color: #444; max-width: 70em; }
.na { color: #8a1c1c; font-style: italic; }
.fail { color: #8a1c1c; white-space: normal; }
.ci { display: block; color: #666; font-size: 0.8em; line-height: 1.1; }
details > summary { cursor: pointer; }
details.notes > summary, details.rows > summary { color: #0b4f8a; font-size: 0.9em; margin: 4px 0; }
details.tail { border-bottom: 1px solid #ddd; }
details.tail > summary h2 { display: inline-block; border: none; margin: 14px 0 0; }
details.tail .hint { color: #666; font-size: 0.88em; margin-left: 8px; }
pre.command { font-size: 0.85em; background: #f6f8fa; padding: 6px; white-space: pre-wrap; }
"""


def _html_table(table: _Table) -> str:
    starts = set()  # first column of each group: a rule on its left, as in the paper's grouped columns
    position = table.label_columns
    for label, span in table.groups:
        if label:
            starts.add(position)
        position += span

    def classes(i: int) -> str:
        names = (["num"] if i >= table.label_columns else []) + (["start"] if i in starts else [])
        return f' class="{" ".join(names)}"' if names else ""

    # The caption is a paragraph, not <caption>, so that a long caption does not wrap to a narrow table's width.
    out = [f'<p class="caption">{html.escape(table.caption)}</p>'] if table.caption else []
    out.append('<div class="scroll"><table><thead>')
    if table.groups:
        group_cells = [f'<th colspan="{table.label_columns}"></th>']
        for label, span in table.groups:
            kind = ' class="group"' if label else ""
            group_cells.append(f'<th colspan="{span}"{kind}>{html.escape(label)}</th>')
        out.append(f"<tr>{''.join(group_cells)}</tr>")
    out.append(
        "<tr>"
        + "".join(f"<th{classes(i)}>{html.escape(c)}</th>" for i, c in enumerate(table.columns))
        + "</tr>"
    )
    out.append("</thead><tbody>")
    for row in table.rows:
        cells = []
        for i, cell in enumerate(row.cells):
            cells.append(f"<td{classes(i)}>{_html_cell(cell)}</td>")
        opening = '<tr class="total">' if row.total else "<tr>"
        out.append(f"{opening}{''.join(cells)}</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _html_cell(cell: _Cell) -> str:
    """A cell's text; a best number in bold, its interval beside it; a failure as one, with its reason."""
    text = html.escape(cell.text)
    if cell.muted:
        text = f'<span class="na">{text}</span>'
        if cell.reason:
            return f'<span class="fail">— {text}: {html.escape(cell.reason)}</span>'
        return text
    if cell.best:
        text = f"<strong>{text}</strong>"
    if cell.interval:
        text += f' <span class="ci">{html.escape(cell.interval)}</span>'
    return text


def _html_plot(plot: _Plot | str) -> str:
    if isinstance(plot, str):
        return f'<p class="note">{html.escape(plot)}</p>'
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(plot.alt)}">'
        f"<figcaption>{html.escape(plot.caption)}</figcaption></figure>"
    )


# The page's order: what a reader looks at first, then the long tail, each part folded (<details>). Sections
# not named here (none today) would join the tail, so that nothing the text report has is ever dropped.
_HEADLINE = ("accuracy", "paired", "components", "repeatability", "cost", "fidelity", "calibration")
_TAIL = (
    *("label-sensitivity", "outcomes", "full-metrics", "per-source", "task-clusters", "leave-one-source-out"),
    *("complementarity", "recall", "turns"),
    "length-groups",
    "call-timing",
)
_LEGEND = (
    "Cells: the number (%) and its {level} interval in brackets; bold: the highest number per backbone and "
    "metric among those that rest on answers; {partial}: a number that counts failed, skipped or unreadable "
    "items as errors; “— failed: …” (or skipped, unreadable, …): a cell whose readable answers cover less than "
    "{share} of its trajectories, never a score and never best."
)


@dataclass(frozen=True, slots=True)
class _Part:
    """One section of the page: the shared section, what shows before its fold, and whether it is folded."""

    section: _Section
    lead: tuple[_Table, ...] | None = None  # shown first, with the section's own tables folded under them
    legend: str = ""
    collapsed: bool = False


def _rows_count(section: _Section) -> int:
    return sum(len(t.rows) for t in section.tables)


def _html_part(part: _Part, report: Mapping[str, Any]) -> str:
    section = part.section
    body: list[str] = []
    if part.legend:
        body.append(f'<p class="legend">{html.escape(part.legend)}</p>')
    if part.lead is not None:
        body += [_html_table(t) for t in part.lead]
        if section.tables:
            rows = _rows_count(section)
            body.append(f'<details class="rows"><summary>Every row ({rows:,})</summary>')
            body += [_html_table(t) for t in section.tables]
            body.append("</details>")
    else:
        body += [_html_table(t) for t in section.tables]
    plot = _PLOTS.get(section.key)
    if plot is not None:
        body.append(_html_plot(plot(report)))
    notes = [f'<p class="note">{html.escape(n)}</p>' for n in section.notes]
    title = html.escape(section.title)
    if part.collapsed:
        rows = _rows_count(section)
        hint = f"{rows:,} rows" if rows else "notes"
        return "\n".join(
            [
                f'<section id="{section.key}"><details class="tail">',
                f'<summary><h2>{title}</h2><span class="hint">{hint}</span></summary>',
                *body,
                *notes,
                "</details></section>",
            ]
        )
    if len(notes) == 1 and not section.tables:
        folded = notes  # a section that is only a sentence ("No ... in this report.") says it openly
    elif notes:
        folded = [f'<details class="notes"><summary>Notes ({len(notes)})</summary>', *notes, "</details>"]
    else:
        folded = []
    return "\n".join([f'<section id="{section.key}">', f"<h2>{title}</h2>", *body, *folded, "</section>"])


def _parts(report: Mapping[str, Any]) -> list[_Part]:
    sections = {s.key: s for s in _sections(report)}
    level = f"{_confidence(report):.0%}"
    legend = _LEGEND.format(level=level, partial=_PARTIAL, share=f"{_min_share(report):.0%}")
    leads = {
        "paired": _paired_lead(report),
        "repeatability": _repeatability_lead(report),
        "cost": _cost_lead(report),
    }
    parts = []
    for key in _HEADLINE:
        if key in sections:
            lead = leads.get(key)
            parts.append(
                _Part(sections.pop(key), lead=lead or None, legend=legend if key == "accuracy" else "")
            )
    for key in (*_TAIL, *sections):
        if key in sections:
            parts.append(_Part(sections.pop(key), collapsed=True))
    parts.append(_Part(_protocol_section(report), collapsed=True))
    return parts


def _protocol_section(report: Mapping[str, Any]) -> _Section:
    """The header's long lines (database, protocol, scoring rule, aggregate, statistics, totals), folded."""
    _, details = _header_lines(report)
    return _Section("protocol", "Protocol and settings", notes=tuple(d[0].upper() + d[1:] for d in details))


# --- the page's own condensed tables -------------------------------------------------------------------------


def _pivot(
    cells: Mapping[tuple[str, str], Sequence[str]], heads: Sequence[str], caption: str, label: str = "Method"
) -> _Table:
    """Rows of (backbone, row label) -> values as Table 3 lays them out: one row per label, a column group of
    ``heads`` per backbone, a dash where a backbone has no such row."""
    backbones = _unique(b for b, _ in cells)
    labels = _unique(m for _, m in cells)
    rows = []
    for name in labels:
        values = []
        for backbone in backbones:
            values += list(cells.get((backbone, name), [DASH] * len(heads)))
        rows.append(_row(name, *values))
    return _Table(
        columns=(label, *(list(heads) * len(backbones))),
        rows=tuple(rows),
        groups=tuple((b, len(heads)) for b in backbones),
        caption=caption,
    )


def _repeatability_lead(report: Mapping[str, Any]) -> tuple[_Table, ...]:
    """Step Acc over realizations and the root-step agreement, one row per method, a column group per backbone."""
    cells: dict[tuple[str, str], Sequence[str]] = {}
    for row in _rows(report, "repeatability"):
        found = row.get("metrics")
        metrics: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        stats = metrics.get("step_acc")
        step: Mapping[str, Any] = stats if isinstance(stats, Mapping) else {}
        cells[_text(row, "backbone"), _text(row, "method")] = (
            f"{_pct(_num(step, 'mean'))} ± {_pct(_num(step, 'sd'))}",
            _pct(_num(row, "mean_agreement")),
        )
    if not cells:
        return ()
    caption = (
        "Step Acc over realizations (mean ± SD, %; SD with ddof = 1) and the mean pairwise agreement of root "
        "steps (%); every metric and pair below the fold."
    )
    return (_pivot(cells, ("Step", "Agree"), caption),)


def _paired_lead(report: Mapping[str, Any]) -> tuple[_Table, ...]:
    """The comparisons between methods with both metrics on one row: Δ and interval, W/L, Holm p each."""
    grouped: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for row in _rows(report, "paired"):
        key = (_text(row, "backbone"), f"{_text(row, 'method_a')} vs {_text(row, 'method_b')}")
        grouped.setdefault(key, {})[_text(row, "metric")] = row
    if not grouped:
        return ()
    metrics = _unique(m for found in grouped.values() for m in found)
    rows = []
    for (backbone, pair), found in grouped.items():
        values = []
        for metric in metrics:
            entry = found.get(metric)
            if entry is None:
                values += [DASH] * 3
                continue
            _, delta, interval, wl, _, holm, *_ = _paired_cells(entry)
            values += [f"{delta} {interval}", wl, holm]
        rows.append(_row(backbone, pair, *values))
    reference = report.get("reference_method")
    table = _Table(
        columns=("Backbone", "A vs B", *(["Δ (pp) [95% CI]", "W/L", "p (Holm)"] * len(metrics))),
        rows=tuple(rows),
        label_columns=2,
        groups=tuple((metric_label(m), 3) for m in metrics),
        caption=f"Paired differences A − B between methods{f' against {reference}' if reference else ''}, first "
        "realization; McNemar p, families and any other comparison below the fold.",
    )
    return (table,)


def _cost_lead(report: Mapping[str, Any]) -> tuple[_Table, ...]:
    """USD and USD per trajectory (API, and GPU time when charged), one row per method, a group per backbone."""
    cost = _rows(report, "cost")
    if not cost:
        return ()
    gpu = _has_gpu(report)
    per_trajectory = _usd_per_trajectory(report, with_gpu=gpu)
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in cost:
        grouped.setdefault((_text(row, "backbone"), _text(row, "method")), []).append(row)
    cells: dict[tuple[str, str], Sequence[str]] = {}
    for key, mine in grouped.items():
        charged = (_usd(_sum(mine, "gpu_usd")),) if gpu else ()
        cells[key] = (_usd(_sum(mine, "cost_usd")), *charged, _usd(per_trajectory.get(key)))
    heads = ("API USD", "GPU USD", "per traj.") if gpu else ("USD", "per traj.")
    per = "API + GPU USD" if gpu else "USD"
    caption = (
        f"USD spent per backbone × method (summed over stages and realizations) and {per} per trajectory; calls, "
        "tokens, latency and budget use per stage below the fold."
    )
    return (_pivot(cells, heads, caption),)


# --- the summary ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fact:
    label: str
    text: str
    more: tuple[str, ...] = ()  # folded lines under it (serve commands)


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _failure_causes(rows: Sequence[Mapping[str, Any]]) -> str:
    """The failed items by their most frequent message per cell, largest first; the rest as "other"."""
    causes: dict[str, int] = {}
    for row in rows:
        found = row.get("messages")
        entry = found.get("failed") if isinstance(found, Mapping) else None
        if isinstance(entry, Mapping):
            message = _short(_text(entry, "message"), _WHY_CHARS)
            causes[message] = causes.get(message, 0) + _int(entry, "count")
    failed = sum(_int(r, "failed") for r in rows)
    listed = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    parts = [f"{message} ×{count:,}" for message, count in listed]
    other = failed - sum(count for _, count in listed)
    if other > 0:
        parts.append(f"other ×{other:,}")
    return "; ".join(parts)


def _summary(report: Mapping[str, Any]) -> list[_Fact]:
    """The page's first section: what ran, what became of it and what it cost, in numbers from the dict."""
    found = report.get("run")
    run: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    facts = [
        _Fact(
            "Run",
            f"{_text(run, 'name') or 'unnamed run'} (id {_text(run, 'run_id') or DASH}, "
            f"{_text(run, 'status') or DASH}, created {_text(run, 'created_at') or DASH})",
        ),
        _Fact(
            "Simulated",
            "yes: every backbone was rcarun's mock server or a random-weight local model; the numbers exercise "
            "the engine, not any model"
            if report.get("simulated")
            else "no",
        ),
    ]
    metrics, outcomes = _rows(report, "metrics"), _rows(report, "outcomes")
    backbones = _unique(_text(r, "backbone") for r in (*metrics, *outcomes, *_rows(report, "cost")))
    methods = _unique(_text(r, "method") for r in (*metrics, *outcomes, *_rows(report, "cost")))
    facts.append(_Fact("Backbones", f"{len(backbones)}: {', '.join(backbones)}" if backbones else DASH))
    for served in _rows(report, "served_by"):
        replicas = _int(served, "replicas")
        text = f"{_text(served, 'backbone')}: served by vLLM {_text(served, 'vllm_version') or '?'}, "
        text += _plural(replicas, "replica")
        if _num(served, "gpus") is not None:
            text += f" on {_plural(_int(served, 'gpus'), 'GPU')}"
        if _num(served, "gpu_usd") is not None:
            text += f", GPU time {_usd(_num(served, 'gpu_usd'))} USD"
        commands = served.get("commands")
        listed = (
            tuple(str(c) for c in commands)
            if isinstance(commands, Sequence) and not isinstance(commands, str)
            else ()
        )
        facts.append(_Fact("Served by", text, listed))
    facts.append(_Fact("Methods", f"{len(methods)}: {', '.join(methods)}" if methods else DASH))
    protocol = _protocol(report)
    if protocol.get("name"):
        resamples = _num(protocol, "resamples")
        facts.append(
            _Fact(
                "Protocol",
                f"{_text(protocol, 'name')}; {_aggregate_label(report)}; "
                f"{_count(resamples)} bootstrap resamples; reference method "
                f"{_text(report, 'reference_method') or DASH} (every rule under Protocol and settings)",
            )
        )
    expected = _num(report, "expected")
    if expected is not None:
        facts.append(
            _Fact(
                "Trajectories",
                f"{_count(expected)} labelled, each expected in every cell; "
                f"{_count(_num(report, 'unlabelled') or 0)} unlabelled, left out",
            )
        )
    if outcomes:
        total = {k: sum(_int(r, k) for r in outcomes) for k in (*_OUTCOME_KEYS, "readable")}
        facts.append(
            _Fact(
                "Items",
                f"{total['expected']:,} expected over {_plural(len(outcomes), 'cell')} (backbone × method × "
                f"realization): {total['predictions']:,} done, {total['failed']:,} failed, "
                f"{total['skipped_budget']:,} skipped for budget, {total['interrupted']:,} interrupted, "
                f"{total['not_run']:,} not run",
            )
        )
        if total["failed"]:
            facts.append(_Fact("Failed, by cause", _failure_causes(outcomes)))
        statuses: dict[str, int] = {}
        for row in outcomes:
            statuses[_text(row, "status")] = statuses.get(_text(row, "status"), 0) + 1
        hidden = ", ".join(f"{n} {w}" for w, n in statuses.items() if w not in ("complete", "partial"))
        share = total["readable"] / total["expected"] if total["expected"] else None
        facts.append(
            _Fact(
                "Coverage",
                f"{total['readable']:,} of {total['expected']:,} expected answers readable ({_pct(share)}%; "
                f"{total['invalid']:,} unreadable, {total['fallback']:,} decided by a fallback); cells: "
                f"{statuses.get('complete', 0)} complete, {statuses.get('partial', 0)} partial"
                + (f", not shown: {hidden}" if hidden else ""),
            )
        )
    cost = _rows(report, "cost")
    if cost:
        api, gpu = _sum(cost, "cost_usd") or 0.0, _sum(cost, "gpu_usd") or 0.0
        money = f"{_usd(api)} USD API"
        if _has_gpu(report):
            money += f" + {_usd(gpu)} USD GPU time = {_usd(api + gpu)} USD"
        tokens = {k: round(_sum(cost, k) or 0) for k in (*_TOKENS, "calls", "attempts", "cached_calls")}
        facts.append(
            _Fact(
                "Spend",
                f"{money}; tokens: {tokens['prompt_tokens']:,} prompt ({tokens['cached_tokens']:,} cached), "
                f"{tokens['completion_tokens']:,} completion ({tokens['reasoning_tokens']:,} reasoning); "
                f"{tokens['calls']:,} calls, {tokens['attempts']:,} attempts, {tokens['cached_calls']:,} "
                "cache hits",
            )
        )
    return facts


def _html_summary(report: Mapping[str, Any]) -> str:
    rows = []
    for fact in _summary(report):
        more = ""
        if fact.more:
            commands = "".join(f'<pre class="command">{html.escape(c)}</pre>' for c in fact.more)
            more = f"<details><summary>commands</summary>{commands}</details>"
        rows.append(f"<tr><th>{html.escape(fact.label)}</th><td>{html.escape(fact.text)}{more}</td></tr>")
    return "\n".join(
        [
            '<section id="summary">',
            "<h2>Summary</h2>",
            '<table class="kv"><tbody>',
            *rows,
            "</tbody></table>",
            "</section>",
        ]
    )


def render_html(report: Mapping[str, Any]) -> str:
    """Render a report as one self-contained HTML page that reads at a glance.

    A summary first (run, items and their failures by cause, coverage, spend, what served the backbones), then
    the accuracy table with intervals and its plot, paired comparisons, repeatability and cost; the long tail
    (outcomes per cell, full metrics, per-source tables, complementarity, protocol, ...) folded in
    ``<details>``, every section in the table of contents. Inline CSS, no scripts and no external URLs; the
    three plots are embedded PNGs, each replaced by a sentence when there is no data.

    Args:
        report: the report dict built by ``rcarun report``.

    Returns:
        The HTML document.
    """
    title, details = _header_lines(report)
    parts = _parts(report)
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1>",
        *(
            f'<p class="meta">{html.escape(d)}</p>' for d in details[:2]
        ),  # run and database; the rest is folded
        "</header>",
    ]
    if report.get("simulated"):
        head.append(f'<div class="banner" role="alert">{html.escape(_SIMULATED)}</div>')
    first = [("summary", "Summary")] + [(p.section.key, p.section.title) for p in parts if not p.collapsed]
    folded = [(p.section.key, p.section.title) for p in parts if p.collapsed]

    def links(entries: Sequence[tuple[str, str]]) -> str:
        return "".join(f'<li><a href="#{key}">{html.escape(title)}</a></li>' for key, title in entries)

    head.append(
        f'<nav id="toc" aria-label="Contents"><ol>{links(first)}</ol>'
        f'<span class="more">Folded:</span><ol>{links(folded)}</ol></nav>'
    )
    body = [_html_summary(report), *(_html_part(p, report) for p in parts)]
    return "\n".join([*head, *body, "</body></html>"]) + "\n"
