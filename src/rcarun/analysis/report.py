"""The report of one run as plain data: accuracy, paired comparisons, repeatability, length groups and cost.

`rcarun report` prints it (text), dumps it (``--json``) or renders it (``--html``); all three read the same
dict built here, so the page, the terminal and a script see identical numbers. Accuracies are fractions.

Protocol choices (LongRCA Sec. 5.1, App. A, B, H, K.1, L.1), each an option of `ReportOptions`; what a flag
leaves open the protocol decides (`rcarun.analysis.protocol`: ``main`` or ``ablation``, ``auto`` by the run's
methods), and ``protocol`` in the dict says what was chosen and why:
    - Scoring rule: abstentions scored on their fields (main) or as errors (ablation); handoff suffixes dropped
      (main) or kept (ablation). Every table states the rule it used.
    - Headline aggregate: pooled on a run of natural source proportions (Full), Macro over sources on a sample
      (a manifest or equal quotas: Mini) and in the component study.
    - Paired comparisons use one retained prediction per method and backbone: realization 0 (as the paper's
      "one retained prediction"; the other realizations feed the repeatability section). Main: each method is
      compared with ``reference_method`` (default: ``rcta`` when present, else full RCTA under another label,
      else the first method by name) on every backbone, for Agent Acc and Step Acc. Ablation: each component
      condition against full RCTA, for Step Acc. Each comparison: difference in the headline aggregate,
      wins/losses, two-sided exact McNemar on the discordant pairs, and a source-stratified paired bootstrap
      interval (``resamples``, ``seed``, ``confidence``).
    - Holm families (``holm_family``): ``"paper"`` (default) is the protocol's own family: main, RCTA against the
      paper's five baselines on the backbones of ``holm_backbones`` (default the API ones), per metric (App. B's
      Holm-20), plus ``p_holm_joint`` over both metrics (Holm-40), while every other comparison is adjusted per
      metric in a family of its own; ablation, the (up to) four component conditions against full RCTA, per
      backbone (App. H). ``"metric"`` adjusts each metric's comparisons together; ``"all"`` adjusts every
      comparison of the report together. Each paired entry names its ``family``.
    - Comparisons across kinds of backbone (``paired_across``): a method that reads a model (SOAP) runs on a
      local backbone only (``provider = "local"``), where no chat method runs, so the per-backbone comparison
      never meets it. Each compared method whose backbones are of the other kind than the reference's is
      compared with the reference across them: its cell on every backbone of its kind against the
      reference's on every backbone of the reference's kind (SOAP on its model against the reference on each
      chat backbone; with ``--reference soap``, every chat method on every chat backbone against SOAP), on
      the trajectories both answered (SOAP's test split, `common_items`), with the same statistics. Model and
      method differ together in such a pair, and its n is the test split's: the comparisons are adjusted per
      metric in a family of their own (``across/<metric>``), never joining App. B's family or changing the
      p-values of the per-backbone ones (docs/fidelity.md); ``"metric"`` and ``"all"`` take them in as any
      other comparison between methods.
    - Backbone comparisons (``compare_backbones``): for every method, each backbone against the first one
      named, with the same statistics, under ``paired_backbones``. When none are named and the run has a
      single method on several backbones, every backbone is compared with the first by name (there is no
      method comparison to make then).
    - Component study (``components``, Table 25 layout): whenever the run holds full RCTA and a component
      condition, per backbone, under the ablation rules whatever the report's protocol: Agent, Step, Step ±5,
      MAE, coverage, and Step Acc Δ, interval and Holm over the conditions. In a main report the conditions
      are compared there and nowhere else.
    - Mini calibration (App. A, ``fidelity``): with ``calibrate_against`` (a Full run), each method's Mini and
      Full scores side by side (`rcarun.analysis.fidelity`); with ``calibration_sizes``, the sample-size
      calibration of Table 5 over this (Full) run.
    - Label sensitivity (App. K.1, ``label_sensitivity``): with ``annotations`` (observed human root steps per
      trajectory), Step Acc and Step ±5 under ``draws`` random choices of one annotation per trajectory
      (`rcarun.analysis.sensitivity`).
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
    - Task-cluster bootstrap (App. B, ``task_clusters``): Step Acc of the reference against each compared
      method per backbone, with the interval of a source-stratified bootstrap that draws tasks (repeated
      attempts at one task together: trajectories sharing ``trajectories.task_sha256``; one without a key is a
      task of its own) instead of trajectories.
    - Leave one source out (Table 13, ``leave_one_source_out``): the reference's Step Acc gain over each compared
      method averaged over App. B's backbones (``holm_backbones``) within each trajectory, on the trajectories
      of every source but one, each source in turn, with its pointwise source-stratified bootstrap interval;
      backbones on which either method's number is not shown are left out of the mean; nothing with a single
      source.
    - Length groups: the shared partition of the expected trajectories' lengths (``length_groups`` groups),
      each group's accuracies with Wilson intervals, and per method and metric the longest group minus the
      shortest with Newcombe's interval (App. F.1: "the highest and lowest groups"; ``length_contrasts``).
    - Post-stratification to ``populations`` when given (e.g. LongRCA Full's source sizes).
    - Outcomes: per backbone × method × realization, what became of the expected trajectories (`Outcome`:
      predictions, unreadable answers, fallback decisions, failed, skipped for budget, interrupted, never run)
      and a ``status``. Failed and skipped items still score as errors (docs/analysis.md), but a number must
      rest on answers: a cell is ``shown`` when readable predictions (not failed, skipped, interrupted, never
      run or unreadable) cover at least `MIN_READABLE_SHARE` of its expected trajectories. A cell that is not
      shown is never marked best, is left out of paired comparisons and complementarity (listed under
      ``excluded``), and its status names the main reason; a cell without any prediction is not scored at all
      (``n`` 0, every metric null) instead of scoring 0 as if it had answered.
    - Call timing (``call_timing``): per backbone, over the attempts sent, how many answers were streamed, time
      to first token and decode rate (nearest-rank p50 / p95; null when unknown) and the generations cut short
      and charged an estimate (`rcarun.analysis.timing.call_timing`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from rcarun.errors import ConfigError, StoreError
from rcarun.store import RunRow, Store

from .cost import cost_rows, served_by
from .fidelity import mini_fidelity, sample_size_calibration
from .protocol import (
    ABLATION_PRESET,
    MethodKind,
    Protocol,
    app_b_backbones,
    method_kinds,
    resolve_protocol,
    uses_manifest,
)
from .results import Cell, Outcome, RunScores, common_items, load_run_scores, resolve_run
from .scoring import (
    METRIC_BY_NAME,
    METRICS,
    ItemScore,
    LengthGroup,
    Metrics,
    Prediction,
    Summary,
    length_groups,
    metric_label,
    pooled,
    score_items,
    summarize,
)
from .sensitivity import ANNOTATION_SEED, label_sensitivity
from .stats import (
    DEFAULT_SEED,
    Aggregate,
    BootstrapInterval,
    Complementarity,
    PairedComparison,
    ProportionInterval,
    adjust_family,
    cluster_paired_bootstrap,
    complementarity,
    leave_one_source_out,
    newcombe_difference,
    paired_comparison,
    pairwise_agreement,
    spread,
    stratified_interval,
    stratified_paired_bootstrap,
    union_complementarity,
    wilson_interval,
)
from .timing import call_timing

__all__ = [
    "CALIBRATION_SEED",
    "DEFAULT_DRAWS",
    "METRIC_NAMES",
    "MIN_READABLE_SHARE",
    "RECALL_SETS",
    "ReportOptions",
    "build_report",
    "cell_status",
    "metrics_json",
]

METRIC_NAMES = tuple(m.name for m in METRICS)
# Step-id lists a method may store under output["diagnostics"], in pipeline order.
RECALL_SETS = ("base_candidate_ids", "excerpt_ids", "evidence_ids")
MIN_READABLE_SHARE = 0.5
"""The share of a cell's expected trajectories that readable predictions must cover for its number to be shown,
marked best and compared (module docstring)."""
DEFAULT_DRAWS = 10_000  # App. A's calibration draws per size and App. K.1's label draws
CALIBRATION_SEED = 20260820  # App. A, "Sampling protocol": the calibration's master seed
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
    """How the report is computed (module docstring). None leaves a choice to the protocol.

    Attributes:
        reference_method: the method the others are compared with.
        protocol: ``"auto"``, ``"main"`` or ``"ablation"`` (`rcarun.analysis.protocol`).
        aggregate: ``"macro"``, ``"pooled"``, or None / ``"auto"`` for the protocol's.
        resamples: bootstrap resamples (None: 20,000 main, 10,000 ablation).
        seed: bootstrap seed.
        confidence: interval level.
        holm_family: ``"paper"``, ``"metric"`` or ``"all"`` (None: ``"paper"``).
        holm_backbones: the backbones of App. B's family (empty: the run's API backbones, self-hosted ones left
            out as App. B leaves out Qwen; `rcarun.analysis.protocol.app_b_backbones`).
        compare_backbones: backbones compared per method, the first against each other.
        populations: post-stratification sizes per source.
        length_groups: groups of the shared length partition.
        keep_handoff: keep handoff suffixes in role matching (None: the protocol's rule).
        abstentions: ``"fields"`` or ``"error"`` (None: the protocol's rule).
        paired_metrics: the metrics compared (None: the protocol's).
        calibrate_against: a Full run to set this (Mini) run's scores beside (App. A); read from ``full_store``
            given to `build_report`, or this run's database.
        calibration_sizes: sample sizes for App. A's sample-size calibration over this run (empty: none).
        calibration_seed: its master seed.
        annotations: observed human root steps per qid, for App. K.1's label sensitivity (None: none).
        annotation_seed: its seed.
        draws: draws of the calibration and of the label sensitivity.
    """

    reference_method: str | None = None
    protocol: str = "auto"
    aggregate: str | None = None
    resamples: int | None = None
    seed: int = DEFAULT_SEED
    confidence: float = 0.95
    holm_family: str | None = None
    holm_backbones: tuple[str, ...] = ()
    compare_backbones: tuple[str, ...] = ()
    populations: Mapping[str, int] | None = None
    length_groups: int = 5
    keep_handoff: bool | None = None
    abstentions: str | None = None
    paired_metrics: tuple[str, ...] | None = None
    calibrate_against: str | None = None
    calibration_sizes: tuple[int, ...] = ()
    calibration_seed: int = CALIBRATION_SEED
    annotations: Mapping[str, Sequence[int]] | None = None
    annotation_seed: int = ANNOTATION_SEED
    draws: int = DEFAULT_DRAWS


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


@dataclass(frozen=True, slots=True)
class _Study:
    """The run's RCTA component study: full RCTA's label and its component conditions' labels."""

    full: str
    conditions: tuple[str, ...]


def _study(kinds: Mapping[str, MethodKind], reference: str | None) -> _Study | None:
    full = sorted(label for label, kind in kinds.items() if kind.full_rcta)
    conditions = sorted(
        (label for label, kind in kinds.items() if kind.component_condition),
        key=lambda label: (kinds[label].ablation or "", label),
    )
    if not full or not conditions:
        return None
    chosen = reference if reference in full else ("rcta" if "rcta" in full else full[0])
    return _Study(full=chosen, conditions=tuple(conditions))


def _protocol(store: Store, run: RunRow, kinds: Mapping[str, MethodKind], options: ReportOptions) -> Protocol:
    sizes = Counter(
        row.source
        for row in store.trajectories(run.run_id)
        if row.ref_role is not None and row.ref_step is not None
    )
    return resolve_protocol(
        kinds,
        sizes,
        manifest=uses_manifest(run.config_json),
        protocol=options.protocol,
        aggregate=None if options.aggregate in (None, "auto") else options.aggregate,
        resamples=options.resamples,
        seed=options.seed,
        keep_handoff=options.keep_handoff,
        abstentions=options.abstentions,
        holm_family=options.holm_family,
        paired_metrics=options.paired_metrics,
    )


def build_report(
    store: Store, run_id: int, options: ReportOptions | None = None, *, full_store: Store | None = None
) -> dict[str, Any]:
    """The report dict of one run (schema: docs/analysis.md).

    Args:
        store: the results database holding the run.
        run_id: the run.
        options: how to compute it (defaults: the protocol's, `ReportOptions`).
        full_store: where ``options.calibrate_against`` lives, when not in ``store``.

    Raises:
        StoreError: no such run (or no such Full run to calibrate against).
        ConfigError: a choice the run cannot honour (an unknown reference method, ``ablation`` without full
            RCTA and a component condition, a Full run whose sources differ, annotations out of range).
    """
    options = options or ReportOptions()
    run = next((r for r in store.runs() if r.run_id == run_id), None)
    if run is None:
        raise StoreError(f"{store.path}: no run with id {run_id}")
    kinds = method_kinds(run.config_json, store.work_names(run_id).methods)
    protocol = _protocol(store, run, kinds, options)
    scores = load_run_scores(store, run, keep_handoff=protocol.keep_handoff, abstentions=protocol.abstentions)
    kinds = {**kinds, **method_kinds(run.config_json, [m for m in scores.methods if m not in kinds])}
    reference = _reference_method(scores, kinds, options.reference_method, protocol)
    study = _study(kinds, reference)
    compared = _compared(scores, kinds, reference, protocol, study)
    if options.holm_backbones:
        holm_why = "--holm-backbones"
    else:
        family, holm_why = app_b_backbones(run.config_json, scores.backbones)
        options = replace(options, holm_backbones=family)
    paired = _paired_methods(scores, reference, compared, kinds, protocol, options)
    if not options.compare_backbones and len(scores.methods) == 1 and len(scores.backbones) > 1:
        options = replace(options, compare_backbones=tuple(scores.backbones))
    paired_backbones = _paired_backbones(scores, protocol, options)
    paired_across = _paired_across(scores, reference, compared, protocol, options)
    paired, paired_backbones, paired_across = _adjust(paired, paired_backbones, paired_across)
    components = _components(store, run, scores, kinds, protocol, options, study)
    left_out = sorted(m for m in scores.methods if m != reference and m not in compared)
    # The methods of the protocol's comparison: App. A and K.1 set these side by side, as the paper its six.
    members = [m for m in scores.methods if m == reference or m in compared]
    return {
        "run": {"name": run.name, "run_id": run.run_id, "status": run.status, "created_at": run.created_at},
        "db": str(store.path),
        "simulated": scores.simulated,
        "aggregate": protocol.aggregate,
        "reference_method": reference,
        "expected": len(scores.expected),
        "unlabelled": scores.unlabelled,
        "protocol": _protocol_json(
            protocol, options, holm_why, kinds, study, left_out, paired + paired_backbones + paired_across
        ),
        "outcomes": [_outcome_json(cell, outcome) for cell, outcome in sorted(scores.outcomes.items())],
        "excluded": _excluded(scores),
        "metrics": _metrics(scores, protocol, options),
        "paired": [entry for entry, _ in paired],
        "paired_backbones": [entry for entry, _ in paired_backbones],
        "paired_across": [entry for entry, _ in paired_across],
        "complementarity": _complementarity(scores, reference, compared),
        "components": components,
        "repeatability": _repeatability(scores, protocol),
        "recall": _recall(scores),
        "turns": _turns(scores, protocol, options),
        "task_clusters": _task_clusters(store, run, scores, reference, compared, protocol, options),
        "leave_one_source_out": _leave_one_source_out(scores, reference, compared, protocol, options),
        "length_groups": _length_groups(scores, options),
        "length_contrasts": _length_contrasts(scores, options),
        "fidelity": _fidelity(store, run, scores, members, protocol, options, full_store),
        "calibration": _calibration(scores, members, options),
        "label_sensitivity": _label_sensitivity(scores, reference, members, options),
        "cost": [row.to_json() for row in cost_rows(store, run_id)],
        # What served each managed backbone (vLLM version, command lines) and its GPU time's charge.
        "served_by": [served.to_json() for served in served_by(store, run_id)],
        # How each backbone's answers came: streamed, time to first token, decode rate, cut generations.
        "call_timing": [timing.to_json() for timing in call_timing(store, run_id)],
    }


def _protocol_json(
    protocol: Protocol,
    options: ReportOptions,
    holm_why: str,
    kinds: Mapping[str, MethodKind],
    study: _Study | None,
    left_out: Sequence[str],
    compared: Paired,
) -> dict[str, Any]:
    """The report's ``protocol``: the rules in force, why, and which methods were left out of the comparison."""
    return {
        "name": protocol.name,
        "requested": options.protocol,
        "reason": protocol.reason,
        "scoring_rule": protocol.rule,
        "abstentions": protocol.abstentions,
        "keep_handoff": protocol.keep_handoff,
        "aggregate_reason": protocol.aggregate_reason,
        "resamples": protocol.resamples,
        "resamples_reason": protocol.resamples_reason,
        "seed": protocol.seed,
        "confidence": options.confidence,
        "holm_family": protocol.holm_family,
        "holm_backbones": list(options.holm_backbones),
        "holm_backbones_reason": holm_why,
        "families": _families(compared, options, holm_why),
        "paired_metrics": list(protocol.paired_metrics),
        "not_compared": [
            {"method": m, "why": _why_not_compared(kinds[m], protocol, study)} for m in left_out
        ],
        "compare_backbones": list(options.compare_backbones),
        "populations": dict(options.populations) if options.populations else None,
        "min_readable_share": MIN_READABLE_SHARE,
        "methods": {
            label: {"name": kind.name, "ablation": kind.ablation} for label, kind in sorted(kinds.items())
        },
    }


def _reference_method(
    scores: RunScores, kinds: Mapping[str, MethodKind], wanted: str | None, protocol: Protocol
) -> str | None:
    methods = scores.methods
    if wanted is not None:
        if wanted not in methods:
            raise ConfigError(
                f"reference method {wanted!r} is not in run {scores.run.name!r} (methods: {methods})"
            )
        if protocol.name == "ablation" and not kinds[wanted].full_rcta:
            raise ConfigError(
                f"--reference: the ablation protocol compares the component conditions with full RCTA, and "
                f"{wanted!r} is {kinds[wanted].name!r}"
            )
        return wanted
    full = [m for m in methods if kinds[m].full_rcta]
    if "rcta" in full:
        return "rcta"
    if full:
        return full[0]
    return methods[0] if methods else None


def _compared(
    scores: RunScores,
    kinds: Mapping[str, MethodKind],
    reference: str | None,
    protocol: Protocol,
    study: _Study | None,
) -> tuple[str, ...]:
    """The methods compared with the reference: every other one (main; the component conditions go to the
    component table when the run holds the study), or the component conditions (ablation)."""
    if reference is None:
        return ()
    if protocol.name == "ablation":
        return study.conditions if study is not None else ()
    held_back = set(study.conditions) if study is not None else set()
    return tuple(m for m in scores.methods if m != reference and m not in held_back)


def _why_not_compared(kind: MethodKind, protocol: Protocol, study: _Study | None) -> str:
    if protocol.name == "ablation":
        return "not part of the component study (the ablation protocol compares conditions with full RCTA)"
    if study is not None and kind.component_condition:
        return "a component condition: compared with full RCTA in the component study, under its rules"
    return "not compared"


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


def _coverage_rule(items: Sequence[ItemScore]) -> str | None:
    """Whose checks decided coverage: the method's stored verdict, the scorer's validity rule, or both."""
    predicted = [item for item in items if item.predicted]
    if not predicted:
        return None
    by_method = sum(item.covered_by_method for item in predicted)
    return "method" if by_method == len(predicted) else "validity" if by_method == 0 else "mixed"


def _metrics(scores: RunScores, protocol: Protocol, options: ReportOptions) -> list[dict[str, Any]]:
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
                {
                    **entry,
                    **_BLANK,
                    "intervals": None,
                    "macro": {**_BLANK, "intervals": None},
                    "per_source": {},
                    "post_stratified": None,
                    "coverage_rule": None,
                }
            )
            continue
        summary = summarize(items, populations=options.populations)
        entries.append(
            {
                **entry,
                **metrics_json(summary.pooled),
                "intervals": _cell_intervals(summary.pooled, summary, "pooled", options.confidence),
                "macro": {
                    **metrics_json(summary.macro),
                    "intervals": _cell_intervals(summary.macro, summary, "macro", options.confidence),
                },
                "per_source": {source: metrics_json(m) for source, m in sorted(summary.per_source.items())},
                "post_stratified": metrics_json(summary.post_stratified) if summary.post_stratified else None,
                "coverage_rule": _coverage_rule(items),
            }
        )
    return entries


def _cell_intervals(
    headline: Metrics, summary: Summary, weighting: Literal["pooled", "macro"], confidence: float
) -> dict[str, list[float]]:
    """The interval of each Table 3 metric of one cell's headline, from its per-source counts."""
    found = {}
    for metric in (m.name for m in METRICS if m.interval):
        strata = [(float(m.n), float(getattr(m, metric))) for m in summary.per_source.values()]
        found[metric] = _bounds(
            stratified_interval(getattr(headline, metric), strata, weighting=weighting, confidence=confidence)
        )
    return found


def _outcomes(items: Sequence[ItemScore], metric: str) -> list[bool]:
    hit = METRIC_BY_NAME[metric].hit
    return [hit(item) for item in items]


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
    p_holm = _holm_within(entries, {i: entry["family"] for i, (entry, _) in enumerate(entries)})
    joint = _holm_within(
        entries, {i: "app-b" for i, (entry, _) in enumerate(entries) if entry["family"].startswith("app-b/")}
    )
    adjusted: Paired = []
    for index, (entry, comparison) in enumerate(entries):
        comparison = replace(comparison, p_holm=p_holm[index])
        adjusted.append(
            ({**entry, **_comparison_json(comparison), "p_holm_joint": joint.get(index)}, comparison)
        )
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
    """The id of the Holm family a comparison of ``method`` with the reference belongs to (module docstring)."""
    if protocol.holm_family == "all":
        return "all"
    if protocol.holm_family == "metric":
        return f"metric/{metric}"
    if protocol.name == "ablation":
        return f"app-h/{backbone}/{metric}"
    in_b = kinds[reference].full_rcta and kinds[method].paper_baseline and backbone in holm_backbones
    return f"app-b/{metric}" if in_b else f"other/{metric}"


def _families(entries: Paired, options: ReportOptions, holm_why: str) -> list[dict[str, Any]]:
    """Every Holm family of the report: its id, how many tests it holds and what it is."""
    counts = Counter(entry["family"] for entry, _ in entries)
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
        found.append({"family": family, "tests": tests, "description": description})
    return found


def _method_pairs(
    scores: RunScores, reference: str | None, compared: Sequence[str]
) -> Iterator[tuple[str, str, list[ItemScore], list[ItemScore]]]:
    """(backbone, method, reference's scores, method's scores) for every compared method, realization 0."""
    if reference is None:
        return
    for backbone in scores.backbones:
        base = scores.scores.get(Cell(backbone, reference, 0))
        if not base or not _shown(scores, Cell(backbone, reference, 0)):
            continue
        for method in compared:
            other = scores.scores.get(Cell(backbone, method, 0))
            if method != reference and other and _shown(scores, Cell(backbone, method, 0)):
                paired_base, paired_other = common_items(base, other)
                if paired_base:
                    yield backbone, method, paired_base, paired_other


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
            entry = {
                "backbone": backbone,
                "method_a": reference,
                "method_b": method,
                "metric": metric,
                "family": family,
            }
            entries.append(({**entry, **_comparison_json(comparison)}, comparison))
    return entries


def _paired_backbones(scores: RunScores, protocol: Protocol, options: ReportOptions) -> Paired:
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
            paired_base, other = common_items(base, other)
            if not paired_base:
                continue
            for metric in protocol.paired_metrics:
                comparison = _compare(paired_base, other, metric, protocol, options.confidence)
                family = "all" if protocol.holm_family == "all" else f"backbones/{metric}"
                entry = {
                    "method": method,
                    "backbone_a": first,
                    "backbone_b": backbone,
                    "metric": metric,
                    "family": family,
                }
                entries.append(({**entry, **_comparison_json(comparison)}, comparison))
    return entries


def _across_pairs(
    scores: RunScores, reference: str | None, compared: Sequence[str]
) -> Iterator[tuple[Cell, Cell, list[ItemScore], list[ItemScore]]]:
    """(reference's cell, method's cell, their scores on the trajectories both answered) for every compared
    method on a backbone of the other kind (local or chat) than the reference's, realization 0, shown cells
    only (module docstring)."""
    if reference is None or not scores.local_backbones:
        return
    local = scores.local_backbones
    for method in compared:
        if method == reference:
            continue
        for reference_backbone in scores.backbones:
            base_cell = Cell(reference_backbone, reference, 0)
            base = scores.scores.get(base_cell)
            if not base or not _shown(scores, base_cell):
                continue
            for backbone in scores.backbones:
                cell = Cell(backbone, method, 0)
                other = scores.scores.get(cell)
                if (
                    (backbone in local) == (reference_backbone in local)
                    or not other
                    or not _shown(scores, cell)
                ):
                    continue
                paired_base, paired_other = common_items(base, other)
                if paired_base:
                    yield base_cell, cell, paired_base, paired_other


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
    """The reference against each compared method of the other kind of backbone (module docstring)."""
    entries: Paired = []
    for base_cell, cell, base, other in _across_pairs(scores, reference, compared):
        for metric in protocol.paired_metrics:
            comparison = _compare(base, other, metric, protocol, options.confidence)
            entry = {
                "method_a": base_cell.method,
                "backbone_a": base_cell.backbone,
                "method_b": cell.method,
                "backbone_b": cell.backbone,
                "metric": metric,
                "family": _across_family(protocol, metric),
            }
            entries.append(({**entry, **_comparison_json(comparison)}, comparison))
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


def _repeatability(scores: RunScores, protocol: Protocol) -> list[dict[str, Any]]:
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
                for first, second in itertools.combinations(realizations, 2)
                # Realizations of different scopes (SOAP's split seeds) agree on the trajectories both answer.
                if steps[first].keys() & steps[second].keys()
                for a in pairwise_agreement({first: steps[first], second: steps[second]})
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


def _headline(summary: Summary, protocol: Protocol) -> Metrics:
    return summary.macro if protocol.aggregate == "macro" else summary.pooled


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


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


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


def _bounds(interval: ProportionInterval) -> list[float]:
    return [interval.low, interval.high]


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


def _interval_json(interval: BootstrapInterval) -> dict[str, float]:
    return {"delta": interval.delta, "ci_low": interval.low, "ci_high": interval.high}


def _task_clusters(
    store: Store,
    run: RunRow,
    scores: RunScores,
    reference: str | None,
    compared: Sequence[str],
    protocol: Protocol,
    options: ReportOptions,
) -> dict[str, Any]:
    """App. B's task-cluster bootstrap of Step Acc, reference against each compared method (module docstring)."""
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
    trajectory, each source left out in turn (module docstring)."""
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
    """The component study in Table 25's layout, under the ablation rules (module docstring); None without one."""
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
            found = _comparison_json(comparison)
            row.update({key: found[key] for key in ("delta", "ci_low", "ci_high", "wins", "losses")})
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
