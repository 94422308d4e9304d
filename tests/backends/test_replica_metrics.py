"""Balancing by what vLLM replicas report: the Prometheus page read (both KV-cache gauge names), the balancer's
rule (reported queue plus our calls since the scrape, stale scrapes ignored, KV usage breaking ties, replicas
marked down skipped), and the poller against simulators that really are busy."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from rcarun.backends.replicas import MetricsPoller, ReplicaBalancer, ReplicaLoad, parse_vllm_metrics
from rcarun.mock import MockConfig, MockServer

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
vllm:gpu_cache_usage_perc{engine="0",model_name="qwen"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="qwen"} 0.75
vllm:prompt_tokens_total{model_name="qwen"} 1.2e6
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_page_is_summed_over_engines_and_either_kv_gauge_name_is_read() -> None:
    assert parse_vllm_metrics(VLLM_PAGE) == ReplicaLoad(running=5.0, waiting=4.0, kv_usage=0.75)
    current = VLLM_PAGE.replace("gpu_cache_usage_perc", "kv_cache_usage_perc")
    both = current + 'vllm:gpu_cache_usage_perc{engine="0"} 0.1\n'
    assert parse_vllm_metrics(both) == ReplicaLoad(
        running=5.0, waiting=4.0, kv_usage=0.75
    )  # the current name wins
    assert parse_vllm_metrics("# nothing of vLLM\nprocess_cpu_seconds_total 3.5\n") is None
    assert parse_vllm_metrics("vllm:num_requests_waiting 2\n") == ReplicaLoad(running=0.0, waiting=2.0)


def test_the_least_loaded_replica_by_its_report_gets_the_call() -> None:
    clock = FakeClock()
    balancer = ReplicaBalancer(("a", "b"), clock=clock)
    balancer.report(0, ReplicaLoad(running=8, waiting=6, kv_usage=0.9))  # busy with another sweep's calls
    balancer.report(1, ReplicaLoad(running=2, waiting=0, kv_usage=0.2))
    picks = [balancer.acquire() for _ in range(12)]
    # b takes calls until its reported load plus ours since the scrape reaches a's 14: 12 of them.
    assert picks == [1] * 12
    assert balancer.load(1) == 14.0
    assert balancer.acquire() == 1  # a tie at 14: b's emptier KV cache breaks it
    assert balancer.acquire() == 0  # 14 against 15
    # The outstanding counter alone would have alternated from the start.
    counting = ReplicaBalancer(("a", "b"))
    assert [counting.acquire() for _ in range(4)] == [0, 1, 0, 1]


def test_a_stale_or_missing_report_falls_back_to_outstanding_counting() -> None:
    clock = FakeClock()
    balancer = ReplicaBalancer(("a", "b"), stale_after_s=1.0, clock=clock)
    balancer.report(0, ReplicaLoad(running=50, waiting=50))
    assert balancer.acquire() == 1
    clock.now += 1.5  # the report is stale: a counts only our own calls (none)
    assert balancer.load(0) == 0.0 and balancer.acquire() == 0
    balancer.report(0, None)  # a page without vLLM's gauges
    assert balancer.load(0) == 1.0


def test_calls_come_back_between_scrapes_and_never_count_below_our_own() -> None:
    clock = FakeClock()
    balancer = ReplicaBalancer(("a", "b"), clock=clock)
    balancer.report(0, ReplicaLoad(running=0, waiting=0))
    balancer.report(1, ReplicaLoad(running=0, waiting=0))
    first = balancer.acquire()
    second = balancer.acquire()
    assert {first, second} == {0, 1}
    balancer.release(first)
    assert balancer.load(first) == 0.0 and balancer.load(second) == 1.0
    balancer.report(second, ReplicaLoad(running=0, waiting=0))  # a scrape that missed our call
    assert balancer.load(second) == 1.0  # our own outstanding call is certain


def test_kv_usage_breaks_ties_and_a_replica_marked_down_gets_nothing_while_another_is_up() -> None:
    clock = FakeClock()
    balancer = ReplicaBalancer(("a", "b", "c"), clock=clock)
    for index, kv in enumerate((0.8, 0.3, 0.6)):
        balancer.report(index, ReplicaLoad(running=1, waiting=0, kv_usage=kv))
    assert balancer.acquire() == 1
    balancer.set_available(1, False)
    balancer.set_available(2, False)
    assert [balancer.acquire() for _ in range(3)] == [0, 0, 0]
    balancer.set_available(0, False)  # every replica down: calls still go somewhere (and are retried)
    assert balancer.acquire() in (0, 1, 2)


@pytest.mark.parametrize("kv_metric", ["kv_cache_usage_perc", "gpu_cache_usage_perc"])
async def test_the_poller_steers_calls_away_from_a_replica_busy_with_other_clients(kv_metric: str) -> None:
    config = MockConfig(
        latency_s=1.5,
        max_concurrency=2,
        over_concurrency="queue",
        kv_cache_tokens=1000,
        kv_cache_metric=kv_metric,
    )
    async with MockServer(config) as busy, MockServer(config) as idle:
        balancer = ReplicaBalancer((busy.base_url, idle.base_url))
        body = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 4}
        async with aiohttp.ClientSession() as session:

            async def call() -> None:
                async with session.post(f"{busy.base_url}/chat/completions", json=body) as response:
                    await response.read()

            others = [asyncio.create_task(call()) for _ in range(5)]  # another sweep: 2 running, 3 waiting
            async with MetricsPoller(balancer, interval_s=0.05) as poller:
                deadline = time.monotonic() + 5
                while balancer.load(0) < 5:
                    assert time.monotonic() < deadline, "the busy replica's queue was never seen"
                    await asyncio.sleep(0.02)
                picks = [balancer.acquire() for _ in range(5)]
                assert picks == [1, 1, 1, 1, 1]  # the counter alone would have sent the first to the busy one
                assert poller.scrapes >= 2 and poller.failures == 0
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        text = busy.metrics_text()
        assert f"vllm:{kv_metric}" in text


async def test_a_replica_without_metrics_is_balanced_by_counting() -> None:
    async with MockServer(MockConfig()) as server:
        balancer = ReplicaBalancer((server.base_url, "http://127.0.0.1:9/v1"))
        async with MetricsPoller(balancer, interval_s=0.05) as poller:
            while poller.scrapes < 4:
                await asyncio.sleep(0.02)
        assert poller.failures >= 2  # the closed port never answered
        assert [balancer.acquire() for _ in range(4)] == [0, 1, 0, 1]
