"""The report of one run as plain data: accuracy, paired comparisons, repeatability, length groups and cost.

`rcarun report` prints it (text), dumps it (``--json``) or renders it (``--html``); all three read the same
dict built here, so the page, the terminal and a script see identical numbers. Accuracies are fractions.

Protocol choices (LongRCA Sec. 5.1, App. B, H, L.1), each an option of `ReportOptions`:
    - Headline aggregate: Macro over sources (``aggregate="macro"``, the paper's Mini protocol; with one source
      it equals pooled) or pooled.
    - Paired comparisons use one retained prediction per method and backbone: realization 0 (as the paper's
      "one retained prediction"; the other realizations feed the repeatability section). Each method is
      compared with ``reference_method`` (default: ``rcta`` when present, else the first method by name) on
      every backbone, for Agent Acc and Step Acc: difference in the headline aggregate, wins/losses, two-sided
      exact McNemar on the discordant pairs, and a source-stratified paired bootstrap interval
      (``resamples``, ``seed``, ``confidence``).
    - Holm families (``holm_family``): ``"metric"`` adjusts each metric's comparisons together (the paper's
      Holm-20 over Step Acc); ``"all"`` adjusts every comparison of the report together (Holm-40).
    - Backbone comparisons (``compare_backbones``): for every method, each backbone against the first one
      named, with the same statistics, under ``paired_backbones``. When none are named and the run has a
      single method on several backbones, every backbone is compared with the first by name (there is no
      method comparison to make then).
    - Complementarity (Step Acc): the reference against each other method and, when there are two or more,
      against their union (a trajectory counts for the union when any other method found its root; the
      paper's Figure 8).
    - Recall diagnostics (LongRCA Fig. 6a): for methods that store ``diagnostics`` in their output (lists of
      step ids under `RECALL_SETS`: RCTA's base candidates, excerpts shown to the attribution call, evidence it
      cited), the share of expected trajectories whose reference root is in each list; realization 0; a
      trajectory without diagnostics counts as not retained.
    - Turns (Continual Search paper, Table 2 and Fig. 7): for methods that store per-turn records (``turns``),
      accuracy of the answer standing after each turn in the headline aggregate, the share of trajectories whose
      answer changed at that turn, and the deduplicated evidence read (new in the turn, and cumulative).
    - Length groups: the shared partition of the expected trajectories' lengths (``length_groups`` groups).
    - Post-stratification to ``populations`` when given (e.g. LongRCA Full's source sizes).
    - Outcomes: per backbone × method × realization, what became of the expected trajectories (`Outcome`:
      predictions, unreadable answers, fallback decisions, failed, skipped for budget, interrupted, never run)
      and a ``status``. Failed and skipped items still score as errors (docs/analysis.md), but a number must
      rest on answers: a cell is ``shown`` when readable predictions (not failed, skipped, interrupted, never
      run or unreadable) cover at least `MIN_READABLE_SHARE` of its expected trajectories. A cell that is not
      shown is never marked best, is left out of paired comparisons and complementarity (listed under
      ``excluded``), and its status names the main reason; a cell without any prediction is not scored at all
      (``n`` 0, every metric null) instead of scoring 0 as if it had answered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rcarun.errors import ConfigError, StoreError
from rcarun.store import Store

from .cost import cost_rows
from .results import Cell, Outcome, RunScores, load_run_scores
from .scoring import (
    ItemScore,
    Metrics,
    Prediction,
    Summary,
    by_length_group,
    length_groups,
    score_items,
    summarize,
)
from .stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Complementarity,
    PairedComparison,
    adjust_family,
    complementarity,
    paired_comparison,
    pairwise_agreement,
    spread,
    union_complementarity,
)

__all__ = [
    "METRIC_NAMES",
    "MIN_READABLE_SHARE",
    "RECALL_SETS",
    "ReportOptions",
    "build_report",
    "cell_status",
    "metrics_json",
]

METRIC_NAMES = ("agent_acc", "step_acc", "step_pm5", "joint_exact", "joint_pm5", "root_mae", "coverage")
PAIRED_METRICS = ("agent_acc", "step_acc")
# Step-id lists a method may store under output["diagnostics"], in pipeline order.
RECALL_SETS = ("base_candidate_ids", "excerpt_ids", "evidence_ids")
_CORRECT = {"agent_acc": "role_correct", "step_acc": "step_exact", "step_pm5": "step_pm5"}
MIN_READABLE_SHARE = 0.5
"""The share of a cell's expected trajectories that readable predictions must cover for its number to be shown,
marked best and compared (module docstring)."""
# Why a cell's number would rest on nothing: the outcome count and the word shown for it (equal counts: "n/a").
_CAUSES = (
    ("failed", "failed"),
    ("skipped_budget", "skipped"),
    ("interrupted", "interrupted"),
    ("not_run", "not run"),
    ("invalid", "unreadable"),
)


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """How the report is computed (module docstring)."""

    reference_method: str | None = None
    aggregate: str = "macro"
    resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED
    confidence: float = 0.95
    holm_family: str = "metric"
    compare_backbones: tuple[str, ...] = ()
    populations: Mapping[str, int] | None = None
    length_groups: int = 5
    keep_handoff: bool = False
    paired_metrics: tuple[str, ...] = PAIRED_METRICS


def cell_status(outcome: Outcome) -> tuple[str, bool]:
    """A cell's status word and whether its number is shown (module docstring).

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


