"""The benchmark's scenario figures computed from hand-worked inputs: storm settling, queueing-delay ratio,
event-loop lag, and the server-side ceilings of the new scenarios."""

from __future__ import annotations

import dataclasses

import pytest

from rcarun_bench import SCENARIO_NAMES, get_scenario, scenarios
from rcarun_bench.metrics import (
    Attempt,
    QueueDelay,
    allowance,
    delay_ratio,
    lag_summary,
    nominal_ceiling_rps,
    percentile,
    storm_figures,
)
from rcarun_bench.scenarios import Scenario


def _attempts(spec: list[tuple[float, bool]]) -> list[Attempt]:
    return [Attempt(sent=100.0 + t, rate_limited=limited) for t, limited in spec]


def test_storm_without_429s_settles_at_once() -> None:
    attempts = _attempts([(t / 10, False) for t in range(100)])

    figures = storm_figures(attempts, settle_after_s=5.0)

    assert figures.late_429_per_request == 0.0
    assert figures.settle_s == 0.0


def test_storm_settles_at_the_end_of_the_last_stormy_window() -> None:
    # 10 requests per second for 10 s; every request in [0, 3) gets a 429, then one stray 429 at t = 6.0, which
    # is 1 of 20 requests in each window that holds it (5 %, not more than 5 %: not stormy).
    spec = [(t / 10, t < 30 or t == 60) for t in range(100)]

    figures = storm_figures(_attempts(spec), settle_after_s=5.0)

    # Windows start every 0.5 s: [2.5, 4.5) holds 5 of 20 rejected (stormy), [3.0, 5.0) holds none. So the
    # last stormy window ends at 4.5 s.
    assert figures.settle_s == pytest.approx(4.5)
    # After 5 s: 50 requests, one of them (t = 6.0) a 429.
    assert figures.late_429_per_request == pytest.approx(1 / 50)


def test_storm_that_never_ends_has_no_settle_time() -> None:
    spec = [(t / 10, t % 5 == 0) for t in range(100)]  # 20 % rejected throughout

    figures = storm_figures(_attempts(spec), settle_after_s=5.0)

    assert figures.settle_s is None
    assert figures.late_429_per_request == pytest.approx(10 / 50)


def test_delay_ratio_compares_the_longest_prompts_with_the_median() -> None:
    # 20 items: prompt sizes 1..20; the two longest (the top decile) waited 0.9 and 0.7 s, the rest 0.1 s
    # except item 1 (0.3 s). Overall median (nearest rank, 10th of 20 sorted) = 0.1 s; the top decile's
    # median (1st of 2 sorted) = 0.7 s.
    delays = [QueueDelay(size, 0.1) for size in range(2, 19)]
    delays += [QueueDelay(1, 0.3), QueueDelay(19, 0.7), QueueDelay(20, 0.9)]

    ratio, top, median = delay_ratio(delays)

    assert top == pytest.approx(0.7)
    assert median == pytest.approx(0.1)
    assert ratio == pytest.approx(7.0)


def test_delay_ratio_counts_delays_below_a_millisecond_as_one() -> None:
    nobody_waited = [QueueDelay(size, 0.0002) for size in range(30)]
    # 27 light items never wait; the three longest wait 50 ms each.
    heavy_waited = [QueueDelay(size, 0.0) for size in range(27)] + [
        QueueDelay(100 + i, 0.05) for i in range(3)
    ]

    assert delay_ratio(nobody_waited)[0] == pytest.approx(1.0)
    ratio, top, median = delay_ratio(heavy_waited)
    assert (ratio, top, median) == (pytest.approx(50.0), pytest.approx(0.05), 0.0)
    assert delay_ratio(nobody_waited[:9]) == (None, 0.0, 0.0)


def test_lag_summary_in_milliseconds_by_nearest_rank() -> None:
    samples = [0.001] * 98 + [0.010, 0.050]

    lag = lag_summary(samples)

    assert lag.p50_ms == pytest.approx(1.0)
    assert lag.p99_ms == pytest.approx(10.0)
    assert lag.max_ms == pytest.approx(50.0)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_ceilings_are_what_the_server_allows() -> None:
    storm = get_scenario("429-storm", quick=False)
    cap = get_scenario("concurrency-cap", quick=False)
    vllm = get_scenario("vllm-queue", quick=False)

    # Told 18,000/min; the server enforces 30 % less: 12,600/min = 210/s.
    assert storm.requests_per_s == pytest.approx(300.0)
    assert nominal_ceiling_rps(storm) == pytest.approx(210.0)
    limit = allowance(storm)
    assert limit is not None and limit.rate_per_s == pytest.approx(210.0)
    assert storm.mock_config().rpm == 12_600
    # 32 slots at 100 ms; the vLLM clients may open 64 but the server generates 32 at a time.
    assert nominal_ceiling_rps(cap) == pytest.approx(320.0)
    assert vllm.concurrency == 64
    assert nominal_ceiling_rps(vllm) == pytest.approx(320.0)
    assert vllm.mock_config().max_concurrency == 32


def test_every_scenario_exists_quick_and_full_and_crosses_processes_as_json() -> None:
    for quick in (True, False):
        assert tuple(s.name for s in scenarios(quick)) == SCENARIO_NAMES
        for scenario in scenarios(quick):
            assert scenario.calls % scenario.realizations == 0
            assert Scenario.from_json(scenario.to_json()) == scenario
    large = get_scenario("large-scale", quick=False)
    assert large.calls == 100_000
    assert get_scenario("length-retries", quick=True).mock_config().length_rate == pytest.approx(0.2)
    assert dataclasses.replace(large, calls=200).trajectories == 2


def test_the_simulators_length_rate_is_a_validated_fraction() -> None:
    from rcarun.mock import MockConfig

    assert MockConfig(length_rate=0.2).length_rate == pytest.approx(0.2)
    with pytest.raises(ValueError, match="length_rate"):
        MockConfig(length_rate=1.5)
