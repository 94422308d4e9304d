"""Every benchmark scenario, each named by what binds it, with ceilings two cores can serve.

A scenario fixes everything the clients must agree on: what the simulator enforces, what the clients are told
(usually the same limits, declared), the concurrency every client may use, how many calls make up the workload
and how large their prompts are. Every client runs the same scenario against the same simulator process, so a
difference in the results is a difference between clients.

The ceiling is always what the *server* allows (`rcarun.bench.metrics.nominal_ceiling_rps`): the server's
concurrency (the clients' when the server has no cap) / latency, capped by the server's request and token
rates. Ceilings stay within what this 2-core machine serves with client and server together (about 1,000
req/s):
    - latency-bound: no limits; 64 / 0.1 s = 640 req/s. The 100-ms latency (the limited scenarios use 50 ms)
      keeps the fixed cost of a loopback round trip on two shared cores (the simulator's request handling,
      TCP, timer granularity: about 2.5 ms per call, whatever the client) from dominating a ratio that is
      meant to measure the client. Real provider latencies are seconds.
    - requests-bound: 18,000 requests/min (300 req/s), declared; concurrency alone would allow 640 req/s.
    - tokens-bound: 12,000,000 tokens/min (200,000 tokens/s), declared, over heavy-tailed (lognormal) prompts;
      the token rate divided by the mean tokens per call as the server charges them, about 130 req/s.
    - 429-storm: the clients are told 18,000 requests/min but the server enforces 12,600 (30 % less): the
      ceiling is the server's 210 req/s, and what matters is how fast a client stops provoking 429s.
    - length-retries: no limits; 20 % of accepted requests are cut with finish_reason "length"
      (`MockConfig.length_rate`); the ceiling counts attempts (a truncated answer is work the server did).
    - concurrency-cap: a DeepSeek-style cap of 32 generating requests, the rest queued FIFO with keep-alive
      blank lines, no rate limits, no rate-limit headers; the clients are told the cap. 32 / 0.1 s = 320 req/s.
    - vllm-queue: a vLLM-style server with 32 generation slots and a queue, no 429s at all; the clients are
      told only that they may keep 64 requests open, not the slot count. 32 / 0.1 s = 320 req/s.
    - fairness: tokens-bound with a heavier tail (sigma 1.3), where a limiter that lets light calls overtake
      heavy ones would starve the longest prompts; its headline is the queueing-delay ratio.
    - large-scale: 1,000 trajectories x 100 realizations = 100,000 queued items (500 with --quick), no
      limits, 64 / 0.1 s = 640 req/s as latency-bound (a rate two cores sustain with the simulator, so that
      memory and loop lag are those of a long sweep, not of a starved CPU); its headline is peak RSS and
      event-loop lag.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal

from rcarun.mock import MockConfig

__all__ = ["SCENARIO_NAMES", "PromptSizes", "Scenario", "get_scenario", "scenarios"]

SCENARIO_NAMES = (
    "latency-bound",
    "requests-bound",
    "tokens-bound",
    "429-storm",
    "length-retries",
    "concurrency-cap",
    "vllm-queue",
    "fairness",
    "large-scale",
)

# Seconds of quota a bucket holds, on both sides: a small burst, as providers allow.
_BURST_S = 1.0
_LATENCY_S = 0.05
_CONCURRENCY = 32
_LATENCY_BOUND_LATENCY_S = 0.1
_LATENCY_BOUND_CONCURRENCY = 64
# The storm's server enforces this fraction of the declared limit ("30 % below what the clients are told").
_STORM_SERVER_FRACTION = 0.7
_SLOTS = 32
# Long enough that a vLLM-style queue never writes a keep-alive line: vLLM sends nothing while a request waits.
_SILENT_KEEPALIVE_S = 600.0


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
        name: one of `SCENARIO_NAMES`.
        binding: what should bind: "latency", "requests", "tokens" (the server's rates) or "slots" (the
            server's concurrency cap).
        calls: calls in the workload (trajectories x realizations; one call per item unless truncated).
        concurrency: calls every client may have in flight (what the clients are told).
        latency_s: the simulator's answer time per accepted request, in seconds.
        sizes: prompt content sizes.
        seed: seeds the workload (sizes and texts) and the simulator.
        rpm / tpm: limits every client is told (declared); None for none.
        burst_s: seconds of quota the buckets hold (server and clients alike).
        server_rpm: what the server enforces when it differs from the declared ``rpm`` (the 429 storm).
        max_concurrency: the server's generation slots (None for no cap); requests beyond them queue.
        keepalive_s: interval of the blank lines a queued request receives.
        headers: which rate-limit headers the server sends ("none" like DeepSeek).
        length_rate: fraction of accepted requests the server cuts with finish_reason "length".
        length_retries: length retries every retrying client allows per call (rcarun's stage setting).
        realizations: times each trajectory is run (items = trajectories x realizations).
        settle_after_s: where the 429-storm's "after the first seconds" starts, from the first request sent.
        headline: the metric the scenario exists for ("throughput", "storm", "length", "fairness", "scale").
        skip_clients: clients that sit this scenario out (each with its reason where the scenario is defined).
    """

    name: str
    binding: Literal["latency", "requests", "tokens", "slots"]
    calls: int
    concurrency: int
    latency_s: float
    sizes: PromptSizes
    seed: int
    rpm: int | None = None
    tpm: int | None = None
    burst_s: float = _BURST_S
    server_rpm: int | None = None
    max_concurrency: int | None = None
    keepalive_s: float = 0.5
    headers: Literal["openai", "none"] = "openai"
    length_rate: float = 0.0
    length_retries: int = 1
    realizations: int = 1
    settle_after_s: float = 10.0
    headline: Literal["throughput", "storm", "length", "fairness", "scale"] = "throughput"
    skip_clients: tuple[str, ...] = ()

    @property
    def trajectories(self) -> int:
        return self.calls // self.realizations

    @property
    def requests_per_s(self) -> float | None:
        """The declared request rate (what the clients are told)."""
        return self.rpm / 60.0 if self.rpm is not None else None

    @property
    def tokens_per_s(self) -> float | None:
        """The declared token rate (what the clients are told)."""
        return self.tpm / 60.0 if self.tpm is not None else None

    @property
    def server_requests_per_s(self) -> float | None:
        """The request rate the server enforces."""
        rpm = self.server_rpm if self.server_rpm is not None else self.rpm
        return rpm / 60.0 if rpm is not None else None

    def to_json(self) -> str:
        """The scenario as JSON: how it reaches the client's process, resized or not."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        values: dict[str, Any] = json.loads(text)
        return cls(
            **{
                **values,
                "sizes": PromptSizes(**values["sizes"]),
                "skip_clients": tuple(values["skip_clients"]),
            }
        )

    def mock_config(self) -> MockConfig:
        """The simulator for this scenario: fixed latency, the server's limits, slots and truncations."""
        return MockConfig(
            model="sim-bench",
            seed=self.seed,
            latency_s=self.latency_s,
            rpm=self.server_rpm if self.server_rpm is not None else self.rpm,
            tpm=self.tpm,
            burst_s=self.burst_s,
            max_concurrency=self.max_concurrency,
            over_concurrency="queue",
            keepalive_s=self.keepalive_s,
            headers=self.headers,
            length_rate=self.length_rate,
        )


