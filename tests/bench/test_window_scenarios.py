"""The window scenarios: what each one sets up, and each one in miniature end to end against the window server.

Correctness, not speed (performance is measured by the benchmark, never asserted here): the miniatures shrink
the window to 1 s so that a run takes about 3 s (LiteLLM's, which imports for seconds, is marked slow), and check that the plain-SDK peer (naive-gather) ran the whole
workload, that every refusal the server counted reached it, and that the server-side figures are there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rcarun_bench import SCENARIO_NAMES, get_scenario, json_document, scenarios
from rcarun_bench import clients as bench_clients
from rcarun_bench.clients import unavailable_reason
from rcarun_bench.metrics import nominal_ceiling_rps
from rcarun_bench.scenarios import Scenario
from rcarun_bench.throughput import format_table, run_scenarios, skipped_clients

WINDOW_SCENARIOS = tuple(name for name in SCENARIO_NAMES if name.startswith("window-"))


def test_every_way_of_signalling_an_undeclared_limit_has_its_scenario_and_its_providers_preset() -> None:
    undeclared = {s.name: s for s in scenarios(quick=False) if s.name.startswith("window-undeclared")}

    assert {s.signal: s.provider for s in undeclared.values()} == {
        "openai-headers": "openai",
        "retry-after": "openai-compatible",
        "both": "openai",
        "bare": "openai-compatible",
        "overload-503": "kimi",
    }
    for scenario in undeclared.values():
        # Told twice what the server enforces.
        assert (scenario.rpm, scenario.server_rpm) == (400, 200)
        config = scenario.window_config()
        assert (config.rpm, config.window_s, config.requests_per_window) == (200, 60.0, 200)
        assert nominal_ceiling_rps(scenario) == pytest.approx(200 / 60)


def test_the_token_scenarios_meter_as_their_providers_do() -> None:
    tokens = get_scenario("window-tokens", quick=False).window_config()
    ratio = get_scenario("window-tokens-ratio", quick=False).window_config()

    assert (tokens.tpm, tokens.metering, tokens.chars_per_token) == (1_200_000, "max_tokens", 4.0)
    assert (ratio.tpm, ratio.metering, ratio.chars_per_token) == (280_000, "usage", 3.0)


def test_quick_keeps_the_rates_in_a_shorter_window_and_each_run_outlasts_the_measured_span() -> None:
    for quick, window_s in ((False, 60.0), (True, 10.0)):
        for scenario in scenarios(quick):
            if scenario.server != "window":
                continue
            assert scenario.window_s == window_s
            assert Scenario.from_json(scenario.to_json()) == scenario
            config = scenario.window_config()
            if scenario.binding == "requests":
                # 2.1 windows of the server's limit: more than a client can be admitted by 4W/3.
                assert config.requests_per_window is not None
                assert scenario.calls >= 2 * config.requests_per_window


# Calls in about 2 one-second windows of each token scenario's limit: 2 calls of 8,650 tokens fit 20,000;
# 4 of about 940 fit 4,666.
_MINIATURE_TOKEN_CALLS = {"window-tokens": 5, "window-tokens-ratio": 10}


def _miniature(name: str, **changes: Any) -> Scenario:
    """The scenario in a 1-s window with 50-ms answers: about 2 windows of work, a few seconds a run."""
    scenario = get_scenario(name, quick=True)
    config = dataclasses.replace(scenario, window_s=1.0).window_config()
    if config.requests_per_window is not None:
        calls = round(2.1 * config.requests_per_window)
    else:
        calls = _MINIATURE_TOKEN_CALLS[name]
    return dataclasses.replace(scenario, window_s=1.0, latency_s=0.05, calls=calls, **changes)


@pytest.mark.slow  # runs a benchmark in miniature: with the slow tests (make test), not make check
@pytest.mark.parametrize("name", WINDOW_SCENARIOS)
def test_window_scenario_miniature_with_the_plain_sdk_peer(name: str) -> None:
    scenario = _miniature(name)

    rows = run_scenarios([scenario], clients=("naive-gather",))

    [row] = rows
    assert (row.name, row.client, row.items) == (name, "naive-gather", scenario.calls)
    # Every call answered once (it takes any answer as it is), every refusal the server sent reached it.
    assert row.calls == row.server_accepted == scenario.calls
    assert row.client_429 == row.server_429 + row.server_503
    # Both rounded to micro-dollars: a total on a rounding boundary may round one unit apart.
    assert row.cost_usd == pytest.approx(row.server_cost_usd, abs=1.000001e-6)
    # All of its 32 requests go at once, more than any of these windows admits: the server refused some, in
    # the way the scenario says.
    assert row.server_429 + row.server_503 > 0
    if scenario.signal == "overload-503":
        assert row.server_429 == 0
    else:
        assert row.server_503 == 0
    assert row.first_refusal_s is not None and row.first_refusal_s >= 0
    assert row.refused_early + row.refused_late == row.server_429 + row.server_503
    assert 0.0 <= row.ratio <= 1.0
    assert row.last_arrival_s is not None and row.last_arrival_s > 0
    assert "refusals" in format_table(rows)


@pytest.mark.slow
def test_litellm_router_miniature() -> None:
    if unavailable_reason("litellm-router") is not None:
        pytest.skip("litellm is not installed (the peers extra of benchmarks/)")
    scenario = _miniature("window-undeclared")

    [row] = run_scenarios([scenario], clients=("litellm-router",))

    assert row.calls == row.server_accepted == scenario.calls
    # Each attempt the server refused reached LiteLLM's failure callback; each answer its success callback.
    assert row.client_429 == row.server_429
    # Both rounded to micro-dollars: a total on a rounding boundary may round one unit apart.
    assert row.cost_usd == pytest.approx(row.server_cost_usd, abs=1.000001e-6)
    assert row.success_rate == 1.0


def test_a_peer_whose_package_is_missing_is_skipped_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(bench_clients.OPTIONAL_PACKAGES, "aiolimiter-loop", "rcarun_bench_no_such_module")
    reason = (
        "aiolimiter-loop: rcarun_bench_no_such_module is not installed (pip install -e './benchmarks[peers]')"
    )

    skipped = skipped_clients(("naive-gather", "aiolimiter-loop"))
    rows = run_scenarios([_miniature("window-requests")], clients=("aiolimiter-loop",))

    assert skipped == {"aiolimiter-loop": reason}
    assert rows == []
    assert json_document(rows, skipped) == {"scenarios": [], "skipped_clients": {"aiolimiter-loop": reason}}
