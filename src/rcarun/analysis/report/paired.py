"""The report's paired comparisons: methods, backbones, across kinds of backbone, Holm families, complementarity, task
clusters and leave-one-source-out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from rcarun.store import RunRow, Store

from ..protocol import MethodKind, Protocol
from ..results import Cell, RunScores, common_items
from ..scoring import ItemScore, metric_label
from ..stats import (
    Aggregate,
    Complementarity,
    PairedComparison,
    adjust_family,
    cluster_paired_bootstrap,
    complementarity,
    leave_one_source_out,
    paired_comparison,
    stratified_paired_bootstrap,
    union_complementarity,
)
from .cells import _outcomes, _shown
from .model import HolmFamily, PairedRow
from .options import ReportOptions, _interval_json


def _compare(
    a: Sequence[ItemScore], b: Sequence[ItemScore], metric: str, protocol: Protocol, confidence: float
) -> PairedComparison:
    return paired_comparison(
        _outcomes(a, metric),
        _outcomes(b, metric),
        [item.source for item in a],
        aggregate="macro" if protocol.aggregate == "macro" else "pooled",
        resamples=protocol.resamples,
        seed=protocol.seed,
        confidence=confidence,
    )


def _paired_entry(
    comparison: PairedComparison,
    kind: Literal["methods", "backbones", "across"],
    a: Cell,
    b: Cell,
    metric: str,
    family: str,
) -> tuple[PairedRow, PairedComparison]:
    """A paired row of the report (what was compared, then the statistics) beside its comparison."""
    row = PairedRow(kind, a.backbone, a.method, b.backbone, b.method, metric, comparison.n, family=family)
    return _with_statistics(row, comparison), comparison


def _with_statistics(row: PairedRow, comparison: PairedComparison) -> PairedRow:
    return replace(
        row,
        n=comparison.n,
        score_a=comparison.score_a,
        score_b=comparison.score_b,
        delta=comparison.delta,
        ci_low=comparison.ci_low,
        ci_high=comparison.ci_high,
        wins=comparison.wins,
        losses=comparison.losses,
        p_mcnemar=comparison.p_mcnemar,
        p_holm=comparison.p_holm,
    )


Paired = list[tuple[PairedRow, PairedComparison]]


def _holm_within(entries: Paired, family: Mapping[int, str]) -> dict[int, float | None]:
    """Holm-adjusted p-values of the entries at the indices of ``family``, adjusted within equal family ids."""
    groups: dict[str, list[int]] = {}
    for index, name in family.items():
        groups.setdefault(name, []).append(index)
    adjusted: dict[int, float | None] = {}
    for indices in groups.values():
        for index, comparison in zip(indices, adjust_family([entries[i][1] for i in indices]), strict=True):
            adjusted[index] = comparison.p_holm
    return adjusted


def _adjust(*groups: Paired) -> tuple[Paired, ...]:
    """Holm within each entry's ``family`` over every group; ``p_holm_joint`` over App. B's family across both
    metrics. The groups come back adjusted, in the order and sizes given."""
    entries = [pair for group in groups for pair in group]
    p_holm = _holm_within(entries, {i: entry.family or "" for i, (entry, _) in enumerate(entries)})
    joint = _holm_within(
        entries,
        {i: "app-b" for i, (entry, _) in enumerate(entries) if (entry.family or "").startswith("app-b/")},
    )
    adjusted: Paired = []
    for index, (entry, comparison) in enumerate(entries):
        comparison = replace(comparison, p_holm=p_holm[index])
        row = replace(_with_statistics(entry, comparison), p_holm_joint=joint.get(index))
        adjusted.append((row, comparison))
    split: list[Paired] = []
    start = 0
    for group in groups:
        split.append(adjusted[start : start + len(group)])
        start += len(group)
    return tuple(split)


def _method_family(
    protocol: Protocol,
    kinds: Mapping[str, MethodKind],
    reference: str,
    method: str,
    backbone: str,
    metric: str,
    holm_backbones: Sequence[str],
) -> str:
    """The id of the Holm family a comparison of ``method`` with the reference belongs to (docs/analysis.md)."""
    if protocol.holm_family == "all":
        return "all"
    if protocol.holm_family == "metric":
        return f"metric/{metric}"
    if protocol.name == "ablation":
        return f"app-h/{backbone}/{metric}"
    in_b = kinds[reference].full_rcta and kinds[method].paper_baseline and backbone in holm_backbones
    return f"app-b/{metric}" if in_b else f"other/{metric}"


def _families(entries: Paired, options: ReportOptions, holm_why: str) -> list[HolmFamily]:
    """Every Holm family of the report: its id, how many tests it holds and what it is."""
    counts = Counter(entry.family or "" for entry, _ in entries)
    backbones = f"{', '.join(options.holm_backbones)} ({holm_why})"
    found = []
    for family, tests in counts.items():
        kind, _, rest = family.partition("/")
        metric = metric_label(rest.rpartition("/")[2])
        description = {
            "app-b": f"App. B: full RCTA against the paper's baselines, {metric}, on {backbones}",
            "other": f"comparisons outside App. B's family, {metric} (exploratory)",
            "app-h": f"App. H: the component conditions against full RCTA on {rest.rpartition('/')[0]}, {metric}",
            "metric": f"every comparison of {metric} between methods (--holm-family metric)",
            "backbones": f"every comparison of {metric} between backbones",
            "across": f"methods on a local backbone against methods on a chat backbone, {metric} (exploratory: "
            "model and method differ together; on the trajectories both answered)",
            "all": "every comparison of the report (--holm-family all)",
        }.get(kind, family)
        found.append(HolmFamily(family, tests, description))
    return found


def _shown_scores(scores: RunScores, cell: Cell) -> list[ItemScore] | None:
    """The cell's item scores when it has some and its number is shown; None otherwise."""
    found = scores.scores.get(cell)
    return found if found and _shown(scores, cell) else None


