"""The three throughput scenarios, each named by the limit that binds it, with ceilings two cores can serve.

A scenario fixes everything both sides must agree on: what the simulator enforces, what the clients are told
(the same limits, declared), the concurrency every client may use, how many calls make up the workload and how
large their prompts are. Every client runs the same scenario against the same simulator process, so a
difference in the results is a difference between clients.

Ceilings stay within what this 2-core machine serves with client and server together (about 1,000 req/s):
    - latency-bound: no limits; concurrency / latency = 64 / 0.1 s = 640 req/s. The 100-ms latency (the other
      scenarios use 50 ms) keeps the fixed cost of a loopback round trip on two shared cores (the simulator's
      request handling, TCP, timer granularity: about 2.5 ms per call, whatever the client) from dominating a
      ratio that is meant to measure the client; at 50 ms even the leanest loop stalls near 0.95. Real
      provider latencies are seconds.
    - requests-bound: 18,000 requests/min (300 req/s), declared; concurrency alone would allow 640 req/s.
    - tokens-bound: 12,000,000 tokens/min (200,000 tokens/s), declared, over heavy-tailed (lognormal) prompts;
      the ceiling is the token rate divided by the mean tokens per call as the server charges them
      (prompt + completion), about 130 req/s for this workload (see `rcarun.bench.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rcarun.mock import MockConfig

__all__ = ["SCENARIO_NAMES", "PromptSizes", "Scenario", "get_scenario", "scenarios"]

SCENARIO_NAMES = ("latency-bound", "requests-bound", "tokens-bound")

# Seconds of quota a bucket holds, on both sides: a small burst, as providers allow.
_BURST_S = 1.0
_LATENCY_S = 0.05
_CONCURRENCY = 32
_LATENCY_BOUND_LATENCY_S = 0.1
_LATENCY_BOUND_CONCURRENCY = 64


@dataclass(frozen=True, slots=True)
class PromptSizes:
    """How many characters of step content each trajectory holds (the prompt adds a fixed template).

    Attributes:
        kind: "uniform" draws from [low, high]; "lognormal" draws exp(N(ln median, sigma)) clipped to
            [low, high] — a heavy right tail like real agent logs, where a few trajectories are huge.
        median: median characters (lognormal only).
        sigma: log-space standard deviation (lognormal only).
        low / high: bounds in characters.
    """

    kind: Literal["uniform", "lognormal"]
    low: int
    high: int
    median: float = 0.0
    sigma: float = 0.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """One benchmark scenario.

    Attributes:
        name: "latency-bound", "requests-bound" or "tokens-bound".
        binding: the limit that should bind: "latency", "requests" or "tokens".
        calls: calls in the workload (one trajectory per call).
        concurrency: calls every client may have in flight.
        latency_s: the simulator's answer time per accepted request, in seconds.
        rpm / tpm: limits the simulator enforces and every client is told; None for none.
        burst_s: seconds of quota the buckets hold (server and clients alike).
        sizes: prompt content sizes.
        seed: seeds the workload (sizes and texts) and the simulator.
    """

    name: str
    binding: Literal["latency", "requests", "tokens"]
    calls: int
    concurrency: int
    latency_s: float
    rpm: int | None
    tpm: int | None
    burst_s: float
    sizes: PromptSizes
    seed: int

    @property
    def requests_per_s(self) -> float | None:
        return self.rpm / 60.0 if self.rpm is not None else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tpm / 60.0 if self.tpm is not None else None

    def mock_config(self) -> MockConfig:
        """The simulator for this scenario: fixed latency, the declared limits, OpenAI-style headers."""
        return MockConfig(
            model="sim-bench",
            seed=self.seed,
            latency_s=self.latency_s,
            rpm=self.rpm,
            tpm=self.tpm,
            burst_s=self.burst_s,
            headers="openai",
        )


_SMALL_PROMPTS = PromptSizes(kind="uniform", low=600, high=1_000)
# Median 2,400 characters, sigma 1: mean about 4,000, 1 trajectory in 100 above 24,000 (clipped at 60,000,
# so no single call comes near the simulator's per-minute token limit, which would make it unservable).
_HEAVY_TAILED_PROMPTS = PromptSizes(kind="lognormal", low=200, high=60_000, median=2_400.0, sigma=1.0)


def scenarios(quick: bool) -> tuple[Scenario, ...]:
    """All three scenarios: about 10 s of work per client at the ceiling, or about 2 s with ``quick``."""
    return (
        Scenario(
            name="latency-bound",
            binding="latency",
            calls=1_280 if quick else 6_400,
            concurrency=_LATENCY_BOUND_CONCURRENCY,
            latency_s=_LATENCY_BOUND_LATENCY_S,
            rpm=None,
            tpm=None,
            burst_s=_BURST_S,
            sizes=_SMALL_PROMPTS,
            seed=101,
        ),
        Scenario(
            name="requests-bound",
            binding="requests",
            # The first ~600 calls ride on the 1-s burst and fall outside the steady window; add them.
            calls=1_000 if quick else 3_600,
            concurrency=_CONCURRENCY,
            latency_s=_LATENCY_S,
            rpm=18_000,
            tpm=None,
            burst_s=_BURST_S,
            sizes=_SMALL_PROMPTS,
            seed=102,
        ),
        Scenario(
            name="tokens-bound",
            binding="tokens",
            calls=400 if quick else 1_450,
            concurrency=_CONCURRENCY,
            latency_s=_LATENCY_S,
            rpm=None,
            tpm=12_000_000,
            burst_s=_BURST_S,
            sizes=_HEAVY_TAILED_PROMPTS,
            seed=103,
        ),
    )


def get_scenario(name: str, quick: bool) -> Scenario:
    """The scenario called ``name``.

    Raises:
        ValueError: no scenario has that name.
    """
    for scenario in scenarios(quick):
        if scenario.name == name:
            return scenario
    raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIO_NAMES)}")
