"""`benchmarks/http_client_floor.py`, behind docs/performance.md's figure for what aiohttp costs a call: both
clients complete their posts against the bench's simulator and the script reports each round and the medians."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "http_client_floor.py"


def _floor(*args: str) -> list[str]:
    """The script's output lines; each client asserts a 200 for every post, so a refused or unread post fails."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


@pytest.mark.slow  # runs a benchmark in miniature: with the slow tests (make test), not make check
def test_both_clients_post_every_request_and_the_medians_are_reported() -> None:
    lines = _floor("--posts", "200", "--rounds", "2")
    rounds = [
        re.match(r"round (\d)  (aiohttp|bare protocol)\s+([\d.]+) ms of CPU a post$", line)
        for line in lines[:-1]
    ]
    assert [(m[1], m[2]) for m in rounds if m] == [
        ("1", "aiohttp"),
        ("1", "bare protocol"),
        ("2", "aiohttp"),
        ("2", "bare protocol"),
    ], lines
    assert all(float(m[3]) > 0 for m in rounds if m)
    medians = re.match(
        r"medians: aiohttp ([\d.]+), bare protocol ([\d.]+) ms a post; aiohttp costs (-?[\d.]+) ms a post more",
        lines[-1],
    )
    assert medians, lines[-1]
    aiohttp_ms, bare_ms, difference_ms = (float(medians[i]) for i in (1, 2, 3))
    assert (
        difference_ms == round(aiohttp_ms - bare_ms, 3)
        or abs(difference_ms - (aiohttp_ms - bare_ms)) < 0.0015
    )


@pytest.mark.slow  # runs a benchmark in miniature: with the slow tests (make test), not make check
def test_another_client_is_posted_beside_them_or_skipped_with_a_line_saying_why() -> None:
    name, module = "pyreqwest", "pyreqwest"
    installed = importlib.util.find_spec(module) is not None
    lines = _floor("--posts", "100", "--rounds", "1", "--client", name)
    if installed:
        assert re.match(rf"round 1  {name}\s+[\d.]+ ms of CPU a post$", lines[2]), lines
        assert re.match(rf"median: {name} [\d.]+ ms a post \([\d.]+ x aiohttp's\)$", lines[3]), lines
    else:
        assert lines[0] == f"skipped: {name}: {module} is not installed", lines
        assert [line.split()[2] for line in lines[1:3]] == ["aiohttp", "bare"], lines
    assert lines[-1].startswith("medians: aiohttp "), lines