def _paired_with(
    scores: RunScores, base: list[ItemScore], cell: Cell
) -> tuple[list[ItemScore], list[ItemScore]] | None:
    """``base`` and the cell's shown scores on the trajectories both answered; None when they share none."""
    other = _shown_scores(scores, cell)
    if other is None:
        return None
    paired = common_items(base, other)
    return paired if paired[0] else None


def _method_pairs(
    scores: RunScores, reference: str | None, compared: Sequence[str]
) -> Iterator[tuple[str, str, list[ItemScore], list[ItemScore]]]:
    """(backbone, method, reference's scores, method's scores) for every compared method, realization 0."""
    if reference is None:
        return
    for backbone in scores.backbones:
        base = _shown_scores(scores, Cell(backbone, reference, 0))
        if base is None:
            continue
        for method in compared:
            paired = None if method == reference else _paired_with(scores, base, Cell(backbone, method, 0))
            if paired is not None:
                yield backbone, method, *paired


def _paired_methods(
    scores: RunScores,
    reference: str | None,
    compared: Sequence[str],
    kinds: Mapping[str, MethodKind],
    protocol: Protocol,
    options: ReportOptions,
) -> Paired:
    entries: Paired = []
    for backbone, method, base, other in _method_pairs(scores, reference, compared):
        assert reference is not None  # _method_pairs yields nothing without one
        for metric in protocol.paired_metrics:
            comparison = _compare(base, other, metric, protocol, options.confidence)
            family = _method_family(
                protocol, kinds, reference, method, backbone, metric, options.holm_backbones
            )
            a, b = Cell(backbone, reference, 0), Cell(backbone, method, 0)
            entries.append(_paired_entry(comparison, "methods", a, b, metric, family))
    return entries


def _paired_backbones(scores: RunScores, protocol: Protocol, options: ReportOptions) -> Paired:
    if len(options.compare_backbones) < 2:
        return []
    first, *others = options.compare_backbones
    entries: Paired = []
    for method in scores.methods:
        base = _shown_scores(scores, Cell(first, method, 0))
        if base is None:
            continue
        for backbone in others:
            paired = _paired_with(scores, base, Cell(backbone, method, 0))
            if paired is None:
                continue
            paired_base, other = paired
            for metric in protocol.paired_metrics:
                comparison = _compare(paired_base, other, metric, protocol, options.confidence)
                family = "all" if protocol.holm_family == "all" else f"backbones/{metric}"
                a, b = Cell(first, method, 0), Cell(backbone, method, 0)
                entries.append(_paired_entry(comparison, "backbones", a, b, metric, family))
    return entries


def _across_pairs(
    scores: RunScores, reference: str | None, compared: Sequence[str]
) -> Iterator[tuple[Cell, Cell, list[ItemScore], list[ItemScore]]]:
    """(reference's cell, method's cell, their scores on the trajectories both answered) for every compared
    method on a backbone of the other kind (local or chat) than the reference's, realization 0, shown cells
    only (docs/analysis.md)."""
    if reference is None or not scores.local_backbones:
        return
    local = scores.local_backbones
    for method in compared:
        if method == reference:
            continue
        for reference_backbone in scores.backbones:
            base_cell = Cell(reference_backbone, reference, 0)
            base = _shown_scores(scores, base_cell)
            if base is None:
                continue
            for backbone in scores.backbones:
                cell = Cell(backbone, method, 0)
                paired = (
                    None
                    if (backbone in local) == (reference_backbone in local)
                    else _paired_with(scores, base, cell)
                )
                if paired is not None:
                    yield base_cell, cell, *paired


def _across_family(protocol: Protocol, metric: str) -> str:
    if protocol.holm_family == "all":
        return "all"
    if protocol.holm_family == "metric":
        return f"metric/{metric}"
    return f"across/{metric}"


