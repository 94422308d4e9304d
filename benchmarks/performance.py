"""Regenerate the measured part of docs/performance.md: the machine, its load, and the table of every scenario.

The benchmark's figures mean little without the machine they were taken on and how busy it was, so this script
prints them together, ready to paste over the "Measured" section of docs/performance.md:

    .venv/bin/python benchmarks/performance.py [--quick] [--repeats N] [--from-json FILE] [--json-out FILE]
    make bench   # the same, with --repeats 3

It runs `rcarun bench throughput` in-process (every scenario, every client: about 12 minutes for the simulator's
scenarios and over an hour more for the window-* ones; about 16 minutes with ``--quick``), or, with ``--from-json``, formats a saved ``rcarun bench throughput --json`` document. The
load average is read before and after the run; other work on the machine lowers every client's figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from rcarun_bench import ResultRow, format_markdown, json_document, run_throughput

_PACKAGES = ("rcarun", "aiohttp", "openai", "httpx", "aiolimiter", "litellm", "pydantic")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"') + f", Linux {platform.release()}"
    except OSError:
        pass
    return platform.platform()


def _load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def _versions() -> str:
    found = []
    for name in _PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smoke-test sizes (figures not comparable)")
    parser.add_argument(
        "--from-json", type=Path, help="format a saved `rcarun bench throughput --json` output"
    )
    parser.add_argument(
        "--json-out", type=Path, help="also save the rows, as `rcarun bench throughput --json` prints them"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="run every client N times per scenario in rotating order; report each one's median run",
    )
    args = parser.parse_args()
    load_before = _load()
    if args.from_json is not None:
        rows = [ResultRow(**row) for row in json.loads(args.from_json.read_text())["scenarios"]]
        load_after = "(not measured: formatted from a saved run)"
    else:
        rows = run_throughput(quick=args.quick, repeats=args.repeats)
        load_after = _load()
        if args.json_out is not None:
            args.json_out.write_text(json.dumps(json_document(rows), indent=2))
    command = (
        "rcarun bench throughput"
        + (" --quick" if args.quick else "")
        + (f" --repeats {args.repeats}" if args.repeats > 1 else "")
    )
    print(f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC with `{command}`.")
    print()
    print(f"- CPU: {_cpu_model()}, {os.cpu_count()} cores; RAM {_memory_gib()}; {_os_name()}")
    print(f"- Python {sys.version.split()[0]}; {_versions()}")
    print(f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}")
    print()
    print(format_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
