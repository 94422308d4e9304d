"""What one client run measured, and the one definition of achieved throughput that every client is held to.

The steady window leaves out the ramp and the drain (10 % of completions each, and the opening burst where a
limit binds). Without a binding limit the rate is the slope of the completions in it; with one, ``ratio`` is
the share of the server's allowance the client used, from the server's bucket replayed over the window, so it
cannot exceed 1. Ceilings are what the server allows. The rules and every row field are in
benchmarks/README.md ("Metrics", "Steady window"); the scenario-specific figures (`storm_figures`,
`delay_ratio`, `lag_summary`, `window_figures`) are defined where they are computed.
"""

from __future__ import annotations

import bisect
import math
import resource
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .scenarios import Scenario

__all__ = [
    "Allowance",
    "Arrival",
    "Attempt",
    "ClientRun",
    "Completion",
    "LagSummary",
    "QueueDelay",
    "ResultRow",
    "SteadyWindow",
    "StormFigures",
    "WindowFigures",
    "allowance",
    "allowance_used",
    "delay_ratio",
    "lag_summary",
    "nominal_ceiling_rps",
    "peak_rss_mb_now",
    "percentile",
    "steady_window",
    "storm_figures",
    "window_figures",
]

_HEAD_FRACTION = 0.1
_TAIL_FRACTION = 0.1
# Fraction of the bucket's capacity within which its replayed level counts as "at its lowest".
_DRAIN_TOLERANCE = 0.05
# The storm has settled once no window of this length (slid in steps of _SETTLE_STEP_S) holds more than
# _SETTLE_MAX_429_FRACTION of 429s among the requests sent in it.
_SETTLE_WINDOW_S = 2.0
_SETTLE_STEP_S = 0.5
_SETTLE_MAX_429_FRACTION = 0.05
# Queueing delays below this count as this much in the fairness ratio: a ratio of two tiny numbers says nothing.
_MIN_DELAY_S = 0.001


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
        unused: with a binding limit, the allowance (requests or tokens) the replayed bucket could not hold
            during the window — quota the client left on the table; None without a limit.
        slope_rps: the least-squares slope of the counted completions' running count against their completion
            times (0 with fewer than two distinct times).
    """

    calls: int
    seconds: float
    tokens: int
    unused: float | None = None
    slope_rps: float = 0.0

    @property
    def rps(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_tokens(self) -> float:
        return self.tokens / self.calls if self.calls else 0.0


def nominal_ceiling_rps(scenario: Scenario, mean_tokens: float | None = None) -> float:
    """The physical ceiling: the server's concurrency / latency, capped by the server's request and token rates.

    Args:
        mean_tokens: mean tokens per call as the server charges them; needed when a token limit is declared.
    """
    concurrency = scenario.concurrency
    if scenario.max_concurrency is not None:
        concurrency = min(concurrency, scenario.max_concurrency)
    ceiling = concurrency / scenario.answer_s
    if scenario.server_requests_per_s is not None:
        ceiling = min(ceiling, scenario.server_requests_per_s)
    if scenario.server_tokens_per_s is not None:
        if not mean_tokens:
            raise ValueError("a token-limited ceiling needs the mean tokens per call")
        ceiling = min(ceiling, scenario.server_tokens_per_s / mean_tokens)
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
    """The scenario's binding rate limit as the server enforces it (None when there is none)."""
    if scenario.server_tokens_per_s is not None:
        rate_per_s = scenario.server_tokens_per_s
        return Allowance(rate_per_s, rate_per_s * scenario.burst_s, tokens=True)
    rate = scenario.server_requests_per_s
    if rate is not None:
        return Allowance(rate, rate * scenario.burst_s, tokens=False)
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
        unused=_unused_allowance(completions, limit, starts_at, ends_at) if limit is not None else None,
        slope_rps=_completion_slope([c.at for c in counted]),
    )