def _paired_across(
    scores: RunScores,
    reference: str | None,
    compared: Sequence[str],
    protocol: Protocol,
    options: ReportOptions,
) -> Paired:
    """The reference against each compared method of the other kind of backbone (docs/analysis.md)."""
    entries: Paired = []
    for base_cell, cell, base, other in _across_pairs(scores, reference, compared):
        for metric in protocol.paired_metrics:
            comparison = _compare(base, other, metric, protocol, options.confidence)
            family = _across_family(protocol, metric)
            entries.append(_paired_entry(comparison, "across", base_cell, cell, metric, family))
    return entries


def _complementarity(
    scores: RunScores, reference: str | None, compared: Sequence[str]
) -> list[dict[str, Any]]:
    """Step Acc overlap of the reference with each compared method and, with two or more, with their union."""
    entries = []
    others_by_backbone: dict[str, list[tuple[list[ItemScore], list[ItemScore]]]] = {}
    for backbone, method, base, other in _method_pairs(scores, reference, compared):
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


def _task_clusters(
    store: Store,
    run: RunRow,
    scores: RunScores,
    reference: str | None,
    compared: Sequence[str],
    protocol: Protocol,
    options: ReportOptions,
) -> dict[str, Any]:
    """App. B's task-cluster bootstrap of Step Acc, reference against each compared method (docs/analysis.md)."""
    keys = {row.qid: row.task_sha256 for row in store.trajectories(run.run_id)}
    task = {e.qid: keys.get(e.qid) or f"qid:{e.qid}" for e in scores.expected}
    rows = []
    for backbone, method, base, other in _method_pairs(scores, reference, compared):
        clusters = [task[item.qid] for item in base]
        interval = cluster_paired_bootstrap(
            [float(x) for x in _outcomes(base, "step_acc")],
            [float(x) for x in _outcomes(other, "step_acc")],
            [item.source for item in base],
            clusters,
            aggregate="macro" if protocol.aggregate == "macro" else "pooled",
            resamples=protocol.resamples,
            seed=protocol.seed,
            confidence=options.confidence,
        )
        rows.append(
            {
                "backbone": backbone,
                "method_a": reference,
                "method_b": method,
                "n": len(base),
                "tasks": len({(item.source, task[item.qid]) for item in base}),
                **_interval_json(interval),
            }
        )
    return {
        "metric": "step_acc",
        "trajectories": len(scores.expected),
        "tasks": len({(e.source, task[e.qid]) for e in scores.expected}),
        "without_task": sum(1 for e in scores.expected if not keys.get(e.qid)),
        "rows": rows,
    }


def _leave_one_source_out(
    scores: RunScores,
    reference: str | None,
    compared: Sequence[str],
    protocol: Protocol,
    options: ReportOptions,
) -> dict[str, Any]:
    """Table 13: the reference's Step Acc gain over each compared method, backbones averaged within each
    trajectory, each source left out in turn (docs/analysis.md)."""
    pairs: dict[str, list[tuple[str, list[ItemScore], list[ItemScore]]]] = {}
    for backbone, method, base, other in _method_pairs(scores, reference, compared):
        if backbone in options.holm_backbones:
            pairs.setdefault(method, []).append((backbone, base, other))
    aggregate: Aggregate = "macro" if protocol.aggregate == "macro" else "pooled"
    rows = []
    for method, found in pairs.items():
        # The trajectories every backbone's pair holds (all expected ones, but for a split like SOAP's).
        qids = set.intersection(*({item.qid for item in base} for _, base, _ in found))
        ordered = [item for item in found[0][1] if item.qid in qids]
        hits_a = [{i.qid: i.step_exact for i in base if i.qid in qids} for _, base, _ in found]
        hits_b = [{i.qid: i.step_exact for i in other if i.qid in qids} for _, _, other in found]
        means = [
            [sum(bool(h[item.qid]) for h in hits) / len(hits) for item in ordered]
            for hits in (hits_a, hits_b)
        ]
        strata = [item.source for item in ordered]
        if len(set(strata)) < 2:
            continue  # nothing to leave out
        settings: dict[str, Any] = {
            "aggregate": aggregate,
            "resamples": protocol.resamples,
            "seed": protocol.seed,
            "confidence": options.confidence,
        }
        entry = {"method_a": reference, "method_b": method, "backbones": [b for b, _, _ in found]}
        every = stratified_paired_bootstrap(means[0], means[1], strata, **settings)
        rows.append({**entry, "excluded": None, "n": len(ordered), **_interval_json(every)})
        for left in leave_one_source_out(means[0], means[1], strata, **settings):
            rows.append({**entry, "excluded": left.source, "n": left.n, **_interval_json(left.interval)})
    return {"metric": "step_acc", "rows": rows}
