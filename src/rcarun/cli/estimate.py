"""`rcarun estimate`: calls, tokens and USD per backbone × method before a sweep spends anything.

The work is `rcarun.runner.estimate` (a dry run of every method, no network); this module parses the flags,
builds the config and prints. With no ``--config`` it estimates the embedded demo: the demo's sweep config with
its simulated backbones' client settings (model, context window, prices) and a placeholder URL, since nothing
is sent. The demo's simulated models declare how long they think (``reasoning_tokens`` of each mock server),
so the demo estimate uses those as its expected reasoning tokens unless ``--reasoning-tokens`` is given; for a
real sweep rcarun cannot know it, and the default is 0.

``--against DB`` sets the estimate beside what a finished run of the same sweep measured (`rcarun cost`'s sums,
shared requests charged to the first method in config order as the estimate charges them): per backbone ×
method and per method, the error of the expected figures and whether the measured prompt tokens fall inside
the estimate's 95% chance range. The database is opened read-only, as by `rcarun report`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcarun.cli.analysis import check_names, open_results
from rcarun.cli.output import survives_closed_stdout
from rcarun.errors import ConfigError, StoreError
from rcarun.runner import SweepConfig, load_sweep_config
from rcarun.runner.estimate import DEFAULT_SAMPLES, ChanceRange, EstimateRow, SweepEstimate, estimate_sweep

if TYPE_CHECKING:
    from rcarun.analysis import ChargedCost  # the analysis (numpy) loads only with `--against`

__all__ = [
    "Comparison",
    "add_estimate_command",
    "cmd_estimate",
    "demo_estimate_config",
    "demo_reasoning_tokens",
]

# Never contacted: an estimate sends nothing, but a backbone config must name an endpoint.
_PLACEHOLDER_URL = "http://127.0.0.1:9/v1"


def demo_estimate_config() -> SweepConfig:
    """The embedded demo's sweep config without starting its simulators (placeholder URLs; nothing is sent)."""
    from rcarun.demo import demo_backbones, demo_sweep_config

    backbones = {
        backbone.name: backbone.backbone_config((_PLACEHOLDER_URL,)) for backbone in demo_backbones()
    }
    return demo_sweep_config(backbones)


def demo_reasoning_tokens() -> dict[str, int]:
    """Reasoning tokens per call each demo backbone's simulated model is configured to produce."""
    from rcarun.demo import demo_backbones

    return {backbone.name: backbone.servers[0].reasoning_tokens for backbone in demo_backbones()}


def add_estimate_command(commands: Any) -> None:
    """Register ``estimate`` on the top-level subparsers."""
    estimate = commands.add_parser(
        "estimate", help="dry-run a sweep: calls, tokens and USD per backbone × method (no network)"
    )
    estimate.add_argument("--config", help="sweep TOML file (default: the embedded demo)")
    estimate.add_argument("--json", action="store_true", help="print the rows as JSON")
    estimate.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help=f"dry runs per item with different answer seeds (default {DEFAULT_SAMPLES})",
    )
    estimate.add_argument(
        "--reasoning-tokens",
        action="append",
        default=[],
        metavar="BACKBONE=N",
        help="expected reasoning tokens per call on a backbone (repeatable; default 0, the demo: its models')",
    )
    estimate.add_argument(
        "--against",
        metavar="DB",
        help="compare with what a finished run of this sweep measured in this results database",
    )
    estimate.add_argument("--run", help="with --against: the run (default: the most recently updated run)")


def _reasoning(values: list[str]) -> dict[str, int]:
    parsed: dict[str, int] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not number.strip().isdigit():
            raise ConfigError(f"--reasoning-tokens expects BACKBONE=N, got {value!r}")
        parsed[name.strip()] = int(number)
    return parsed


@survives_closed_stdout
def cmd_estimate(args: argparse.Namespace) -> int:
    reasoning = _reasoning(args.reasoning_tokens)
    if args.config is None:
        config = demo_estimate_config()
        reasoning = reasoning or demo_reasoning_tokens()
    else:
        config = load_sweep_config(Path(args.config))
    check_names("--reasoning-tokens", "backbone", reasoning, sorted(config.backbones), "the sweep")
    # The run is read first, so a wrong path fails before the dry runs.
    measured = _measured(Path(args.against), args.run, config) if args.against else None
    estimate = estimate_sweep(config, samples=args.samples, reasoning_tokens=reasoning)
    compared = None if measured is None else (measured[0], _compare(estimate, measured[1]))
    if args.json:
        document: dict[str, Any] = {
            "trajectories": estimate.trajectories,
            "realizations": estimate.realizations,
            "samples": estimate.samples,
            "data_problems": estimate.data_problems,
            "usd_expected": estimate.usd_expected,
            "usd_worst": estimate.usd_worst,
            "usd_range": estimate.usd_range,
            "method_ranges": {label: asdict(chance) for label, chance in estimate.method_ranges.items()},
            "rows": [row.as_dict() for row in estimate.rows],
        }
        if compared is not None:
            run, comparisons = compared
            document["against"] = {"run": run, "comparisons": [c.to_json() for c in comparisons]}
        print(json.dumps(document, indent=2))
        return 0
    _print_table(estimate, demo=args.config is None)
    if compared is not None:
        _print_comparison(*compared)
    return 0


