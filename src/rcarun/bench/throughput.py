"""`rcarun bench throughput`: rcarun's runner beside two plain-asyncio peers, on one simulator, in one command.

For each scenario the simulator is started once in its own process (so the server has a core of its own) and
every client runs the same workload against it in turn, each in a fresh subprocess (`rcarun.bench.client`) so
that CPU time and peak RSS belong to that client alone. The server's counters are reset before each client and
read after it: 429s and limit overshoot are what the server saw, not what a client says about itself.

Output: ``--json`` prints ``{"scenarios": [row, ...]}`` on stdout (one row per scenario × client, fields of
`rcarun.bench.metrics.ResultRow`); otherwise a table with, per scenario, rcarun's steady rate relative to the
faster peer. Progress goes to stderr.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rcarun.mock import MockProcess, MockStats

from .clients import CLIENTS
from .metrics import ClientRun, ResultRow, nominal_ceiling_rps
from .scenarios import Scenario, scenarios
from .workload import write_dataset

__all__ = ["CLIENT_ORDER", "format_table", "json_document", "result_row", "run_throughput"]

CLIENT_ORDER = ("rcarun", "naive-gather", "aiolimiter-loop")
_CLIENT_TIMEOUT_S = 300.0


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _run_client(
    scenario: Scenario, client: str, mock: MockProcess, dataset: Path, workdir: Path, quick: bool
) -> ClientRun:
    command = [
        sys.executable,
        "-m",
        "rcarun.bench.client",
        scenario.name,
        client,
        "--base-url",
        mock.base_url,
        "--dataset",
        str(dataset),
        "--workdir",
        str(workdir),
    ]
    if quick:
        command.append("--quick")
    env = dict(os.environ)
    # The child must import this very package, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    completed = subprocess.run(
        command,
        capture_output=True,
        env=env,
        timeout=_CLIENT_TIMEOUT_S,
        check=False,
    )
    if completed.returncode != 0:
        tail = completed.stderr.decode(errors="replace")[-4000:]
        raise RuntimeError(f"client {client} on {scenario.name} exited with {completed.returncode}:\n{tail}")
    lines = [line for line in completed.stdout.decode().splitlines() if line.strip()]
    return ClientRun.from_json(json.loads(lines[-1]))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc; NaN where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    # After the command name: state is field 3, utime and stime are fields 14 and 15 (in clock ticks).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def result_row(scenario: Scenario, client: str, run: ClientRun, stats: MockStats) -> ResultRow:
    """One report row from what the client measured and what the server counted."""
    window = run.window
    if scenario.tokens_per_s is not None:
        ceiling = nominal_ceiling_rps(scenario, window.mean_tokens) if window.calls else 0.0
    else:
        ceiling = nominal_ceiling_rps(scenario)
    overshoot = {
        "latency": max(stats.overshoot_requests, stats.overshoot_tokens),
        "requests": stats.overshoot_requests,
        "tokens": stats.overshoot_tokens,
    }[scenario.binding]
    return ResultRow(
        name=scenario.name,
        client=client,
        calls=run.calls,
        wall_s=round(run.wall_s, 3),
        achieved_rps=round(window.rps, 2),
        ceiling_rps=round(ceiling, 2),
        ratio=round(window.rps / ceiling, 4) if ceiling else 0.0,
        server_429=stats.rejected_429,
        server_max_overshoot=round(overshoot, 3),
        cpu_ms_per_call=round(run.cpu_s * 1000 / run.calls, 3) if run.calls else 0.0,
        peak_rss_mb=round(run.peak_rss_mb, 1),
        recorded_calls=run.recorded_calls,
    )


def run_throughput(
    quick: bool, clients: Sequence[str] = CLIENT_ORDER, names: Sequence[str] = ()
) -> list[ResultRow]:
    """Run every scenario (or those in ``names``) for every client in ``clients``."""
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        raise ValueError(f"unknown clients {unknown}; known: {sorted(CLIENTS)}")
    rows: list[ResultRow] = []
    with tempfile.TemporaryDirectory(prefix="rcarun-bench-") as tmp:
        root = Path(tmp)
        for scenario in scenarios(quick):
            if names and scenario.name not in names:
                continue
            dataset = write_dataset(scenario, root / scenario.name / "dataset")
            _progress(f"{scenario.name}: {scenario.calls} calls, concurrency {scenario.concurrency}")
            with MockProcess(scenario.mock_config()) as mock:
                for client in clients:
                    workdir = root / scenario.name / client
                    workdir.mkdir(parents=True)
                    mock.reset()
                    server_cpu_before = _cpu_s(mock.pid)
                    run = _run_client(scenario, client, mock, dataset, workdir, quick)
                    server_cpu_s = _cpu_s(mock.pid) - server_cpu_before
                    stats = mock.stats()
                    row = result_row(scenario, client, run, stats)
                    rows.append(row)
                    _progress(
                        f"  {client:<16} {row.achieved_rps:8.1f} req/s of {row.ceiling_rps:.1f} "
                        f"(ratio {row.ratio:.3f}), 429s {row.server_429}, {row.cpu_ms_per_call:.2f} ms CPU/call, "
                        f"wall {row.wall_s:.1f} s; server {server_cpu_s * 1000 / max(1, stats.requests_total):.2f} "
                        "ms CPU/request"
                        + (f", {run.failed} failed" if run.failed else "")
                        + (f", server accepted {stats.accepted}" if stats.accepted != run.calls else "")
                    )
    return rows


def json_document(rows: Sequence[ResultRow]) -> dict[str, Any]:
    """What ``--json`` prints: ``{"scenarios": [row, ...]}``."""
    return {"scenarios": [row.to_json() for row in rows]}


def format_table(rows: Sequence[ResultRow]) -> str:
    """The human-readable report: one line per client, and rcarun against the faster peer per scenario."""
    header = (
        f"{'scenario':<15} {'client':<16} {'calls':>6} {'wall s':>7} {'req/s':>8} {'ceiling':>8} {'ratio':>6} "
        f"{'429s':>6} {'overshoot':>9} {'CPU ms/call':>11} {'RSS MB':>7} {'recorded':>8}"
    )
    lines = [header, "-" * len(header)]
    for name in dict.fromkeys(row.name for row in rows):
        group = [row for row in rows if row.name == name]
        for row in group:
            lines.append(
                f"{row.name:<15} {row.client:<16} {row.calls:>6} {row.wall_s:>7.1f} {row.achieved_rps:>8.1f} "
                f"{row.ceiling_rps:>8.1f} {row.ratio:>6.3f} {row.server_429:>6} {row.server_max_overshoot:>9.1f} "
                f"{row.cpu_ms_per_call:>11.3f} {row.peak_rss_mb:>7.1f} {row.recorded_calls:>8}"
            )
        ours = next((row for row in group if row.client == "rcarun"), None)
        peers = [row for row in group if row.client != "rcarun"]
        if ours is not None and peers:
            best = max(peers, key=lambda row: row.achieved_rps)
            relative = ours.achieved_rps / best.achieved_rps if best.achieved_rps else float("inf")
            lines.append(f"{'':<15} rcarun / faster peer ({best.client}): {relative:.2f}x")
        lines.append("")
    return "\n".join(lines).rstrip()
