"""The renderers' shared ground: number formats, the table model, and reading the `Report`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..report.model import CellMetrics, CellOutcome, ProtocolInfo, Report, Rows, Scores
from ..scoring import METRIC_BY_NAME, METRICS
from ..stats import stratified_interval

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


def _finite(value: float | None) -> float | None:
    """The number, or None when it is missing or not finite (as `_num` reads a dict)."""
    return None if value is None or not math.isfinite(value) else float(value)


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


_Columns = Sequence[tuple[str, Callable[[float | None], str] | None]]


def _keyed_row(row: Mapping[str, Any], columns: _Columns) -> _Row:
    """A row of the dict's values under each key: text (no format) or a number in its format."""
    return _row(*(_text(row, key) if fmt is None else fmt(_num(row, key)) for key, fmt in columns))


# --- reading the report ----------------------------------------------------------------------------------------


def _rows(part: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = part.get(key)
    return _listed(value) if isinstance(value, Sequence) else []


def _listed(rows: Rows) -> list[Mapping[str, Any]]:
    """A report section's rows, less anything that is not a row (a hand-built report may hold anything)."""
    return [row for row in rows if isinstance(row, Mapping)]


@dataclass(frozen=True, slots=True)
class _RunWords:
    """The run's name, id, status and creation time as the header shows them ("" when the report has no run)."""

    name: str = ""
    run_id: str = ""
    status: str = ""
    created_at: str = ""


def _run(report: Report) -> _RunWords:
    run = report.run
    return _RunWords() if run is None else _RunWords(run.name, str(run.run_id), run.status, run.created_at)


def _presets(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    value = cell.get("presets")
    return value if isinstance(value, Mapping) else {}


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _aggregate(report: Report) -> str:
    return "pooled" if report.aggregate == "pooled" else "macro"


def _first_realizations(report: Report) -> dict[tuple[str, str], CellMetrics]:
    """(backbone, method) -> its metrics row with the lowest realization, in the report's order."""
    chosen: dict[tuple[str, str], CellMetrics] = {}
    for row in report.metrics:
        key = (row.backbone, row.method)
        if key not in chosen or row.realization < chosen[key].realization:
            chosen[key] = row
    return chosen


def _headline(report: Report, row: CellMetrics) -> Scores:
    """The scores of the report's aggregate: macro or pooled."""
    return row.pooled if _aggregate(report) == "pooled" else row.macro


def _score(scores: Scores | None, metric: str) -> float | None:
    """A metric's finite value, or None (no scores, nothing scored, or not finite)."""
    return None if scores is None else _finite(scores.value(metric))


def _sources(report: Report) -> list[str]:
    return _unique(source for row in report.metrics for source in row.per_source)


def _aggregate_label(report: Report) -> str:
    if _aggregate(report) == "pooled":
        return "pooled: every trajectory weighs the same"
    k = len(_sources(report))
    name = f"Macro-{k}" if k else "macro"
    return f"{name}: each source's mean, then the unweighted mean over sources"


def _protocol(report: Report) -> ProtocolInfo:
    """The report's protocol; an empty one (every rule unknown) for a report without."""
    return report.protocol or ProtocolInfo()


def _rule_note(report: Report, *, full: bool = False) -> tuple[str, ...]:
    """The scoring rule a table used, as a footnote: in full, or in short (none for a dict from before
    protocols)."""
    protocol = _protocol(report)
    rule = protocol.scoring_rule or ""
    if not rule:
        return ()
    name = protocol.name or ""
    if full:
        return (f"Scoring rule{f' ({name} protocol)' if name else ''}: {rule}.",)
    abstentions = (
        "abstentions scored on their fields" if protocol.abstentions == "fields" else "abstentions as errors"
    )
    suffixes = "handoff suffixes kept" if protocol.keep_handoff is True else "handoff suffixes dropped"
    return (f"Scoring: {name} protocol rule ({abstentions}; {suffixes}; see the header).",)


def _has_gpu(report: Report) -> bool:
    """Whether any cost row charges self-hosted GPU time (``gpu_usd``, present in newer reports only)."""
    return any(_finite(row.gpu_usd) for row in report.cost)


def _usd_per_trajectory(report: Report, *, with_gpu: bool = False) -> dict[tuple[str, str], float]:
    """(backbone, method) -> USD per trajectory, summed over stages (stages without a figure are skipped); with
    ``with_gpu``, plus the cell's GPU charge over its work items (the most items any of its stages saw)."""
    totals: dict[tuple[str, str], float] = {}
    gpu: dict[tuple[str, str], float] = {}
    items: dict[tuple[str, str], float] = {}
    for row in report.cost:
        key = (row.backbone, row.method)
        value = _finite(row.usd_per_trajectory)
        if value is not None:
            totals[key] = totals.get(key, 0.0) + value
        gpu[key] = gpu.get(key, 0.0) + (_finite(row.gpu_usd) or 0.0)
        items[key] = max(items.get(key, 0.0), _finite(row.items) or 0.0)
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


def _outcomes(report: Report) -> dict[tuple[str, str, int], CellOutcome]:
    """(backbone, method, realization) -> its outcome row."""
    return {(row.backbone, row.method, row.realization): row for row in report.outcomes}


def _clean(row: CellOutcome) -> bool:
    """Every expected trajectory has a readable prediction that the model decided."""
    return row.readable == row.expected and row.fallback == 0


def _min_share(report: Report) -> float:
    share = _finite(_protocol(report).min_readable_share)
    return 0.5 if share is None else share


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why a cell's number must not be read as a score: its status word and, for the page, the reason."""

    word: str
    reason: str


def _failure(
    report: Report,
    row: CellMetrics,
    outcomes: Mapping[tuple[str, str, int], CellOutcome] | None = None,
) -> _Failure | None:
    """The failure of a backbone × method × realization cell, or None when its number rests on answers.

    A cell fails when the report does not show its number (``shown`` false in its metrics or outcome row), when
    it has no scored prediction (``n`` 0), or when its readable answers cover less of its expected trajectories
    than the report's threshold (``min_readable_share``): the last is checked here too, so a number is never
    marked best on the word of a flag alone.
    """
    key = (row.backbone, row.method, row.realization)
    outcome = (_outcomes(report) if outcomes is None else outcomes).get(key)
    expected, readable = (0, 0) if outcome is None else (outcome.expected, outcome.readable)
    low = outcome is not None and (expected == 0 or readable < _min_share(report) * expected)
    hidden = not row.shown or (outcome is not None and not outcome.shown)
    if not (low or hidden or row.pooled.n == 0):
        return None
    status = row.status or ("" if outcome is None else outcome.status)
    word = status if status and status not in ("complete", "partial") else "too few readable"
    entry = None if outcome is None else outcome.messages.get("invalid" if word == "unreadable" else "failed")
    message = "" if entry is None else entry.message
    if len(message) > _WHY_CHARS:
        message = message[: _WHY_CHARS - 1] + "…"
    counts = f"{readable} of {expected} answers readable" if outcome is not None else "no answers scored"
    return _Failure(word, f"{message} ({counts})" if message else counts)


_WHY_CHARS = 72


def _confidence(report: Report) -> float:
    level = _finite(_protocol(report).confidence)
    return 0.95 if level is None or not 0 < level < 1 else level


def _interval(report: Report, row: CellMetrics, metric: str) -> tuple[float, float] | None:
    """The report's interval for one cell's headline Agent or Step Acc; None when the cell has no number.

    A report without ``intervals`` (built by hand, or by an older rcarun) gets `stratified_interval` of
    its per-source counts, which is what the report computes.
    """
    headline = _headline(report, row)
    estimate = _score(headline, metric)
    if estimate is None:
        return None
    carried = row.pooled_intervals if _aggregate(report) == "pooled" else row.macro_intervals
    bounds = None if carried is None else carried.get(metric)
    if bounds is not None:
        return float(bounds[0]), float(bounds[1])
    strata = []
    for scores in row.per_source.values():
        p = _score(scores, metric)
        if scores.n and p is not None:
            strata.append((float(scores.n), p))
    if not strata:  # a row without sources: the headline as one binomial
        n = headline.n or row.pooled.n
        if not n:
            return None
        strata = [(float(n), estimate)]
    found = stratified_interval(
        estimate,
        strata,
        weighting="pooled" if _aggregate(report) == "pooled" else "macro",
        confidence=_confidence(report),
    )
    return found.low, found.high


def _totals(report: Report) -> str | None:
    """One line over every cell: expected items, predictions, unreadable, fallback, failed, skipped, unrun."""
    rows = report.outcomes
    if not rows:
        return None
    total = {k: sum(r.count(k) for r in rows) for k in _OUTCOME_KEYS}
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


def _outcome_sentence(label: str, row: CellOutcome) -> str:
    """What one cell's number rests on, in words."""
    expected, predictions = row.expected, row.predictions
    invalid, fallback = row.invalid, row.fallback
    failed, skipped = row.failed, row.skipped_budget
    unrun = row.interrupted + row.not_run
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
    if not row.shown:
        if predictions == 0:
            return f"{text}. Not scored ({row.status}): no answer to rest a number on."
        return f"{text}. Not shown ({row.status}): only {row.readable} readable answers; not compared."
    errors = failed + skipped + unrun
    if errors or invalid:
        text += (
            f". Its numbers count {errors} failed, skipped or unrun item{'s' if errors != 1 else ''} "
            f"and {invalid} unreadable answer{'s' if invalid != 1 else ''} as errors"
        )
    return text + "."


def _outcome_notes(report: Report, keys: Iterable[tuple[str, str, int]]) -> list[str]:
    """The sentences of the cells among ``keys`` whose numbers count errors (or are not shown), capped, then a
    pointer to Outcomes. A cell whose every answer was read, some decided by a published fallback, has no note
    under the accuracy table (its number counts no error); the Outcomes section lists it."""
    outcomes = _outcomes(report)
    single = len({b for b, _, _ in outcomes}) == 1
    sentences = []
    for backbone, method, realization in keys:
        row = outcomes.get((backbone, method, realization))
        if row is None or row.readable == row.expected:
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
