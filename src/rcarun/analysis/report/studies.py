"""The report's studies: repeatability, recall, turns, length groups, the component study, Mini fidelity, sample-size
calibration and label sensitivity.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rcarun.errors import ConfigError
from rcarun.store import RunRow, Store

from ..fidelity import mini_fidelity, sample_size_calibration
from ..protocol import ABLATION_PRESET, MethodKind, Protocol, resolve_protocol
from ..results import Cell, RunScores, load_run_scores, resolve_run
from ..scoring import (
    METRICS,
    ItemScore,
    LengthGroup,
    Prediction,
    length_groups,
    pooled,
    score_items,
    summarize,
)
from ..sensitivity import label_sensitivity
from ..stats import (
    PairedComparison,
    adjust_family,
    newcombe_difference,
    pairwise_agreement,
    spread,
    wilson_interval,
)
from .cells import _coverage_rule, _headline, _outcomes, _scored, _shown, cell_status
from .model import Repeatability
from .options import METRIC_NAMES, RECALL_SETS, ReportOptions, _bounds, _number, _Study
from .paired import _compare


def _repeatability(scores: RunScores, protocol: Protocol) -> list[Repeatability]:
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
                    if (value := getattr(_headline(summary, protocol), name)) is not None
                }
                if values:
                    metrics[name] = spread(values)
            steps = {
                r: {item.qid: item.step for item in scores.scores[Cell(backbone, method, r)]}
                for r in realizations
            }
            agreement = [
                a
                for first, second in itertools.combinations(realizations, 2)
                # Realizations of different scopes (SOAP's split seeds) agree on the trajectories both answer.
                if steps[first].keys() & steps[second].keys()
                for a in pairwise_agreement({first: steps[first], second: steps[second]})
            ]
            rates = [a.rate for a in agreement]
            mean = sum(rates) / len(rates) if rates else None
            entries.append(Repeatability(backbone, method, tuple(realizations), metrics, agreement, mean))
    return entries


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


def _turns(scores: RunScores, protocol: Protocol, options: ReportOptions) -> list[dict[str, Any]]:
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
            items = score_items(
                scores.expected,
                predictions,
                keep_handoff=protocol.keep_handoff,
                abstentions=protocol.abstentions,
            )
            metrics = (
                _headline(summarize(items, populations=options.populations), protocol) if items else None
            )
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


_GROUP_METRICS = tuple(m.name for m in METRICS if m.by_length)


def _length_cells(
    scores: RunScores, options: ReportOptions
) -> Iterator[tuple[Cell, list[tuple[LengthGroup, list[ItemScore]]]]]:
    """Each scored realization-0 cell with its items in each group of the shared length partition, shortest
    group first."""
    if not scores.expected or options.length_groups < 1:
        return
    partition = length_groups({e.qid: e.n_steps for e in scores.expected}, k=options.length_groups)
    for cell, items in scores.scores.items():
        if cell.realization != 0 or not _scored(scores, cell):
            continue
        by_qid = {item.qid: item for item in items}
        yield cell, [(group, [by_qid[q] for q in group.qids if q in by_qid]) for group in partition.groups]


def _hits(items: Sequence[ItemScore], metric: str) -> int:
    return sum(_outcomes(items, metric))


def _length_groups(scores: RunScores, options: ReportOptions) -> list[dict[str, Any]]:
    entries = []
    for cell, groups in _length_cells(scores, options):
        for group, items in groups:
            metrics = pooled(items) if items else None
            entries.append(
                {
                    "backbone": cell.backbone,
                    "method": cell.method,
                    "low": group.low,
                    "high": group.high,
                    "n": len(group.qids),
                    **{metric: getattr(metrics, metric) if metrics else None for metric in _GROUP_METRICS},
                    # App. F.1's Wilson intervals, over the group's scored trajectories.
                    "intervals": {
                        metric: _bounds(
                            wilson_interval(_hits(items, metric), len(items), confidence=options.confidence)
                        )
                        for metric in _GROUP_METRICS
                    }
                    if items
                    else None,
                }
            )
    return entries


def _length_contrasts(scores: RunScores, options: ReportOptions) -> list[dict[str, Any]]:
    """Per cell and metric, the longest length group minus the shortest with Newcombe's interval (App. F.1);
    groups with no scored trajectory are passed over."""
    entries = []
    for cell, groups in _length_cells(scores, options):
        scored = [(group, items) for group, items in groups if items]
        if len(scored) < 2:
            continue
        (short, shortest), (long, longest) = scored[0], scored[-1]
        for metric in _GROUP_METRICS:
            found = newcombe_difference(
                _hits(longest, metric),
                len(longest),
                _hits(shortest, metric),
                len(shortest),
                confidence=options.confidence,
            )
            entries.append(
                {
                    "backbone": cell.backbone,
                    "method": cell.method,
                    "metric": metric,
                    "longest": [long.low, long.high],
                    "shortest": [short.low, short.high],
                    "delta": found.estimate,
                    "ci_low": found.low,
                    "ci_high": found.high,
                }
            )
    return entries


def _component_row(
    scores: RunScores, cell: Cell, kinds: Mapping[str, MethodKind], rules: Protocol
) -> dict[str, Any]:
    outcome = scores.outcomes.get(cell)
    status, shown = cell_status(outcome) if outcome is not None else ("complete", True)
    row: dict[str, Any] = {
        "backbone": cell.backbone,
        "method": cell.method,
        "ablation": kinds[cell.method].ablation,
        "status": status,
        "shown": shown,
        **dict.fromkeys(("delta", "ci_low", "ci_high", "wins", "losses", "p_mcnemar", "p_holm")),
    }
    items = scores.scores[cell]
    fields = ("agent_acc", "step_acc", "step_pm5", "root_mae", "coverage")
    if not items or not _scored(scores, cell):
        return {**row, "n": 0, **dict.fromkeys(fields), "valid_step_n": 0, "coverage_rule": None}
    headline = _headline(summarize(items), rules)
    return {
        **row,
        "n": headline.n,
        **{name: getattr(headline, name) for name in fields},
        "valid_step_n": headline.valid_step_n,
        "coverage_rule": _coverage_rule(items),
    }


def _components(
    store: Store,
    run: RunRow,
    scores: RunScores,
    kinds: Mapping[str, MethodKind],
    protocol: Protocol,
    options: ReportOptions,
    study: _Study | None,
) -> dict[str, Any] | None:
    """The component study in Table 25's layout, under the ablation rules (docs/analysis.md); None without one."""
    if study is None:
        return None
    if protocol.name == "ablation":
        rules, study_scores = protocol, scores
    else:
        rules = resolve_protocol(
            kinds, {}, manifest=False, protocol="ablation", resamples=options.resamples, seed=options.seed
        )
        study_scores = load_run_scores(
            store, run, keep_handoff=rules.keep_handoff, abstentions=rules.abstentions
        )
    rows: list[dict[str, Any]] = []
    for backbone in study_scores.backbones:
        base_cell = Cell(backbone, study.full, 0)
        present = [c for c in study.conditions if Cell(backbone, c, 0) in study_scores.scores]
        if base_cell not in study_scores.scores or not present:
            continue
        block = [_component_row(study_scores, base_cell, kinds, rules)]
        tested: list[tuple[dict[str, Any], PairedComparison]] = []
        for condition in present:
            cell = Cell(backbone, condition, 0)
            row = _component_row(study_scores, cell, kinds, rules)
            block.append(row)
            if _shown(study_scores, base_cell) and _shown(study_scores, cell):
                # Δ is the condition minus full RCTA, as Table 25 prints it.
                comparison = _compare(
                    study_scores.scores[cell],
                    study_scores.scores[base_cell],
                    "step_acc",
                    rules,
                    options.confidence,
                )
                tested.append((row, comparison))
        for (row, _), comparison in zip(tested, adjust_family([c for _, c in tested]), strict=True):
            row.update(
                {key: getattr(comparison, key) for key in ("delta", "ci_low", "ci_high", "wins", "losses")}
            )
            row.update({"p_mcnemar": comparison.p_mcnemar, "p_holm": comparison.p_holm})
        rows += block
    return {
        "reference": study.full,
        "conditions": list(study.conditions),
        "off_settings": _off_ablation_settings(store, run.run_id, (study.full, *study.conditions)),
        "scoring_rule": rules.rule,
        "abstentions": rules.abstentions,
        "keep_handoff": rules.keep_handoff,
        "aggregate": rules.aggregate,
        "resamples": rules.resamples,
        "seed": rules.seed,
        "metric": "step_acc",
        "family": "App. H: Holm over the component conditions against full RCTA, per backbone",
        "rows": rows,
    }


