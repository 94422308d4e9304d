"""What one trajectory page shows, read from results.db: predictions scored as the report scores them, the
item status of work that has no prediction, and the calls behind each.

Correctness comes from `rcarun.analysis.scoring.score_items` under the report's own rules (abstentions, role
matching), so a verdict shown green here is one the report counted as a hit.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcarun.analysis.report.model import Report
from rcarun.analysis.scoring import AbstentionRule, Expected, ItemScore, Prediction, score_items
from rcarun.store import ItemRow, PredictionRow, Store, TrajectoryRow

__all__ = [
    "CallView",
    "PredictionView",
    "Rules",
    "TrajectoryFacts",
    "read_calls",
    "read_predictions",
    "reason_and_evidence",
]

# SQLite's default limit on host parameters is 999 in older builds: stay well below it.
_CHUNK = 400
_REASON_KEYS = ("reason", "rationale", "explanation", "reasoning")


@dataclass(frozen=True, slots=True)
class Rules:
    """The report's scoring rules the verdicts follow (its ``protocol`` entry)."""

    abstentions: AbstentionRule = "fields"
    keep_handoff: bool = False

    @classmethod
    def of_report(cls, report: Report) -> Rules:
        protocol = report.protocol
        if protocol is None:
            return cls()
        return cls(
            abstentions="error" if protocol.abstentions == "error" else "fields",
            keep_handoff=bool(protocol.keep_handoff),
        )


@dataclass(frozen=True, slots=True)
class TrajectoryFacts:
    """A trajectory's row in results.db, its roles decoded."""

    row: TrajectoryRow
    roles: tuple[str, ...]

    @classmethod
    def of(cls, row: TrajectoryRow) -> TrajectoryFacts:
        try:
            decoded = json.loads(row.roles_json)
        except ValueError:
            decoded = []
        roles = tuple(str(r) for r in decoded) if isinstance(decoded, list) else ()
        return cls(row=row, roles=roles)

    @property
    def labelled(self) -> bool:
        return self.row.ref_role is not None and self.row.ref_step is not None

    def expected(self) -> Expected | None:
        row = self.row
        if row.ref_role is None or row.ref_step is None or not 0 <= row.ref_step < row.n_steps:
            return None
        return Expected(
            qid=row.qid,
            source=row.source,
            n_steps=row.n_steps,
            ref_role=row.ref_role,
            ref_step=row.ref_step,
            roles=frozenset(self.roles) if self.roles else None,
        )


@dataclass(frozen=True, slots=True)
class CallView:
    """One attempt of one call, as the page lists it; the ``*_sha256`` fields name the blobs behind its texts."""

    call_id: int
    backbone: str
    stage: str
    attempt: int
    status: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float
    latency_ms: float | None
    error: str | None
    request_sha256: str | None
    response_sha256: str | None
    response_text_sha256: str | None
    reasoning_text_sha256: str | None


@dataclass(frozen=True, slots=True)
class PredictionView:
    """One backbone × method × realization work item of the trajectory: its prediction, when there is one.

    Attributes:
        item_id: the runner's id, which the calls share.
        status: the item's status (``done``, ``failed``, ...), or ``done`` for a prediction without an item row.
        item_error: why the item failed, when it did.
        prediction: the stored prediction, None when the item ended without one.
        score: the verdict under the report's rules; None when the trajectory has no usable reference or the
            item has no prediction.
        reason / evidence: the method's stated reason and cited evidence, when its output holds them.
    """

    item_id: str
    backbone: str
    method: str
    realization: int
    status: str
    item_error: str | None
    prediction: PredictionRow | None
    score: ItemScore | None
    reason: str | None
    evidence: str | None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.backbone, self.method, self.realization)


def _output(output_json: str | None) -> dict[str, Any]:
    if not output_json:
        return {}
    try:
        value = json.loads(output_json)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _evidence_text(value: object) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and value:
        return ", ".join(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in value)
    return None


