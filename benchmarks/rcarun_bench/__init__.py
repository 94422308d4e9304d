"""Performance benchmarks: `rcarun bench throughput [--json|--markdown] [--quick]`.

Timing claims belong here, not in timed tests (STYLE.md): the benchmark runs rcarun's real runner beside its
peers on the same workload against the same server process (the simulator, or the bench's strict sliding-window
server) and reports what the *server* counted beside what each client achieved, so that "as fast as the limits
allow" is a measured claim. How it works: benchmarks/README.md; the figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from .clients import CLIENTS
from .metrics import ClientRun, Completion, ResultRow, steady_window
from .scenarios import SCENARIO_NAMES, Scenario, get_scenario, scenarios
from .throughput import (
    CLIENT_ORDER,
    format_markdown,
    format_table,
    json_document,
    run_throughput,
    skipped_clients,
)

__all__ = [
    "CLIENT_ORDER",
    "SCENARIO_NAMES",
    "ClientRun",
    "Completion",
    "ResultRow",
    "Scenario",
    "format_markdown",
    "format_table",
    "get_scenario",
    "json_document",
    "main",
    "run_throughput",
    "scenarios",
    "skipped_clients",
    "steady_window",
]


def main(args: argparse.Namespace) -> int:
    """Entry point of ``rcarun bench``: ``args.suite`` ("throughput"), ``args.json``, ``args.markdown``,
    ``args.quick``, ``args.scenario`` (names to run; all when empty), ``args.client`` (clients to run; rcarun
    and its peers when empty) and ``args.repeats`` (runs per client)."""
    if args.suite != "throughput":
        print(f"rcarun bench: unknown suite {args.suite!r} (known: throughput)", file=sys.stderr)
        return 2
    names = tuple(getattr(args, "scenario", None) or ())
    unknown = sorted(set(names) - {*SCENARIO_NAMES, "window"})
    if unknown:
        print(
            f"rcarun bench: unknown scenarios {unknown} (known: {', '.join(SCENARIO_NAMES)})", file=sys.stderr
        )
        return 2
    repeats = int(getattr(args, "repeats", 1) or 1)
    if repeats < 1:
        print(f"rcarun bench: --repeats must be at least 1, got {repeats}", file=sys.stderr)
        return 2
    clients = tuple(getattr(args, "client", None) or CLIENT_ORDER)
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        print(f"rcarun bench: unknown clients {unknown} (known: {', '.join(CLIENTS)})", file=sys.stderr)
        return 2
    rows = run_throughput(quick=bool(args.quick), clients=clients, names=names, repeats=repeats)
    skipped = skipped_clients(clients)
    if args.json:
        print(json.dumps(json_document(rows, skipped), indent=2))
    elif getattr(args, "markdown", False):
        print(format_markdown(rows))
    else:
        print(format_table(rows))
    if not args.json:
        for reason in skipped.values():
            print(f"skipped {reason}")
    return 0