_SMALL_PROMPTS = PromptSizes(kind="uniform", low=600, high=1_000)
# Median 2,400 characters, sigma 1: mean about 4,000, 1 trajectory in 100 above 24,000 (clipped at 60,000,
# so no single call comes near the simulator's per-minute token limit, which would make it unservable).
_HEAVY_TAILED_PROMPTS = PromptSizes(kind="lognormal", low=200, high=60_000, median=2_400.0, sigma=1.0)
# Median 1,600, sigma 1.3: the top decile is about 8 times the median, the longest near the 60,000 clip.
_HEAVIER_TAILED_PROMPTS = PromptSizes(kind="lognormal", low=200, high=60_000, median=1_600.0, sigma=1.3)


def scenarios(quick: bool) -> tuple[Scenario, ...]:
    """Every scenario: about 10 s of work per client at the ceiling (the storm 25 s, large-scale about 100 s),
    or about a second with ``quick``."""
    return (
        Scenario(
            name="latency-bound",
            binding="latency",
            calls=320 if quick else 6_400,
            concurrency=_LATENCY_BOUND_CONCURRENCY,
            latency_s=_LATENCY_BOUND_LATENCY_S,
            sizes=_SMALL_PROMPTS,
            seed=101,
        ),
        Scenario(
            name="requests-bound",
            binding="requests",
            # The first ~600 calls ride on the 1-s burst and fall outside the steady window; add them.
            calls=300 if quick else 3_600,
            concurrency=_CONCURRENCY,
            latency_s=_LATENCY_S,
            rpm=18_000,
            sizes=_SMALL_PROMPTS,
            seed=102,
        ),
        Scenario(
            name="tokens-bound",
            binding="tokens",
            calls=120 if quick else 1_450,
            concurrency=_CONCURRENCY,
            latency_s=_LATENCY_S,
            tpm=12_000_000,
            sizes=_HEAVY_TAILED_PROMPTS,
            seed=103,
        ),
        Scenario(
            name="429-storm",
            binding="requests",
            # 25 s at the server's 210 req/s (2 s with quick): 15 s after the first 10 to measure the tail in.
            calls=420 if quick else 5_250,
            concurrency=_CONCURRENCY,
            latency_s=_LATENCY_S,
            rpm=18_000,
            sizes=_SMALL_PROMPTS,
            seed=104,
            server_rpm=round(18_000 * _STORM_SERVER_FRACTION),
            settle_after_s=1.0 if quick else 10.0,
            headline="storm",
        ),
        Scenario(
            name="length-retries",
            binding="latency",
            calls=320 if quick else 3_200,
            concurrency=_LATENCY_BOUND_CONCURRENCY,
            latency_s=_LATENCY_BOUND_LATENCY_S,
            sizes=_SMALL_PROMPTS,
            seed=105,
            length_rate=0.2,
            # Enough that a call cut four times running (1 in 625) still gets its answer.
            length_retries=4,
            headline="length",
        ),
        Scenario(
            name="concurrency-cap",
            binding="slots",
            calls=160 if quick else 3_200,
            concurrency=_SLOTS,
            latency_s=_LATENCY_BOUND_LATENCY_S,
            sizes=_SMALL_PROMPTS,
            seed=106,
            max_concurrency=_SLOTS,
            headers="none",
        ),
        Scenario(
            name="vllm-queue",
            binding="slots",
            calls=160 if quick else 3_200,
            concurrency=2 * _SLOTS,
            latency_s=_LATENCY_BOUND_LATENCY_S,
            sizes=_SMALL_PROMPTS,
            seed=107,
            max_concurrency=_SLOTS,
            keepalive_s=_SILENT_KEEPALIVE_S,
            headers="none",
        ),
        Scenario(
            name="fairness",
            binding="tokens",
            calls=120 if quick else 1_500,
            concurrency=_CONCURRENCY,
            latency_s=_LATENCY_S,
            tpm=12_000_000,
            sizes=_HEAVIER_TAILED_PROMPTS,
            seed=108,
            headline="fairness",
        ),
        Scenario(
            name="large-scale",
            binding="latency",
            calls=500 if quick else 100_000,
            concurrency=_LATENCY_BOUND_CONCURRENCY,
            latency_s=_LATENCY_BOUND_LATENCY_S,
            sizes=_SMALL_PROMPTS,
            seed=109,
            realizations=100,
            headline="scale",
            # At 3 ms of CPU per call (the openai SDK on httpx) 100,000 calls take naive-gather over five
            # minutes on two cores, longer than the rest of the benchmark together.
            skip_clients=("naive-gather",),
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