def _outcome_json(cell: Cell, outcome: Outcome) -> dict[str, Any]:
    status, shown = cell_status(outcome)
    return {
        "backbone": cell.backbone,
        "method": cell.method,
        "realization": cell.realization,
        "expected": outcome.expected,
        "predictions": outcome.predictions,
        "invalid": outcome.invalid,
        "fallback": outcome.fallback,
        "failed": outcome.failed,
        "skipped_budget": outcome.skipped_budget,
        "interrupted": outcome.interrupted,
        "not_run": outcome.not_run,
        "unanswered": outcome.unanswered,
        "readable": outcome.readable,
        "status": status,
        "shown": shown,
        "messages": {
            kind: {"message": message, "count": count} for kind, (message, count) in outcome.messages.items()
        },
    }


def _shown(scores: RunScores, cell: Cell) -> bool:
    outcome = scores.outcomes.get(cell)
    return outcome is not None and cell_status(outcome)[1]


def metrics_json(metrics: Metrics) -> dict[str, Any]:
    """A `Metrics` as the report's metric dict (fractions; ``root_mae`` in steps)."""
    return {"n": metrics.n, **{name: getattr(metrics, name) for name in METRIC_NAMES}}


def build_report(store: Store, run_id: int, options: ReportOptions | None = None) -> dict[str, Any]:
    """The report dict of one run (schema: docs/analysis.md)."""
    options = options or ReportOptions()
    run = next((r for r in store.runs() if r.run_id == run_id), None)
    if run is None:
        raise StoreError(f"{store.path}: no run with id {run_id}")
    scores = load_run_scores(store, run, keep_handoff=options.keep_handoff)
    reference = _reference_method(scores, options.reference_method)
    paired = _paired_methods(scores, reference, options)
    if not options.compare_backbones and len(scores.methods) == 1 and len(scores.backbones) > 1:
        options = replace(options, compare_backbones=tuple(scores.backbones))
    paired_backbones = _paired_backbones(scores, options)
    if options.holm_family == "all":
        paired, paired_backbones = _holm_all(paired, paired_backbones)
    return {
        "run": {"name": run.name, "run_id": run.run_id, "status": run.status, "created_at": run.created_at},
        "db": str(store.path),
        "simulated": scores.simulated,
        "aggregate": options.aggregate,
        "reference_method": reference,
        "expected": len(scores.expected),
        "unlabelled": scores.unlabelled,
        "protocol": {
            "resamples": options.resamples,
            "seed": options.seed,
            "confidence": options.confidence,
            "holm_family": options.holm_family,
            "compare_backbones": list(options.compare_backbones),
            "keep_handoff": options.keep_handoff,
            "populations": dict(options.populations) if options.populations else None,
            "min_readable_share": MIN_READABLE_SHARE,
        },
        "outcomes": [_outcome_json(cell, outcome) for cell, outcome in sorted(scores.outcomes.items())],
        "excluded": _excluded(scores),
        "metrics": _metrics(scores, options),
        "paired": [entry for entry, _ in paired],
        "paired_backbones": [entry for entry, _ in paired_backbones],
        "complementarity": _complementarity(scores, reference),
        "repeatability": _repeatability(scores, options),
        "recall": _recall(scores),
        "turns": _turns(scores, options),
        "length_groups": _length_groups(scores, options),
        "cost": [row.to_json() for row in cost_rows(store, run_id)],
    }


