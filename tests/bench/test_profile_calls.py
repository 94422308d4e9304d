"""`benchmarks/profile_calls.py`, the script docs/performance.md's CPU-per-call figures come from: its CPU line
splits user from system time, and ``--perf`` gives each thread's CPU by library from Linux perf."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_calls.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("profile_calls", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--calls", "300", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _perf_works() -> bool:
    if shutil.which("perf") is None:
        return False
    probe = subprocess.run(
        ["perf", "stat", "-e", "cpu-clock", "true"], capture_output=True, timeout=30, check=False
    )
    return probe.returncode == 0


@pytest.mark.slow  # runs a benchmark in miniature: with the slow tests (make test), not make check
def test_the_cpu_line_splits_user_from_system_time() -> None:
    line = _run("--no-profile").splitlines()[0]
    found = re.search(
        r"CPU (?P<cpu>[\d.]+) ms/call \(main thread (?P<main>[\d.]+); user (?P<user>[\d.]+), "
        r"system (?P<system>[\d.]+)\)",
        line,
    )
    assert found, line
    cpu, main, user, system = (float(found[name]) for name in ("cpu", "main", "user", "system"))
    assert main > 0 and user > 0 and system >= 0
    # os.times spans the whole client run (its bookkeeping after the CPU figure's end too) in clock ticks: at
    # least the CPU figure, less the two ticks its rounding can lose, spread over the 300 calls.
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    assert user + system >= cpu - 2 * tick_ms / 300


def test_perf_report_rows_become_a_table_naming_the_main_thread() -> None:
    module = _load_script()
    report = (
        "# To display the perf.data header info, please use --header/--header-only options.\n"
        "#\n"
        "# Overhead\tPid:Command\tShared Object\n"
        "#\n"
        "    71.10%\t  4242:python\tlibpython3.11.so.1.0\n"
        "     7.54%\t  4242:python\t[kernel.kallsyms]\n"
        "     2.55%\t  4250:python\tlibsqlite3.so.0.8.6\n"
        "     1.55%\t  4242:python\torjson.cpython-311-x86_64-linux-gnu.so\n"
        "\n"
    )
    table = module.format_perf_shares(report, 4242, 3).splitlines()
    assert table[1:] == [
        "   71.10%  main thread   libpython3.11.so.1.0",
        "    7.54%  main thread   [kernel.kallsyms]",
        "    2.55%  thread 4250   libsqlite3.so.0.8.6",
    ]


@pytest.mark.slow  # runs a benchmark in miniature: with the slow tests (make test), not make check
@pytest.mark.skipif(not _perf_works(), reason="Linux perf is not installed or may not sample here")
def test_perf_gives_the_main_threads_cpu_by_library() -> None:
    out = _run("--perf", "8").splitlines()
    header = next(index for index, line in enumerate(out) if line.startswith("perf:"))
    rows = [
        re.match(r"\s*([\d.]+)%\s+(main thread|thread \d+)\s+(\S.*)$", line) for line in out[header + 1 :]
    ]
    assert rows and all(rows), out[header:]
    shares = [float(row[1]) for row in rows if row]
    assert len(shares) <= 8
    assert shares == sorted(shares, reverse=True)
    assert sum(shares) <= 100.01
    # The client is a Python program: its main thread's largest share is the interpreter (libpython, or the
    # python executable where the interpreter is linked into it).
    first = rows[0]
    assert first is not None and first[2] == "main thread" and "python" in first[3], out[header:]