def reason_and_evidence(output: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The reason and evidence a method's output states: at its top level, in its ``answer`` or its
    ``diagnostics`` (methods differ; RCTA keeps ``evidence_ids`` in diagnostics). Counts such as
    ``evidence_tokens`` are not evidence."""
    places = [output]
    places += [output[k] for k in ("answer", "diagnostics") if isinstance(output.get(k), Mapping)]
    reason = evidence = None
    for place in places:
        for key in _REASON_KEYS:
            value = place.get(key)
            if reason is None and isinstance(value, str) and value.strip():
                reason = value.strip()
        for key, value in place.items():
            if evidence is None and isinstance(key, str) and key.startswith("evidence"):
                evidence = _evidence_text(value)
    return reason, evidence


def read_predictions(
    facts: TrajectoryFacts, predictions: Iterable[PredictionRow], items: Iterable[ItemRow], rules: Rules
) -> list[PredictionView]:
    """Every work item of one trajectory with its prediction and verdict, sorted by backbone, method, realization."""
    expected = facts.expected()
    by_key: dict[tuple[str, str, int], ItemRow] = {(i.backbone, i.method, i.realization): i for i in items}
    views: list[PredictionView] = []
    seen: set[tuple[str, str, int]] = set()
    for row in predictions:
        key = (row.backbone, row.method, row.realization)
        seen.add(key)
        item = by_key.get(key)
        output = _output(row.output_json)
        covered = output.get("covered")
        score = None
        if expected is not None:
            prediction = Prediction(
                role=row.pred_role,
                step=row.pred_step,
                abstained=bool(row.abstained),
                covered=covered if isinstance(covered, bool) else None,
            )
            score = score_items(
                [expected],
                {facts.row.qid: prediction},
                keep_handoff=rules.keep_handoff,
                abstentions=rules.abstentions,
            )[0]
        reason, evidence = reason_and_evidence(output)
        views.append(
            PredictionView(
                item_id=row.item_id,
                backbone=row.backbone,
                method=row.method,
                realization=row.realization,
                status=item.status if item is not None else "done",
                item_error=item.error if item is not None else None,
                prediction=row,
                score=score,
                reason=reason,
                evidence=evidence,
            )
        )
    for key, item in by_key.items():
        if key not in seen:
            views.append(
                PredictionView(
                    item_id=item.item_id,
                    backbone=item.backbone,
                    method=item.method,
                    realization=item.realization,
                    status=item.status,
                    item_error=item.error,
                    prediction=None,
                    score=None,
                    reason=None,
                    evidence=None,
                )
            )
    return sorted(views, key=lambda v: v.key)


_CALL_COLUMNS = (
    "call_id, item_id, backbone, stage, attempt, status, finish_reason, prompt_tokens, completion_tokens, "
    "reasoning_tokens, cost_usd, latency_ms, error, request_sha256, response_sha256, response_text_sha256, "
    "reasoning_text_sha256"
)


def _chunks(values: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def read_calls(store: Store, run_id: int, item_ids: Sequence[str]) -> dict[str, list[CallView]]:
    """The calls of the given work items, by item id, in the order they were recorded.

    One query per few hundred items, on the ``(run_id, item_id)`` index: a page costs what its own calls cost,
    never a scan of the run's.
    """
    calls: dict[str, list[CallView]] = defaultdict(list)
    for chunk in _chunks(sorted(set(item_ids)), _CHUNK):
        marks = ", ".join("?" for _ in chunk)
        rows = store.connection.execute(
            f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? AND item_id IN ({marks}) ORDER BY call_id",
            (run_id, *chunk),
        ).fetchall()
        for row in rows:
            calls[str(row["item_id"])].append(
                CallView(
                    call_id=int(row["call_id"]),
                    backbone=str(row["backbone"]),
                    stage=str(row["stage"]),
                    attempt=int(row["attempt"]),
                    status=str(row["status"]),
                    finish_reason=row["finish_reason"],
                    prompt_tokens=int(row["prompt_tokens"] or 0),
                    completion_tokens=int(row["completion_tokens"] or 0),
                    reasoning_tokens=int(row["reasoning_tokens"] or 0),
                    cost_usd=float(row["cost_usd"] or 0.0),
                    latency_ms=None if row["latency_ms"] is None else float(row["latency_ms"]),
                    error=row["error"],
                    request_sha256=row["request_sha256"],
                    response_sha256=row["response_sha256"],
                    response_text_sha256=row["response_text_sha256"],
                    reasoning_text_sha256=row["reasoning_text_sha256"],
                )
            )
    for found in calls.values():
        found.sort(key=lambda c: c.call_id)
    return dict(calls)
