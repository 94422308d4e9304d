"""A run of results.db as scoring inputs: expected trajectories and, per backbone × method × realization, scores.

Every cell is scored against every expected (labelled) trajectory, so a failed, skipped or never-run item is an
error, not a gap; a method that learns from part of the run (SOAP) is scored on the split it answers
(``RunScores.scopes``; cells of different scopes meet on `common_items`), and local backbones are kept apart
(``RunScores.local_backbones``). Predictions are re-scored from ``pred_role``/``pred_step`` (the stored validity
flags are the method's own view, kept for audit), and each cell gets its `Outcome`. The rules: docs/analysis.md
("Scoring", "Outcomes").
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rcarun.errors import StoreError
from rcarun.store import METHOD_PREPARED, RunRow, Store

from .scoring import AbstentionRule, Expected, ItemScore, Prediction, score_items

__all__ = [
    "Cell",
    "Outcome",
    "RunScores",
    "backbone_providers",
    "common_items",
    "load_run_scores",
    "resolve_run",
    "run_config",
]


@dataclass(frozen=True, slots=True, order=True)
class Cell:
    """One backbone × method × realization of a run."""

    backbone: str
    method: str
    realization: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one cell's expected trajectories; the counts cover labelled trajectories only.

    ``predictions + failed + skipped_budget + interrupted + not_run == expected``; ``invalid`` and ``fallback``
    are subsets of ``predictions`` and may overlap (a fallback that decided on unreadable answers).

    Attributes:
        expected: the labelled trajectories the run read (every cell's denominator).
        predictions: expected trajectories with a prediction.
        invalid: predictions whose answer could not be read (``predictions.error`` set).
        fallback: predictions decided, in part, by a rule of the method instead of the model
            (``predictions.fallback`` set).
        failed / skipped_budget / interrupted: expected trajectories without a prediction whose item has that
            status.
        not_run: expected trajectories with neither a prediction nor such an item (never run, or an item marked
            done whose prediction is missing).
        messages: per kind (``failed``, ``invalid``, ``fallback``), the most frequent message and its count.
    """

    expected: int
    predictions: int = 0
    invalid: int = 0
    fallback: int = 0
    failed: int = 0
    skipped_budget: int = 0
    interrupted: int = 0
    not_run: int = 0
    messages: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def readable(self) -> int:
        """Predictions whose answer was read: the ones a number can rest on."""
        return self.predictions - self.invalid

    @property
    def unanswered(self) -> int:
        """Expected trajectories without a prediction, scored as errors by the protocol."""
        return self.expected - self.predictions


