"""The throughput benchmark end to end on its quick latency-bound scenario, and its steady-window rule.

Timing claims live in the benchmark itself, not here: these tests check that every client ran the whole
workload against the simulator process, that the report has the agreed JSON fields, and that its numbers are
sane (a ratio is achieved over ceiling, rcarun recorded every call, the peers recorded none).
"""

from __future__ import annotations

import json
import sys

import pytest

from rcarun.cli import main as cli_main
from rcarun_bench import (
    CLIENT_ORDER,
    Completion,
    get_scenario,
    json_document,
    run_throughput,
    skipped_clients,
    steady_window,
)
from rcarun_bench.clients import unavailable_reason
from rcarun_bench.metrics import Allowance, ResultRow, allowance_used
from rcarun_bench.throughput import format_markdown, format_table, median_rows, round_order

_FIELDS = {
    "name",
    "client",
    "calls",
    "wall_s",
    "achieved_rps",
    "ceiling_rps",
    "ratio",
    "server_429",
    "server_max_overshoot",
    "cpu_ms_per_call",
    "peak_rss_mb",
    "recorded_calls",
    "items",
    "success_rate",
    "late_429_per_request",
    "settle_s",
    "wasted_tokens",
    "cost_usd",
    "server_cost_usd",
    "delay_ratio",
    "top_decile_delay_ms",
    "median_delay_ms",
    "lag_p50_ms",
    "lag_p99_ms",
    "lag_max_ms",
    "server_max_generating",
    "server_max_in_flight",
    "server_accepted",
    "server_length_stops",
    "client_429",
    "window_rps",
    "runs",
    "ratio_min",
    "ratio_max",
    "server_503",
    "first_refusal_s",
    "refused_early",
    "refused_late",
    "late_refused_share",
    "recovery_s",
    "last_arrival_s",
    "server_completion_tokens",
    "cpu_us_per_completion_token",
}


@pytest.mark.slow
def test_quick_latency_bound_runs_every_client_end_to_end() -> None:
    scenario = get_scenario("latency-bound", quick=True)

    rows = run_throughput(quick=True, names=("latency-bound",))
    document = json.loads(json.dumps(json_document(rows, skipped_clients())))

    rows = document["scenarios"]
    # A peer whose package is not installed (the peers extra) sits out, with its reason in the document;
    # rcarun-unstreamed runs only where answers stream long (the streaming scenario).
    available = [
        client
        for client in CLIENT_ORDER
        if unavailable_reason(client) is None and client not in scenario.skip_clients
    ]
    assert [row["client"] for row in rows] == available
    assert set(document["skipped_clients"]) == {
        client for client in CLIENT_ORDER if unavailable_reason(client) is not None
    }
    for row in rows:
        assert set(row) == _FIELDS
        assert row["name"] == "latency-bound"
        assert row["calls"] == scenario.calls
        assert row["ceiling_rps"] == pytest.approx(scenario.concurrency / scenario.latency_s)
        assert 0 < row["achieved_rps"] <= row["ceiling_rps"] * 1.05
        assert row["ratio"] == pytest.approx(row["achieved_rps"] / row["ceiling_rps"], abs=1e-3)
        assert row["runs"] == 1 and row["ratio_min"] == row["ratio_max"] == row["ratio"]
        assert row["wall_s"] >= scenario.calls / row["ceiling_rps"]
        assert row["server_429"] == 0
        assert row["server_max_overshoot"] == 0
        assert row["cpu_ms_per_call"] > 0
        assert row["peak_rss_mb"] > 10
    recorded = {row["client"]: row["recorded_calls"] for row in rows}
    assert recorded == {client: scenario.calls if client == "rcarun" else 0 for client in available}


def _paced(burst: float, rate: float, total: int, fast_rate: float, cost: float = 1.0) -> list[Completion]:
    """A client sending as fast as ``fast_rate`` allows while a bucket (``burst`` full, refilled at ``rate``)
    holds ``cost`` units for the next call: it rides the burst, then settles at the limit."""
    completions: list[Completion] = []
    sent = 0.0
    for index in range(total):
        earliest = index / fast_rate
        # The bucket holds (burst + rate * t - index * cost) at time t; wait until that reaches ``cost``.
        allowed = ((index + 1) * cost - burst) / rate
        sent = max(sent, earliest, allowed)
        completions.append(Completion(sent=sent, at=sent + 0.05, tokens=100))
    return completions


