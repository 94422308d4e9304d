"""Performance benchmarks against rcarun's simulator: `rcarun bench throughput [--json] [--quick]`.

Timing claims belong here, not in timed tests (STYLE.md): the benchmark runs rcarun's real runner beside two
plain-asyncio peers on the same workload against the same simulator process and reports what the *server*
counted (429s, limit overshoot) beside what each client achieved, so that "as fast as the limits allow" is a
measured claim. Scenarios, ceilings and metrics are described in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from .metrics import ClientRun, Completion, ResultRow, steady_window
from .scenarios import SCENARIO_NAMES, Scenario, get_scenario, scenarios
from .throughput import CLIENT_ORDER, format_table, json_document, run_throughput

__all__ = [
    "CLIENT_ORDER",
    "SCENARIO_NAMES",
    "ClientRun",
    "Completion",
    "ResultRow",
    "Scenario",
    "format_table",
    "get_scenario",
    "json_document",
    "main",
    "run_throughput",
    "scenarios",
    "steady_window",
]


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rcarun bench``: ``args.suite`` ("throughput"), ``args.json`` and ``args.quick``."""
    if args.suite != "throughput":
        print(f"rcarun bench: unknown suite {args.suite!r} (known: throughput)", file=sys.stderr)
        return 2
    rows = run_throughput(quick=bool(args.quick))
    if args.json:
        print(json.dumps(json_document(rows), indent=2))
    else:
        print(format_table(rows))
    return 0