def _measured(
    db: Path, run_name: str | None, config: SweepConfig
) -> tuple[str, dict[tuple[str, str], ChargedCost]]:
    """The run's paid tokens per backbone × method, shared requests charged in the config's method order."""
    if not db.is_file():
        raise StoreError(f"{db}: no such results database (run the sweep first)")
    from rcarun.analysis import charged_costs, resolve_run

    with open_results(db) as store:
        run = resolve_run(store, run_name)
        return run.name, charged_costs(store, run.run_id, [m.resolved_label for m in config.methods])


@dataclass(frozen=True, slots=True)
class Comparison:
    """One estimate set beside what the run measured: a backbone × method row, or a method over its backbones
    (``backbone`` None). Errors are (estimated − measured) / measured; ``items`` are the run's work items."""

    backbone: str | None
    method: str
    items_estimated: int
    items_measured: int
    prompt_estimated: int
    prompt_measured: int
    output_estimated: int
    output_measured: int
    usd_estimated: float
    usd_measured: float
    prompt_range: tuple[int, int] | None

    def to_json(self) -> dict[str, Any]:
        errors = {
            "prompt_error": self.prompt_error,
            "output_error": self.output_error,
            "usd_error": self.usd_error,
        }
        return {**asdict(self), **errors, "in_range": self.in_range}

    @property
    def prompt_error(self) -> float | None:
        return _error(self.prompt_estimated, self.prompt_measured)

    @property
    def output_error(self) -> float | None:
        return _error(self.output_estimated, self.output_measured)

    @property
    def usd_error(self) -> float | None:
        return _error(self.usd_estimated, self.usd_measured)

    @property
    def in_range(self) -> bool | None:
        """Whether the measured prompt tokens fall inside the estimate's 95% chance range; None when there is
        none or it is one point (the answers do not change the calls: the error is the token model's)."""
        if self.prompt_range is None or self.prompt_range[0] == self.prompt_range[1]:
            return None
        low, high = self.prompt_range
        return low <= self.prompt_measured <= high


def _error(estimated: float, measured: float) -> float | None:
    """(estimated − measured) / measured; None when nothing was measured (no ratio to give: JSON has no inf)."""
    return (estimated - measured) / measured if measured else None


def _percent(error: float | None, width: int) -> str:
    return f"{'—':>{width}}" if error is None else f"{error:>+{width}.1%}"


def _compare(estimate: SweepEstimate, measured: dict[tuple[str, str], ChargedCost]) -> list[Comparison]:
    """Each row, then each method over its backbones (a method's range is drawn jointly over them)."""
    from rcarun.analysis import ChargedCost

    nothing = ChargedCost("", "", 0, 0, 0, 0, 0.0)

    def comparison(
        backbone: str | None, method: str, rows: list[EstimateRow], chance: ChanceRange | None
    ) -> Comparison:
        runs = [measured.get((row.backbone, row.method), nothing) for row in rows]
        return Comparison(
            backbone=backbone,
            method=method,
            items_estimated=sum(row.trajectories * row.realizations for row in rows),
            items_measured=sum(run.items for run in runs),
            prompt_estimated=sum(row.prompt_tokens_expected for row in rows),
            prompt_measured=sum(run.prompt_tokens for run in runs),
            output_estimated=sum(row.output_tokens_expected for row in rows),
            output_measured=sum(run.completion_tokens for run in runs),
            usd_estimated=sum(row.usd_expected for row in rows),
            usd_measured=sum(run.cost_usd for run in runs),
            prompt_range=None if chance is None else chance.prompt_tokens,
        )

    result = [comparison(row.backbone, row.method, [row], row.chance_range) for row in estimate.rows]
    for method in dict.fromkeys(row.method for row in estimate.rows):
        rows = [row for row in estimate.rows if row.method == method]
        result.append(comparison(None, method, rows, estimate.method_ranges.get(method)))
    return result


