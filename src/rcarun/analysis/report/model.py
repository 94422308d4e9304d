"""The typed report: what `build_report` returns and the renderers read; JSON only at the CLI's edge.

The top level and these sections are typed: run, protocol, outcomes, excluded, metrics, the three paired sections,
repeatability, cost, served_by and call_timing. Each other section keeps the rows its builder makes (JSON-shaped
mappings, schema in docs/analysis.md). `Report.to_json` is exactly the document ``rcarun report --json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..agreement import Agreement, Spread
from ..cost import CostRow, ServedBy
from ..timing import CallTiming

Rows = Sequence[Mapping[str, Any]]
"""A section's rows, each a JSON object."""

Part = Mapping[str, Any] | None
"""A section that is one JSON object, or None when the run cannot have it."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run a report is of."""

    name: str
    run_id: int
    status: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "run_id": self.run_id,
            "status": self.status,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True)
class HolmFamily:
    """A Holm family of the report: its id, how many tests it holds and what it is."""

    family: str
    tests: int
    description: str


@dataclass(frozen=True, slots=True)
class NotCompared:
    """A method the protocol leaves out of the paired comparisons, and why."""

    method: str
    why: str


@dataclass(frozen=True, slots=True)
class MethodInfo:
    """A method label's configured name and the component it ablates (None: not an ablation)."""

    name: str
    ablation: str | None


@dataclass(frozen=True, slots=True)
class ProtocolInfo:
    """The rules the report used and why (docs/analysis.md, Protocols). The fields' order is the JSON's; one left
    None is one a hand-built report lacks."""

    name: str | None = None
    requested: str | None = None  # what --protocol asked for
    reason: str | None = None
    scoring_rule: str | None = None
    abstentions: str | None = None  # "fields" or "error"
    keep_handoff: bool | None = None
    aggregate_reason: str | None = None
    resamples: int | None = None
    resamples_reason: str | None = None
    seed: int | None = None
    confidence: float | None = None
    holm_family: str | None = None
    holm_backbones: Sequence[str] = ()
    holm_backbones_reason: str | None = None
    families: Sequence[HolmFamily] = ()
    paired_metrics: Sequence[str] = ()
    not_compared: Sequence[NotCompared] = ()
    compare_backbones: Sequence[str] = ()
    populations: Mapping[str, int] | None = None
    min_readable_share: float | None = None
    methods: Mapping[str, MethodInfo] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "families":
                value = [{"family": f.family, "tests": f.tests, "description": f.description} for f in value]
            elif item.name == "not_compared":
                value = [{"method": n.method, "why": n.why} for n in value]
            elif item.name == "methods":
                value = {label: {"name": m.name, "ablation": m.ablation} for label, m in value.items()}
            elif isinstance(value, tuple | list):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            found[item.name] = value
        return found


@dataclass(frozen=True, slots=True)
class Message:
    """A cell's most frequent message of one kind (failure, unreadable answer, fallback) and how often it came."""

    message: str
    count: int


@dataclass(frozen=True, slots=True)
class CellOutcome:
    """What became of a backbone × method × realization cell's expected trajectories, its status word and
    whether its number is shown (docs/analysis.md, Outcomes). The fields' order is the JSON's."""

    backbone: str
    method: str
    realization: int
    expected: int
    predictions: int
    invalid: int
    fallback: int
    failed: int
    skipped_budget: int
    interrupted: int
    not_run: int
    unanswered: int
    readable: int
    status: str
    shown: bool
    messages: Mapping[str, Message] = field(default_factory=dict)  # keyed "failed", "invalid", "fallback"

    def count(self, key: str) -> int:
        """One of the counts, by its JSON key."""
        if key not in OUTCOME_COUNTS:
            raise KeyError(key)
        found: int = getattr(self, key)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in _OUTCOME_FIELDS},
            "messages": {kind: {"message": m.message, "count": m.count} for kind, m in self.messages.items()},
        }


