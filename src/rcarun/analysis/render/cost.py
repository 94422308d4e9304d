"""The report's cost and call-timing sections."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from ..cost import CostRow
from ..report.model import Report
from .model import (
    DASH,
    _count,
    _finite,
    _has_gpu,
    _Row,
    _row,
    _Section,
    _Table,
    _unique,
    _usd,
)


def _sum(values: Iterable[float | None]) -> float | None:
    found = [v for v in map(_finite, values) if v is not None]
    return sum(found) if found else None


def _sums(rows: Sequence[CostRow], part: Callable[[CostRow], tuple[float | None, ...]]) -> list[float | None]:
    """Each of the part's figures summed over the rows (None where no row has it)."""
    return [_sum(column) for column in zip(*map(part, rows), strict=True)]


def _usage(row: CostRow) -> tuple[float | None, ...]:
    """Items, calls, attempts, length retries, rate limited; prompt, cached, completion, reasoning tokens."""
    return (row.items, row.calls, row.attempts, row.length_retries, row.rate_limited, *_tokens(row))


def _tokens(row: CostRow) -> tuple[float | None, ...]:
    return (row.prompt_tokens, row.cached_tokens, row.completion_tokens, row.reasoning_tokens)


def _money(row: CostRow) -> tuple[float | None, ...]:
    """USD, GPU USD, USD per trajectory, latency p50 and p95 (ms), budget use."""
    return (
        row.cost_usd,
        row.gpu_usd,
        row.usd_per_trajectory,
        row.latency_p50_ms,
        row.latency_p95_ms,
        row.budget_use,
    )


def _cost_cells(
    usage: Sequence[float | None], money: Sequence[float | None], gpu: bool
) -> tuple[list[str], list[str]]:
    usd, gpu_usd, per_trajectory, p50, p95, budget = map(_finite, money)
    cells = [
        _usd(usd),
        *((_usd(gpu_usd),) if gpu else ()),
        _usd(per_trajectory),
        _count(p50),
        _count(p95),
        DASH if budget is None else f"{budget * 100:.1f}%",
    ]
    return [_count(_finite(v)) for v in usage], cells


def _cost_section(report: Report) -> _Section:
    cost = report.cost
    title = "Cost"
    if not cost:
        return _Section("cost", title, notes=("No cost rows in this report (no recorded calls).",))
    gpu = _has_gpu(report)
    usage_rows: list[_Row] = []
    money_rows: list[_Row] = []
    for backbone in _unique(r.backbone for r in cost):
        mine = [r for r in cost if r.backbone == backbone]
        for row in mine:
            labels = (backbone, row.method, row.stage)
            usage, money = _cost_cells(_usage(row), _money(row), gpu)
            usage_rows.append(_row(*labels, *usage))
            money_rows.append(_row(*labels, *money))
        # Stage rows of one backbone × method add up to its USD per trajectory, so the sum over methods is the
        # cost of running every method once on one trajectory. Items and latencies do not add up.
        usage, money = _cost_cells(_sums(mine, _usage), _sums(mine, _money), gpu)
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
