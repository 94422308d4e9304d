"""What one client run measured, and the one definition of achieved throughput that every client is held to.

Steady-state rate. A run starts with a ramp (the first answers take one latency to come back, and a declared
limit's bucket starts full, so a burst goes through at once) and ends with a drain (the last calls finishing one
by one). Neither says how fast the client goes. So, with the successful calls' completion times sorted, the
steady window ends at the completion of the call 10 % from the end and starts at the later of
    - the completion of the call 10 % from the start, and
    - when a declared limit binds: the completion of the first call at which the simulator's bucket, replayed
      from the send time and charge of every accepted call (capacity B = burst_s seconds of quota, refilled at
      the limit's rate r), is within 5 % of B of its lowest level in the run,
and ``achieved_rps`` = calls completed inside the window / its length in seconds. The second rule keeps the
initial burst out of the window, whatever the client's speed: calls counted = r·T + (level at the start − level
at the end), so the rate can exceed the limit by at most 0.05·B/T (0.5 % of r over a 10-s window at burst_s = 1).
Every client is measured with exactly this rule, from times taken the same way: just before the request is
sent and when its response has been read (for rcarun, the ``started_at`` and ``ended_at`` of its own ``calls``
rows, which bracket exactly the backend call).

Ceilings. Latency-bound: concurrency / latency. Requests-bound: the declared requests per second.
Tokens-bound: the declared tokens per second divided by the mean tokens per call *of the calls completed in the
window*, as the server charged them (prompt + completion, read back from each response's ``usage``, which is
the simulator's own count). Heavy-tailed prompts make the mean of any subset of calls noisy; dividing by the
mean of the very calls counted makes ``ratio`` exactly "tokens per second achieved / tokens per second allowed".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .scenarios import Scenario

__all__ = [
    "Allowance",
    "ClientRun",
    "Completion",
    "ResultRow",
    "SteadyWindow",
    "allowance",
    "nominal_ceiling_rps",
    "steady_window",
]

_HEAD_FRACTION = 0.1
_TAIL_FRACTION = 0.1
# Fraction of the bucket's capacity within which its replayed level counts as "at its lowest".
_DRAIN_TOLERANCE = 0.05


@dataclass(frozen=True, slots=True)
class Completion:
    """One successful call (its last, accepted attempt).

    Attributes:
        sent: when the request went out, in seconds on a clock shared within the run.
        at: when its answer had been read, on the same clock.
        tokens: tokens the server charged for it (prompt + completion, from the response's usage).
    """

    sent: float
    at: float
    tokens: int


@dataclass(frozen=True, slots=True)
class SteadyWindow:
    """The steady part of a run.

    Attributes:
        calls: completions inside the window (after the head, up to and including the last counted one).
        seconds: the window's length.
        tokens: tokens charged for those calls (prompt + completion, the server's count).
    """

    calls: int
    seconds: float
    tokens: int

    @property
    def rps(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.calls if self.calls else 0.0


def nominal_ceiling_rps(scenario: Scenario, mean_tokens: float | None = None) -> float:
    """The physical ceiling: concurrency / latency, capped by the declared request and token rates.

    Args:
        mean_tokens: mean tokens per call as the server charges them; needed when a token limit is declared.
    """
    ceiling = scenario.concurrency / scenario.latency_s
    if scenario.requests_per_s is not None:
        ceiling = min(ceiling, scenario.requests_per_s)
    if scenario.tokens_per_s is not None:
        if not mean_tokens:
            raise ValueError("a token-limited ceiling needs the mean tokens per call")
        ceiling = min(ceiling, scenario.tokens_per_s / mean_tokens)
    return ceiling


@dataclass(frozen=True, slots=True)
class Allowance:
    """A declared limit as the server's bucket sees it.

    Attributes:
        rate_per_s: units refilled per second.
        burst: units the full bucket holds at the start.
        tokens: True when the unit is tokens, False when it is requests.
    """

    rate_per_s: float
    burst: float
    tokens: bool


def allowance(scenario: Scenario) -> Allowance | None:
    """The scenario's binding declared limit (None when nothing is declared)."""
    if scenario.tokens_per_s is not None:
        return Allowance(scenario.tokens_per_s, scenario.tokens_per_s * scenario.burst_s, tokens=True)
    if scenario.requests_per_s is not None:
        return Allowance(scenario.requests_per_s, scenario.requests_per_s * scenario.burst_s, tokens=False)
    return None


def steady_window(completions: Sequence[Completion], limit: Allowance | None) -> SteadyWindow:
    """The steady window of a run (rule in the module docstring).

    Args:
        completions: every successful call, in any order.
        limit: the binding declared limit, if any.
    """
    n = len(completions)
    by_completion = sorted(completions, key=lambda c: c.at)
    head = math.ceil(_HEAD_FRACTION * n)
    last = n - 1 - math.floor(_TAIL_FRACTION * n)
    if n < 3 or head >= last:
        return SteadyWindow(calls=0, seconds=0.0, tokens=0)
    starts_at = by_completion[head].at
    ends_at = by_completion[last].at
    if limit is not None:
        drained = _burst_drained(completions, limit, upto=ends_at)
        if drained is not None:
            starts_at = max(starts_at, drained)
    counted = [c for c in by_completion if starts_at < c.at <= ends_at]
    return SteadyWindow(
        calls=len(counted),
        seconds=max(0.0, ends_at - starts_at),
        tokens=sum(c.tokens for c in counted),
    )


def _burst_drained(completions: Sequence[Completion], limit: Allowance, upto: float) -> float | None:
    """Completion time of the first call after which the replayed bucket is within tolerance of its lowest."""
    by_send = sorted((c for c in completions if c.at <= upto), key=lambda c: c.sent)
    if not by_send:
        return None
    level = limit.burst
    previous = by_send[0].sent
    levels: list[float] = []
    for call in by_send:
        level = min(limit.burst, level + limit.rate_per_s * (call.sent - previous))
        previous = call.sent
        level -= call.tokens if limit.tokens else 1
        levels.append(level)
    threshold = min(levels) + _DRAIN_TOLERANCE * limit.burst
    first = next(index for index, value in enumerate(levels) if value <= threshold)
    return by_send[first].at


@dataclass(frozen=True, slots=True)
class ClientRun:
    """What a client's own process reports about one run (one JSON line from ``rcarun.bench.client``).

    Attributes:
        calls: successful calls (the workload's size when nothing failed).
        failed: calls that gave up.
        retries_429: 429 answers the client saw and retried (the server's own count is authoritative).
        wall_s: from the start of the run (dataset read included) to the last call recorded.
        cpu_s: the process's CPU time over the same span, all threads.
        peak_rss_mb: the process's peak resident set size, in MiB.
        recorded_calls: successful calls the client stored somewhere durable (rows in results.db for rcarun).
        window_calls / window_s / window_tokens: the steady window (see `steady_window`).
    """

    calls: int
    failed: int
    retries_429: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    recorded_calls: int
    window_calls: int
    window_s: float
    window_tokens: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> ClientRun:
        return cls(**values)

    @property
    def window(self) -> SteadyWindow:
        return SteadyWindow(calls=self.window_calls, seconds=self.window_s, tokens=self.window_tokens)


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One (scenario, client) line of the report; field names are the JSON keys."""

    name: str
    client: str
    calls: int
    wall_s: float
    achieved_rps: float
    ceiling_rps: float
    ratio: float
    server_429: int
    server_max_overshoot: float
    cpu_ms_per_call: float
    peak_rss_mb: float
    recorded_calls: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
