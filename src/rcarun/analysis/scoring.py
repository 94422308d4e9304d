"""LongRCA Bench scoring: per-trajectory outcomes, the aggregates the paper reports, and the metric registry.

Every number rcarun prints (reports, leaderboard entries, fidelity checks, length-group curves) follows these
rules, which are subtle enough (denominators, invalid fields, abstentions, source weighting) that a second
implementation would drift: LongRCA Sec. 5.1 and App. L.1, spelt out in docs/analysis.md ("Scoring"). Each
metric is declared once, in `METRICS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from rcarun.data import parse_step
from rcarun.data.roles import normalize_role, role_matches

from .lengths import LengthGroup, LengthPartition, length_groups

__all__ = [
    "ABSTENTION_RULES",
    "FRACTION_METRICS",
    "LONGRCA_FULL_POPULATIONS",
    "METRICS",
    "METRIC_BY_NAME",
    "STEP_TOLERANCE",
    "AbstentionRule",
    "Expected",
    "GroupMetrics",
    "ItemScore",
    "LengthGroup",
    "LengthPartition",
    "Metric",
    "Metrics",
    "Prediction",
    "Summary",
    "by_length_group",
    "by_source",
    "length_groups",
    "macro",
    "metric_label",
    "pooled",
    "post_stratified",
    "score_items",
    "summarize",
]

# Source sizes of the full benchmark (LongRCA Sec. 3: SWE 128, TB2 42, TP 685, Vita 108, WA 177; total 1,140),
# keyed by the source directory names of the release. The weights of the paper's post-stratified Mini scores.
LONGRCA_FULL_POPULATIONS: Mapping[str, int] = {
    "swe_bench_pro": 128,
    "terminal_bench_2": 42,
    "travelplanner": 685,
    "vitabench": 108,
    "webarena_verified": 177,
}

# The ±5 tolerance of "Step ±5" (absolute step error at most five).
STEP_TOLERANCE = 5


AbstentionRule = Literal["fields", "error"]
"""How an abstained prediction is scored: ``"fields"`` scores the role and step it gives (the main comparisons,
Sec. 5.1), ``"error"`` makes it an error for every target (the component conditions, App. L.1)."""
ABSTENTION_RULES: tuple[AbstentionRule, ...] = ("fields", "error")


@dataclass(frozen=True, slots=True)
class Expected:
    """One trajectory a method was expected to attribute, with its reference label.

    Attributes:
        qid: the trajectory's identifier (a submission's ``question_ID``).
        source: the sub-benchmark, e.g. ``"travelplanner"``.
        n_steps: the number of recorded steps; valid steps are ``0 .. n_steps - 1``.
        ref_role: the reference responsible role, raw as recorded (may be a handoff form).
        ref_step: the 0-based reference root step.
        roles: the recorded role set of the trajectory, when known (decides role validity for coverage).
    """

    qid: str
    source: str
    n_steps: int
    ref_role: str
    ref_step: int
    roles: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.n_steps < 1:
            raise ValueError(f"{self.qid}: n_steps must be at least 1, got {self.n_steps}")
        if not 0 <= self.ref_step < self.n_steps:
            raise ValueError(f"{self.qid}: ref_step {self.ref_step} is outside 0..{self.n_steps - 1}")


@dataclass(frozen=True, slots=True)
class Prediction:
    """A method's answer for one trajectory, exactly as given (validity is decided when scoring).

    Attributes:
        role: the explicit responsible-role output, or None when there is none.
        step: the root-step output as given: an int, a string, a float, None, ... (see `parse_step`).
        abstained: the method declined to answer; scored by the `AbstentionRule` in force, never covered.
        covered: the method's own coverage verdict (App. L.1's validation checks of its condition), when it
            stores one; None: the scorer's role and step validity decide.
    """

    role: str | None
    step: object
    abstained: bool = False
    covered: bool | None = None


@dataclass(frozen=True, slots=True)
class ItemScore:
    """The outcome for one expected trajectory (``qid``, ``source``, ``n_steps``).

    Attributes:
        predicted: a prediction existed (abstained or not); abstained: it abstained, whichever rule scored it.
        role_valid: non-empty, and in the recorded role set when that is known; role_correct: the reference's.
        step_valid: parsed to an int in ``[0, n_steps)``; step_exact, step_pm5: the reference step, within ±5;
            abs_err: the absolute error of a valid step; step: the valid step (what repeatability compares).
        joint_exact, joint_pm5: role correct and step exact, within ±5.
        covered: a valid output (docs/analysis.md); covered_by_method: the method's own verdict decided it.
    """

    qid: str
    source: str
    n_steps: int
    predicted: bool
    role_valid: bool
    role_correct: bool
    step_valid: bool
    step_exact: bool
    step_pm5: bool
    abs_err: int | None
    joint_exact: bool
    joint_pm5: bool
    covered: bool
    step: int | None = None
    abstained: bool = False
    covered_by_method: bool = False


@dataclass(frozen=True, slots=True)
class Metrics:
    """Aggregate scores: one field per metric of `METRICS` (fractions in [0, 1]; ``root_mae`` in steps over the
    valid steps, weighted by the aggregate, None without one), and the totals ``n`` (expected trajectories) and
    ``valid_step_n``, whatever the aggregate."""

    n: int
    agent_acc: float
    step_acc: float
    step_pm5: float
    joint_exact: float
    joint_pm5: float
    root_mae: float | None
    coverage: float
    valid_step_n: int


@dataclass(frozen=True, slots=True)
class Summary:
    """The usual set of aggregates for one method's scores.

    Attributes:
        pooled: trajectories weighted equally, with the source-weighted MAE.
        macro: unweighted mean over the sources present.
        per_source: each source's own scores, sorted by source name.
        post_stratified: re-weighted to the given populations, when populations were given.
    """

    pooled: Metrics
    macro: Metrics
    per_source: Mapping[str, Metrics]
    post_stratified: Metrics | None


def _never(score: ItemScore) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Metric:
    """One reported metric, declared once: its name, labels, per-item rule, and the analyses that use it.

    Attributes:
        name: the `Metrics` field and the report's JSON key.
        label: how reports name it ("Step ±5").
        column: `rcarun score`'s short column header.
        hit: the per-item rule of a fraction (the share of items it holds for); unused for the MAE.
        fraction: a share of items shown as a percentage; False: the valid-output MAE, in steps.
        paired: the protocols whose paired tests compare it (``"main"``, ``"ablation"``).
        calibrated: App. A's sample-size calibration and the Mini fidelity check measure it.
        by_length: the report's length-group curves (App. F.1) show it.
        label_sensitive: App. K.1's label sensitivity re-scores it.
        interval: a headline of Table 3; the report carries each cell's interval for it.
    """

    name: str
    label: str
    column: str
    hit: Callable[[ItemScore], bool] = _never
    fraction: bool = True
    paired: tuple[str, ...] = ()
    calibrated: bool = False
    by_length: bool = False
    label_sensitive: bool = False
    interval: bool = False


METRICS: tuple[Metric, ...] = (
    Metric(
        "agent_acc",
        "Agent Acc",
        "Agent",
        lambda s: s.role_correct,
        paired=("main",),
        calibrated=True,
        by_length=True,
        interval=True,
    ),
    Metric(
        "step_acc",
        "Step Acc",
        "Step",
        lambda s: s.step_exact,
        paired=("main", "ablation"),
        calibrated=True,
        by_length=True,
        label_sensitive=True,
        interval=True,
    ),
    Metric(
        "step_pm5",
        "Step ±5",
        "Step±5",
        lambda s: s.step_pm5,
        calibrated=True,
        by_length=True,
        label_sensitive=True,
    ),
    Metric("joint_exact", "Joint exact", "Joint", lambda s: s.joint_exact),
    Metric("joint_pm5", "Joint ±5", "Joint±5", lambda s: s.joint_pm5),
    Metric("root_mae", "Root MAE", "MAE", fraction=False),
    Metric("coverage", "Coverage", "Cov.", lambda s: s.covered),
)
"""Every metric in report order. A new metric is a declaration here and a field of `Metrics`."""
METRIC_BY_NAME: Mapping[str, Metric] = {m.name: m for m in METRICS}
FRACTION_METRICS: tuple[Metric, ...] = tuple(m for m in METRICS if m.fraction)


def metric_label(metric: str) -> str:
    """How reports name a metric column (``step_pm5`` is "Step ±5"); an unknown name is shown as it is."""
    found = METRIC_BY_NAME.get(metric)
    return found.label if found else metric


class GroupMetrics(NamedTuple):
    """One length group's scores: ``for group, metrics in by_length_group(...)``."""

    group: LengthGroup
    metrics: Metrics | None