def _completion_slope(times: Sequence[float]) -> float:
    """Least-squares slope of the running count (0, 1, 2, ...) against sorted completion times."""
    n = len(times)
    if n < 2:
        return 0.0
    mean_t = math.fsum(times) / n
    mean_i = (n - 1) / 2
    spread = math.fsum((t - mean_t) ** 2 for t in times)
    if spread <= 0:
        return 0.0
    return math.fsum((t - mean_t) * (i - mean_i) for i, t in enumerate(times)) / spread


def allowance_used(window: SteadyWindow, limit: Allowance | None) -> float | None:
    """The share of the server's allowance the client used in the window (module docstring); None without a
    binding limit or an empty window."""
    if limit is None or window.unused is None or window.seconds <= 0:
        return None
    return 1.0 - window.unused / (limit.rate_per_s * window.seconds)


class _ReplayedBucket:
    """The server's bucket replayed from a client's sends: full at ``start``, refilled at the limit's rate up to
    its capacity (what would overflow is counted in ``lost``), charged a request or its tokens per call."""

    __slots__ = ("level", "limit", "lost", "updated_at")

    def __init__(self, limit: Allowance, start: float) -> None:
        self.limit = limit
        self.level = limit.burst
        self.lost = 0.0
        self.updated_at = start

    def advance(self, moment: float) -> None:
        if moment > self.updated_at:
            self.level += self.limit.rate_per_s * (moment - self.updated_at)
            self.updated_at = moment
            if self.level > self.limit.burst:
                self.lost += self.level - self.limit.burst
                self.level = self.limit.burst

    def charge(self, call: Completion) -> None:
        self.advance(call.sent)
        self.level -= call.tokens if self.limit.tokens else 1


def _unused_allowance(
    completions: Sequence[Completion], limit: Allowance, starts_at: float, ends_at: float
) -> float:
    """Refill the replayed bucket lost to overflow between ``starts_at`` and ``ends_at`` (one replay)."""
    by_send = sorted(completions, key=lambda c: c.sent)
    if not by_send:
        return 0.0
    bucket = _ReplayedBucket(limit, by_send[0].sent)
    lost_at_start: float | None = None
    for call in by_send:
        if call.sent >= ends_at:
            break
        if lost_at_start is None and call.sent >= starts_at:
            bucket.advance(starts_at)
            lost_at_start = bucket.lost
        bucket.charge(call)
    if lost_at_start is None:
        bucket.advance(starts_at)
        lost_at_start = bucket.lost
    bucket.advance(ends_at)
    return bucket.lost - lost_at_start


def _burst_drained(completions: Sequence[Completion], limit: Allowance, upto: float) -> float | None:
    """Completion time of the first call after which the replayed bucket is within tolerance of its lowest."""
    by_send = sorted((c for c in completions if c.at <= upto), key=lambda c: c.sent)
    if not by_send:
        return None
    bucket = _ReplayedBucket(limit, by_send[0].sent)
    levels: list[float] = []
    for call in by_send:
        bucket.charge(call)
        levels.append(bucket.level)
    # The lowest level of the first half only: a client that reserves more than it is charged (rcarun reserves
    # each call's whole output budget and is refunded on settling) keeps a floating headroom in the replayed
    # bucket, whose lowest point over the whole run can fall anywhere — even near the end, which would shrink
    # the window to a few noisy seconds. The initial burst is spent early in any run.
    midpoint = by_send[0].sent + (by_send[-1].sent - by_send[0].sent) / 2
    early = [value for call, value in zip(by_send, levels, strict=True) if call.sent <= midpoint]
    threshold = min(early) + _DRAIN_TOLERANCE * limit.burst
    first = next(index for index, value in enumerate(levels) if value <= threshold)
    return by_send[first].at


@dataclass(frozen=True, slots=True)
class Attempt:
    """One request a client sent.

    Attributes:
        sent: when it went out (seconds, ``time.time()``'s clock).
        rate_limited: the answer was a 429.
    """

    sent: float
    rate_limited: bool


