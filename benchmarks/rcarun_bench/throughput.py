"""`rcarun bench throughput`: rcarun's runner beside its peers, on one server per scenario, in one command.

For each scenario its server — the simulator, or for the window scenarios the bench's strict sliding-window
server (`rcarun_bench.window_server`) — is started once in its own process (so the server has a core of its
own) and every client runs the same workload against it in turn, each in a fresh subprocess
(`rcarun_bench.client`) so that CPU time and peak RSS belong to that client alone. The server's counters are
reset before each client and read after it: 429s and limit overshoot are what the server saw, not what a client
says about itself; against the window server every figure of the headline comes from its log of arrivals.
A peer whose package is not installed (`rcarun_bench.clients.unavailable_reason`) is skipped with a one-line
reason.

Output: ``--json`` prints ``{"scenarios": [row, ...], "skipped_clients": {client: reason}}`` on stdout (one row
per scenario × client, fields of `rcarun_bench.metrics.ResultRow`); ``--markdown`` prints the one table of
docs/performance.md; otherwise a text table with, per scenario, rcarun's ratio to the ceiling relative to the
best peer's, and its CPU per call relative to the leanest peer's. Progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from rcarun.mock import MockProcess, MockStats
from rcarun.mock.process import child_environment

from .clients import CLIENTS, PRICES, RCARUN_CLIENTS, unavailable_reason
from .metrics import (
    ClientRun,
    ResultRow,
    WindowFigures,
    allowance,
    allowance_used,
    nominal_ceiling_rps,
    window_figures,
)
from .scenarios import Scenario, scenarios
from .window_server import WindowServerProcess
from .workload import write_dataset

__all__ = [
    "CLIENT_ORDER",
    "format_markdown",
    "format_table",
    "headline",
    "json_document",
    "result_row",
    "run_scenarios",
    "run_throughput",
    "scenario_server",
    "skipped_clients",
]

CLIENT_ORDER = ("rcarun", "rcarun-unstreamed", "naive-gather", "aiolimiter-loop", "litellm-router")
_CLIENT_TIMEOUT_S = 300.0
# Against the window server a client that stalls for a window at a time may take several windows.
_WINDOW_TIMEOUT_WINDOWS = 10
# A CPU burner: a loop that never waits.
_SPIN = "while True:\n    pass\n"


class _Server(Protocol):
    """What the bench needs of a server process: the simulator's `MockProcess` or a `WindowServerProcess`."""

    @property
    def base_url(self) -> str: ...

    @property
    def pid(self) -> int: ...

    def reset(self) -> None: ...

    def stats(self) -> MockStats: ...

    def __enter__(self) -> _Server: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


def scenario_server(scenario: Scenario) -> _Server:
    """The scenario's server, not yet started: use it as a context manager (it runs in a process of its own)."""
    if scenario.server == "window":
        return WindowServerProcess(scenario.window_config())
    return MockProcess(scenario.mock_config())


def skipped_clients(clients: Sequence[str] = CLIENT_ORDER) -> dict[str, str]:
    """The clients that cannot run here, each with its one-line reason (their package is not installed)."""
    reasons = {client: unavailable_reason(client) for client in clients}
    return {client: reason for client, reason in reasons.items() if reason is not None}


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _run_client(scenario: Scenario, client: str, mock: _Server, dataset: Path, workdir: Path) -> ClientRun:
    command = [
        sys.executable,
        "-m",
        "rcarun_bench.client",
        scenario.to_json(),
        client,
        "--base-url",
        mock.base_url,
        "--dataset",
        str(dataset),
        "--workdir",
        str(workdir),
    ]
    # The child must import this very code, installed or not.
    env = child_environment([str(Path(__file__).resolve().parents[1])])
    timeout_s = _CLIENT_TIMEOUT_S
    if scenario.server == "window":
        timeout_s = max(timeout_s, _WINDOW_TIMEOUT_WINDOWS * scenario.window_s)
    completed = subprocess.run(command, capture_output=True, env=env, timeout=timeout_s, check=False)
    if completed.returncode != 0:
        tail = completed.stderr.decode(errors="replace")[-4000:]
        raise RuntimeError(f"client {client} on {scenario.name} exited with {completed.returncode}:\n{tail}")
    lines = [line for line in completed.stdout.decode().splitlines() if line.strip()]
    return ClientRun.from_json(json.loads(lines[-1]))