def _reference_method(scores: RunScores, wanted: str | None) -> str | None:
    methods = scores.methods
    if wanted is not None:
        if wanted not in methods:
            raise ConfigError(
                f"reference method {wanted!r} is not in run {scores.run.name!r} (methods: {methods})"
            )
        return wanted
    if "rcta" in methods:
        return "rcta"
    return methods[0] if methods else None


def _excluded(scores: RunScores) -> list[dict[str, Any]]:
    """Realization-0 cells left out of paired comparisons and complementarity: their number is not shown."""
    return [
        {"backbone": cell.backbone, "method": cell.method, "status": cell_status(outcome)[0]}
        for cell, outcome in sorted(scores.outcomes.items())
        if cell.realization == 0 and not cell_status(outcome)[1]
    ]


def _scored(scores: RunScores, cell: Cell) -> bool:
    """The cell has at least one prediction: there is something to score (module docstring)."""
    outcome = scores.outcomes.get(cell)
    return outcome is None or outcome.predictions > 0


_BLANK = {"n": 0, **dict.fromkeys(METRIC_NAMES)}


def _metrics(scores: RunScores, options: ReportOptions) -> list[dict[str, Any]]:
    entries = []
    for cell, items in scores.scores.items():
        if not items:
            continue
        outcome = scores.outcomes.get(cell)
        status, shown = cell_status(outcome) if outcome is not None else ("complete", True)
        entry: dict[str, Any] = {
            "backbone": cell.backbone,
            "method": cell.method,
            "realization": cell.realization,
            "status": status,
            "shown": shown,
        }
        if not _scored(scores, cell):  # nothing answered: not 0.0 as if it had
            entries.append(
                {**entry, **_BLANK, "macro": dict(_BLANK), "per_source": {}, "post_stratified": None}
            )
            continue
        summary = summarize(items, populations=options.populations)
        entries.append(
            {
                **entry,
                **metrics_json(summary.pooled),
                "macro": metrics_json(summary.macro),
                "per_source": {source: metrics_json(m) for source, m in sorted(summary.per_source.items())},
                "post_stratified": metrics_json(summary.post_stratified) if summary.post_stratified else None,
            }
        )
    return entries


def _outcomes(items: Sequence[ItemScore], metric: str) -> list[bool]:
    attribute = _CORRECT[metric]
    return [bool(getattr(item, attribute)) for item in items]


def _compare(
    a: Sequence[ItemScore], b: Sequence[ItemScore], metric: str, options: ReportOptions
) -> PairedComparison:
    return paired_comparison(
        _outcomes(a, metric),
        _outcomes(b, metric),
        [item.source for item in a],
        aggregate="macro" if options.aggregate == "macro" else "pooled",
        resamples=options.resamples,
        seed=options.seed,
        confidence=options.confidence,
    )


def _comparison_json(comparison: PairedComparison) -> dict[str, Any]:
    return {
        "n": comparison.n,
        "score_a": comparison.score_a,
        "score_b": comparison.score_b,
        "delta": comparison.delta,
        "ci_low": comparison.ci_low,
        "ci_high": comparison.ci_high,
        "wins": comparison.wins,
        "losses": comparison.losses,
        "p_mcnemar": comparison.p_mcnemar,
        "p_holm": comparison.p_holm,
    }


Paired = list[tuple[dict[str, Any], PairedComparison]]


def _with_holm(entries: Paired, group_key: str | None) -> Paired:
    """Holm-adjust ``entries`` within groups of equal ``entry[group_key]`` (all together when None)."""
    groups: dict[Any, list[int]] = {}
    for index, (entry, _) in enumerate(entries):
        groups.setdefault(entry[group_key] if group_key else None, []).append(index)
    adjusted = list(entries)
    for indices in groups.values():
        for index, comparison in zip(indices, adjust_family([entries[i][1] for i in indices]), strict=True):
            entry = {**entries[index][0], **_comparison_json(comparison)}
            adjusted[index] = (entry, comparison)
    return adjusted


