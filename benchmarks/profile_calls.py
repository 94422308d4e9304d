"""Where rcarun's CPU goes per call: the bench's latency-bound scenario, rcarun's client, under a profiler.

Runs `rcarun bench throughput`'s latency-bound workload (6,400 calls, 64 in flight, 100 ms simulated latency,
the simulator in its own process) through rcarun's real runner once, in this process, as the bench's client
does (`rcarun_bench.client.measure`), and prints the CPU time per call and the profile. The CPU figure is of an
unprofiled run first (a profiler adds its own cost), then the profile of a second run. Usage:

    .venv/bin/python benchmarks/profile_calls.py                 # CPU/call, then pyinstrument's tree
    .venv/bin/python benchmarks/profile_calls.py --cprofile 25   # cProfile's 25 costliest functions (own time)
    .venv/bin/python benchmarks/profile_calls.py --no-profile    # CPU/call only
    .venv/bin/python benchmarks/profile_calls.py --calls 20000   # a longer run (start-up weighs less)
    .venv/bin/python benchmarks/profile_calls.py --pin           # the simulator on CPU 0, the client on CPU 1
    .venv/bin/python benchmarks/profile_calls.py --perf 12       # each thread's CPU by library (Linux perf)

pyinstrument (sampling, wall and CPU of the main thread) and cProfile (deterministic, every function) are both
available: pyinstrument shows where a call's path spends, cProfile which functions cost most by their own time.
Neither sees the store writer's thread; its share is the CPU figure minus the main thread's (printed too).
The unprofiled run also reports its CPU split into user and system time, and the garbage collector's CPU per
call and its collections (`gc.callbacks`).

``--perf N`` records the second run with Linux ``perf record`` (CPU-clock samples of this process alone, only
while the run lasts) and prints the N largest shares by thread and shared object: the interpreter
(libpython), the kernel, SQLite, orjson, aiohttp's C parts. It is the view with no bias toward system calls:
py-spy's default mode stops the process to read a sample, and a running process stops at its next entry into
the kernel, so its samples pile up on lines that make a system call (docs/performance.md, "CPU per call").
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import os
import pstats
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rcarun_bench.client import measure
from rcarun_bench.scenarios import Scenario, get_scenario
from rcarun_bench.throughput import scenario_server
from rcarun_bench.workload import write_dataset


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
    parser.add_argument(
        "--perf", type=int, metavar="N", default=0, help="Linux perf's N largest shares by thread and library"
    )
    args = parser.parse_args()
    if args.perf and shutil.which("perf") is None:
        raise SystemExit(
            "profile_calls.py: --perf needs Linux perf on PATH (Debian: apt-get install linux-perf)"
        )
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
                    thread_started, times_before = time.thread_time(), os.times()
                    try:
                        run = measure(scenario, "rcarun", server.base_url, dataset, workdir)
                    finally:
                        gc.callbacks.remove(collector)
                    main_thread_s = time.thread_time() - thread_started
                    times_after = os.times()
                    user_ms = (times_after.user - times_before.user) * 1000 / run.calls
                    system_ms = (times_after.system - times_before.system) * 1000 / run.calls
                    print(
                        f"{run.calls} calls, ratio {run.calls / run.wall_s / (scenario.concurrency / scenario.latency_s):.3f} "
                        f"of the ceiling over the whole run, CPU {run.cpu_s * 1000 / run.calls:.3f} ms/call "
                        f"(main thread {main_thread_s * 1000 / run.calls:.3f}; user {user_ms:.3f}, "
                        f"system {system_ms:.3f}), wall {run.wall_s:.1f} s; "
                        f"garbage collector {collector.cpu_s * 1e6 / run.calls:.1f} us/call in "
                        f"{sum(collector.collections)} collections (by generation {collector.collections})"
                    )
                    continue
                if args.perf:
                    print(
                        _perf_shares(
                            scenario, server.base_url, dataset, workdir, root / "perf.data", args.perf
                        )
                    )
                elif args.cprofile:
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
                            "profile_calls.py: pyinstrument is not installed (pip install -e './benchmarks[peers]'), "
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


# perf report's column separator: a tab, which no share, thread or library name holds.
_FIELDS = "\t"


def _perf_shares(
    scenario: Scenario, base_url: str, dataset: Path, workdir: Path, data: Path, top: int
) -> str:
    """One run under ``perf record`` (this process only, from just before the run to its end; threads started
    during the run are followed): the ``top`` largest shares of the samples by thread and shared object."""
    recorder = subprocess.Popen(
        [
            *("perf", "record", "--quiet", "-e", "cpu-clock", "-F", "2000"),
            *("-p", str(os.getpid()), "-o", str(data)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # perf attaches to every thread before the run starts
    if recorder.poll() is not None:
        _, error = recorder.communicate()
        raise SystemExit(f"profile_calls.py: perf record failed: {error.decode()[-300:]}")
    try:
        measure(scenario, "rcarun", base_url, dataset, workdir)
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait()
    report = subprocess.run(
        [
            *("perf", "report", "-i", str(data), "--stdio", "--no-children", "-g", "none"),
            *("--sort", "pid,dso", "--field-separator", _FIELDS),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return format_perf_shares(report, os.getpid(), top)


def format_perf_shares(report: str, main_tid: int, top: int) -> str:
    """``perf report --sort pid,dso --field-separator '\\t'``'s rows as a table, the main thread named (its thread
    id is the process's), largest first as perf sorts them, at most ``top`` rows."""
    lines = [f"perf: this process's CPU-clock samples over the run, by thread and library (largest {top})"]
    for row in report.splitlines():
        fields = row.split(_FIELDS)
        if row.startswith("#") or len(fields) != 3:
            continue
        share, thread, library = (field.strip() for field in fields)
        tid = thread.partition(":")[0]
        role = "main thread" if tid == str(main_tid) else f"thread {tid}"
        lines.append(f"  {share:>7}  {role:<12}  {library}")
        if len(lines) > top:
            break
    return "\n".join(lines)


if __name__ == "__main__":
    main()