@dataclass(frozen=True, slots=True)
class StormFigures:
    """How a client came through a 429 storm.

    Attributes:
        late_429_per_request: 429s among the requests sent at least ``settle_after_s`` after the first request,
            divided by those requests (0 when none were sent then).
        settle_s: seconds from the first request to the end of the last *stormy* window: windows of
            ``_SETTLE_WINDOW_S`` (2 s), half-open [start, start + 2 s), start every ``_SETTLE_STEP_S`` (0.5 s)
            from the first request, the last being the first one that reaches past the last request; a window
            is stormy when more than ``_SETTLE_MAX_429_FRACTION`` (5 %) of the requests sent in it got a 429.
            0 when no window was stormy; None when the last window still was (the client never settled).
    """

    late_429_per_request: float
    settle_s: float | None


def storm_figures(attempts: Sequence[Attempt], settle_after_s: float) -> StormFigures:
    """The storm's figures (definitions in `StormFigures`)."""
    if not attempts:
        return StormFigures(late_429_per_request=0.0, settle_s=0.0)
    sent = sorted(attempts, key=lambda a: a.sent)
    first, last = sent[0].sent, sent[-1].sent
    late = [a for a in sent if a.sent - first >= settle_after_s]
    late_429 = sum(a.rate_limited for a in late) / len(late) if late else 0.0
    times = [a.sent - first for a in sent]
    rejected_before = [0]
    for attempt in sent:
        rejected_before.append(rejected_before[-1] + attempt.rate_limited)
    span = last - first
    settle = 0.0
    start = 0.0
    while True:
        end = start + _SETTLE_WINDOW_S
        low, high = bisect.bisect_left(times, start), bisect.bisect_left(times, end)
        rejected = rejected_before[high] - rejected_before[low]
        stormy = rejected > _SETTLE_MAX_429_FRACTION * (high - low)
        if stormy:
            settle = min(end, span)
        if end > span:
            break
        start += _SETTLE_STEP_S
    return StormFigures(late_429_per_request=late_429, settle_s=None if stormy else settle)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One chat request as the window server counted it (`rcarun_bench.window_server`).

    Attributes:
        at: seconds since the first arrival after the server's reset.
        status: 200 (accepted), 429 or 503 (refused).
        tokens: the tokens metered for it at arrival (charged to the window only when accepted).
    """

    at: float
    status: int
    tokens: int


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """A client's run against the window server, from the server's log alone. Every span is a fraction of the
    server's window W, so that a shorter window (``--quick``) scales them all; the values at W = 60 s are given.

    Attributes:
        goodput: requests (or, when tokens bind, metered tokens) accepted with arrival in [W/3, 4W/3) =
            [20, 80) s, over what the limit allows in that span. A strict window admits at most its limit in
            any W seconds, so 1 is the most.
        refused: every refusal (429 or 503) the server sent.
        first_refusal_s: arrival time of the first refusal; None when there was none.
        refused_early: refusals within W/2 = 30 s of the first one, the first included.
        refused_late: refusals after that.
        late_refused_share: ``refused_late`` over every request that arrived after it (0 when none did).
        recovery_s: from the first refusal to the end of the first sliding span of W/4 = 15 s, starting at or
            after it (in steps of W/240 = 0.25 s), in which the accepted units reach 0.95 of what the limit
            allows in 15 s: so at least 15 s, and "back to 0.95 of the limit within 30 s" is recovery_s <= 30.
            None without a refusal, or when no such span ends within the run.
        last_arrival_s: the last arrival; below 4W/3 the client ran out of work inside the measured span.
        mean_tokens: tokens metered per accepted request (what a token-limited ceiling divides by).
    """

    goodput: float
    refused: int
    first_refusal_s: float | None
    refused_early: int
    refused_late: int
    late_refused_share: float
    recovery_s: float | None
    last_arrival_s: float
    mean_tokens: float


_RECOVERY_LEVEL = 0.95


def window_figures(
    arrivals: Sequence[Arrival], *, limit_per_window: float, window_s: float, by_tokens: bool
) -> WindowFigures:
    """The window scenario's figures (definitions in `WindowFigures`).

    Args:
        arrivals: the server's log, in arrival order.
        limit_per_window: requests (or tokens) the server admits per window.
        window_s: the server's window W.
        by_tokens: True when the token limit binds (count metered tokens, not requests).
    """
    if not arrivals:
        return WindowFigures(0.0, 0, None, 0, 0, 0.0, None, 0.0, 0.0)
    taken = [a.tokens for a in arrivals if a.status == 200]
    mean_tokens = sum(taken) / len(taken) if taken else 0.0
    times = [a.at for a in arrivals]
    units = [(a.tokens if by_tokens else 1) if a.status == 200 else 0 for a in arrivals]
    accepted_before = [0]
    for value in units:
        accepted_before.append(accepted_before[-1] + value)

    def accepted(start: float, end: float) -> int:
        return (
            accepted_before[bisect.bisect_left(times, end)]
            - accepted_before[bisect.bisect_left(times, start)]
        )

    rate = limit_per_window / window_s
    span_start, span_end = window_s / 3, 4 * window_s / 3
    goodput = accepted(span_start, span_end) / (rate * (span_end - span_start))
    refusals = [a.at for a in arrivals if a.status != 200]
    if not refusals:
        return WindowFigures(goodput, 0, None, 0, 0, 0.0, None, times[-1], mean_tokens)
    first = refusals[0]
    grace_end = first + window_s / 2
    late = [t for t in refusals if t > grace_end]
    arrived_late = len(times) - bisect.bisect_right(times, grace_end)
    mean_span, step = window_s / 4, window_s / 240
    needed = _RECOVERY_LEVEL * rate * mean_span
    recovery: float | None = None
    start = first
    while start + mean_span <= times[-1]:
        if accepted(start, start + mean_span) >= needed:
            recovery = start + mean_span - first
            break
        start += step
    return WindowFigures(
        goodput=goodput,
        refused=len(refusals),
        first_refusal_s=first,
        refused_early=len(refusals) - len(late),
        refused_late=len(late),
        late_refused_share=len(late) / arrived_late if arrived_late else 0.0,
        recovery_s=recovery,
        last_arrival_s=times[-1],
        mean_tokens=mean_tokens,
    )


@dataclass(frozen=True, slots=True)
class QueueDelay:
    """How long one item waited inside its client before its first request went out.

    Attributes:
        prompt_chars: characters of the item's prompt (what "longest prompt" ranks by).
        delay_s: from the moment the item became runnable — the client had the item in hand and asked to
            send (rcarun: its method called ``llm.chat``; naive-gather: its coroutine started; aiolimiter-loop:
            a worker took it) — to the moment its first request was sent.
    """

    prompt_chars: int
    delay_s: float


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def delay_ratio(delays: Sequence[QueueDelay]) -> tuple[float | None, float, float]:
    """The longest-prompt decile's median queueing delay against the median of every call.

    Both medians count as at least 1 ms (about the event loop's timer resolution), so that a client where most
    items never wait but the longest do shows a large ratio rather than a division by zero, and one where
    nobody waits shows 1.

    Returns:
        (ratio, top decile's median delay in s, everyone's median delay in s); ratio is None when fewer than
        ten items were measured.
    """
    if len(delays) < 10:
        return None, 0.0, 0.0
    by_size = sorted(delays, key=lambda d: d.prompt_chars, reverse=True)
    top = by_size[: math.ceil(len(by_size) / 10)]
    top_median = percentile([d.delay_s for d in top], 0.5)
    median = percentile([d.delay_s for d in delays], 0.5)
    ratio = max(top_median, _MIN_DELAY_S) / max(median, _MIN_DELAY_S)
    return ratio, top_median, median


@dataclass(frozen=True, slots=True)
class LagSummary:
    """Event-loop lag: how late a periodic timer fired, in milliseconds (nearest-rank percentiles)."""

    p50_ms: float
    p99_ms: float
    max_ms: float


def lag_summary(lateness_s: Sequence[float]) -> LagSummary:
    """Summarise timer lateness samples (seconds) in milliseconds; zeros when there are none."""
    if not lateness_s:
        return LagSummary(0.0, 0.0, 0.0)
    return LagSummary(
        p50_ms=percentile(lateness_s, 0.5) * 1000,
        p99_ms=percentile(lateness_s, 0.99) * 1000,
        max_ms=max(lateness_s) * 1000,
    )


def peak_rss_mb_now() -> float:
    """This process's peak resident set in MiB: ``VmHWM``, which starts afresh at exec. ``ru_maxrss`` does
    not: after fork + exec it keeps the forking parent's peak, so it never reads below the benchmark's own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True, slots=True)