def _method_pairs(
    scores: RunScores, reference: str | None
) -> Iterator[tuple[str, str, list[ItemScore], list[ItemScore]]]:
    """(backbone, method, reference's scores, method's scores) for every other method, realization 0."""
    if reference is None:
        return
    for backbone in scores.backbones:
        base = scores.scores.get(Cell(backbone, reference, 0))
        if not base or not _shown(scores, Cell(backbone, reference, 0)):
            continue
        for method in scores.methods:
            other = scores.scores.get(Cell(backbone, method, 0))
            if method != reference and other and _shown(scores, Cell(backbone, method, 0)):
                yield backbone, method, base, other


def _paired_methods(scores: RunScores, reference: str | None, options: ReportOptions) -> Paired:
    entries: Paired = []
    for backbone, method, base, other in _method_pairs(scores, reference):
        for metric in options.paired_metrics:
            comparison = _compare(base, other, metric, options)
            entry = {"backbone": backbone, "method_a": reference, "method_b": method, "metric": metric}
            entries.append(({**entry, **_comparison_json(comparison)}, comparison))
    return _with_holm(entries, "metric")


def _paired_backbones(scores: RunScores, options: ReportOptions) -> Paired:
    if len(options.compare_backbones) < 2:
        return []
    first, *others = options.compare_backbones
    entries: Paired = []
    for method in scores.methods:
        base = scores.scores.get(Cell(first, method, 0))
        if not base or not _shown(scores, Cell(first, method, 0)):
            continue
        for backbone in others:
            other = scores.scores.get(Cell(backbone, method, 0))
            if not other or not _shown(scores, Cell(backbone, method, 0)):
                continue
            for metric in options.paired_metrics:
                comparison = _compare(base, other, metric, options)
                entry = {"method": method, "backbone_a": first, "backbone_b": backbone, "metric": metric}
                entries.append(({**entry, **_comparison_json(comparison)}, comparison))
    return _with_holm(entries, "metric")


def _holm_all(paired: Paired, paired_backbones: Paired) -> tuple[Paired, Paired]:
    combined = _with_holm(paired + paired_backbones, None)
    return combined[: len(paired)], combined[len(paired) :]


def _complementarity(scores: RunScores, reference: str | None) -> list[dict[str, Any]]:
    """Step Acc overlap of the reference with each other method and, with two or more, with their union."""
    entries = []
    others_by_backbone: dict[str, list[tuple[list[ItemScore], list[ItemScore]]]] = {}
    for backbone, method, base, other in _method_pairs(scores, reference):
        others_by_backbone.setdefault(backbone, []).append((base, other))
        counts = complementarity(_outcomes(base, "step_acc"), _outcomes(other, "step_acc"))
        entries.append(_overlap(backbone, reference, method, counts))
    for backbone, pairs in others_by_backbone.items():
        if len(pairs) >= 2:
            base = pairs[0][0]
            union = union_complementarity(
                _outcomes(base, "step_acc"), [_outcomes(other, "step_acc") for _, other in pairs]
            )
            entries.append(_overlap(backbone, reference, "union of the others", union))
    return entries


def _overlap(backbone: str, method_a: str | None, method_b: str, counts: Complementarity) -> dict[str, Any]:
    return {
        "backbone": backbone,
        "method_a": method_a,
        "method_b": method_b,
        "metric": "step_acc",
        "a_only": counts.a_only,
        "b_only": counts.b_only,
        "both": counts.both,
        "neither": counts.neither,
    }


def _repeatability(scores: RunScores, options: ReportOptions) -> list[dict[str, Any]]:
    entries = []
    for backbone in scores.backbones:
        for method in scores.methods:
            realizations = [
                r for r in scores.realizations(backbone, method) if _scored(scores, Cell(backbone, method, r))
            ]
            if len(realizations) < 2:
                continue
            per_realization = {r: summarize(scores.scores[Cell(backbone, method, r)]) for r in realizations}
            metrics = {}
            for name in METRIC_NAMES:
                values = {
                    r: value
                    for r, summary in per_realization.items()
                    if (value := getattr(_headline(summary, options), name)) is not None
                }
                if values:
                    s = spread(values)
                    metrics[name] = {
                        "n": s.n,
                        "mean": s.mean,
                        "sd": s.sd,
                        "min": s.min,
                        "max": s.max,
                        "range": s.range,
                    }
            steps = {
                r: {item.qid: item.step for item in scores.scores[Cell(backbone, method, r)]}
                for r in realizations
            }
            agreement = [
                {
                    "first": a.first,
                    "second": a.second,
                    "n": a.n,
                    "agree": a.agree,
                    "both_missing": a.both_missing,
                    "rate": a.rate,
                }
                for a in pairwise_agreement(steps)
            ]
            rates = [entry["rate"] for entry in agreement]
            entries.append(
                {
                    "backbone": backbone,
                    "method": method,
                    "realizations": realizations,
                    "metrics": metrics,
                    "agreement": agreement,
                    "mean_agreement": sum(rates) / len(rates) if rates else None,
                }
            )
    return entries