_OUTCOME_FIELDS = tuple(f.name for f in fields(CellOutcome) if f.name != "messages")
OUTCOME_COUNTS = _OUTCOME_FIELDS[3:13]
"""The counts of a `CellOutcome`, ``expected`` to ``readable``: the names `results.Outcome` has too."""


@dataclass(frozen=True, slots=True)
class Excluded:
    """A realization-0 cell left out of the paired comparisons and complementarity: its number is not shown."""

    backbone: str
    method: str
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"backbone": self.backbone, "method": self.method, "status": self.status}


@dataclass(frozen=True, slots=True)
class Scores:
    """One aggregate of a cell's scores: ``n`` expected trajectories and one value per metric of `METRICS`
    (fractions; ``root_mae`` in steps; None when nothing was scored). The fields' order is the JSON's."""

    n: int
    agent_acc: float | None = None
    step_acc: float | None = None
    step_pm5: float | None = None
    joint_exact: float | None = None
    joint_pm5: float | None = None
    root_mae: float | None = None
    coverage: float | None = None

    def value(self, metric: str) -> float | None:
        """The value of a metric named as in `METRICS`."""
        if metric == "n" or metric not in _SCORE_FIELDS:
            raise KeyError(metric)
        found: float | None = getattr(self, metric)
        return found

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SCORE_FIELDS}


_SCORE_FIELDS = tuple(f.name for f in fields(Scores))

Bounds = tuple[float, float]
"""An interval's low and high end."""


@dataclass(frozen=True, slots=True)
class CellMetrics:
    """A backbone × method × realization cell's scores: pooled, macro, per source and post-stratified, with the
    interval of each Table 3 metric of the two headlines (None: not carried, as in a hand-built report)."""

    backbone: str
    method: str
    realization: int
    pooled: Scores
    macro: Scores
    status: str = ""  # "" in a report without outcomes
    shown: bool = True
    pooled_intervals: Mapping[str, Bounds] | None = None
    macro_intervals: Mapping[str, Bounds] | None = None
    per_source: Mapping[str, Scores] = field(default_factory=dict)
    post_stratified: Scores | None = None
    coverage_rule: str | None = None  # whose checks decided coverage: "method", "validity" or "mixed"

    def to_json(self) -> dict[str, Any]:
        """The metrics row: pooled at the top level, the rest nested, as ``--json`` has always written it."""
        return {
            "backbone": self.backbone,
            "method": self.method,
            "realization": self.realization,
            "status": self.status,
            "shown": self.shown,
            **self.pooled.to_json(),
            "intervals": _bounds_json(self.pooled_intervals),
            "macro": {**self.macro.to_json(), "intervals": _bounds_json(self.macro_intervals)},
            "per_source": {source: scores.to_json() for source, scores in self.per_source.items()},
            "post_stratified": None if self.post_stratified is None else self.post_stratified.to_json(),
            "coverage_rule": self.coverage_rule,
        }


def _bounds_json(intervals: Mapping[str, Bounds] | None) -> dict[str, list[float]] | None:
    return None if intervals is None else {metric: list(bounds) for metric, bounds in intervals.items()}


