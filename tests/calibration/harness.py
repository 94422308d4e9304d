"""Is `rcarun estimate` right on average? Many draws of the demo's sweep set against one estimate.

The demo is one draw of every answer. For a method whose answers decide how many calls it makes (Step-by-step
stops at the first step judged decisive), one draw can sit far from the expected figure while the estimate is
exactly right on average; judging the estimate on that draw alone mixes its error with the draw's luck. This
harness separates the two. It runs the demo's own sweep (its four simulated backbones, their limits, faults and
length retries, over real HTTP on loopback) ``draws`` times, each against simulated models of other names: the
simulator seeds a temperature-0 answer by model and request, so a new name is an independent draw of every
answer while every prompt stays the same. Draw 0 keeps the demo's names, so it is the demo itself.

Each draw's paid tokens per method come from `rcarun.analysis.charged_costs` (what ``rcarun estimate
--against`` compares); the estimate is that of the demo config (``rcarun estimate``). Per method it reports the
mean of the draws and its standard error, the estimate's error against that mean, how many draws fall inside
the estimate's 95% chance range, and how many fall within 15% of the expected figure.

Shared by ``tests/calibration/test_calibration.py`` and ``scripts/estimate_calibration.py``.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rcarun.analysis import charged_costs, resolve_run
from rcarun.cli.estimate import demo_estimate_config, demo_reasoning_tokens
from rcarun.demo import demo_sweep_config, simulated_backbones
from rcarun.runner import SweepConfig, narrow_sweep, run_sweep
from rcarun.runner.estimate import SweepEstimate, estimate_sweep
from rcarun.store import open_store

__all__ = ["MethodCalibration", "draw_totals", "render_table", "run_calibration", "summarize"]


def _suffix(draw: int) -> str:
    """The simulated models' renaming in ``draw`` (draw 0: the demo's own names)."""
    return "" if draw == 0 else f"~draw{draw}"


def _only(config: SweepConfig, methods: Sequence[str] | None) -> SweepConfig:
    if methods is None:
        return config
    unknown = sorted(set(methods) - {m.resolved_label for m in config.methods})
    if unknown:
        raise ValueError(f"the demo runs no method called {unknown}")
    # As `rcarun sweep --method` slices it: the demo's local backbone goes when no method that reads a model is
    # left to run on it.
    return narrow_sweep(config, methods=methods)


async def _run_draw(db: Path, draw: int, methods: Sequence[str] | None) -> None:
    async with simulated_backbones(_suffix(draw)) as backbones:
        config = _only(demo_sweep_config(backbones), methods)
        await run_sweep(config, db_path=db, run_name=f"draw-{draw}", show_progress=False)


def draw_totals(db: Path, draw: int, methods: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per method: (work items, prompt tokens paid) of one draw, over the four backbones."""
    with open_store(db) as store:
        run = resolve_run(store, f"draw-{draw}")
        charged = charged_costs(store, run.run_id, methods)
    totals: dict[str, tuple[int, int]] = {}
    for method in methods:
        rows = [cost for (_, label), cost in charged.items() if label == method]
        totals[method] = (sum(c.items for c in rows), sum(c.prompt_tokens for c in rows))
    return totals


@dataclass(frozen=True, slots=True)
class MethodCalibration:
    """One method: the estimate beside ``draws`` measured sweeps (prompt tokens over the four backbones)."""

    method: str
    expected: int
    chance_range: tuple[int, int] | None
    measured: tuple[int, ...]  # draw 0 first: the demo's own names

    @property
    def mean(self) -> float:
        return statistics.fmean(self.measured)

    @property
    def standard_error(self) -> float:
        """Of the draws' mean (0 with one draw)."""
        if len(self.measured) < 2:
            return 0.0
        return statistics.stdev(self.measured) / math.sqrt(len(self.measured))

    @property
    def error_against_mean(self) -> float:
        return (self.expected - self.mean) / self.mean

    @property
    def inside_range(self) -> int:
        """Draws inside the 95% chance range (every draw when there is no range to miss)."""
        if self.chance_range is None:
            return len(self.measured)
        low, high = self.chance_range
        return sum(low <= value <= high for value in self.measured)

    @property
    def within_15_percent(self) -> int:
        """Draws the expected figure is within 15% of (the issue's line, applied to each draw)."""
        return sum(abs(self.expected - value) <= 0.15 * value for value in self.measured)


def summarize(estimate: SweepEstimate, measured: Mapping[str, Sequence[int]]) -> list[MethodCalibration]:
    """The estimate's expected figure and range per method beside each draw's measured prompt tokens."""
    result = []
    for method, values in measured.items():
        chance = estimate.method_ranges.get(method)
        result.append(
            MethodCalibration(
                method=method,
                expected=sum(r.prompt_tokens_expected for r in estimate.rows if r.method == method),
                chance_range=None if chance is None else chance.prompt_tokens,
                measured=tuple(values),
            )
        )
    return result


def run_calibration(
    workdir: Path, draws: int, methods: Sequence[str] | None = None, samples: int = 16
) -> tuple[list[MethodCalibration], int]:
    """Run ``draws`` sweeps into ``workdir/results.db`` and estimate once; returns the rows and the work items
    each draw finished per method (the same for all, or it raises: an unfinished draw would compare nothing)."""
    db = workdir / "results.db"
    config = _only(demo_estimate_config(), methods)
    labels = [m.resolved_label for m in config.methods]
    measured: dict[str, list[int]] = {label: [] for label in labels}
    finished: set[int] = set()
    for draw in range(draws):
        asyncio.run(_run_draw(db, draw, labels))
        for label, (items, prompt) in draw_totals(db, draw, labels).items():
            measured[label].append(prompt)
            finished.add(items)
    if len(finished) != 1 or 0 in finished:
        raise RuntimeError(
            f"the draws finished different numbers of work items per method: {sorted(finished)}"
        )
    estimate = estimate_sweep(config, samples=samples, reasoning_tokens=demo_reasoning_tokens())
    return summarize(estimate, measured), finished.pop()


def render_table(rows: Sequence[MethodCalibration]) -> str:
    draws = len(rows[0].measured) if rows else 0
    lines = [
        f"{draws} draws of the demo (draw 0 is the demo itself); prompt tokens over its four backbones",
        f"{'method':<22} {'estimate':>10} {'95% range':>21} {'draws mean ± se':>20} {'err vs mean':>11} "
        f"{'demo':>9} {'in range':>8} {'≤15%':>5}",
    ]
    for row in rows:
        span = "" if row.chance_range is None else f"{row.chance_range[0]:,}–{row.chance_range[1]:,}"
        lines.append(
            f"{row.method:<22} {row.expected:>10,} {span:>21} "
            f"{f'{row.mean:,.0f} ± {row.standard_error:,.0f}':>20} {row.error_against_mean:>+11.1%} "
            f"{row.measured[0]:>9,} {f'{row.inside_range}/{draws}':>8} {f'{row.within_15_percent}/{draws}':>5}"
        )
    return "\n".join(lines)