def _print_table(estimate: SweepEstimate, *, demo: bool) -> None:
    source = "the embedded demo" if demo else "the sweep"
    print(
        f"estimate for {source}: {estimate.trajectories} trajectories × {estimate.realizations} realizations, "
        f"{estimate.data_problems} data problems; mean of {estimate.samples} dry runs per item, nothing sent"
    )
    header = (
        f"{'backbone':<16} {'method':<20} {'traj':>5} {'calls exp/max':>15} {'prompt exp/worst':>23} "
        f"{'output exp/worst':>21} {'USD exp/worst':>19} {'USD/traj':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in estimate.rows:
        calls = f"{row.calls_expected:,.0f}/{row.calls_max:,}"
        prompt = f"{row.prompt_tokens_expected:,}/{row.prompt_tokens_worst:,}"
        output = f"{row.output_tokens_expected:,}/{row.output_tokens_worst:,}"
        usd = f"{row.usd_expected:.4f}/{row.usd_worst:.4f}"
        failed = f"  ({row.failed_items:g} items fail)" if row.failed_items else ""
        print(
            f"{row.backbone:<16} {row.method:<20} {row.trajectories:>5} {calls:>15} {prompt:>23} {output:>21} "
            f"{usd:>19} {row.usd_per_trajectory:>9.5f}{failed}"
        )
    chancy = [row for row in estimate.rows if row.chance_range and _spread(row.chance_range)]
    if chancy:
        print(
            "\nwhere the answers decide how many calls are made, one sweep lands within (95% of resampled sweeps, "
            "realizations repeating a draw):"
        )
        for row in chancy:
            print(f"{row.backbone:<16} {row.method:<20} {_range_text(row.chance_range)}")
        for method, chance in estimate.method_ranges.items():
            if _spread(chance):
                print(f"{'all backbones':<16} {method:<20} {_range_text(chance)}")
    # Per method over its backbones: the rows' dry runs are independent, so their variances add.
    uncertain = []
    for method in dict.fromkeys(row.method for row in estimate.rows):
        rows = [row for row in estimate.rows if row.method == method]
        expected = sum(row.prompt_tokens_expected for row in rows)
        se = math.sqrt(sum((row.prompt_tokens_expected_se or 0.0) ** 2 for row in rows))
        if expected and se > 0.05 * expected:
            uncertain.append((method, expected, se))
    if uncertain:
        print(
            f"\nexpected figures still uncertain as means of {estimate.samples} dry runs "
            "(one standard error; --samples narrows it):"
        )
        for method, expected, se in uncertain:
            print(f"{'all backbones':<16} {method:<20} prompt {expected:,} ± {se:,.0f} ({se / expected:.1%})")
    spread = (
        f" (95%: {estimate.usd_range[0]:.4f}–{estimate.usd_range[1]:.4f})"
        if estimate.usd_range and estimate.usd_range[0] != estimate.usd_range[1]
        else ""
    )
    print(f"total USD expected {estimate.usd_expected:.4f}{spread}, worst case {estimate.usd_worst:.4f}")
    print(
        "expected: answers' own tokens plus declared reasoning (--reasoning-tokens); worst: every call uses its "
        "whole budget and every length retry"
    )


def _spread(chance: ChanceRange) -> bool:
    return chance.prompt_tokens[0] != chance.prompt_tokens[1]


def _range_text(chance: ChanceRange | None) -> str:
    if chance is None:
        return ""
    (prompt_low, prompt_high), (output_low, output_high) = chance.prompt_tokens, chance.output_tokens
    usd_low, usd_high = chance.usd
    return (
        f"prompt {prompt_low:,}–{prompt_high:,}  output {output_low:,}–{output_high:,}  "
        f"USD {usd_low:.4f}–{usd_high:.4f}"
    )


def _print_comparison(run: str, comparisons: list[Comparison]) -> None:
    print(
        f"\nagainst run {run!r} (measured: paid attempts, a request methods shared charged to the first in config "
        "order); error = (estimate − measured) / measured"
    )
    header = (
        f"{'backbone':<16} {'method':<20} {'items est/run':>13} {'prompt est':>11} {'measured':>11} {'err':>7} "
        f"{'in 95%':>6} {'output err':>10} {'USD err':>8}"
    )
    print(header)
    print("-" * len(header))
    for index, c in enumerate(comparisons):
        if c.backbone is None and (index == 0 or comparisons[index - 1].backbone is not None):
            print("per method, over the backbones:")
        inside = {None: "—", True: "yes", False: "NO"}[c.in_range]
        print(
            f"{c.backbone or '':<16} {c.method:<20} {f'{c.items_estimated}/{c.items_measured}':>13} "
            f"{c.prompt_estimated:>11,} {c.prompt_measured:>11,} {_percent(c.prompt_error, 7)} {inside:>6} "
            f"{_percent(c.output_error, 10)} {_percent(c.usd_error, 8)}"
        )
    partial = [c for c in comparisons if c.backbone is not None and c.items_measured != c.items_estimated]
    if partial:
        print(
            f"{len(partial)} rows: the run holds other work items than the estimate covers (a partial run or "
            "another config); their errors compare different sweeps"
        )
