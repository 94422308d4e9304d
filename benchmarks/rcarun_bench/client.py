"""One client's run in a process of its own, so that its CPU time and peak RSS are its own.

``python -m rcarun_bench.client SCENARIO_JSON CLIENT --base-url URL --dataset DIR --workdir DIR`` runs the
client once and prints one JSON line (`rcarun_bench.metrics.ClientRun`) on stdout. CPU time is
``time.process_time`` (every thread of the process, so rcarun's store-writer thread counts) from just before the
run to just after (rcarun's: to the end of its sweep, before its calls are read back for the figures). A peer's
optional package (`rcarun_bench.clients.OPTIONAL_PACKAGES`: litellm takes seconds to import) is imported before
that span; the modules a client imports inside its run function (openai for naive-gather, rcarun's runner for
rcarun) are inside it. Every client runs on asyncio's loop (`asyncio.run`), as `rcarun sweep` does. Peak RSS
is the process's high-water mark (``VmHWM``), imports included, read when the client's own work ends (rcarun's
before its calls are read back from results.db for the figures). Event-loop lag is measured in the same loop as
the client's work: a task sleeps `_LAG_PERIOD_S` at a time and records how much later than asked it woke up,
for the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from .clients import CLIENTS, import_optional_packages
from .metrics import (
    ClientRun,
    allowance,
    delay_ratio,
    lag_summary,
    peak_rss_mb_now,
    steady_window,
    storm_figures,
)
from .scenarios import Scenario

_T = TypeVar("_T")
_LAG_PERIOD_S = 0.01


async def _with_lag_probe(work: Coroutine[Any, Any, _T], lateness: list[float]) -> _T:
    """Run ``work`` while a periodic timer in the same loop notes how late it fires (seconds)."""
    loop = asyncio.get_running_loop()

    async def probe() -> None:
        while True:
            due = loop.time() + _LAG_PERIOD_S
            await asyncio.sleep(_LAG_PERIOD_S)
            lateness.append(max(0.0, loop.time() - due))

    prober = asyncio.create_task(probe())
    try:
        return await work
    finally:
        prober.cancel()


__all__ = ["main", "measure"]


def measure(scenario: Scenario, client: str, base_url: str, dataset: Path, workdir: Path) -> ClientRun:
    """Run ``client`` on the scenario's workload and measure it (in this process)."""
    runner = CLIENTS[client]
    cpu_started = time.process_time()
    started = time.perf_counter()
    lateness: list[float] = []
    work = _with_lag_probe(runner(scenario, dataset, base_url, workdir), lateness)
    outcome = asyncio.run(work)
    wall_s = time.perf_counter() - started
    cpu_s = (outcome.cpu_done_s if outcome.cpu_done_s is not None else time.process_time()) - cpu_started
    completions = outcome.completions
    window = steady_window(completions, allowance(scenario))
    storm = storm_figures(outcome.attempts, scenario.settle_after_s)
    ratio, top_delay_s, median_delay_s = delay_ratio(outcome.delays)
    lag = lag_summary(lateness)
    peak_rss_mb = outcome.peak_rss_mb if outcome.peak_rss_mb is not None else peak_rss_mb_now()
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
        window_unused=window.unused,
        window_slope_rps=window.slope_rps,
        items=outcome.items,
        succeeded=outcome.succeeded,
        wasted_tokens=outcome.wasted_tokens,
        cost_usd=outcome.cost_usd,
        late_429_per_request=storm.late_429_per_request,
        settle_s=storm.settle_s,
        delay_ratio=ratio,
        top_decile_delay_ms=top_delay_s * 1000,
        median_delay_ms=median_delay_s * 1000,
        lag_p50_ms=lag.p50_ms,
        lag_p99_ms=lag.p99_ms,
        lag_max_ms=lag.max_ms,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rcarun_bench.client", description=__doc__)
    parser.add_argument("scenario", help="the scenario as JSON (`Scenario.to_json`)")
    parser.add_argument("client", choices=sorted(CLIENTS))
    parser.add_argument("--base-url", required=True, help="the simulator's OpenAI base URL (…/v1)")
    parser.add_argument("--dataset", required=True, type=Path, help="the scenario's dataset directory")
    parser.add_argument("--workdir", required=True, type=Path, help="a fresh directory for results.db")
    args = parser.parse_args(argv)
    scenario = Scenario.from_json(args.scenario)
    import_optional_packages(args.client)
    run = measure(scenario, args.client, args.base_url, args.dataset, args.workdir)
    print(json.dumps(run.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
