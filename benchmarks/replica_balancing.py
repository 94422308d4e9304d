"""Replica balancing on the simulator: outstanding-request counting against vLLM metrics (issue 20).

Three vLLM-like replicas (queueing, 4 sequences at a time) of different speeds serve one client's calls; in the
second scenario another client keeps the fastest replica busy, as a second sweep on the same ``rcarun serve``
replicas would. The client sends every call through `ReplicaBalancer` (with or without a `MetricsPoller` at
250 ms) at a fixed concurrency and reports throughput and latency percentiles.

The third scenario measures prefix affinity: trajectories that each send several calls in turn sharing one long
first message (RCTA's stages), to three equal replicas whose prefix cache (LRU over first messages, small or
large) makes a hit skip the shared prefix's prefill; outstanding vs metrics vs affinity.

    .venv/bin/python benchmarks/replica_balancing.py [--calls 600] [--concurrency 24] [--only prefix]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import time
from collections.abc import AsyncIterator

import aiohttp

from rcarun.backends.replicas import MetricsPoller, ReplicaBalancer, prefix_key
from rcarun.mock import MockConfig, MockServer

MIXED_S = (0.05, 0.1, 0.2)
EQUAL_S = (0.1, 0.1, 0.1)
BODY = {"model": "m", "messages": [{"role": "user", "content": "x" * 800}], "max_tokens": 16}


@contextlib.asynccontextmanager
async def replicas(speeds: tuple[float, ...]) -> AsyncIterator[list[MockServer]]:
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                MockServer(MockConfig(latency_s=latency, max_concurrency=4, over_concurrency="queue", seed=i))
            )
            for i, latency in enumerate(speeds)
        ]
        yield servers


async def run(
    rule: str, speeds: tuple[float, ...], calls: int, concurrency: int, foreign: int
) -> dict[str, float]:
    async with (
        replicas(speeds) as servers,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        balancer = ReplicaBalancer(tuple(server.base_url for server in servers))
        stop_foreign = asyncio.Event()

        async def post(url: str) -> None:
            async with session.post(f"{url}/chat/completions", json=BODY) as response:
                await response.read()

        async def foreign_load() -> None:  # another client on the fastest replica
            while not stop_foreign.is_set():
                await post(servers[0].base_url)

        others = [asyncio.create_task(foreign_load()) for _ in range(foreign)]
        await asyncio.sleep(0.3)
        latencies: list[float] = []
        sent = [0] * len(servers)
        remaining = calls

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                index = balancer.acquire()
                sent[index] += 1
                try:
                    await post(balancer.urls[index])
                finally:
                    balancer.release(index)
                latencies.append(time.perf_counter() - started)

        poller = MetricsPoller(balancer, interval_s=0.25) if rule == "metrics" else contextlib.nullcontext()
        async with poller:
            await asyncio.sleep(0.3 if rule == "metrics" else 0.0)
            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - began
        stop_foreign.set()
        await asyncio.gather(*others)  # each finishes the call it has in flight
    latencies.sort()
    return {
        "calls_per_s": calls / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        **{f"share_{i}": sent[i] / calls for i in range(len(servers))},
    }


# The prefix workload: a 2,000-token first message (8,000 characters at 4 per token) prefilled at 10,000 tokens/s
# (0.2 s) on top of 0.1 s of decoding, so a hit answers in a third of the time of a miss.
PREFIX_CHARS = 8000
STAGES = 4
PREFILL_S_PER_TOKEN = 0.0001
CACHE_SIZES = (("small", 4), ("large", 1024))
AFFINITY_FACTOR = float(os.environ.get("AFFINITY_FACTOR", "1.0"))


async def run_prefix(rule: str, cache_entries: int, calls: int, concurrency: int) -> dict[str, float]:
    """``concurrency`` trajectories in flight, each sending `STAGES` calls one after another that share its
    first message; ``calls`` calls in all."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                MockServer(
                    MockConfig(
                        latency_s=0.1,
                        max_concurrency=4,
                        over_concurrency="queue",
                        seed=i,
                        prefix_cache_entries=cache_entries,
                        latency_per_prompt_token_s=PREFILL_S_PER_TOKEN,
                    )
                )
            )
            for i in range(3)
        ]
        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        )
        balancer = ReplicaBalancer(tuple(server.base_url for server in servers), affinity=rule == "affinity")
        balancer.affinity_factor = AFFINITY_FACTOR
        latencies: list[float] = []
        trajectories = iter(range(calls // STAGES))
        # Prefix lengths (half to one and a half times PREFIX_CHARS) and the client's time between a
        # trajectory's calls (building the next prompt) vary, seeded: equal calls in lockstep would let plain
        # round-robin land each trajectory on one replica by accident.
        rng = random.Random(0)

        async def worker() -> None:
            for trajectory in trajectories:
                # Distinct from the first character on, so that no two trajectories share a prefix.
                first = f"{trajectory:08d} " + "s" * rng.randint(PREFIX_CHARS // 2, 3 * PREFIX_CHARS // 2)
                key = prefix_key("user", first)
                for stage in range(STAGES):
                    body = {
                        "model": "m",
                        "messages": [
                            {"role": "user", "content": first},
                            {"role": "user", "content": f"stage {stage}"},
                        ],
                        "max_tokens": 16,
                    }
                    started = time.perf_counter()
                    with balancer.lease(key) as url:
                        async with session.post(f"{url}/chat/completions", json=body) as response:
                            await response.read()
                    latencies.append(time.perf_counter() - started)
                    await asyncio.sleep(rng.uniform(0.0, 0.02))

        poller = MetricsPoller(balancer, interval_s=0.25) if rule == "metrics" else contextlib.nullcontext()
        async with poller:
            await asyncio.sleep(0.3 if rule == "metrics" else 0.0)
            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - began
        hits = sum(server.prefix_hits for server in servers)
        misses = sum(server.prefix_misses for server in servers)
    latencies.sort()
    return {
        "calls_per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "hit_rate": hits / max(1, hits + misses),
    }


async def prefix_table(calls: int, concurrency: int) -> None:
    print("| prefix cache per replica | rule | calls/s | p50 ms | p95 ms | prefix hits |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for label, entries in CACHE_SIZES:
        for rule in ("outstanding", "metrics", "affinity"):
            result = await run_prefix(rule, entries, calls, concurrency)
            print(
                f"| {label} ({entries} prefixes) | {rule} | {result['calls_per_s']:.1f} | "
                f"{result['p50_ms']:.0f} | {result['p95_ms']:.0f} | {result['hit_rate']:.0%} |"
            )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--only", choices=("load", "prefix"), default=None)
    args = parser.parse_args()
    if args.only != "load":
        await prefix_table(args.calls, args.concurrency)
        print()
    if args.only == "prefix":
        return
    print("| replicas (ms per call) | other client | rule | calls/s | p50 ms | p95 ms | share per replica |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for speeds in (MIXED_S, EQUAL_S):
        for foreign in (0, 8):
            for rule in ("outstanding", "metrics"):
                result = await run(rule, speeds, args.calls, args.concurrency, foreign)
                shares = " / ".join(f"{result[f'share_{i}']:.2f}" for i in range(len(speeds)))
                label = "/".join(f"{1000 * s:.0f}" for s in speeds)
                other = f"{foreign} calls on replica 0" if foreign else "none"
                print(
                    f"| {label} | {other} | {rule} | {result['calls_per_s']:.1f} | {result['p50_ms']:.0f} | "
                    f"{result['p95_ms']:.0f} | {shares} |"
                )


if __name__ == "__main__":
    asyncio.run(main())
