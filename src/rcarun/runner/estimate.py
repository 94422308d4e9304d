"""What a sweep will cost before it is run: every method dry-run against `EstimatingLLM`, which sends nothing.

``rcarun estimate`` answers "how many calls, tokens and dollars?" from the dataset's actual sizes and each
method's real call structure, not from a formula per method that drifts from the code. This module runs the dry
runs and totals them per backbone × method, with the chance range one sweep could land in; the cost model
(expected and worst case, shared stages, chance range) is described in ``docs/estimate.md``.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rcarun.backends import Usage, utf8_length
from rcarun.budgets import PriceTable, TokenEstimator
from rcarun.data import Record, Trajectory, iter_dataset, load_manifest
from rcarun.errors import ConfigError, DataError, RcarunError
from rcarun.methods import Method, create_method, home_backbone
from rcarun.runner.config import BackboneConfig, SweepConfig
from rcarun.runner.dryrun import EstimatingLLM, Tally
from rcarun.runner.wiring import build_prices, check_method_backbones

__all__ = ["CHANCE_DRAWS", "ChanceRange", "EstimateRow", "EstimatingLLM", "SweepEstimate", "estimate_sweep"]

# Dry runs per item: enough that Step-by-step's chance stopping point mostly averages out (more: --samples).
DEFAULT_SAMPLES = 16

CHANCE_DRAWS = 1000
"""Resampled sweeps behind a `ChanceRange` (its ends are the 25th and 975th of them)."""


@dataclass(frozen=True, slots=True)
class ChanceRange:
    """The central 95% of a total over resampled sweeps (``docs/estimate.md``, "Chance range"): (low, high) each."""

    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    usd: tuple[float, float]


@dataclass(frozen=True, slots=True)
class EstimateRow:
    """One backbone × method: totals over every trajectory and realization of the sweep, expected and worst
    case; the fields are described in ``docs/estimate.md`` ("The rows")."""

    backbone: str
    method: str
    trajectories: int
    realizations: int
    calls_expected: float
    calls_max: int
    shared_calls: float
    attempts_expected: float
    prompt_tokens_expected: int
    prompt_tokens_worst: int
    output_tokens_expected: int
    output_tokens_worst: int
    usd_expected: float
    usd_worst: float
    failed_items: float
    chance_range: ChanceRange | None = None
    prompt_tokens_expected_se: float | None = None

    @property
    def usd_per_trajectory(self) -> float:
        """Expected USD per trajectory (all realizations)."""
        return self.usd_expected / self.trajectories if self.trajectories else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usd_per_trajectory": self.usd_per_trajectory}


@dataclass(frozen=True, slots=True)
class SweepEstimate:
    """Every backbone × method row, and the chance ranges of rows drawn jointly: per method over its backbones
    (``method_ranges``) and the whole sweep's USD (``usd_range``); empty and None with a single sample."""

    rows: tuple[EstimateRow, ...]
    trajectories: int
    realizations: int
    samples: int
    data_problems: int
    method_ranges: Mapping[str, ChanceRange]
    usd_range: tuple[float, float] | None

    @property
    def usd_expected(self) -> float:
        return sum(row.usd_expected for row in self.rows)

    @property
    def usd_worst(self) -> float:
        return sum(row.usd_worst for row in self.rows)


@dataclass(slots=True)
class _Sums:
    """One backbone × method over the trajectories: means over samples, and the bounds."""

    calls: float = 0.0
    calls_max: int = 0
    shared_calls: float = 0.0
    attempts: float = 0.0
    prompt_expected: float = 0.0
    prompt_worst: float = 0.0
    output_expected: float = 0.0
    output_worst: float = 0.0
    failed: float = 0.0
    prompt_mean_variance: float = 0.0


