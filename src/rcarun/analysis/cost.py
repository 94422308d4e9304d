"""Tokens, money and time per backbone × method × stage, read straight from the ``calls`` table.

A cost figure is only worth publishing if anyone can recompute it from the raw rows, so every number here is a
plain aggregate of ``calls`` (no second tally kept by the runner): the sums reconcile exactly with ``SELECT
sum(...) FROM calls``.

Definitions (one row per run × backbone × method × stage):
    - ``items``: distinct work items (qid × realization) with at least one attempt in this stage.
    - ``calls``: logical calls (``attempt = 1``); ``attempts``: every row, retries and cache hits included.
    - ``length_retries``: attempts cut off by ``max_tokens`` (status ``length``); ``rate_limited``: 429s.
    - ``cached_calls``: attempts served from rcarun's call cache; they were not sent, cost nothing and are
      excluded from every token and USD sum (as in `rcarun.store.BackboneSummary`).
    - tokens: prompt (cached prompt tokens included), cached prompt, completion (reasoning included),
      reasoning — summed over attempts sent to the provider, failed ones included when the provider reported
      usage.
    - ``cost_usd``: the sum of ``cost_usd`` over those attempts.
    - ``estimated_calls``: attempts among those whose usage is rcarun's conservative estimate
      (``usage_source = 'estimated'``: the provider sent no usage, or usage no bill can be); their tokens and USD
      are in the sums above, and are an estimate, not the provider's bill.
    - ``usd_per_trajectory``: ``cost_usd`` / the number of work items of the backbone × method (over all
      stages), so the stage rows of one backbone × method add up to its cost per trajectory.
    - latency p50 / p95: nearest-rank percentiles of ``latency_ms`` over attempts that were sent.
    - ``budget_use``: ``cost_usd`` as a fraction of the backbone's ``budget.max_usd`` in the run's config
      (None when the backbone had no USD budget).

`charged_costs` totals the same sums per backbone × method with one difference: a request several methods
shared (one cache key, e.g. RCTA's Stage I across its ablations) is charged to the first of them in an order
the caller gives — the rule `rcarun estimate` uses — instead of to whichever sent it first, which is timing.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rcarun.store import Store

__all__ = ["ChargedCost", "CostRow", "charged_costs", "cost_rows", "nearest_rank"]

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
    """The cost of one backbone × method × stage within one run (definitions in the module docstring)."""

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
    result = []
    for row in connection.execute(_STAGE_SQL, (run_id,)).fetchall():
        key = (row["backbone"], row["method"], row["stage"])
        cost = float(row["cost_usd"] or 0.0)
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
            )
        )
    return result


def _usd_budgets(store: Store, run_id: int) -> dict[str, float]:
    """Backbone → ``budget.max_usd`` from the run's stored config (plain JSON: analysis never imports runner)."""
    row = store.connection.execute("SELECT config_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    try:
        config = json.loads(row["config_json"]) if row is not None else {}
    except json.JSONDecodeError:
        return {}
    budgets: dict[str, float] = {}
    backbones = config.get("backbones") if isinstance(config, dict) else None
    for name, backbone in (backbones or {}).items():
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
    """What one backbone × method paid in a run, shared requests charged by order (module docstring).

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
