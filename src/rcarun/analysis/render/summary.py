"""The HTML page's opening facts: run, items and failures by cause, coverage, spend, serving."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..cost import CostRow, ServedBy
from ..report.model import CellOutcome, Report
from .cost import _sum, _sums, _tokens
from .model import (
    _OUTCOME_KEYS,
    _WHY_CHARS,
    DASH,
    _aggregate_label,
    _count,
    _has_gpu,
    _pct,
    _protocol,
    _run,
    _unique,
    _usd,
)
from .plots import _short


@dataclass(frozen=True, slots=True)
class _Fact:
    label: str
    text: str
    more: tuple[str, ...] = ()  # folded lines under it (serve commands)


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _failure_causes(rows: Sequence[CellOutcome]) -> str:
    """The failed items by their most frequent message per cell, largest first; the rest as "other"."""
    causes: dict[str, int] = {}
    for row in rows:
        entry = row.messages.get("failed")
        if entry is not None:
            message = _short(entry.message, _WHY_CHARS)
            causes[message] = causes.get(message, 0) + entry.count
    failed = sum(r.failed for r in rows)
    listed = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    parts = [f"{message} ×{count:,}" for message, count in listed]
    other = failed - sum(count for _, count in listed)
    if other > 0:
        parts.append(f"other ×{other:,}")
    return "; ".join(parts)


def _summary(report: Report) -> list[_Fact]:
    """The page's first section: what ran, what became of it and what it cost, in the report's numbers."""
    run = _run(report)
    facts = [
        _Fact(
            "Run",
            f"{run.name or 'unnamed run'} (id {run.run_id or DASH}, {run.status or DASH}, "
            f"created {run.created_at or DASH})",
        ),
        _Fact(
            "Simulated",
            "yes: every backbone was rcarun's mock server or a random-weight local model; the numbers exercise "
            "the engine, not any model"
            if report.simulated
            else "no",
        ),
    ]
    metrics, outcomes = report.metrics, report.outcomes
    backbones = _unique(
        [
            *(r.backbone for r in metrics),
            *(r.backbone for r in outcomes),
            *(r.backbone for r in report.cost),
        ]
    )
    methods = _unique(
        [
            *(r.method for r in metrics),
            *(r.method for r in outcomes),
            *(r.method for r in report.cost),
        ]
    )
    facts.append(_Fact("Backbones", f"{len(backbones)}: {', '.join(backbones)}" if backbones else DASH))
    facts += [_served_fact(served) for served in report.served_by]
    facts.append(_Fact("Methods", f"{len(methods)}: {', '.join(methods)}" if methods else DASH))
    protocol = _protocol(report)
    if protocol.name:
        resamples = None if protocol.resamples is None else float(protocol.resamples)
        facts.append(
            _Fact(
                "Protocol",
                f"{protocol.name}; {_aggregate_label(report)}; "
                f"{_count(resamples)} bootstrap resamples; reference method "
                f"{report.reference_method or DASH} (every rule under Protocol and settings)",
            )
        )
    expected = None if report.expected is None else float(report.expected)
    if expected is not None:
        facts.append(
            _Fact(
                "Trajectories",
                f"{_count(expected)} labelled, each expected in every cell; "
                f"{_count(report.unlabelled or 0)} unlabelled, left out",
            )
        )
    facts += _outcome_facts(outcomes)
    if report.cost:
        facts.append(_spend_fact(report, report.cost))
    return facts


def _served_fact(served: ServedBy) -> _Fact:
    """How a self-hosted backbone was served: vLLM version, replicas, GPUs, GPU time and the commands."""
    text = f"{served.backbone}: served by vLLM {served.vllm_version or '?'}, {_plural(served.replicas, 'replica')}"
    text += f" on {_plural(served.gpus, 'GPU')}, GPU time {_usd(served.gpu_usd)} USD"
    return _Fact("Served by", text, tuple(served.commands))


def _outcome_facts(outcomes: Sequence[CellOutcome]) -> list[_Fact]:
    """Items by outcome, failures by cause, and coverage over every cell."""
    facts: list[_Fact] = []
    if outcomes:
        total = {k: sum(r.count(k) for r in outcomes) for k in (*_OUTCOME_KEYS, "readable")}
        facts.append(
            _Fact(
                "Items",
                f"{total['expected']:,} expected over {_plural(len(outcomes), 'cell')} (backbone × method × "
                f"realization): {total['predictions']:,} done, {total['failed']:,} failed, "
                f"{total['skipped_budget']:,} skipped for budget, {total['interrupted']:,} interrupted, "
                f"{total['not_run']:,} not run",
            )
        )
        if total["failed"]:
            facts.append(_Fact("Failed, by cause", _failure_causes(outcomes)))
        statuses: dict[str, int] = {}
        for row in outcomes:
            statuses[row.status] = statuses.get(row.status, 0) + 1
        hidden = ", ".join(f"{n} {w}" for w, n in statuses.items() if w not in ("complete", "partial"))
        share = total["readable"] / total["expected"] if total["expected"] else None
        facts.append(
            _Fact(
                "Coverage",
                f"{total['readable']:,} of {total['expected']:,} expected answers readable ({_pct(share)}%; "
                f"{total['invalid']:,} unreadable, {total['fallback']:,} decided by a fallback); cells: "
                f"{statuses.get('complete', 0)} complete, {statuses.get('partial', 0)} partial"
                + (f", not shown: {hidden}" if hidden else ""),
            )
        )
    return facts


def _spend_fact(report: Report, cost: Sequence[CostRow]) -> _Fact:
    """API spend (and GPU time when cost rows carry it), tokens, calls and cache hits."""
    api, gpu = _sum(r.cost_usd for r in cost) or 0.0, _sum(r.gpu_usd for r in cost) or 0.0
    money = f"{_usd(api)} USD API"
    if _has_gpu(report):
        money += f" + {_usd(gpu)} USD GPU time = {_usd(api + gpu)} USD"
    prompt, cached, completion, reasoning = (round(total or 0) for total in _sums(cost, _tokens))
    counts = _sums(cost, lambda r: (r.calls, r.attempts, r.cached_calls))
    calls, attempts, hits = (round(total or 0) for total in counts)
    return _Fact(
        "Spend",
        f"{money}; tokens: {prompt:,} prompt ({cached:,} cached), {completion:,} completion ({reasoning:,} "
        f"reasoning); {calls:,} calls, {attempts:,} attempts, {hits:,} cache hits",
    )