def estimate_sweep(
    config: SweepConfig,
    *,
    samples: int = DEFAULT_SAMPLES,
    reasoning_tokens: Mapping[str, int] | None = None,
) -> SweepEstimate:
    """Dry-run every backbone × method × trajectory of ``config`` (backbones resolved) ``samples`` times with
    different answer seeds and total the expected (mean) and worst-case cost. ``reasoning_tokens``: expected
    reasoning tokens per call, by backbone (default 0). Runs its own event loop: call it outside one.

    Raises:
        ConfigError: unknown method, duplicate labels, no backbones, ``samples`` below 1.
        DataError: no trajectories (or a bad record with ``strict_data``).
    """
    if samples < 1:
        raise ConfigError(f"samples must be >= 1, got {samples}")
    if not config.backbones:
        raise ConfigError("the sweep has no backbones to estimate")
    methods = [create_method(m.name, label=m.resolved_label, options=m.options) for m in config.methods]
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"method labels must be unique within a sweep, got {labels}")
    check_method_backbones(methods, config)
    problems: list[DataError] = []
    trajectories = [record.trajectory for record in _records(config, problems)]
    if not trajectories:
        raise DataError("no trajectories found", path=config.sweep.dataset)
    reasoning = dict(reasoning_tokens or {})
    unknown = sorted(set(reasoning) - set(config.backbones))
    if unknown:
        raise ConfigError(f"reasoning tokens given for backbones the sweep does not use: {unknown}")

    sums, varying = asyncio.run(_dry_runs(config, methods, trajectories, samples, reasoning))
    realizations = config.sweep.realizations
    draws = _resample(varying, samples) if samples > 1 else {}
    rows: list[EstimateRow] = []
    chances: dict[_Key, _Draws] = {}
    for name, backbone in config.backbones.items():
        prices = build_prices(backbone)
        for method in methods:
            key = (name, method.label)
            if key not in sums:
                continue
            chance = None
            if samples > 1:
                chances[key] = _row_draws(sums[key], draws.get(key), realizations, prices)
                chance = chances[key].central()
            rows.append(_row(name, method.label, sums[key], len(trajectories), realizations, prices, chance))
    method_ranges = {
        method.label: _Draws.total(
            [d for (_, label), d in chances.items() if label == method.label]
        ).central()
        for method in methods
        if any(label == method.label for _, label in chances)
    }
    usd_range = _Draws.total(list(chances.values())).central().usd if chances else None
    return SweepEstimate(
        rows=tuple(rows),
        trajectories=len(trajectories),
        realizations=realizations,
        samples=samples,
        data_problems=len(problems),
        method_ranges=method_ranges,
        usd_range=usd_range,
    )


async def _dry_runs(
    config: SweepConfig,
    methods: Sequence[Method],
    trajectories: Sequence[Trajectory],
    samples: int,
    reasoning: Mapping[str, int],
) -> tuple[dict[_Key, _Sums], list[_Deviations]]:
    """Every backbone × trajectory's dry runs, folded per backbone × method, and the deviations that vary.

    One event loop for the whole estimate, not one per dry run.
    """
    by_label = {method.label: method for method in methods}
    sums: dict[_Key, _Sums] = {}
    varying: list[_Deviations] = []
    for name, backbone in config.backbones.items():
        if backbone.is_local:
            continue  # forward passes on this machine: no tokens billed, nothing to estimate
        runs_here = [m for m in methods if not m.reads_model and home_backbone(m) in (None, name)]
        for trajectory in trajectories:
            runs = [
                await _dry_run(config, name, runs_here, trajectory, sample, reasoning)
                for sample in range(samples)
            ]
            for key in dict.fromkeys(key for run in runs for key in run):
                backbone_name, label = key
                tallies = [run.get(key, Tally()) for run in runs]
                backbone_config = config.backbones[backbone_name]
                _fold(sums.setdefault(key, _Sums()), tallies, by_label[label], trajectory, backbone_config)
            deviations = _deviations(runs)
            if deviations:
                varying.append(deviations)
    return sums, varying


async def _dry_run(
    config: SweepConfig,
    name: str,
    methods: Sequence[Method],
    trajectory: Trajectory,
    sample: int,
    reasoning_tokens: Mapping[str, int],
) -> dict[tuple[str, str], Tally]:
    """Every method run by backbone ``name`` on one trajectory, in config order, sharing one set of already-paid
    shareable requests per backbone; counts are keyed by (backbone sent to, method)."""
    shared: dict[str, set[str]] = {}
    tallies: dict[tuple[str, str], Tally] = {}
    for method in methods:

        def llm_on(backbone_name: str, method: Method = method) -> EstimatingLLM:
            if backbone_name not in config.backbones:
                raise ConfigError(f"the sweep defines no backbone called {backbone_name!r}")
            return EstimatingLLM(
                config.backbones[backbone_name],
                name=backbone_name,
                stages=config.stages,
                method_label=method.label,
                shareable_stages=method.shareable_stages,
                budgeted_stages=frozenset(method.stage_budgets),
                shared=shared.setdefault(backbone_name, set()),
                tally=tallies.setdefault((backbone_name, method.label), Tally()),
                sample=sample,
                reasoning_tokens=reasoning_tokens.get(backbone_name, 0),
                sibling=llm_on,
            )

        llm = llm_on(name)
        try:
            await method.attribute(trajectory, llm)
        except RcarunError:
            tallies[(name, method.label)].failed += 1
    return tallies