def _off_ablation_settings(store: Store, run_id: int, labels: Sequence[str]) -> list[dict[str, Any]]:
    """The study's cells whose predictions did not all run at App. H's settings (RCTA's ``ablation`` preset):
    their numbers are not Table 25's (full RCTA at the Full budgets, or a condition from before it defaulted)."""
    off = []
    for (backbone, method), presets in sorted(store.output_values(run_id, "preset").items()):
        if method in labels and set(presets) != {ABLATION_PRESET}:
            off.append({"backbone": backbone, "method": method, "presets": dict(sorted(presets.items()))})
    return off


def _shown_cells(scores: RunScores, methods: Sequence[str]) -> dict[tuple[str, str], list[ItemScore]]:
    """Realization-0 scores of the cells of ``methods`` whose number is shown, by (backbone, method)."""
    return {
        (cell.backbone, cell.method): items
        for cell, items in sorted(scores.scores.items())
        if cell.realization == 0 and cell.method in methods and items and _shown(scores, cell)
    }


def _fidelity(
    store: Store,
    run: RunRow,
    scores: RunScores,
    methods: Sequence[str],
    protocol: Protocol,
    options: ReportOptions,
    full_store: Store | None,
) -> dict[str, Any] | None:
    """App. A's Mini-against-Full fidelity of ``methods`` with ``options.calibrate_against`` as the Full run;
    None without."""
    if options.calibrate_against is None:
        return None
    source = full_store if full_store is not None else store
    full_run = resolve_run(source, options.calibrate_against)
    if source is store and full_run.run_id == run.run_id:
        raise ConfigError(f"--calibrate-against names the report's own run {run.name!r}")
    full_scores = load_run_scores(
        source, full_run, keep_handoff=protocol.keep_handoff, abstentions=protocol.abstentions
    )
    mini_cells, full_cells = _shown_cells(scores, methods), _shown_cells(full_scores, methods)
    result = mini_fidelity(scores.expected, mini_cells, full_scores.expected, full_cells)
    excluded = sorted(
        {(c.backbone, c.method) for c in scores.scores if c.realization == 0 and c.method in methods}
        | {(c.backbone, c.method) for c in full_scores.scores if c.realization == 0 and c.method in methods}
    )
    return {
        "full_run": full_run.name,
        "full_db": str(source.path),
        "mini_run": run.name,
        "aggregate": "macro",
        "scoring_rule": protocol.rule,
        **result,
        "excluded": [
            {
                "backbone": backbone,
                "method": method,
                "why": "not shown in the Mini run"
                if (backbone, method) not in mini_cells and (backbone, method) in full_cells
                else "not shown in the Full run"
                if (backbone, method) in mini_cells
                else "not in both runs with a shown number",
            }
            for backbone, method in excluded
            if (backbone, method) not in mini_cells or (backbone, method) not in full_cells
        ],
    }


