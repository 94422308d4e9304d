"""Every benchmark scenario, each named by what binds it, with ceilings two cores can serve.

A scenario fixes everything the clients must agree on: what the server enforces, what the clients are told, the
concurrency they may use, the workload's size and prompt sizes. Every client runs it against the same server
process, so a difference in the results is a difference between clients. The ceiling is what the *server*
allows (`rcarun_bench.metrics.nominal_ceiling_rps`). The scenarios and their ceilings are tabled in
benchmarks/README.md; the window scenarios (against `rcarun_bench.window_server`) in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rcarun.mock import MockConfig

__all__ = [
    "SCENARIO_NAMES",
    "SIGNALS",
    "Metering",
    "PromptSizes",
    "Scenario",
    "Signal",
    "WindowConfig",
    "get_scenario",
    "scenarios",
]

Signal = Literal["openai-headers", "retry-after", "both", "bare", "overload-503"]
"""How the window server signals a refusal (`rcarun_bench.window_server`)."""
SIGNALS: tuple[Signal, ...] = ("openai-headers", "retry-after", "both", "bare", "overload-503")
Metering = Literal["usage", "max_tokens"]
"""How the window server charges a request's tokens at arrival (`rcarun_bench.window_server`)."""

SCENARIO_NAMES = (
    "latency-bound",
    "streaming",
    "latency-bound-contended",
    "requests-bound",
    "tokens-bound",
    "429-storm",
    "length-retries",
    "concurrency-cap",
    "vllm-queue",
    "fairness",
    "large-scale",
    "window-requests",
    "window-undeclared",
    "window-undeclared-retry-after",
    "window-undeclared-both",
    "window-undeclared-bare",
    "window-undeclared-503",
    "window-tokens",
    "window-tokens-ratio",
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
# The window scenarios: a provider's minute (10 s with --quick), answers in half a second, 32 in flight.
_WINDOW_S = 60.0
_QUICK_WINDOW_S = 10.0
_WINDOW_LATENCY_S = 0.5
# Windows of the server's limit each run holds (module docstring).
_WINDOW_RUN_WINDOWS = 2.1


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
class WindowConfig:
    """How the window server behaves.

    Attributes:
        rpm / tpm: requests and tokens per minute (None: no such limit).
        window_s: the sliding window's length; it admits ``rpm × window_s / 60`` requests.
        latency_s: the answer time of every accepted request.
        metering: how a request's tokens are charged at arrival ("usage" or "max_tokens").
        chars_per_token: characters per token, prompt and answer alike, as this server counts them.
        signal: how a refusal is signalled (benchmarks/README.md, "The window server").
        model: the model name answers report.
    """

    rpm: int | None = None
    tpm: int | None = None
    window_s: float = 60.0
    latency_s: float = 0.05
    metering: Metering = "usage"
    chars_per_token: float = 4.0
    signal: Signal = "openai-headers"
    model: str = "window-bench"

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.latency_s < 0 or self.chars_per_token <= 0:
            raise ValueError("window_s and chars_per_token must be positive and latency_s not negative")
        for name, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and value * self.window_s / 60 < 1:
                raise ValueError(f"{name}={value} admits less than one per {self.window_s:g}-s window")
        if self.signal not in SIGNALS:
            raise ValueError(f"unknown signal {self.signal!r}; known: {', '.join(SIGNALS)}")
        if self.metering not in ("usage", "max_tokens"):
            raise ValueError(f"unknown metering {self.metering!r}; known: usage, max_tokens")

    @property
    def requests_per_window(self) -> int | None:
        return None if self.rpm is None else math.floor(self.rpm * self.window_s / 60)

    @property
    def tokens_per_window(self) -> int | None:
        return None if self.tpm is None else math.floor(self.tpm * self.window_s / 60)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> WindowConfig:
        return cls(**values)


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
        headline: the metric the scenario exists for ("throughput", "storm", "length", "fairness", "scale",
            "window").
        skip_clients: clients that sit this scenario out (each with its reason where the scenario is defined);
            ``rcarun-unstreamed`` sits out every scenario but those that name the clients they skip (what
            streaming costs is measured where answers are long, not repeated everywhere).
        server: "simulator" (`rcarun.mock`) or "window" (`rcarun_bench.window_server`).
        provider: rcarun's backbone preset, and the preset every client's request bodies are built with.
        window_s / signal / metering / server_chars_per_token: the window server's window length, how it
            signals a refusal, how it charges tokens at arrival and its characters per prompt token.
        server_tpm: what the server enforces when it differs from the declared ``tpm``.
        cpu_burners: processes that spin on the CPU for the whole of each client's run (each takes a core from
            the client and the server: on a 2-core machine, one leaves them a core between them).
        reasoning_tokens / latency_per_token_s / tokens_per_chunk: the simulator's thinking tokens per answer,
            seconds per generated token and tokens per streamed chunk (long answers, for the streaming scenario).
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
    headline: Literal["throughput", "storm", "length", "fairness", "scale", "window"] = "throughput"
    skip_clients: tuple[str, ...] = ("rcarun-unstreamed",)
    server: Literal["simulator", "window"] = "simulator"
    provider: str = "simulated"
    window_s: float = _WINDOW_S
    signal: Signal = "openai-headers"
    metering: Metering = "usage"
    server_chars_per_token: float = 4.0
    server_tpm: int | None = None
    cpu_burners: int = 0
    reasoning_tokens: int = 0
    latency_per_token_s: float = 0.0
    tokens_per_chunk: int = 1

    @property
    def answer_s(self) -> float:
        """The simulator's answer time per call, thinking tokens included (the answer's own few are not)."""
        return self.latency_s + self.latency_per_token_s * self.reasoning_tokens

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

    @property
    def server_tokens_per_s(self) -> float | None:
        """The token rate the server enforces."""
        tpm = self.server_tpm if self.server_tpm is not None else self.tpm
        return tpm / 60.0 if tpm is not None else None

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
            reasoning_tokens=self.reasoning_tokens,
            latency_per_token_s=self.latency_per_token_s,
            tokens_per_chunk=self.tokens_per_chunk,
        )

    def window_config(self) -> WindowConfig:
        """The window server for this scenario: its limits, window, latency, metering and signalling."""
        return WindowConfig(
            rpm=self.server_rpm if self.server_rpm is not None else self.rpm,
            tpm=self.server_tpm if self.server_tpm is not None else self.tpm,
            window_s=self.window_s,
            latency_s=self.latency_s,
            metering=self.metering,
            chars_per_token=self.server_chars_per_token,
            signal=self.signal,
            model="sim-bench",
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
    return (*_simulator_scenarios(quick), *_window_scenarios(quick))


def _simulator_scenarios(quick: bool) -> tuple[Scenario, ...]:
    """The scenarios against the simulator (module docstring)."""
    # 64 in flight at 100 ms (latency-bound and its kin), 32 at 50 ms (where a limit binds).
    unlimited: dict[str, Any] = {
        "concurrency": _LATENCY_BOUND_CONCURRENCY,
        "latency_s": _LATENCY_BOUND_LATENCY_S,
        "sizes": _SMALL_PROMPTS,
    }
    limited: dict[str, Any] = {"concurrency": _CONCURRENCY, "latency_s": _LATENCY_S}
    slots: dict[str, Any] = {
        "binding": "slots",
        "calls": 160 if quick else 3_200,
        "latency_s": _LATENCY_BOUND_LATENCY_S,
        "sizes": _SMALL_PROMPTS,
        "max_concurrency": _SLOTS,
        "headers": "none",
    }
    latency_bound = Scenario(
        name="latency-bound", binding="latency", calls=320 if quick else 6_400, seed=101, **unlimited
    )
    return (
        latency_bound,
        # Thinking answers streamed token by token as providers stream them, 60 tokens a second each: 320 calls
        # of 600 tokens in flight, about 19,000 streamed tokens a second in all. rcarun streamed against rcarun
        # unstreamed: what a streamed token costs. The peers send unstreamed requests, so they sit it out.
        Scenario(
            name="streaming",
            binding="latency",
            calls=64 if quick else 960,
            concurrency=320,
            latency_s=0.05,
            sizes=_SMALL_PROMPTS,
            seed=111,
            reasoning_tokens=60 if quick else 600,  # quick: a second a call
            latency_per_token_s=1 / 60,
            skip_clients=("naive-gather", "aiolimiter-loop", "litellm-router"),
        ),
        # The same, with one core taken by a process that spins: what a shared machine (a notebook, a CI
        # runner, another job) leaves a client. A client's CPU per call is what decides it.
        dataclasses.replace(latency_bound, name="latency-bound-contended", cpu_burners=1),
        # The first ~600 calls ride on the 1-s burst and fall outside the steady window; add them.
        Scenario(
            name="requests-bound",
            binding="requests",
            calls=300 if quick else 3_600,
            rpm=18_000,
            sizes=_SMALL_PROMPTS,
            seed=102,
            **limited,
        ),
        Scenario(
            name="tokens-bound",
            binding="tokens",
            calls=120 if quick else 1_450,
            tpm=12_000_000,
            sizes=_HEAVY_TAILED_PROMPTS,
            seed=103,
            **limited,
        ),
        # 25 s at the server's 210 req/s (2 s with quick): 15 s after the first 10 to measure the tail in.
        Scenario(
            name="429-storm",
            binding="requests",
            calls=420 if quick else 5_250,
            rpm=18_000,
            sizes=_SMALL_PROMPTS,
            seed=104,
            server_rpm=round(18_000 * _STORM_SERVER_FRACTION),
            settle_after_s=1.0 if quick else 10.0,
            headline="storm",
            **limited,
        ),
        # Enough length retries that a call cut four times running (1 in 625) still gets its answer.
        Scenario(
            name="length-retries",
            binding="latency",
            calls=320 if quick else 3_200,
            seed=105,
            length_rate=0.2,
            length_retries=4,
            headline="length",
            **unlimited,
        ),
        Scenario(name="concurrency-cap", concurrency=_SLOTS, seed=106, **slots),
        Scenario(
            name="vllm-queue", concurrency=2 * _SLOTS, seed=107, keepalive_s=_SILENT_KEEPALIVE_S, **slots
        ),
        Scenario(
            name="fairness",
            binding="tokens",
            calls=120 if quick else 1_500,
            tpm=12_000_000,
            sizes=_HEAVIER_TAILED_PROMPTS,
            seed=108,
            headline="fairness",
            **limited,
        ),
        # At 3 ms of CPU per call (the openai SDK on httpx) 100,000 calls take naive-gather over five minutes
        # on two cores, longer than the rest of the benchmark together; LiteLLM's Router spends several times
        # that per call.
        Scenario(
            name="large-scale",
            binding="latency",
            calls=500 if quick else 100_000,
            seed=109,
            realizations=100,
            headline="scale",
            skip_clients=("rcarun-unstreamed", "naive-gather", "litellm-router"),
            **unlimited,
        ),
    )


def _window_calls(limit_per_min: float, cost_per_call: float, window_s: float) -> int:
    """Calls that hold `_WINDOW_RUN_WINDOWS` windows of a server limit, each call costing ``cost_per_call``."""
    return math.ceil(_WINDOW_RUN_WINDOWS * math.floor(limit_per_min * window_s / 60) / cost_per_call)


def _window_scenarios(quick: bool) -> tuple[Scenario, ...]:
    """The scenarios against the strict sliding-window server (module docstring)."""
    window_s = _QUICK_WINDOW_S if quick else _WINDOW_S
    common: dict[str, Any] = {
        "concurrency": _CONCURRENCY,
        "latency_s": _WINDOW_LATENCY_S,
        "sizes": _SMALL_PROMPTS,
        "server": "window",
        "window_s": window_s,
        "headline": "window",
    }
    undeclared: dict[str, Any] = {
        **common,
        "binding": "requests",
        "calls": _window_calls(200, 1, window_s),
        "rpm": 400,
        "server_rpm": 200,
    }
    # Tokens a call costs as the servers meter them (prompts of this workload: 650 tokens at 4 characters a
    # token, 860 at 3; answers 56 and 74): prompt + max_tokens (8,000) at arrival; prompt + answer at 3.
    max_tokens_call = 650 + 8_000
    ratio_call = 860 + 74
    return (
        Scenario(
            name="window-requests",
            binding="requests",
            calls=_window_calls(300, 1, window_s),
            rpm=300,
            seed=201,
            provider="openai",
            **common,
        ),
        Scenario(name="window-undeclared", seed=202, provider="openai", **undeclared),
        Scenario(
            name="window-undeclared-retry-after",
            seed=203,
            provider="openai-compatible",
            signal="retry-after",
            **undeclared,
        ),
        Scenario(name="window-undeclared-both", seed=204, provider="openai", signal="both", **undeclared),
        Scenario(
            name="window-undeclared-bare", seed=205, provider="openai-compatible", signal="bare", **undeclared
        ),
        Scenario(
            name="window-undeclared-503", seed=206, provider="kimi", signal="overload-503", **undeclared
        ),
        Scenario(
            name="window-tokens",
            binding="tokens",
            calls=_window_calls(1_200_000, max_tokens_call, window_s),
            tpm=1_200_000,
            seed=207,
            provider="openai",
            metering="max_tokens",
            **common,
        ),
        Scenario(
            name="window-tokens-ratio",
            binding="tokens",
            calls=_window_calls(280_000, ratio_call, window_s),
            tpm=280_000,
            seed=208,
            provider="openai-compatible",
            server_chars_per_token=3.0,
            **common,
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