def _role_valid(role: str | None, roles: frozenset[str] | None, *, keep_handoff: bool) -> bool:
    if role is None:
        return False
    normal = normalize_role(role, keep_handoff=keep_handoff)
    if not normal:
        return False
    if roles is None:
        return True
    return normal in {normalize_role(known, keep_handoff=keep_handoff) for known in roles}


def _score_one(
    expected: Expected, prediction: Prediction | None, *, keep_handoff: bool, abstentions: AbstentionRule
) -> ItemScore:
    if prediction is None or (prediction.abstained and abstentions == "error"):
        return ItemScore(
            qid=expected.qid,
            source=expected.source,
            n_steps=expected.n_steps,
            predicted=prediction is not None,
            role_valid=False,
            role_correct=False,
            step_valid=False,
            step_exact=False,
            step_pm5=False,
            abs_err=None,
            joint_exact=False,
            joint_pm5=False,
            covered=False,
            abstained=prediction is not None,
            covered_by_method=prediction is not None and prediction.covered is not None,
        )
    role_valid = _role_valid(prediction.role, expected.roles, keep_handoff=keep_handoff)
    role_correct = role_matches(prediction.role, expected.ref_role, keep_handoff=keep_handoff)
    step = parse_step(prediction.step)
    step_valid = step is not None and 0 <= step < expected.n_steps
    abs_err = abs(step - expected.ref_step) if step is not None and step_valid else None
    step_exact = abs_err == 0
    step_pm5 = abs_err is not None and abs_err <= STEP_TOLERANCE
    checks = prediction.covered if prediction.covered is not None else role_valid and step_valid
    return ItemScore(
        qid=expected.qid,
        source=expected.source,
        n_steps=expected.n_steps,
        predicted=True,
        role_valid=role_valid,
        role_correct=role_correct,
        step_valid=step_valid,
        step_exact=step_exact,
        step_pm5=step_pm5,
        abs_err=abs_err,
        joint_exact=role_correct and step_exact,
        joint_pm5=role_correct and step_pm5,
        covered=checks and not prediction.abstained,
        step=step if step_valid else None,
        abstained=prediction.abstained,
        covered_by_method=prediction.covered is not None,
    )


