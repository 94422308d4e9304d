"""Tokens, money and time per backbone × method × stage, read straight from the ``calls`` table.

Every number is a plain aggregate of ``calls`` (no second tally kept by the runner), so it reconciles exactly with
``SELECT sum(...) FROM calls`` and anyone can recompute it. GPU time of managed replicas is charged from
``run_events`` and split over a backbone's rows by tokens processed; `charged_costs` charges a request several
methods shared to the first of them in a given order, as `rcarun estimate` does. Definitions: docs/analysis.md
("Cost").
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from rcarun.store import Store

__all__ = [
    "ChargedCost",
    "CostRow",
    "ReplicaThroughput",
    "ServedBy",
    "charged_costs",
    "cost_rows",
    "nearest_rank",
    "served_by",
]

# The run_events kinds the runner writes for managed replicas (`rcarun.runner.managed`; analysis never imports
# the runner, so the labels are repeated here).
_STARTED = "replicas_started"
_STOPPED = "replicas_stopped"

_STAGE_SQL = """
SELECT backbone, method, stage,
       count(DISTINCT item_id) AS items,
       sum(attempt = 1) AS calls,
       count(*) AS attempts,
       sum(status = 'length') AS length_retries,
       sum(status = 'rate_limited') AS rate_limited,
       sum(status = 'cached') AS cached_calls,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE prompt_tokens END) AS prompt_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE cached_tokens END) AS cached_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE completion_tokens END) AS completion_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE reasoning_tokens END) AS reasoning_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE cost_usd END) AS cost_usd,
       sum(status != 'cached' AND usage_source = 'estimated') AS estimated_calls