def test_steady_window_leaves_the_initial_burst_out() -> None:
    completions = _paced(burst=300, rate=300.0, total=3000, fast_rate=640.0)

    window = steady_window(completions, Allowance(rate_per_s=300.0, burst=300.0, tokens=False))

    assert window.rps == pytest.approx(300.0, rel=0.01)
    assert window.calls > 2000
    # Without the drain rule the 10 % head alone would start inside the burst and overstate the rate.
    assert steady_window(completions, None).rps > 310


def test_steady_window_measures_tokens_against_the_token_limit() -> None:
    completions = _paced(burst=2_000.0, rate=10_000.0, total=1000, fast_rate=640.0, cost=100.0)

    window = steady_window(completions, Allowance(rate_per_s=10_000.0, burst=2_000.0, tokens=True))

    assert window.mean_tokens == 100
    assert window.tokens / window.seconds == pytest.approx(10_000.0, rel=0.01)


def _lumpy(rate: float, lump: int, period_s: float, seconds: float) -> list[Completion]:
    """A client at exactly the limit on average that sends ``lump`` calls at once every ``period_s``; the
    answers trickle back over most of the period."""
    completions: list[Completion] = []
    for tick in range(round(seconds / period_s)):
        sent = tick * period_s
        completions.extend(
            Completion(sent=sent, at=sent + 0.05 + index * 0.8 * period_s / lump, tokens=100)
            for index in range(lump)
        )
    assert lump / period_s == rate
    return completions


def test_a_client_at_the_limit_uses_all_of_it_wherever_its_bucket_level_floats() -> None:
    limit = Allowance(rate_per_s=300.0, burst=300.0, tokens=False)
    lumpy = _lumpy(300.0, lump=210, period_s=0.7, seconds=20.0)

    window = steady_window(lumpy, limit)

    # Counting calls in the window depends on where its edges fall between lumps; the corrected rate does not.
    assert window.rps / 300.0 < 0.995
    assert allowance_used(window, limit) == pytest.approx(1.0, abs=1e-9)
    paced = _paced(burst=2_000.0, rate=10_000.0, total=1000, fast_rate=640.0, cost=100.0)
    token_limit = Allowance(rate_per_s=10_000.0, burst=2_000.0, tokens=True)
    assert allowance_used(steady_window(paced, token_limit), token_limit) == pytest.approx(1.0, abs=1e-9)


def test_a_client_that_stops_asking_is_charged_the_quota_it_left() -> None:
    limit = Allowance(rate_per_s=300.0, burst=300.0, tokens=False)
    before = _paced(burst=300, rate=300.0, total=3000, fast_rate=640.0)
    resume = before[-1].sent + 3.0  # silent for 3 s: the bucket refills in 1 s, then 2 s of quota overflow
    after = [
        Completion(sent=resume + c.sent, at=resume + c.at, tokens=c.tokens)
        for c in _paced(300, 300.0, 3000, 640.0)
    ]

    window = steady_window(before + after, limit)

    assert window.unused == pytest.approx(2 * 300.0, rel=0.01)
    assert allowance_used(window, limit) == pytest.approx(1 - 600.0 / (300.0 * window.seconds), rel=1e-6)
    assert allowance_used(window, None) is None


def test_rounds_rotate_the_clients_so_each_runs_in_every_position() -> None:
    clients = ("rcarun", "naive-gather", "aiolimiter-loop")
    orders = [round_order(clients, index) for index in range(3)]

    assert orders[0] == list(clients)
    for position in range(3):
        assert sorted(order[position] for order in orders) == sorted(clients)
    assert round_order(clients, 3) == orders[0]


def _row(
    ratio: float, wall_s: float, client: str = "rcarun", cpu_ms_per_call: float = 1.0, calls: int = 10
) -> ResultRow:
    return ResultRow(
        name="concurrency-cap",
        client=client,
        calls=calls,
        wall_s=wall_s,
        achieved_rps=ratio * 320,
        ceiling_rps=320.0,
        ratio=ratio,
        server_429=0,
        server_max_overshoot=0.0,
        cpu_ms_per_call=cpu_ms_per_call,
        peak_rss_mb=60.0,
        recorded_calls=10 if client == "rcarun" else 0,
    )


