"""The report's cost and call-timing sections."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..report.model import Report
from .model import (
    DASH,
    _count,
    _has_gpu,
    _listed,
    _num,
    _Row,
    _row,
    _Section,
    _Table,
    _text,
    _unique,
    _usd,
)

_COUNTS = ("calls", "attempts", "length_retries", "rate_limited")
_TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
_MONEY = ("cost_usd", "usd_per_trajectory", "budget_use")


def _sum(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [v for v in (_num(r, key) for r in rows) if v is not None]
    return sum(values) if values else None


def _cost_cells(row: Mapping[str, Any], gpu: bool = False) -> tuple[list[str], list[str]]:
    usage = [_count(_num(row, k)) for k in ("items", *_COUNTS, *_TOKENS)]
    budget = _num(row, "budget_use")
    money = [
        _usd(_num(row, "cost_usd")),
        *((_usd(_num(row, "gpu_usd")),) if gpu else ()),
        _usd(_num(row, "usd_per_trajectory")),
        _count(_num(row, "latency_p50_ms")),
        _count(_num(row, "latency_p95_ms")),
        DASH if budget is None else f"{budget * 100:.1f}%",
    ]
    return usage, money


def _cost_section(report: Report) -> _Section:
    cost = _listed(report.cost)
    title = "Cost"
    if not cost:
        return _Section("cost", title, notes=("No cost rows in this report (no recorded calls).",))
    gpu = _has_gpu(report)
    usage_rows: list[_Row] = []
    money_rows: list[_Row] = []
    for backbone in _unique(_text(r, "backbone") for r in cost):
        mine = [r for r in cost if _text(r, "backbone") == backbone]
        for row in mine:
            labels = (backbone, _text(row, "method"), _text(row, "stage"))
            usage, money = _cost_cells(row, gpu)
            usage_rows.append(_row(*labels, *usage))
            money_rows.append(_row(*labels, *money))
        # Stage rows of one backbone × method add up to its USD per trajectory, so the sum over methods is the
        # cost of running every method once on one trajectory. Items and latencies do not add up.
        totals = {k: _sum(mine, k) for k in (*_COUNTS, *_TOKENS, *_MONEY, "gpu_usd")}
        usage, money = _cost_cells(totals, gpu)
        usage[0] = ""
        latency = 3 if gpu else 2
        money[latency : latency + 2] = ["", ""]
        usage_rows.append(_row(backbone, "total", "", *usage, total=True))
        money_rows.append(_row(backbone, "total", "", *money, total=True))
    labels = ("Backbone", "Method", "Stage")
    usage_table = _Table(
        columns=(
            *labels,
            *("Items", "Calls", "Attempts", "Length retries", "Rate limited"),
            *("Prompt", "Cached", "Completion", "Reasoning"),
        ),
        rows=tuple(usage_rows),
        label_columns=3,
        groups=(("", 5), ("Tokens", 4)),
        caption="Calls and tokens (prompt tokens include cached ones, completion tokens include reasoning).",
    )
    money_table = _Table(
        columns=(
            *labels,
            "USD",
            *(("GPU USD",) if gpu else ()),
            "USD / traj.",
            "p50 ms",
            "p95 ms",
            "Budget use",
        ),
        rows=tuple(money_rows),
        label_columns=3,
        caption="Money and time (budget use: share of the backbone's USD budget).",
    )
    notes = (
        "A backbone's total USD / traj. is the sum over its methods: running every method once on one trajectory.",
        *(
            (
                "GPU USD: the self-hosted replicas' GPU time, charged to the calls they served; USD and USD / traj. "
                "are the API's.",
            )
            if gpu
            else ()
        ),
    )
    return _Section("cost", title, (usage_table, money_table), notes)


def _call_timing_section(report: Report) -> _Section | None:
    """Per backbone: streamed answers, time to first token, decode rate and cut generations (``call_timing``,
    in reports of newer runs only)."""
    if not report.call_timing:
        return None
    rows = tuple(
        _row(
            *(t.backbone, _count(t.attempts), _count(t.streamed_calls)),
            *(_seconds(t.ttft_p50_s), _seconds(t.ttft_p95_s)),
            *(_rate(t.decode_p50_tokens_per_s), _rate(t.decode_p95_tokens_per_s)),
            *(_count(t.cut_calls), _usd(t.cut_usd)),
        )
        for t in report.call_timing
    )
    table = _Table(
        columns=(
            *("Backbone", "Attempts", "Streamed", "TTFT p50 s", "TTFT p95 s"),
            *("Decode p50 tok/s", "Decode p95 tok/s", "Cut", "Cut USD"),
        ),
        rows=rows,
        caption="How the answers came, over attempts sent (cache hits left out).",
    )
    notes = (
        "Streamed: answers that came as a server-sent-event stream. TTFT: time to first token, from sending the "
        "request to the first chunk of answer, thinking or tool-call text; decode: completion tokens after the "
        "first over the seconds from the first token to the last. Nearest-rank percentiles over the attempts that "
        "have them; – where unknown (no streamed answer, or a file from before they were recorded).",
        "Cut: generations cut short (silence timeout, disconnect, size cap, call deadline, Ctrl-C) and charged an "
        "estimate of what they generated; their USD is in the cost above too.",
    )
    return _Section("call-timing", "Call timing", (table,), notes)


def _seconds(value: float | None) -> str:
    return DASH if value is None or not math.isfinite(value) else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return DASH if value is None or not math.isfinite(value) else f"{value:.1f}"