def _calibration(scores: RunScores, methods: Sequence[str], options: ReportOptions) -> dict[str, Any] | None:
    """App. A's sample-size calibration of ``methods`` over this (Full) run; None unless sizes were asked for."""
    if not options.calibration_sizes:
        return None
    result = sample_size_calibration(
        scores.expected,
        _shown_cells(scores, methods),
        options.calibration_sizes,
        draws=options.draws,
        seed=options.calibration_seed,
    )
    return {"run": scores.run.name, "aggregate": "macro", **result}


def _label_sensitivity(
    scores: RunScores, reference: str | None, methods: Sequence[str], options: ReportOptions
) -> dict[str, Any] | None:
    """App. K.1's label sensitivity of ``methods`` per backbone; None without annotations."""
    if options.annotations is None:
        return None
    annotations = options.annotations
    expected_qids = {item.qid for item in scores.expected}
    rows: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []
    orderings: list[dict[str, Any]] = []
    cells = _shown_cells(scores, methods)
    for backbone in sorted({backbone for backbone, _ in cells}):
        found = label_sensitivity(
            scores.expected,
            {method: items for (b, method), items in cells.items() if b == backbone},
            annotations,
            reference=reference,
            draws=options.draws,
            seed=options.annotation_seed,
            confidence=options.confidence,
        )
        rows += [{"backbone": backbone, **row} for row in found["rows"]]
        gaps += [{"backbone": backbone, **row} for row in found["gaps"]]
        orderings += [{"backbone": backbone, **row} for row in found["orderings"]]
    n = sum(1 for item in scores.expected if len(annotations.get(item.qid, ())) >= 2)
    return {
        "draws": options.draws,
        "seed": options.annotation_seed,
        "confidence": options.confidence,
        "annotated": len(annotations),
        "unknown": sum(1 for qid in annotations if qid not in expected_qids),
        "single": sum(1 for qid, steps in annotations.items() if qid in expected_qids and len(steps) < 2),
        "n": n,
        "reference": reference,
        "aggregate": "pooled",
        "rows": rows,
        "gaps": gaps,
        "orderings": orderings,
    }