FROM calls WHERE run_id = ?
GROUP BY backbone, method, stage
ORDER BY backbone, method, stage
"""

_ITEMS_SQL = """
SELECT backbone, method, count(DISTINCT item_id) AS items
FROM calls WHERE run_id = ? GROUP BY backbone, method
"""

_LATENCY_SQL = """
SELECT backbone, method, stage, latency_ms FROM calls
WHERE run_id = ? AND status != 'cached' AND latency_ms IS NOT NULL
ORDER BY backbone, method, stage, latency_ms
"""


@dataclass(frozen=True, slots=True)
class CostRow:
    """The cost of one backbone × method × stage within one run (definitions in docs/analysis.md)."""

    backbone: str
    method: str
    stage: str
    items: int
    calls: int
    attempts: int
    length_retries: int
    rate_limited: int
    cached_calls: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float
    usd_per_trajectory: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    budget_use: float | None
    estimated_calls: int = 0
    gpu_usd: float = 0.0
    total_usd: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ReplicaThroughput:
    """One managed replica over the run: the attempts it served, their tokens, and tokens per second up."""

    index: int
    gpus: tuple[int, ...]
    attempts: int
    tokens: int
    up_s: float
    tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class ServedBy:
    """What served a managed backbone in a run and what its GPU time cost (rule in docs/analysis.md).

    ``vllm_version``, ``replicas``, ``gpus`` and ``commands`` are the latest session's; ``sessions`` counts
    the sessions that started the replicas (a resume is another).
    """

    backbone: str
    vllm_version: str
    replicas: int
    gpus: int
    commands: tuple[str, ...]
    sessions: int
    unclosed_sessions: int
    gpu_hours: float
    gpu_hour_usd: float
    gpu_usd: float
    tokens: int
    tokens_per_s_per_replica: float | None
    per_replica: tuple[ReplicaThroughput, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def nearest_rank(sorted_values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile: the smallest value with at least ``fraction`` of the values at or below."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def cost_rows(store: Store, run_id: int) -> list[CostRow]:
    """One `CostRow` per backbone × method × stage of the run, sorted by those three."""
    connection = store.connection
    items_of = {
        (row["backbone"], row["method"]): int(row["items"])
        for row in connection.execute(_ITEMS_SQL, (run_id,)).fetchall()
    }
    latencies: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for row in connection.execute(_LATENCY_SQL, (run_id,)):
        latencies[(row["backbone"], row["method"], row["stage"])].append(float(row["latency_ms"]))
    budgets = _usd_budgets(store, run_id)
    stage_rows = connection.execute(_STAGE_SQL, (run_id,)).fetchall()
    charges = {served.backbone: served.gpu_usd for served in served_by(store, run_id)}
    tokens_of: dict[str, int] = defaultdict(int)
    for row in stage_rows:
        tokens_of[row["backbone"]] += int(row["prompt_tokens"] or 0) + int(row["completion_tokens"] or 0)
    result = []
    for row in stage_rows:
        key = (row["backbone"], row["method"], row["stage"])
        cost = float(row["cost_usd"] or 0.0)
        backbone_tokens = tokens_of[row["backbone"]]
        row_tokens = int(row["prompt_tokens"] or 0) + int(row["completion_tokens"] or 0)
        gpu = charges.get(row["backbone"], 0.0) * row_tokens / backbone_tokens if backbone_tokens else 0.0
        items = items_of.get((row["backbone"], row["method"]), 0)
        budget = budgets.get(row["backbone"])
        result.append(
            CostRow(
                backbone=row["backbone"],
                method=row["method"],
                stage=row["stage"],
                items=int(row["items"]),
                calls=int(row["calls"] or 0),
                attempts=int(row["attempts"]),
                length_retries=int(row["length_retries"] or 0),
                rate_limited=int(row["rate_limited"] or 0),
                cached_calls=int(row["cached_calls"] or 0),
                prompt_tokens=int(row["prompt_tokens"] or 0),
                cached_tokens=int(row["cached_tokens"] or 0),
                completion_tokens=int(row["completion_tokens"] or 0),
                reasoning_tokens=int(row["reasoning_tokens"] or 0),
                cost_usd=cost,
                usd_per_trajectory=cost / items if items else None,
                latency_p50_ms=nearest_rank(latencies[key], 0.50),
                latency_p95_ms=nearest_rank(latencies[key], 0.95),
                budget_use=cost / budget if budget else None,
                estimated_calls=int(row["estimated_calls"] or 0),
                gpu_usd=gpu,
                total_usd=cost + gpu,
            )
        )
    return result


@dataclass(slots=True)
class _Session:
    started_at: str
    started: dict[str, Any]
    stopped: dict[str, Any] | None = None
    ends_at: str | None = None  # the next session's start, when this one never recorded its stop


_CALLS_SERVED_SQL = """
SELECT endpoint, started_at, ended_at, coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0) AS tokens
FROM calls
WHERE run_id = ? AND backbone = ? AND status != 'cached'
"""


def served_by(store: Store, run_id: int) -> list[ServedBy]:
    """Per managed backbone of the run (one with ``replicas_started`` events), sorted by name: what served it,
    its GPU time's charge and each replica's tokens per second (rule in docs/analysis.md)."""
    sessions: dict[str, list[_Session]] = defaultdict(list)
    for event in store.events(run_id):
        if event.kind not in (_STARTED, _STOPPED):
            continue
        try:
            detail = json.loads(event.detail_json)
        except json.JSONDecodeError:
            continue
        if not isinstance(detail, dict) or not isinstance(detail.get("backbone"), str):
            continue
        runs = sessions[detail["backbone"]]
        session_id = detail.get("session")
        if event.kind == _STARTED:
            runs.append(_Session(started_at=event.at, started=detail))
            continue
        open_ = [run for run in runs if run.stopped is None]
        if session_id is not None:
            open_ = [run for run in open_ if run.started.get("session") == session_id]
        if open_:
            open_[-1].stopped = detail
    for runs in sessions.values():
        # A session that never recorded its stop was killed; its calls are those before the next start.
        for run, following in itertools.pairwise(runs):
            if run.stopped is None:
                run.ends_at = following.started_at
    prices = _gpu_prices(store, run_id)
    return [
        _served(store, run_id, backbone, runs, prices.get(backbone, 0.0))
        for backbone, runs in sorted(sessions.items())
        if runs
    ]


def _served(store: Store, run_id: int, backbone: str, runs: list[_Session], config_price: float) -> ServedBy:
    calls = store.connection.execute(_CALLS_SERVED_SQL, (run_id, backbone)).fetchall()
    usd_seconds = 0.0
    gpu_seconds = 0.0
    unclosed = 0
    up_of: dict[int, float] = defaultdict(float)
    attempts_of: dict[int, int] = defaultdict(int)
    tokens_of: dict[int, int] = defaultdict(int)
    gpus_of: dict[int, tuple[int, ...]] = {}
    for session in runs:
        replicas = [r for r in session.started.get("replicas") or () if isinstance(r, dict)]
        index_of = {str(r.get("base_url", "")).rstrip("/"): int(r.get("index", 0)) for r in replicas}
        for replica in replicas:
            gpus_of[int(replica.get("index", 0))] = tuple(int(gpu) for gpu in replica.get("gpus") or ())
        gpus = int(session.started.get("gpus") or sum(len(r.get("gpus") or ()) for r in replicas))
        price = float(session.started.get("gpu_hour_usd", config_price) or 0.0)
        last_call = session.started_at
        for call in calls:
            at = call["started_at"] or ""
            if at < session.started_at or (session.ends_at is not None and at >= session.ends_at):
                continue
            last_call = max(last_call, call["ended_at"] or at)
            index = index_of.get(str(call["endpoint"] or "").rstrip("/"))
            if index is not None:
                attempts_of[index] += 1
                tokens_of[index] += int(call["tokens"] or 0)
        if session.stopped is not None:
            held = float(session.stopped.get("held_s") or 0.0)
            up = float(session.stopped.get("up_s") or 0.0)
        else:
            unclosed += 1
            up = _seconds_between(session.started_at, last_call)
            held = up + max((float(r.get("startup_s") or 0.0) for r in replicas), default=0.0)
        for replica in replicas:
            up_of[int(replica.get("index", 0))] += up
        gpu_seconds += held * gpus
        usd_seconds += held * gpus * price
    latest = runs[-1].started
    replicas = [r for r in latest.get("replicas") or () if isinstance(r, dict)]
    tokens = sum(int(call["tokens"] or 0) for call in calls)
    total_up = sum(up_of.values())
    return ServedBy(
        backbone=backbone,
        vllm_version=str(latest.get("vllm_version", "unknown")),
        replicas=len(replicas),
        gpus=int(latest.get("gpus") or sum(len(r.get("gpus") or ()) for r in replicas)),
        commands=tuple(shlex.join(str(word) for word in r.get("argv") or ()) for r in replicas),
        sessions=len(runs),
        unclosed_sessions=unclosed,
        gpu_hours=gpu_seconds / 3600,
        gpu_hour_usd=float(latest.get("gpu_hour_usd", config_price) or 0.0),
        gpu_usd=usd_seconds / 3600,
        tokens=tokens,
        tokens_per_s_per_replica=sum(tokens_of.values()) / total_up if total_up > 0 else None,
        per_replica=tuple(
            ReplicaThroughput(
                index=index,
                gpus=gpus_of.get(index, ()),
                attempts=attempts_of[index],
                tokens=tokens_of[index],
                up_s=round(up_of[index], 3),
                tokens_per_s=tokens_of[index] / up_of[index] if up_of[index] > 0 else None,
            )
            for index in sorted(up_of)
        ),
    )


def _seconds_between(start: str, end: str) -> float:
    try:
        return max(0.0, (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())
    except ValueError:
        return 0.0


def _gpu_prices(store: Store, run_id: int) -> dict[str, float]:
    """Backbone → ``prices.gpu_hour_usd`` from the run's stored config: the price of sessions whose events
    predate the price being recorded with them."""
    backbones = _stored_backbones(store, run_id)
    prices: dict[str, float] = {}
    for name, backbone in backbones.items():
        table = backbone.get("prices") if isinstance(backbone, dict) else None
        price = table.get("gpu_hour_usd") if isinstance(table, dict) else None
        if isinstance(price, int | float) and price > 0:
            prices[name] = float(price)
    return prices


def _stored_backbones(store: Store, run_id: int) -> dict[str, Any]:
    row = store.connection.execute("SELECT config_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    try:
        config = json.loads(row["config_json"]) if row is not None else {}
    except json.JSONDecodeError:
        return {}
    backbones = config.get("backbones") if isinstance(config, dict) else None
    return backbones if isinstance(backbones, dict) else {}


def _usd_budgets(store: Store, run_id: int) -> dict[str, float]:
    """Backbone → ``budget.max_usd`` from the run's stored config (plain JSON: analysis never imports runner)."""
    budgets: dict[str, float] = {}
    for name, backbone in _stored_backbones(store, run_id).items():
        budget = backbone.get("budget") if isinstance(backbone, dict) else None
        max_usd = budget.get("max_usd") if isinstance(budget, dict) else None
        if isinstance(max_usd, int | float) and max_usd > 0:
            budgets[name] = float(max_usd)
    return budgets