def _fold(
    sums: _Sums, tallies: Sequence[Tally], method: Method, trajectory: Trajectory, backbone: BackboneConfig
) -> None:
    """Add one trajectory's dry runs: means for the expected figures, the largest run or a bound for the maxima."""
    samples = len(tallies)
    sums.calls += sum(t.calls for t in tallies) / samples
    sums.shared_calls += sum(t.shared_calls for t in tallies) / samples
    sums.attempts += sum(t.attempts for t in tallies) / samples
    sums.prompt_expected += sum(t.prompt_expected for t in tallies) / samples
    sums.output_expected += sum(t.output_expected for t in tallies) / samples
    sums.failed += sum(t.failed for t in tallies) / samples
    if samples > 1:
        # The sampling variance of this trajectory's mean; trajectories are dry-run independently, so they add.
        sums.prompt_mean_variance += statistics.variance(t.prompt_expected for t in tallies) / samples
    worst = max(tallies, key=lambda t: t.prompt_worst + t.output_worst)
    calls_max = max(t.calls for t in tallies)
    prompt_worst, output_worst = worst.prompt_worst, worst.output_worst
    bound = method.worst_case(trajectory, _Counter(backbone))
    if bound is not None:
        # Answers decide when the method stops (Step-by-step: the first flagged step); its declared bound is
        # the maximum, each call at its worst length-retry chain.
        attempts = max(t.chain_attempts for t in tallies) or 1
        chain_output = max(t.chain_output for t in tallies)
        calls_max = max(calls_max, bound.calls)
        prompt_worst = max(prompt_worst, bound.prompt_tokens * attempts)
        output_worst = max(output_worst, bound.calls * chain_output)
    sums.calls_max += calls_max
    sums.prompt_worst += prompt_worst
    sums.output_worst += output_worst


_Key = tuple[str, str]  # (backbone the request went to, method label)
_Deviations = dict[_Key, list[tuple[float, float]]]  # per key, per sample: (prompt, output) minus their mean


def _deviations(runs: Sequence[Mapping[_Key, Tally]]) -> _Deviations:
    """One backbone × trajectory's dry runs as each sample's distance from their mean, for the keys that vary."""
    varying: _Deviations = {}
    for key in dict.fromkeys(key for run in runs for key in run):
        values = [(t.prompt_expected, t.output_expected) for t in (run.get(key, Tally()) for run in runs)]
        if len(set(values)) == 1:
            continue
        prompt_mean = statistics.fmean(p for p, _ in values)
        output_mean = statistics.fmean(o for _, o in values)
        varying[key] = [(p - prompt_mean, o - output_mean) for p, o in values]
    return varying


def _resample(varying: Sequence[_Deviations], samples: int) -> dict[_Key, list[tuple[float, float]]]:
    """Per key, ``CHANCE_DRAWS`` draws of the summed deviation: each draw takes one dry run of every varying
    backbone × trajectory (the same one for all its keys, which were answered together)."""
    rng = random.Random(0)
    totals: dict[_Key, list[list[float]]] = {}
    for key in dict.fromkeys(key for unit in varying for key in unit):
        totals[key] = [[0.0, 0.0] for _ in range(CHANCE_DRAWS)]
    for draw in range(CHANCE_DRAWS):
        for unit in varying:
            sample = rng.randrange(samples)
            for key, deviations in unit.items():
                prompt, output = deviations[sample]
                total = totals[key][draw]
                total[0] += prompt
                total[1] += output
    return {key: [(p, o) for p, o in draws] for key, draws in totals.items()}