def score_items(
    expected: Iterable[Expected],
    predictions: Mapping[str, Prediction],
    *,
    keep_handoff: bool = False,
    abstentions: AbstentionRule = "fields",
) -> list[ItemScore]:
    """Score every expected trajectory against its prediction, in the order of ``expected``.

    Predictions for qids that are not expected are ignored here (`rcarun.analysis.submission` reports them).

    Args:
        expected: the trajectories that count; each stays in every denominator.
        predictions: predictions by qid; a missing qid is an error for every target.
        keep_handoff: the ablation role rule (keep handoff suffixes).
        abstentions: how an abstained prediction is scored (`AbstentionRule`; the default is the main
            comparisons' rule).

    Raises:
        ValueError: a qid appears twice in ``expected``, or ``abstentions`` is not a rule.
    """
    if abstentions not in ABSTENTION_RULES:
        raise ValueError(f"abstentions must be one of {ABSTENTION_RULES}, got {abstentions!r}")
    seen: set[str] = set()
    scores: list[ItemScore] = []
    for item in expected:
        if item.qid in seen:
            raise ValueError(f"qid {item.qid!r} is expected twice")
        seen.add(item.qid)
        scores.append(
            _score_one(item, predictions.get(item.qid), keep_handoff=keep_handoff, abstentions=abstentions)
        )
    return scores


def _group_by_source(scores: Iterable[ItemScore]) -> dict[str, list[ItemScore]]:
    groups: dict[str, list[ItemScore]] = {}
    for score in scores:
        groups.setdefault(score.source, []).append(score)
    return dict(sorted(groups.items()))


def _plain_mae(scores: Sequence[ItemScore]) -> float | None:
    errors = [score.abs_err for score in scores if score.abs_err is not None]
    return sum(errors) / len(errors) if errors else None


def _weighted_mae(maes: Mapping[str, float | None], weights: Mapping[str, float]) -> float | None:
    """``Σ w_b·MAE_b / Σ w_b`` over the sources that have an MAE; None when none has one."""
    present = {source: mae for source, mae in maes.items() if mae is not None}
    total = sum(weights[source] for source in present)
    if not present or total == 0:
        return None
    return sum(weights[source] * mae for source, mae in present.items()) / total


def _fractions(scores: Sequence[ItemScore]) -> dict[str, float]:
    return {m.name: sum(1 for score in scores if m.hit(score)) / len(scores) for m in FRACTION_METRICS}


def _require_scores(scores: Sequence[ItemScore]) -> None:
    if not scores:
        raise ValueError("no scores to aggregate")


def _metrics(fractions: Mapping[str, float], *, n: int, root_mae: float | None, valid_step_n: int) -> Metrics:
    return Metrics(n=n, root_mae=root_mae, valid_step_n=valid_step_n, **fractions)


def _valid_step_n(scores: Iterable[ItemScore]) -> int:
    return sum(1 for score in scores if score.step_valid)