@dataclass(frozen=True, slots=True)
class PairedRow:
    """One paired comparison, A − B on one metric over the trajectories both answered. ``kind`` names its
    section: two methods on one backbone (``paired``), one method on two backbones (``paired_backbones``), or
    a method on each kind of backbone (``paired_across``). A statistic left None is one a hand-built row lacks."""

    kind: Literal["methods", "backbones", "across"]
    backbone_a: str
    method_a: str
    backbone_b: str
    method_b: str
    metric: str
    n: int
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    wins: int | None = None
    losses: int | None = None
    p_mcnemar: float | None = None
    p_holm: float | None = None  # within its Holm family
    family: str | None = None  # the Holm family's id (docs/analysis.md)
    score_a: float | None = None
    score_b: float | None = None
    p_holm_joint: float | None = None  # App. B's family over both metrics

    def to_json(self) -> dict[str, Any]:
        """The row as its section has always written it: the labels in that section's order, then the statistics."""
        labels: dict[str, Any]
        if self.kind == "methods":
            labels = {"backbone": self.backbone_a, "method_a": self.method_a, "method_b": self.method_b}
        elif self.kind == "backbones":
            labels = {"method": self.method_a, "backbone_a": self.backbone_a, "backbone_b": self.backbone_b}
        else:
            labels = {
                "method_a": self.method_a,
                "backbone_a": self.backbone_a,
                "method_b": self.method_b,
                "backbone_b": self.backbone_b,
            }
        return {
            **labels,
            "metric": self.metric,
            "family": self.family,
            "n": self.n,
            "score_a": self.score_a,
            "score_b": self.score_b,
            "delta": self.delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "wins": self.wins,
            "losses": self.losses,
            "p_mcnemar": self.p_mcnemar,
            "p_holm": self.p_holm,
            "p_holm_joint": self.p_holm_joint,
        }


@dataclass(frozen=True, slots=True)
class Repeatability:
    """One backbone × method over its scored realizations: each metric's spread over them (headline aggregate)
    and how often each pair of realizations predicts the same root step."""

    backbone: str
    method: str
    realizations: Sequence[int]
    metrics: Mapping[str, Spread]
    agreement: Sequence[Agreement]
    mean_agreement: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "backbone": self.backbone,
            "method": self.method,
            "realizations": list(self.realizations),
            "metrics": {
                name: {"n": s.n, "mean": s.mean, "sd": s.sd, "min": s.min, "max": s.max, "range": s.range}
                for name, s in self.metrics.items()
            },
            "agreement": [
                {
                    "first": a.first,
                    "second": a.second,
                    "n": a.n,
                    "agree": a.agree,
                    "both_missing": a.both_missing,
                    "rate": a.rate,
                }
                for a in self.agreement
            ],
            "mean_agreement": self.mean_agreement,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """One run's report. A field left at its default is a part the report does not have (a hand-built one).

    The fields' order is the JSON's key order (`to_json`): add a field where its key belongs.
    """

    run: RunInfo | None = None
    db: str | None = None
    simulated: bool = False
    aggregate: str | None = None
    reference_method: str | None = None
    expected: int | None = None
    unlabelled: int | None = None
    protocol: ProtocolInfo | None = None
    outcomes: Sequence[CellOutcome] = ()
    excluded: Sequence[Excluded] = ()
    metrics: Sequence[CellMetrics] = ()
    paired: Sequence[PairedRow] = ()
    paired_backbones: Sequence[PairedRow] = ()
    paired_across: Sequence[PairedRow] = ()
    complementarity: Rows = ()
    components: Part = None
    repeatability: Sequence[Repeatability] = ()
    recall: Rows = ()
    turns: Rows = ()
    task_clusters: Part = None
    leave_one_source_out: Part = None
    length_groups: Rows = ()
    length_contrasts: Rows = ()
    fidelity: Part = None
    calibration: Part = None
    label_sensitivity: Part = None
    cost: Sequence[CostRow] = ()
    served_by: Sequence[
        ServedBy
    ] = ()  # what served each managed backbone (vLLM, command lines), its GPU charge
    call_timing: Sequence[
        CallTiming
    ] = ()  # per backbone: streamed or not, time to first token, decode rate, cuts

    def to_json(self) -> dict[str, Any]:
        """The report as ``rcarun report --json`` prints it: the fields in order, each as JSON."""
        return {field.name: _json(getattr(self, field.name)) for field in fields(self)}


_TYPED_ROWS = (CellOutcome, Excluded, CellMetrics, PairedRow, Repeatability, CostRow, CallTiming, ServedBy)


def _json(value: object) -> object:
    if isinstance(value, RunInfo | ProtocolInfo):
        return value.to_json()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple):
        return [row.to_json() if isinstance(row, _TYPED_ROWS) else dict(row) for row in value]
    return value