@dataclass(frozen=True, slots=True)
class _Draws:
    """A total over the resampled sweeps: prompt tokens, output tokens and USD of each draw."""

    prompt: tuple[float, ...]
    output: tuple[float, ...]
    usd: tuple[float, ...]

    @staticmethod
    def total(parts: Sequence[_Draws]) -> _Draws:
        """The draw-by-draw sum: the parts were drawn jointly, so draw k of each belongs to one sweep."""
        return _Draws(*(tuple(map(math.fsum, zip(*columns, strict=True))) for columns in _columns(parts)))

    def central(self) -> ChanceRange:
        def ends(values: tuple[float, ...]) -> tuple[float, float]:
            cuts = statistics.quantiles(values, n=40, method="inclusive")  # 2.5% steps
            return cuts[0], cuts[-1]

        (prompt_low, prompt_high), (output_low, output_high) = ends(self.prompt), ends(self.output)
        return ChanceRange(
            prompt_tokens=(round(prompt_low), round(prompt_high)),
            output_tokens=(round(output_low), round(output_high)),
            usd=ends(self.usd),
        )


def _columns(parts: Sequence[_Draws]) -> tuple[list[tuple[float, ...]], ...]:
    if not parts:
        empty = [(0.0,) * CHANCE_DRAWS]
        return empty, empty, empty
    return [p.prompt for p in parts], [p.output for p in parts], [p.usd for p in parts]


def _row_draws(
    sums: _Sums, deviations: Sequence[tuple[float, float]] | None, realizations: int, prices: PriceTable
) -> _Draws:
    """One row's resampled sweeps: its expected figures moved by each draw's deviation, every realization
    repeating the draw (the widest case, ``docs/estimate.md``)."""
    moves = deviations or [(0.0, 0.0)] * CHANCE_DRAWS
    prompt = tuple(max(0.0, (sums.prompt_expected + p) * realizations) for p, _ in moves)
    output = tuple(max(0.0, (sums.output_expected + o) * realizations) for _, o in moves)
    price = prices.default
    usd = tuple(
        price.cost_usd(Usage(prompt_tokens=round(p), completion_tokens=round(o)))
        for p, o in zip(prompt, output, strict=True)
    )
    return _Draws(prompt, output, usd)


class _Counter:
    """A `TokenCounter` with the backbone's estimator and context window (what the method sees in a sweep)."""

    def __init__(self, backbone: BackboneConfig) -> None:
        self._estimator = TokenEstimator(backbone.chars_per_token)
        self.context_window = backbone.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._estimator.estimate(utf8_length(text))


def _row(
    backbone: str,
    method: str,
    sums: _Sums,
    trajectories: int,
    realizations: int,
    prices: PriceTable,
    chance_range: ChanceRange | None,
) -> EstimateRow:
    """Totals over every realization (one realization estimated, multiplied), priced at the default price."""
    price = prices.default
    prompt_expected = round(sums.prompt_expected * realizations)
    output_expected = round(sums.output_expected * realizations)
    prompt_worst = round(sums.prompt_worst * realizations)
    output_worst = round(sums.output_worst * realizations)
    return EstimateRow(
        backbone=backbone,
        method=method,
        trajectories=trajectories,
        realizations=realizations,
        calls_expected=sums.calls * realizations,
        calls_max=sums.calls_max * realizations,
        shared_calls=sums.shared_calls * realizations,
        attempts_expected=sums.attempts * realizations,
        prompt_tokens_expected=prompt_expected,
        prompt_tokens_worst=prompt_worst,
        output_tokens_expected=output_expected,
        output_tokens_worst=output_worst,
        usd_expected=price.cost_usd(Usage(prompt_tokens=prompt_expected, completion_tokens=output_expected)),
        usd_worst=price.cost_usd(Usage(prompt_tokens=prompt_worst, completion_tokens=output_worst)),
        failed_items=sums.failed * realizations,
        chance_range=chance_range,
        prompt_tokens_expected_se=None
        if chance_range is None
        else math.sqrt(sums.prompt_mean_variance) * realizations,
    )


def _records(config: SweepConfig, problems: list[DataError]) -> Iterator[Record]:
    """The sweep's records: the dataset, or the manifest's selection with its pinned SHA-256 (as the runner reads)."""
    records = iter_dataset(
        Path(config.sweep.dataset), strict=config.sweep.strict_data, on_problem=problems.append
    )
    if config.sweep.manifest is None:
        yield from records
        return
    listed = {entry.qid: entry for entry in load_manifest(config.sweep.manifest).records}
    for record in records:
        entry = listed.get(record.trajectory.qid)
        if entry is None:
            continue
        if entry.sha256 != record.trajectory.sha256:
            problems.append(DataError("SHA-256 differs from the manifest's; left out", record=entry.qid))
            continue
        yield record
