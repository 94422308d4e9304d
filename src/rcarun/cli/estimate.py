"""`rcarun estimate`: calls, tokens and USD per backbone × method before a sweep spends anything.

The work is `rcarun.runner.estimate` (a dry run of every method, no network); this module parses the flags,
builds the config and prints. With no ``--config`` it estimates the embedded demo: the demo's sweep config with
its simulated backbones' client settings (model, context window, prices) and a placeholder URL, since nothing
is sent. The demo's simulated models declare how long they think (``reasoning_tokens`` of each mock server),
so the demo estimate uses those as its expected reasoning tokens unless ``--reasoning-tokens`` is given; for a
real sweep rcarun cannot know it, and the default is 0.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rcarun.errors import ConfigError
from rcarun.runner import BackboneConfig, SweepConfig, load_sweep_config
from rcarun.runner.estimate import DEFAULT_SAMPLES, SweepEstimate, estimate_sweep

__all__ = ["add_estimate_command", "cmd_estimate", "demo_estimate_config", "demo_reasoning_tokens"]

# Never contacted: an estimate sends nothing, but a backbone config must name an endpoint.
_PLACEHOLDER_URL = "http://127.0.0.1:9/v1"


def demo_estimate_config() -> SweepConfig:
    """The embedded demo's sweep config without starting its simulators (placeholder URLs; nothing is sent)."""
    from rcarun.demo import demo_backbones, demo_sweep_config

    backbones = {
        backbone.name: BackboneConfig.model_validate(
            {"model": backbone.servers[0].model, "base_url": _PLACEHOLDER_URL, **backbone.client}
        )
        for backbone in demo_backbones()
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


def _reasoning(values: list[str]) -> dict[str, int]:
    parsed: dict[str, int] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not number.strip().isdigit():
            raise ConfigError(f"--reasoning-tokens expects BACKBONE=N, got {value!r}")
        parsed[name.strip()] = int(number)
    return parsed


def cmd_estimate(args: argparse.Namespace) -> int:
    reasoning = _reasoning(args.reasoning_tokens)
    if args.config is None:
        config = demo_estimate_config()
        reasoning = reasoning or demo_reasoning_tokens()
    else:
        config = load_sweep_config(Path(args.config))
    estimate = estimate_sweep(config, samples=args.samples, reasoning_tokens=reasoning)
    if args.json:
        print(
            json.dumps(
                {
                    "trajectories": estimate.trajectories,
                    "realizations": estimate.realizations,
                    "samples": estimate.samples,
                    "data_problems": estimate.data_problems,
                    "usd_expected": estimate.usd_expected,
                    "usd_worst": estimate.usd_worst,
                    "rows": [row.as_dict() for row in estimate.rows],
                },
                indent=2,
            )
        )
        return 0
    _print_table(estimate, demo=args.config is None)
    return 0


def _print_table(estimate: SweepEstimate, *, demo: bool) -> None:
    source = "the embedded demo" if demo else "the sweep"
    print(
        f"estimate for {source}: {estimate.trajectories} trajectories × {estimate.realizations} realizations, "
        f"{estimate.data_problems} data problems; mean of {estimate.samples} dry runs per item, nothing sent"
    )
    header = (
        f"{'backbone':<16} {'method':<16} {'traj':>5} {'calls exp/max':>15} {'prompt exp/worst':>23} "
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
            f"{row.backbone:<16} {row.method:<16} {row.trajectories:>5} {calls:>15} {prompt:>23} {output:>21} "
            f"{usd:>19} {row.usd_per_trajectory:>9.5f}{failed}"
        )
    print(f"total USD expected {estimate.usd_expected:.4f}, worst case {estimate.usd_worst:.4f}")
    print(
        "expected: answers' own tokens plus declared reasoning (--reasoning-tokens); worst: every call uses its "
        "whole budget and every length retry"
    )
