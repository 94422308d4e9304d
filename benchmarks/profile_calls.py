"""Where rcarun's CPU goes per call: the bench's latency-bound scenario, rcarun's client, under a profiler.

Runs `rcarun bench throughput`'s latency-bound workload (6,400 calls, 64 in flight, 100 ms simulated latency,
the simulator in its own process) through rcarun's real runner once, in this process, as the bench's client
does (`rcarun.bench.client.measure`), and prints the CPU time per call and the profile. The CPU figure is of an
unprofiled run first (a profiler adds its own cost), then the profile of a second run. Usage:

    .venv/bin/python benchmarks/profile_calls.py                 # CPU/call, then pyinstrument's tree
    .venv/bin/python benchmarks/profile_calls.py --cprofile 25   # cProfile's 25 costliest functions (own time)
    .venv/bin/python benchmarks/profile_calls.py --no-profile    # CPU/call only
    .venv/bin/python benchmarks/profile_calls.py --calls 20000   # a longer run (start-up weighs less)
    .venv/bin/python benchmarks/profile_calls.py --pin           # the simulator on CPU 0, the client on CPU 1

pyinstrument (sampling, wall and CPU of the main thread) and cProfile (deterministic, every function) are both
available: pyinstrument shows where a call's path spends, cProfile which functions cost most by their own time.
Neither sees the store writer's thread; its share is the CPU figure minus the main thread's (printed too).
The unprofiled run also reports the garbage collector's CPU per call and its collections (`gc.callbacks`).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import os
import pstats
import tempfile
import time
from pathlib import Path

from rcarun.bench.client import measure
from rcarun.bench.scenarios import get_scenario
from rcarun.bench.throughput import scenario_server
from rcarun.bench.workload import write_dataset


class _CollectorClock:
    """A `gc.callbacks` entry adding up the CPU time of the collections (the collecting thread's clock)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.cpu_s += time.thread_time() - self._started
            self.collections[info["generation"]] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=None, help="calls in the run (default: the scenario's)")
    parser.add_argument(
        "--cprofile", type=int, metavar="N", default=0, help="cProfile's N costliest functions"
    )
    parser.add_argument("--no-profile", action="store_true", help="only the CPU time per call")
    parser.add_argument("--pin", action="store_true", help="the server on CPU 0, this process on CPU 1")
    args = parser.parse_args()
    scenario = get_scenario("latency-bound", quick=False)
    if args.calls is not None:
        scenario = dataclasses.replace(scenario, calls=args.calls)
    with tempfile.TemporaryDirectory(prefix="rcarun-profile-") as tmp:
        root = Path(tmp)
        dataset = write_dataset(scenario, root / "dataset")
        with scenario_server(scenario) as server:
            if args.pin:
                # The server on one core, this client (main and writer threads) on the other: less noise.
                os.sched_setaffinity(server.pid, {0})
                os.sched_setaffinity(0, {1})
            for attempt in range(1 if args.no_profile else 2):
                workdir = root / f"run-{attempt}"
                workdir.mkdir()
                server.reset()
                if attempt == 0:
                    collector = _CollectorClock()
                    gc.callbacks.append(collector)
                    thread_started = time.thread_time()
                    try:
                        run = measure(scenario, "rcarun", server.base_url, dataset, workdir)
                    finally:
                        gc.callbacks.remove(collector)
                    main_thread_s = time.thread_time() - thread_started
                    print(
                        f"{run.calls} calls, ratio {run.calls / run.wall_s / (scenario.concurrency / scenario.latency_s):.3f} "
                        f"of the ceiling over the whole run, CPU {run.cpu_s * 1000 / run.calls:.3f} ms/call "
                        f"(main thread {main_thread_s * 1000 / run.calls:.3f}), wall {run.wall_s:.1f} s; "
                        f"garbage collector {collector.cpu_s * 1e6 / run.calls:.1f} us/call in "
                        f"{sum(collector.collections)} collections (by generation {collector.collections})"
                    )
                    continue
                if args.cprofile:
                    profile = cProfile.Profile()
                    profile.enable()
                    measure(scenario, "rcarun", server.base_url, dataset, workdir)
                    profile.disable()
                    out = io.StringIO()
                    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.cprofile)
                    print(out.getvalue())
                else:
                    try:
                        from pyinstrument import Profiler
                    except ImportError:
                        raise SystemExit(
                            "profile_calls.py: pyinstrument is not installed (pip install -e '.[bench]'), "
                            "or use --cprofile N"
                        ) from None

                    profiler = Profiler(interval=0.0005, async_mode="disabled")
                    profiler.start()
                    measure(scenario, "rcarun", server.base_url, dataset, workdir)
                    profiler.stop()
                    print(
                        profiler.output_text(
                            unicode=False, color=False, show_all=False, time="percent_of_total"
                        )
                    )


if __name__ == "__main__":
    main()
