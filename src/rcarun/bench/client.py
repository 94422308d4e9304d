"""One client's run in a process of its own, so that its CPU time and peak RSS are its own.

``python -m rcarun.bench.client SCENARIO CLIENT --base-url URL --dataset DIR --workdir DIR [--quick]`` runs the
client once and prints one JSON line (`rcarun.bench.metrics.ClientRun`) on stdout. CPU time is
``time.process_time`` (every thread of the process, so rcarun's store-writer thread counts) from just before the
run to just after; imports are outside that span for every client alike. Peak RSS is the process's high-water
mark (``ru_maxrss``), imports included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

from .clients import CLIENTS
from .metrics import ClientRun, allowance, steady_window
from .scenarios import SCENARIO_NAMES, get_scenario

__all__ = ["main", "measure"]


def measure(
    scenario_name: str, client: str, base_url: str, dataset: Path, workdir: Path, quick: bool
) -> ClientRun:
    """Run ``client`` on the scenario's workload and measure it (in this process)."""
    scenario = get_scenario(scenario_name, quick)
    runner = CLIENTS[client]
    cpu_started = time.process_time()
    started = time.perf_counter()
    outcome = asyncio.run(runner(scenario, dataset, base_url, workdir))
    wall_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    completions = outcome.completions
    window = steady_window(completions, allowance(scenario))
    # ru_maxrss is in KiB on Linux.
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return ClientRun(
        calls=len(completions),
        failed=outcome.failed,
        retries_429=outcome.retries_429,
        wall_s=wall_s,
        cpu_s=cpu_s,
        peak_rss_mb=peak_rss_mb,
        recorded_calls=outcome.recorded_calls,
        window_calls=window.calls,
        window_s=window.seconds,
        window_tokens=window.tokens,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rcarun.bench.client", description=__doc__)
    parser.add_argument("scenario", choices=SCENARIO_NAMES)
    parser.add_argument("client", choices=sorted(CLIENTS))
    parser.add_argument("--base-url", required=True, help="the simulator's OpenAI base URL (…/v1)")
    parser.add_argument("--dataset", required=True, type=Path, help="the scenario's dataset directory")
    parser.add_argument("--workdir", required=True, type=Path, help="a fresh directory for results.db")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    run = measure(args.scenario, args.client, args.base_url, args.dataset, args.workdir, args.quick)
    print(json.dumps(run.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