# {ranks} is a VALUES list of (method, rank); methods not in it rank after it, by name.
_CHARGED_SQL = """
WITH charge_rank(method, rank) AS (VALUES {ranks}),
used AS (
    SELECT c.cache_key, c.method, coalesce(r.rank, {unranked}) AS rank
    FROM calls c LEFT JOIN charge_rank r ON r.method = c.method
    WHERE c.run_id = ? AND c.cache_key IS NOT NULL
    GROUP BY c.cache_key, c.method
),
ordered AS (
    SELECT cache_key, method, count(*) OVER (PARTITION BY cache_key) AS users,
           row_number() OVER (PARTITION BY cache_key ORDER BY rank, method) AS place
    FROM used
),
payer AS (SELECT cache_key, method FROM ordered WHERE users > 1 AND place = 1)
SELECT c.backbone, coalesce(p.method, c.method) AS charged, sum(c.attempt = 1) AS calls,
       sum(c.prompt_tokens) AS prompt_tokens, sum(c.completion_tokens) AS completion_tokens,
       sum(c.cost_usd) AS cost_usd
FROM calls c LEFT JOIN payer p ON p.cache_key = c.cache_key
WHERE c.run_id = ? AND c.status != 'cached'
GROUP BY c.backbone, charged
"""


@dataclass(frozen=True, slots=True)
class ChargedCost:
    """What one backbone × method paid in a run, shared requests charged by order (docs/analysis.md).

    ``items`` counts the method's work items (with any call row, cache hits included); ``calls`` are logical
    calls (``attempt = 1``); tokens and USD are summed over attempts sent to the provider, as in `CostRow`.
    """

    backbone: str
    method: str
    items: int
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


def charged_costs(
    store: Store, run_id: int, charge_order: Sequence[str]
) -> dict[tuple[str, str], ChargedCost]:
    """Per (backbone, method): the run's paid calls, each request several methods shared charged to the first
    of them in ``charge_order`` (methods not in it come after it, by name)."""
    connection = store.connection
    ranks = ", ".join("(?, ?)" for _ in charge_order) or "(NULL, NULL)"
    sql = _CHARGED_SQL.format(ranks=ranks, unranked=len(charge_order))
    parameters = [value for index, method in enumerate(charge_order) for value in (method, index)]
    items_of = {
        (row["backbone"], row["method"]): int(row["items"])
        for row in connection.execute(_ITEMS_SQL, (run_id,)).fetchall()
    }
    return {
        (row["backbone"], row["charged"]): ChargedCost(
            backbone=row["backbone"],
            method=row["charged"],
            items=items_of.get((row["backbone"], row["charged"]), 0),
            calls=int(row["calls"] or 0),
            prompt_tokens=int(row["prompt_tokens"] or 0),
            completion_tokens=int(row["completion_tokens"] or 0),
            cost_usd=float(row["cost_usd"] or 0.0),
        )
        for row in connection.execute(sql, (*parameters, run_id, run_id))
    }