@contextlib.contextmanager
def _cpu_burners(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU (pure Python, never sleeping) while the block runs."""
    burners = [
        subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc; NaN where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    # After the command name: state is field 3, utime and stime are fields 14 and 15 (in clock ticks).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def result_row(
    scenario: Scenario,
    client: str,
    run: ClientRun,
    stats: MockStats,
    figures: WindowFigures | None = None,
) -> ResultRow:
    """One report row from what the client measured and what the server counted (with ``figures`` from the
    window server's log in a window scenario)."""
    window = run.window
    if figures is not None:
        # Against the window server: the server's goodput, and the mean tokens it metered per acceptance.
        mean_tokens = figures.mean_tokens
        ceiling = nominal_ceiling_rps(scenario, mean_tokens) if mean_tokens or not scenario.tpm else 0.0
        ratio = figures.goodput
    else:
        if scenario.tokens_per_s is not None:
            ceiling = nominal_ceiling_rps(scenario, window.mean_tokens) if window.calls else 0.0
        else:
            ceiling = nominal_ceiling_rps(scenario)
        # Under a binding limit, the level-corrected rate; otherwise the completions' slope (`metrics`).
        used = allowance_used(window, allowance(scenario))
        sloped = window.slope_rps / ceiling if ceiling else 0.0
        ratio = used if used is not None else sloped
    overshoot = {
        "latency": max(stats.overshoot_requests, stats.overshoot_tokens),
        "slots": max(stats.overshoot_requests, stats.overshoot_tokens),
        "requests": stats.overshoot_requests,
        "tokens": stats.overshoot_tokens,
    }[scenario.binding]
    return ResultRow(
        name=scenario.name,
        client=client,
        calls=run.calls,
        wall_s=round(run.wall_s, 3),
        achieved_rps=round(ratio * ceiling, 2),
        window_rps=round(window.rps, 2),
        ceiling_rps=round(ceiling, 2),
        ratio=round(ratio, 4),
        ratio_min=round(ratio, 4),
        ratio_max=round(ratio, 4),
        server_429=stats.rejected_429,
        server_max_overshoot=round(overshoot, 3),
        cpu_ms_per_call=round(run.cpu_s * 1000 / run.calls, 3) if run.calls else 0.0,
        peak_rss_mb=round(run.peak_rss_mb, 1),
        recorded_calls=run.recorded_calls,
        items=run.items,
        success_rate=round(run.succeeded / run.items, 4) if run.items else 0.0,
        late_429_per_request=round(run.late_429_per_request, 4),
        settle_s=None if run.settle_s is None else round(run.settle_s, 2),
        wasted_tokens=run.wasted_tokens,
        cost_usd=round(run.cost_usd, 6),
        server_cost_usd=round(
            PRICES.cost_usd(stats.accepted_prompt_tokens, stats.accepted_completion_tokens), 6
        ),
        delay_ratio=None if run.delay_ratio is None else round(run.delay_ratio, 3),
        top_decile_delay_ms=round(run.top_decile_delay_ms, 2),
        median_delay_ms=round(run.median_delay_ms, 2),
        lag_p50_ms=round(run.lag_p50_ms, 2),
        lag_p99_ms=round(run.lag_p99_ms, 2),
        lag_max_ms=round(run.lag_max_ms, 2),
        server_max_generating=stats.max_generating,
        server_max_in_flight=stats.max_in_flight,
        server_accepted=stats.accepted,
        server_length_stops=stats.length_stops,
        client_429=run.retries_429,
        server_503=stats.errors_5xx if figures is not None else 0,
        server_completion_tokens=stats.accepted_completion_tokens,
        cpu_us_per_completion_token=round(run.cpu_s * 1e6 / stats.accepted_completion_tokens, 3)
        if stats.accepted_completion_tokens
        else None,
        **_window_fields(figures),
    )


def _window_fields(figures: WindowFigures | None) -> dict[str, Any]:
    if figures is None:
        return {}
    return {
        "first_refusal_s": None if figures.first_refusal_s is None else round(figures.first_refusal_s, 2),
        "refused_early": figures.refused_early,
        "refused_late": figures.refused_late,
        "late_refused_share": round(figures.late_refused_share, 4),
        "recovery_s": None if figures.recovery_s is None else round(figures.recovery_s, 2),
        "last_arrival_s": round(figures.last_arrival_s, 2),
    }


def run_throughput(
    quick: bool, clients: Sequence[str] = CLIENT_ORDER, names: Sequence[str] = (), repeats: int = 1
) -> list[ResultRow]:
    """Run the simulator's scenarios (or those in ``names``; ``"window"`` names every window-server scenario) for
    every client in ``clients``, ``repeats`` times each. The window scenarios are left out by default: at full
    size they take over an hour, each of their runs holding two minutes of a provider's minute."""
    chosen = [
        scenario
        for scenario in scenarios(quick)
        if (scenario.name in names or ("window" in names and scenario.server == "window"))
        or (not names and scenario.server == "simulator")
    ]
    return run_scenarios(chosen, clients, repeats)


def round_order(clients: Sequence[str], round_index: int) -> list[str]:
    """The clients' order in one round: rotated by the round's number, so that over as many rounds as there are
    clients each client runs once in every position (first, while the machine is freshest, and last)."""
    shift = round_index % len(clients) if clients else 0
    return [*clients[shift:], *clients[:shift]]


def median_rows(runs: Sequence[ResultRow]) -> ResultRow:
    """One client's repeated runs of one scenario as one row: the run with the median ratio (the lower of the
    two middle ones for an even count), its spread in ``ratio_min`` / ``ratio_max`` and the count in ``runs``."""
    if not runs:
        raise ValueError("no runs to summarise")
    ordered = sorted(runs, key=lambda row: row.ratio)
    middle = ordered[(len(ordered) - 1) // 2]
    return dataclasses.replace(
        middle, runs=len(ordered), ratio_min=ordered[0].ratio, ratio_max=ordered[-1].ratio
    )


def run_scenarios(
    chosen: Sequence[Scenario], clients: Sequence[str] = CLIENT_ORDER, repeats: int = 1
) -> list[ResultRow]:
    """Run the given scenarios (resized ones included, as the tests do) for every client in ``clients``.

    With ``repeats`` above 1 every client runs each scenario that many times (large-scale once), in rounds
    whose order rotates (`round_order`), and is reported by its median run (`median_rows`). Clients run one
    after another, so a single round hands each a slightly different machine; the rotation spreads that over
    all of them.
    """
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        raise ValueError(f"unknown clients {unknown}; known: {sorted(CLIENTS)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rows: list[ResultRow] = []
    skipped = skipped_clients(clients)
    for reason in skipped.values():
        _progress(f"skipping {reason}")
    with tempfile.TemporaryDirectory(prefix="rcarun-bench-") as tmp:
        root = Path(tmp)
        for scenario in chosen:
            dataset = write_dataset(scenario, root / scenario.name / "dataset")
            _progress(f"{scenario.name}: {scenario.calls} items, concurrency {scenario.concurrency}")
            taking_part = [c for c in clients if c not in scenario.skip_clients and c not in skipped]
            runs: dict[str, list[ResultRow]] = {client: [] for client in taking_part}
            # large-scale is about memory and loop lag, not a race, and takes minutes a run: once is enough.
            rounds = 1 if scenario.headline == "scale" else repeats
            with scenario_server(scenario) as mock:
                for round_index in range(rounds):
                    for client in round_order(taking_part, round_index):
                        workdir = root / scenario.name / f"{client}-{round_index}"
                        workdir.mkdir(parents=True)
                        runs[client].append(_measured_row(scenario, client, mock, dataset, workdir))
            rows.extend(median_rows(runs[client]) for client in taking_part)
    return rows


def _measured_row(scenario: Scenario, client: str, mock: _Server, dataset: Path, workdir: Path) -> ResultRow:
    mock.reset()
    server_cpu_before = _cpu_s(mock.pid)
    with _cpu_burners(scenario.cpu_burners):
        run = _run_client(scenario, client, mock, dataset, workdir)
    server_cpu_s = _cpu_s(mock.pid) - server_cpu_before
    stats = mock.stats()
    figures = None
    if isinstance(mock, WindowServerProcess):
        config = mock.config
        by_tokens = scenario.binding == "tokens"
        limit = config.tokens_per_window if by_tokens else config.requests_per_window
        assert limit is not None, "a window scenario binds by a limit its server enforces"
        figures = window_figures(
            mock.arrivals(), limit_per_window=limit, window_s=config.window_s, by_tokens=by_tokens
        )
    row = result_row(scenario, client, run, stats, figures)
    _progress(
        f"  {client:<16} {row.achieved_rps:8.1f} req/s of {row.ceiling_rps:.1f} "
        f"(ratio {row.ratio:.3f}), 429s {row.server_429}"
        + (f", 503s {row.server_503}" if row.server_503 else "")
        + f", {row.cpu_ms_per_call:.2f} ms CPU/call, "
        f"wall {row.wall_s:.1f} s; server {server_cpu_s * 1000 / max(1, stats.requests_total):.2f} "
        "ms CPU/request"
        + (f", {run.failed} failed" if run.failed else "")
        + (f", server accepted {stats.accepted}" if stats.accepted != run.calls else "")
    )
    return row


def json_document(rows: Sequence[ResultRow], skipped: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``--json`` prints: ``{"scenarios": [row, ...], "skipped_clients": {client: reason}}``."""
    return {"scenarios": [row.to_json() for row in rows], "skipped_clients": dict(skipped or {})}


def headline(row: ResultRow) -> str:
    """The figures a row's scenario exists for, in words (empty for the plain throughput scenarios)."""
    kind = {scenario.name: scenario.headline for scenario in scenarios(quick=False)}.get(row.name)
    if kind == "storm":
        settle = "never" if row.settle_s is None else f"{row.settle_s:.1f} s"
        return f"429s/request after warm-up {row.late_429_per_request:.3f}; settled {settle}"
    if kind == "length":
        error = row.cost_usd / row.server_cost_usd - 1 if row.server_cost_usd else 0.0
        return (
            f"success {row.success_rate:.1%}; wasted {row.wasted_tokens:,} tok; "
            f"cost ${row.cost_usd:.4f} vs server ${row.server_cost_usd:.4f} ({error:+.1%})"
        )
    if kind == "fairness":
        ratio = "n/a" if row.delay_ratio is None else f"{row.delay_ratio:.2f}"
        return (
            f"delay top decile / median {ratio} "
            f"({row.top_decile_delay_ms:.0f} / {row.median_delay_ms:.0f} ms)"
        )
    if kind == "window":
        recovery = "n/a" if row.recovery_s is None else f"{row.recovery_s:.1f} s"
        first = "none" if row.first_refusal_s is None else f"first at {row.first_refusal_s:.1f} s"
        return (
            f"refusals {row.server_429 + row.server_503} ({first}; {row.refused_early} within W/2 of it, "
            f"{row.refused_late} after = {row.late_refused_share:.1%}); back to 0.95 after {recovery}"
        )
    if kind == "scale":
        return (
            f"{row.items:,} items; peak RSS {row.peak_rss_mb:.0f} MB; loop lag p50/p99/max "
            f"{row.lag_p50_ms:.1f}/{row.lag_p99_ms:.1f}/{row.lag_max_ms:.0f} ms"
        )
    return ""


def _is_peer(client: str) -> bool:
    """Whether ``client`` is one of the tools rcarun is compared with (rcarun run another way is not)."""
    return client not in RCARUN_CLIENTS


def _best_peer(group: Sequence[ResultRow]) -> tuple[ResultRow | None, ResultRow | None]:
    ours = next((row for row in group if row.client == "rcarun"), None)
    peers = [row for row in group if _is_peer(row.client)]
    # By ratio, not req/s: in token-limited scenarios each window holds different calls with different sizes.
    return ours, max(peers, key=lambda row: row.ratio) if peers else None


def _leanest_peer(group: Sequence[ResultRow]) -> ResultRow | None:
    """The peer that spent the least CPU per call (of those that completed any call)."""
    peers = [row for row in group if _is_peer(row.client) and row.calls > 0 and row.cpu_ms_per_call > 0]
    return min(peers, key=lambda row: row.cpu_ms_per_call) if peers else None


def _cpu_over_leanest(row: ResultRow, leanest: ResultRow | None) -> float | None:
    """``row``'s CPU per call over the leanest peer's; None without a peer, or for a client that completed nothing.

    CPU per call moves with the machine's spell (every client's rose by a tenth to a half between spells of one day
    here); this ratio, against a peer of the same rounds, moves far less (docs/performance.md).
    """
    if leanest is None or row.calls == 0:
        return None
    return row.cpu_ms_per_call / leanest.cpu_ms_per_call


def _streaming_lines(group: Sequence[ResultRow], width: int) -> list[str]:
    """rcarun streamed beside rcarun unstreamed in one scenario: CPU per call and per completion token, and the
    ratios (what streaming costs)."""
    streamed = next((row for row in group if row.client == "rcarun" and row.calls), None)
    whole = next((row for row in group if row.client == "rcarun-unstreamed" and row.calls), None)
    if streamed is None or whole is None or not whole.cpu_ms_per_call:
        return []
    line = (
        f"{'':<{width}} rcarun streamed / unstreamed: CPU per call {streamed.cpu_ms_per_call:.3f} / "
        f"{whole.cpu_ms_per_call:.3f} ms ({streamed.cpu_ms_per_call / whole.cpu_ms_per_call:.2f}x)"
    )
    per_token = streamed.cpu_us_per_completion_token, whole.cpu_us_per_completion_token
    if per_token[0] is not None and per_token[1] is not None:
        line += f"; per completion token {per_token[0]:.2f} / {per_token[1]:.2f} us"
        tokens_per_s = streamed.server_completion_tokens / streamed.wall_s if streamed.wall_s else 0.0
        line += f"; {tokens_per_s:,.0f} tokens/s took {per_token[0] * tokens_per_s / 1e6:.2f} of a core"
    return [line]


def format_table(rows: Sequence[ResultRow]) -> str:
    """The human-readable report: one line per client, then per scenario rcarun's ratio against the best
    peer's and its CPU per call against the leanest peer's."""
    width = max([15, *(len(row.name) for row in rows)])
    header = (
        f"{'scenario':<{width}} {'client':<16} {'calls':>6} {'wall s':>7} {'req/s':>8} {'ceiling':>8} "
        f"{'ratio':>6} {'429s':>6} {'overshoot':>9} {'CPU ms/call':>11} {'RSS MB':>7} {'recorded':>8}  "
        "scenario figures"
    )
    lines = [header, "-" * len(header)]
    for name in dict.fromkeys(row.name for row in rows):
        group = [row for row in rows if row.name == name]
        for row in group:
            lines.append(
                f"{row.name:<{width}} {row.client:<16} {row.calls:>6} {row.wall_s:>7.1f} "
                f"{row.achieved_rps:>8.1f} {row.ceiling_rps:>8.1f} {row.ratio:>6.3f} {row.server_429:>6} "
                f"{row.server_max_overshoot:>9.1f} {row.cpu_ms_per_call:>11.3f} {row.peak_rss_mb:>7.1f} "
                f"{row.recorded_calls:>8}  {headline(row)}"
            )
            if row.runs > 1:
                lines.append(
                    f"{'':<{width}} {'':<16} the median of {row.runs} runs "
                    f"(ratio {row.ratio_min:.3f}–{row.ratio_max:.3f})"
                )
        ours, best = _best_peer(group)
        if ours is not None and best is not None:
            relative = ours.ratio / best.ratio if best.ratio else float("inf")
            lines.append(f"{'':<{width}} rcarun's ratio / best peer's ({best.client}): {relative:.3f}")
        lines.extend(_streaming_lines(group, width))
        leanest = _leanest_peer(group)
        for row in group:
            if _is_peer(row.client) or leanest is None:
                continue
            cpu_relative = _cpu_over_leanest(row, leanest)
            if cpu_relative is not None:
                lines.append(
                    f"{'':<{width}} {row.client}'s CPU per call / leanest peer's ({leanest.client}): "
                    f"{cpu_relative:.2f}"
                )
        lines.append("")
    return "\n".join(lines).rstrip()


def _ratio_text(row: ResultRow) -> str:
    """The ratio, with the spread of the repeated runs it is the median of."""
    if row.runs <= 1:
        return f"{row.ratio:.3f}"
    return f"{row.ratio:.3f} ({row.ratio_min:.3f}–{row.ratio_max:.3f}, {row.runs} runs)"


def format_markdown(rows: Sequence[ResultRow]) -> str:
    """One Markdown table of every scenario and client (what docs/performance.md shows); each client's CPU per call
    is also given over the scenario's leanest peer's (see `format_table`)."""
    lines = [
        "| scenario | client | req/s | counted req/s | ceiling | ratio | server 429s | overshoot | CPU ms/call "
        "| CPU / leanest peer's | peak RSS MB | recorded | scenario figures |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    leanest = {
        name: _leanest_peer([row for row in rows if row.name == name]) for name in {row.name for row in rows}
    }
    for row in rows:
        cpu_relative = _cpu_over_leanest(row, leanest[row.name])
        relative = "—" if cpu_relative is None else f"{cpu_relative:.2f}"
        lines.append(
            f"| {row.name} | {row.client} | {row.achieved_rps:.1f} | {row.window_rps:.1f} | {row.ceiling_rps:.1f} "
            f"| {_ratio_text(row)} "
            f"| {row.server_429} | {row.server_max_overshoot:g} | {row.cpu_ms_per_call:.2f} | {relative} "
            f"| {row.peak_rss_mb:.0f} | {row.recorded_calls} | {headline(row)} |"
        )
    return "\n".join(lines)