def _weighted(
    per_source: Mapping[str, Metrics], weights: Mapping[str, float], *, n: int, valid_step_n: int
) -> Metrics:
    """Every fraction as ``Σ w_b·S_b / Σ w_b`` and the MAE as `_weighted_mae`."""
    total = sum(weights.values())
    fractions = {
        name: sum(weights[source] * getattr(metrics, name) for source, metrics in per_source.items()) / total
        for name in (m.name for m in FRACTION_METRICS)
    }
    maes = {source: metrics.root_mae for source, metrics in per_source.items()}
    return _metrics(fractions, n=n, root_mae=_weighted_mae(maes, weights), valid_step_n=valid_step_n)


def by_source(scores: Iterable[ItemScore]) -> dict[str, Metrics]:
    """Each source's own scores (its MAE is the plain mean over its valid steps), sorted by source name."""
    return {
        source: _metrics(
            _fractions(items), n=len(items), root_mae=_plain_mae(items), valid_step_n=_valid_step_n(items)
        )
        for source, items in _group_by_source(scores).items()
    }


def pooled(scores: Sequence[ItemScore]) -> Metrics:
    """Trajectories weighted equally; ``root_mae`` is the source-weighted valid-output MAE of App. L.1.

    Raises:
        ValueError: ``scores`` is empty.
    """
    _require_scores(scores)
    groups = _group_by_source(scores)
    maes = {source: _plain_mae(items) for source, items in groups.items()}
    weights = {source: float(len(items)) for source, items in groups.items()}
    return _metrics(
        _fractions(scores),
        n=len(scores),
        root_mae=_weighted_mae(maes, weights),
        valid_step_n=_valid_step_n(scores),
    )


def macro(scores: Sequence[ItemScore]) -> Metrics:
    """The unweighted mean over the sources present of each source's score (Macro-5 on five sources).

    The MAE is the mean of the per-source MAEs over the sources that have one; ``n`` and ``valid_step_n`` are
    totals.

    Raises:
        ValueError: ``scores`` is empty.
    """
    _require_scores(scores)
    per_source = by_source(scores)
    return _weighted(
        per_source,
        dict.fromkeys(per_source, 1.0),
        n=len(scores),
        valid_step_n=_valid_step_n(scores),
    )


def post_stratified(scores: Sequence[ItemScore], populations: Mapping[str, int]) -> Metrics:
    """Source scores re-weighted to population sizes: ``Σ_b (N_b / Σ N) · S_b`` (LongRCA Table 10).

    Args:
        scores: item scores of every source in ``populations`` (e.g. a Mini run).
        populations: each source's population size ``N_b`` (e.g. `LONGRCA_FULL_POPULATIONS`).

    Raises:
        ValueError: ``scores`` is empty, a scored source has no population, a population's source has no
            scores, or a population is not a positive integer.
    """
    _require_scores(scores)
    per_source = by_source(scores)
    unweighted = sorted(set(per_source) - set(populations))
    if unweighted:
        raise ValueError(f"scored sources without a population size: {unweighted}")
    unscored = sorted(set(populations) - set(per_source))
    if unscored:
        raise ValueError(f"population sources without any scores: {unscored}")
    for source, size in populations.items():
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"population of {source!r} must be a positive integer, got {size!r}")
    weights = {source: float(populations[source]) for source in per_source}
    return _weighted(per_source, weights, n=len(scores), valid_step_n=_valid_step_n(scores))


def summarize(scores: Sequence[ItemScore], populations: Mapping[str, int] | None = None) -> Summary:
    """Pooled, macro, per-source and (when ``populations`` is given) post-stratified scores.

    Raises:
        ValueError: as `pooled` and `post_stratified`.
    """
    return Summary(
        pooled=pooled(scores),
        macro=macro(scores),
        per_source=by_source(scores),
        post_stratified=None if populations is None else post_stratified(scores, populations),
    )


def by_length_group(scores: Iterable[ItemScore], partition: LengthPartition) -> list[GroupMetrics]:
    """Pooled scores of each length group, in increasing length order.

    A group none of whose trajectories was scored (e.g. a Mini run on the Full partition) gets ``None``.

    Raises:
        ValueError: a score's qid is not in the partition.
    """
    group_of = {qid: index for index, group in enumerate(partition.groups) for qid in group.qids}
    members: list[list[ItemScore]] = [[] for _ in partition.groups]
    for score in scores:
        if score.qid not in group_of:
            raise ValueError(f"qid {score.qid!r} is not in the length partition")
        members[group_of[score.qid]].append(score)
    return [
        GroupMetrics(group=group, metrics=pooled(items) if items else None)
        for group, items in zip(partition.groups, members, strict=True)
    ]