def test_the_table_gives_rcaruns_cpu_per_call_against_the_leanest_peers() -> None:
    rows = [
        _row(0.97, 1.0, cpu_ms_per_call=0.69),
        _row(0.88, 1.0, client="naive-gather", cpu_ms_per_call=1.93),
        _row(0.96, 1.0, client="aiolimiter-loop", cpu_ms_per_call=0.345),
        # A peer that completed nothing has no CPU per call worth comparing against.
        _row(0.0, 1.0, client="litellm-router", cpu_ms_per_call=0.01, calls=0),
    ]

    text = format_table(rows)

    assert "rcarun's CPU per call / leanest peer's (aiolimiter-loop): 2.00" in text
    assert "rcarun's ratio / best peer's (aiolimiter-loop): 1.010" in text
    assert "leanest peer" not in format_table(rows[:1])  # no peer ran
    assert "leanest peer" not in format_table(rows[1:])  # rcarun did not run
    cells = {line.split(" | ")[1]: line.split(" | ")[9] for line in format_markdown(rows).splitlines()[2:]}
    assert cells == {
        "rcarun": "2.00",
        "naive-gather": "5.59",
        "aiolimiter-loop": "1.00",
        "litellm-router": "—",
    }
    assert format_markdown(rows[:1]).splitlines()[2].split(" | ")[9] == "—"


@pytest.mark.slow
def test_the_bench_runs_only_the_clients_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = get_scenario("latency-bound", quick=True)
    argv = ["bench", "throughput", "--quick", "--json", "--scenario", "latency-bound"]

    assert cli_main([*argv, "--client", "rcarun", "--client", "naive-gather"]) == 0

    rows = json.loads(capsys.readouterr().out)["scenarios"]
    recorded = {row["client"]: (row["calls"], row["recorded_calls"]) for row in rows}
    assert recorded == {"rcarun": (scenario.calls, scenario.calls), "naive-gather": (scenario.calls, 0)}


@pytest.mark.parametrize("client", ["rcarun-h2", "rcarun-httptools"])  # rcarun-httptools: removed (issue 34)
def test_an_unknown_client_is_refused_with_the_known_ones(
    client: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "throughput", "--quick", "--json", "--scenario", "latency-bound", "--client", client]

    assert cli_main(argv) == 2
    assert capsys.readouterr().err == (
        f"rcarun bench: unknown clients [{client!r}] "
        "(known: rcarun, rcarun-unstreamed, naive-gather, aiolimiter-loop, litellm-router)\n"
    )


def test_rcarun_bench_without_the_benchmarks_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rcarun_bench", None)  # what `import rcarun_bench` meets where absent

    assert cli_main(["bench", "throughput", "--quick"]) == 2
    assert capsys.readouterr().err == (
        "rcarun bench: the benchmarks are not installed (pip install -e ./benchmarks from a checkout)\n"
    )


def test_repeated_runs_are_reported_by_the_median_run_with_their_spread() -> None:
    median = median_rows([_row(0.97, 1.0), _row(0.95, 2.0), _row(0.99, 3.0)])

    assert (median.ratio, median.wall_s) == (0.97, 1.0)  # the whole median run, not a mix of runs
    assert (median.runs, median.ratio_min, median.ratio_max) == (3, 0.95, 0.99)
    assert median_rows([_row(0.97, 1.0), _row(0.95, 2.0)]).ratio == 0.95  # the lower middle of an even count
    assert "0.970 (0.950–0.990, 3 runs)" in format_markdown([median])
    with pytest.raises(ValueError):
        median_rows([])


def test_without_a_limit_the_rate_is_the_slope_so_clumped_answers_do_not_move_it() -> None:
    # A queue that frees 32 slots together every 100 ms: each clump of answers is read over 4 ms, bunched
    # at its start (the way a client drains a burst of responses).
    completions = [
        Completion(sent=tick * 0.1, at=tick * 0.1 + 0.1 + 0.004 * (index / 32) ** 3, tokens=100)
        for tick in range(100)
        for index in range(32)
    ]

    window = steady_window(completions, None)

    assert abs(window.rps / 320.0 - 1) > 0.005  # where the two ends fall inside their clumps shows
    assert window.slope_rps == pytest.approx(320.0, rel=0.002)


@pytest.mark.slow
def test_the_streaming_scenario_sets_rcarun_streamed_beside_rcarun_unstreamed() -> None:
    rows = run_throughput(quick=True, names=("streaming",), clients=("rcarun", "rcarun-unstreamed"))

    by_client = {row.client: row for row in rows}
    assert set(by_client) == {"rcarun", "rcarun-unstreamed"}
    scenario = get_scenario("streaming", quick=True)
    for row in by_client.values():
        assert row.calls == row.recorded_calls == scenario.calls
        # Every answer's thinking was generated: about a thousand completion tokens a call.
        assert row.server_completion_tokens >= scenario.calls * scenario.reasoning_tokens
        assert row.cpu_us_per_completion_token is not None and row.cpu_us_per_completion_token > 0
    table = format_table(rows)
    assert "rcarun streamed / unstreamed: CPU per call" in table
    assert "per completion token" in table