class ClientRun:
    """What a client's own process reports about one run (one JSON line from ``rcarun_bench.client``).

    Attributes:
        calls: successful calls (the workload's size when nothing failed).
        failed: calls that gave up.
        retries_429: 429 answers the client saw and retried (the server's own count is authoritative).
        wall_s: from the start of the run (dataset read included) to the last call recorded.
        cpu_s: the process's CPU time over the same span, all threads.
        peak_rss_mb: the process's peak resident set size, in MiB.
        recorded_calls: successful calls the client stored somewhere durable (rows in results.db for rcarun).
        window_calls / window_s / window_tokens / window_unused / window_slope_rps: the steady window (see
            `steady_window`).
        items: work items in the workload.
        succeeded: items that got a complete answer (not cut by a length stop).
        wasted_tokens: prompt + completion tokens of the attempts cut by a length stop.
        cost_usd: what the client itself says it spent (rcarun: the sum of ``calls.cost_usd``).
        late_429_per_request / settle_s: `StormFigures`.
        delay_ratio / top_decile_delay_ms / median_delay_ms: `delay_ratio`.
        lag_p50_ms / lag_p99_ms / lag_max_ms: `LagSummary` over the whole run.
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
    window_unused: float | None = None
    window_slope_rps: float = 0.0
    items: int = 0
    succeeded: int = 0
    wasted_tokens: int = 0
    cost_usd: float = 0.0
    late_429_per_request: float = 0.0
    settle_s: float | None = 0.0
    delay_ratio: float | None = None
    top_decile_delay_ms: float = 0.0
    median_delay_ms: float = 0.0
    lag_p50_ms: float = 0.0
    lag_p99_ms: float = 0.0
    lag_max_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> ClientRun:
        return cls(**values)

    @property
    def window(self) -> SteadyWindow:
        return SteadyWindow(
            calls=self.window_calls,
            seconds=self.window_s,
            tokens=self.window_tokens,
            unused=self.window_unused,
            slope_rps=self.window_slope_rps,
        )


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One (scenario, client) line of the report; field names are the JSON keys. The window scenarios' own
    figures (`WindowFigures`, from the window server's log) are None or 0 elsewhere; there ``ratio`` is the
    goodput and ``server_429`` / ``server_503`` count the server's refusals."""

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
    items: int = 0
    success_rate: float = 0.0
    late_429_per_request: float = 0.0
    settle_s: float | None = 0.0
    wasted_tokens: int = 0
    cost_usd: float = 0.0
    server_cost_usd: float = 0.0
    delay_ratio: float | None = None
    top_decile_delay_ms: float = 0.0
    median_delay_ms: float = 0.0
    lag_p50_ms: float = 0.0
    lag_p99_ms: float = 0.0
    lag_max_ms: float = 0.0
    server_max_generating: int = 0
    server_max_in_flight: int = 0
    server_accepted: int = 0
    server_length_stops: int = 0
    client_429: int = 0
    window_rps: float = 0.0
    runs: int = 1
    ratio_min: float = 0.0
    ratio_max: float = 0.0
    server_503: int = 0
    first_refusal_s: float | None = None
    refused_early: int = 0
    refused_late: int = 0
    late_refused_share: float = 0.0
    recovery_s: float | None = None
    last_arrival_s: float | None = None
    server_completion_tokens: int = 0
    cpu_us_per_completion_token: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