@dataclass(slots=True)
class RunScores:
    """Everything scoring needs from one run.

    Attributes:
        run: the run's row.
        expected: the labelled trajectories the run read, by qid order.
        unlabelled: trajectories the run read without a label (not scored).
        scores: per cell, one `ItemScore` per expected trajectory (same order as ``expected``).
        diagnostics: per cell, qid → the ``diagnostics`` object a method stored in its output (e.g. RCTA's
            candidate, excerpt and evidence step ids), for recall diagnostics.
        turns: per cell, qid → the per-turn records a multi-turn method stored (``turns``: each turn's
            prediction, ``changed_from_prev`` and evidence read), for per-turn accuracy.
        simulated: True when the run's config says ``sweep.simulated`` (the demo) or every backbone has
            provider ``simulated``: the numbers then show the engine, not any model.
        outcomes: per cell, what became of its expected trajectories (docs/analysis.md).
        scopes: per cell of a method that answers only part of the run (SOAP's test split), the ids it answers;
            its scores and outcome cover the expected trajectories among them. Cells not here answer all.
        local_backbones: the run's backbones with ``provider = "local"`` (its stored config).
    """

    run: RunRow
    expected: list[Expected]
    unlabelled: int
    scores: dict[Cell, list[ItemScore]] = field(default_factory=dict)
    diagnostics: dict[Cell, dict[str, dict[str, Any]]] = field(default_factory=dict)
    turns: dict[Cell, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    simulated: bool = False
    outcomes: dict[Cell, Outcome] = field(default_factory=dict)
    scopes: dict[Cell, frozenset[str]] = field(default_factory=dict)
    local_backbones: frozenset[str] = frozenset()

    @property
    def backbones(self) -> list[str]:
        return sorted({cell.backbone for cell in self.scores})

    @property
    def methods(self) -> list[str]:
        return sorted({cell.method for cell in self.scores})

    def realizations(self, backbone: str, method: str) -> list[int]:
        return sorted(c.realization for c in self.scores if (c.backbone, c.method) == (backbone, method))


def resolve_run(store: Store, name: str | None) -> RunRow:
    """The run called ``name``, or the most recently updated run when ``name`` is None.

    Raises:
        StoreError: no such run, or the database holds no run at all.
    """
    if name is not None:
        run = store.run_by_name(name)
        if run is None:
            known = ", ".join(repr(r.name) for r in store.runs()) or "none"
            raise StoreError(f"{store.path}: no run named {name!r} (runs: {known})")
        return run
    runs = store.runs()
    if not runs:
        raise StoreError(f"{store.path}: holds no runs yet")
    return max(runs, key=lambda r: (r.updated_at, r.run_id))


def load_run_scores(
    store: Store, run: RunRow, *, keep_handoff: bool = False, abstentions: AbstentionRule = "fields"
) -> RunScores:
    """Score every cell of ``run`` against its expected trajectories (rules in docs/analysis.md).

    Args:
        store: the results database.
        run: the run to score.
        keep_handoff: the component conditions' role rule (handoff suffixes kept).
        abstentions: how abstained predictions are scored (`rcarun.analysis.scoring.AbstentionRule`).
    """
    expected: list[Expected] = []
    unlabelled = 0
    for row in store.trajectories(run.run_id):
        if row.ref_role is None or row.ref_step is None:
            unlabelled += 1
            continue
        expected.append(
            Expected(
                qid=row.qid,
                source=row.source,
                n_steps=row.n_steps,
                ref_role=row.ref_role,
                ref_step=row.ref_step,
                roles=frozenset(json.loads(row.roles_json)),
            )
        )
    predictions: dict[Cell, dict[str, Prediction]] = defaultdict(dict)
    statuses: dict[Cell, dict[str, tuple[str, str | None]]] = defaultdict(dict)
    for item in store.items(run.run_id):
        cell = Cell(item.backbone, item.method, item.realization)
        predictions[cell]  # a cell with items but no answers
        statuses[cell][item.qid] = (item.status, item.error)
    diagnostics: dict[Cell, dict[str, dict[str, Any]]] = defaultdict(dict)
    turns: dict[Cell, dict[str, list[dict[str, Any]]]] = defaultdict(dict)
    errors: dict[Cell, dict[str, str]] = defaultdict(dict)
    for prediction in store.predictions(run.run_id):
        cell = Cell(prediction.backbone, prediction.method, prediction.realization)
        output = _output(prediction.output_json)
        covered = output.get("covered")
        predictions[cell][prediction.qid] = Prediction(
            role=prediction.pred_role,
            step=prediction.pred_step,
            abstained=bool(prediction.abstained),
            covered=covered if isinstance(covered, bool) else None,
        )
        if prediction.error is not None:
            errors[cell][prediction.qid] = prediction.error
        found = output.get("diagnostics")
        if isinstance(found, dict):
            diagnostics[cell][prediction.qid] = found
        recorded = output.get("turns")
        if isinstance(recorded, list) and all(isinstance(t, dict) for t in recorded):
            turns[cell][prediction.qid] = recorded
    result = RunScores(
        run=run,
        expected=expected,
        unlabelled=unlabelled,
        diagnostics=dict(diagnostics),
        turns=dict(turns),
        simulated=_simulated(run),
        local_backbones=_local_backbones(run),
    )
    fallbacks = _fallbacks(store, run.run_id)
    result.scopes = _scopes(store, run.run_id)
    for cell in sorted(predictions):
        scope = result.scopes.get(cell)
        answered = expected if scope is None else [e for e in expected if e.qid in scope]
        result.scores[cell] = score_items(
            answered, predictions[cell], keep_handoff=keep_handoff, abstentions=abstentions
        )
        result.outcomes[cell] = _outcome(
            [e.qid for e in answered],
            predictions[cell],
            statuses.get(cell, {}),
            errors.get(cell, {}),
            fallbacks.get(cell, {}),
        )
    return result


def _scopes(store: Store, run_id: int) -> dict[Cell, frozenset[str]]:
    """Per cell with a ``method_prepared`` event, the ids it answers (the latest event of a cell wins)."""
    scopes: dict[Cell, frozenset[str]] = {}
    for event in store.events(run_id):
        if event.kind != METHOD_PREPARED:
            continue
        detail = _output(event.detail_json)
        backbone, method, realization, items = (
            detail.get(key) for key in ("backbone", "method", "realization", "items")
        )
        named = isinstance(backbone, str) and isinstance(method, str) and isinstance(realization, int)
        if named and isinstance(items, list):
            scopes[Cell(str(backbone), str(method), int(str(realization)))] = frozenset(str(q) for q in items)
    return scopes


def common_items(a: list[ItemScore], b: list[ItemScore]) -> tuple[list[ItemScore], list[ItemScore]]:
    """Two cells' scores on the trajectories both answer, in the same order (the expected set's), for a paired
    comparison; unchanged when they answer the same trajectories (every cell without a scope)."""
    if len(a) == len(b) and all(x.qid == y.qid for x, y in zip(a, b, strict=True)):
        return a, b
    shared = {x.qid for x in a} & {y.qid for y in b}
    return [x for x in a if x.qid in shared], [y for y in b if y.qid in shared]


def _fallbacks(store: Store, run_id: int) -> dict[Cell, dict[str, str]]:
    """Per cell, qid → ``predictions.fallback`` where set; nothing for a results.db without that column."""
    connection = store.connection
    columns = {row[1] for row in connection.execute("PRAGMA table_info(predictions)")}
    if "fallback" not in columns:
        return {}
    found: dict[Cell, dict[str, str]] = defaultdict(dict)
    rows = connection.execute(
        "SELECT backbone, method, realization, qid, fallback FROM predictions "
        "WHERE run_id = ? AND fallback IS NOT NULL",
        (run_id,),
    )
    for backbone, method, realization, qid, fallback in rows:
        found[Cell(backbone, method, realization)][qid] = str(fallback)
    return dict(found)


_STATUS_COUNTS = {"failed": "failed", "skipped_budget": "skipped_budget", "interrupted": "interrupted"}
_MESSAGE_CHARS = 240


def _outcome(
    qids: list[str],
    predicted: dict[str, Prediction],
    statuses: dict[str, tuple[str, str | None]],
    errors: dict[str, str],
    fallbacks: dict[str, str],
) -> Outcome:
    counts: Counter[str] = Counter()
    messages: dict[str, Counter[str]] = defaultdict(Counter)
    for qid in qids:
        if qid in predicted:
            counts["predictions"] += 1
            if qid in errors:
                counts["invalid"] += 1
                messages["invalid"][errors[qid][:_MESSAGE_CHARS]] += 1
            if qid in fallbacks:
                counts["fallback"] += 1
                messages["fallback"][fallbacks[qid][:_MESSAGE_CHARS]] += 1
            continue
        status, error = statuses.get(qid, ("", None))
        kind = _STATUS_COUNTS.get(status, "not_run")
        counts[kind] += 1
        if kind == "failed":
            messages["failed"][(error or "no error recorded")[:_MESSAGE_CHARS]] += 1
    return Outcome(
        expected=len(qids),
        predictions=counts["predictions"],
        invalid=counts["invalid"],
        fallback=counts["fallback"],
        failed=counts["failed"],
        skipped_budget=counts["skipped_budget"],
        interrupted=counts["interrupted"],
        not_run=counts["not_run"],
        # most_common keeps first-seen order among equal counts, and qids come in order: deterministic.
        messages={kind: found.most_common(1)[0] for kind, found in sorted(messages.items())},
    )


def _output(output_json: str | None) -> dict[str, Any]:
    """A prediction's method output, or {} when there is none or it is not a JSON object."""
    if not output_json:
        return {}
    try:
        output = json.loads(output_json)
    except json.JSONDecodeError:
        return {}
    return output if isinstance(output, dict) else {}


def run_config(run: RunRow) -> dict[str, Any]:
    """The sweep config stored with ``run``, as a dict ({} when it is not a JSON object)."""
    try:
        config = json.loads(run.config_json)
    except json.JSONDecodeError:
        return {}
    return config if isinstance(config, dict) else {}


def backbone_providers(config: Mapping[str, Any]) -> dict[str, str]:
    """Backbone name -> provider (its preset) in a stored sweep config (`run_config`); malformed entries left out."""
    backbones = config.get("backbones")
    if not isinstance(backbones, dict):
        return {}
    return {
        str(name): str(b["provider"])
        for name, b in backbones.items()
        if isinstance(b, dict) and isinstance(b.get("provider"), str)
    }


def _local_backbones(run: RunRow) -> frozenset[str]:
    backbones = run_config(run).get("backbones")
    if not isinstance(backbones, dict):
        return frozenset()
    return frozenset(
        str(name) for name, b in backbones.items() if isinstance(b, dict) and b.get("provider") == "local"
    )


def _simulated(run: RunRow) -> bool:
    config = run_config(run)
    if not config:
        return False
    sweep = config.get("sweep")
    if isinstance(sweep, dict) and sweep.get("simulated") is True:
        return True
    backbones = config.get("backbones")
    if not isinstance(backbones, dict) or not backbones:
        return False
    return all(isinstance(b, dict) and b.get("provider") == "simulated" for b in backbones.values())