def _headline(summary: Summary, options: ReportOptions) -> Metrics:
    return summary.macro if options.aggregate == "macro" else summary.pooled


def _recall(scores: RunScores) -> list[dict[str, Any]]:
    entries = []
    roots = {e.qid: e.ref_step for e in scores.expected}
    for cell, by_qid in sorted(scores.diagnostics.items()):
        if cell.realization != 0 or not by_qid or not roots:
            continue
        entry: dict[str, Any] = {"backbone": cell.backbone, "method": cell.method, "n": len(roots)}
        for name in RECALL_SETS:
            retained = sum(
                1
                for qid, root in roots.items()
                if isinstance(ids := by_qid.get(qid, {}).get(name), list) and root in ids
            )
            entry[name.removesuffix("_ids")] = retained / len(roots)
        entries.append(entry)
    return entries


def _turns(scores: RunScores, options: ReportOptions) -> list[dict[str, Any]]:
    """Per-turn accuracy of multi-turn methods (Continual Search, Passive Continuation), every realization.

    Turn t's prediction of a trajectory is the answer standing after turn t; a trajectory whose record stops
    earlier (no continuation was possible) keeps its last answer, and one without a prediction (a failed item)
    counts as wrong at every turn, as in the method's own row. Evidence figures are means over the trajectories
    with a record: new deduplicated tokens read in the turn, and the cumulative total after it.
    """
    entries = []
    for cell, by_qid in sorted(scores.turns.items()):
        if not by_qid:
            continue
        last_turn = max(len(records) for records in by_qid.values())
        for index in range(last_turn):
            predictions = {}
            changed = evidence_new = evidence_total = 0.0
            for qid, records in by_qid.items():
                record = records[min(index, len(records) - 1)]
                step = record.get("pred_step")
                role = record.get("pred_role")
                predictions[qid] = Prediction(
                    role=role if isinstance(role, str) else None,
                    step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                    abstained=False,
                )
                if index < len(records):
                    changed += bool(record.get("changed_from_prev"))
                    evidence_new += _number(record.get("evidence_tokens"))
                evidence_total += _number(record.get("evidence_total"))
            items = score_items(scores.expected, predictions, keep_handoff=options.keep_handoff)
            metrics = _headline(summarize(items, populations=options.populations), options) if items else None
            entries.append(
                {
                    "backbone": cell.backbone,
                    "method": cell.method,
                    "realization": cell.realization,
                    "turn": index + 1,
                    "n": len(by_qid),
                    "agent_acc": metrics.agent_acc if metrics else None,
                    "step_acc": metrics.step_acc if metrics else None,
                    "step_pm5": metrics.step_pm5 if metrics else None,
                    "changed": changed / len(by_qid),
                    "evidence_tokens": evidence_new / len(by_qid),
                    "evidence_total": evidence_total / len(by_qid),
                }
            )
    return entries


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _length_groups(scores: RunScores, options: ReportOptions) -> list[dict[str, Any]]:
    if not scores.expected or options.length_groups < 1:
        return []
    partition = length_groups({e.qid: e.n_steps for e in scores.expected}, k=options.length_groups)
    entries = []
    for cell, items in scores.scores.items():
        if cell.realization != 0 or not _scored(scores, cell):
            continue
        for group in by_length_group(items, partition):
            metrics = group.metrics
            entries.append(
                {
                    "backbone": cell.backbone,
                    "method": cell.method,
                    "low": group.group.low,
                    "high": group.group.high,
                    "n": len(group.group.qids),
                    "agent_acc": metrics.agent_acc if metrics else None,
                    "step_acc": metrics.step_acc if metrics else None,
                    "step_pm5": metrics.step_pm5 if metrics else None,
                }
            )
    return entries
