"""What the server saw, so that throughput and limit compliance are measured at the server, not self-reported.

`StatsRecorder` is updated on the request path: O(1) amortised updates and memory bounded on long runs.
`MockStats` is its snapshot at ``GET /mock/stats``; `RequestLog` the optional, bounded per-request record at
``GET /mock/log``, against which a client's own records can be reconciled entry by entry.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .config import FAULT_RATE_FIELDS

__all__ = [
    "FAULT_KINDS",
    "REJECTION_KINDS",
    "MockStats",
    "RequestLog",
    "RequestLogEntry",
    "SlidingWindowMax",
    "StatsRecorder",
    "request_digest",
]

FAULT_KINDS = tuple(name.removesuffix("_rate") for name in FAULT_RATE_FIELDS)
REJECTION_KINDS = ("rpm", "rps", "tpm", "concurrency", "quota")


@dataclass(frozen=True, slots=True)
class MockStats:
    """A snapshot of the server's counters since the last reset.

    Attributes:
        elapsed_s: seconds since reset.
        requests_total: chat-completion requests received (every outcome).
        accepted: requests admitted past every limit and answered (or being answered).
        rejected_429: every 429 (rate limits, concurrency, quota).
        rejected_by: 429s by cause: rpm, rps, tpm, concurrency, quota.
        errors_4xx: 400/401 answers (bad JSON, context overflow, wrong key).
        errors_5xx: injected 500 and 503 answers.
        faults: injected faults by kind. The 429 kinds (rate_limit, long_pause, bare_rate_limit) are not in
            ``rejected_429``, which counts the limits' own; the answer kinds (huge_step, surrogate, bad_usage,
            control, stream_stall, stream_drop) are also counted in ``accepted`` with their tokens.
        length_stops: accepted answers cut by max_tokens (finish_reason "length"), ``length_faults`` included.
        length_faults: accepted answers cut short by the ``length_rate`` fault.
        max_in_flight: most chat requests open at once (queued and hanging ones included).
        max_generating: most requests holding a generation slot at once.
        accepted_tokens / accepted_prompt_tokens / accepted_completion_tokens: tokens of accepted requests.
        accepted_per_second: accepted requests in each 1-s bucket since reset.
        max_requests_1s / max_tokens_1s / max_requests_60s / max_tokens_60s: most accepted requests and tokens
            in any sliding window of that length.
        overshoot_requests: largest deficit in requests of the offered load against the declared request
            limits (rpm and rps); 0 means the client never asked for more than the limits allowed.
        overshoot_tokens: the same against the declared token limit (tpm).
        overshoot_by_limit: the deficit per declared limit.
    """

    elapsed_s: float = 0.0
    requests_total: int = 0
    accepted: int = 0
    rejected_429: int = 0
    rejected_by: Mapping[str, int] = field(default_factory=dict)
    errors_4xx: int = 0
    errors_5xx: int = 0
    faults: Mapping[str, int] = field(default_factory=dict)
    length_stops: int = 0
    length_faults: int = 0
    max_in_flight: int = 0
    max_generating: int = 0
    accepted_tokens: int = 0
    accepted_prompt_tokens: int = 0
    accepted_completion_tokens: int = 0
    accepted_per_second: tuple[int, ...] = ()
    max_requests_1s: int = 0
    max_tokens_1s: int = 0
    max_requests_60s: int = 0
    max_tokens_60s: int = 0
    overshoot_requests: float = 0.0
    overshoot_tokens: float = 0.0
    overshoot_by_limit: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["accepted_per_second"] = list(self.accepted_per_second)
        for name in ("rejected_by", "faults", "overshoot_by_limit"):
            values[name] = dict(values[name])
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> MockStats:
        """Rebuild a snapshot from `to_dict` output (as served over HTTP); unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in values.items() if k in known}
        if "accepted_per_second" in kept:
            kept["accepted_per_second"] = tuple(kept["accepted_per_second"])
        return cls(**kept)


class SlidingWindowMax:
    """The most requests and tokens seen in any window of ``window_s`` seconds ending at an event."""

    __slots__ = ("_events", "_requests", "_tokens", "max_requests", "max_tokens", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._tokens = 0
        self._requests = 0
        self.max_requests = 0
        self.max_tokens = 0

    def add(self, now: float, tokens: int) -> None:
        events = self._events
        horizon = now - self.window_s
        while events and events[0][0] <= horizon:
            self._tokens -= events.popleft()[1]
            self._requests -= 1
        events.append((now, tokens))
        self._tokens += tokens
        self._requests += 1
        if self._requests > self.max_requests:
            self.max_requests = self._requests
        if self._tokens > self.max_tokens:
            self.max_tokens = self._tokens


class StatsRecorder:
    """Mutable counters behind `MockStats`."""

    def __init__(self, now: float) -> None:
        self.started_at = now
        self.requests_total = 0
        self.accepted = 0
        self.rejected_by = dict.fromkeys(REJECTION_KINDS, 0)
        self.errors_4xx = 0
        self.errors_5xx = 0
        self.faults = dict.fromkeys(FAULT_KINDS, 0)
        self.length_stops = 0
        self.length_faults = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.generating = 0
        self.max_generating = 0
        self.accepted_prompt_tokens = 0
        self.accepted_completion_tokens = 0
        self.per_second: list[int] = []
        self.window_1s = SlidingWindowMax(1.0)
        self.window_60s = SlidingWindowMax(60.0)

    def request_started(self) -> None:
        self.requests_total += 1
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight

    def request_finished(self) -> None:
        self.in_flight -= 1

    def generation_started(self) -> None:
        self.generating += 1
        if self.generating > self.max_generating:
            self.max_generating = self.generating

    def generation_finished(self) -> None:
        self.generating -= 1

    def rejected(self, kind: str) -> None:
        self.rejected_by[kind] += 1

    def fault(self, kind: str) -> None:
        self.faults[kind] += 1
        if kind in ("error_500", "error_503"):
            self.errors_5xx += 1

    def accept(self, now: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.accepted += 1
        self.accepted_prompt_tokens += prompt_tokens
        self.accepted_completion_tokens += completion_tokens
        second = int(now - self.started_at)
        per_second = self.per_second
        if second >= len(per_second):
            per_second.extend([0] * (second + 1 - len(per_second)))
        per_second[second] += 1
        tokens = prompt_tokens + completion_tokens
        self.window_1s.add(now, tokens)
        self.window_60s.add(now, tokens)

    def snapshot(self, now: float, overshoot_by_limit: Mapping[str, float]) -> MockStats:
        request_overshoot = [v for k, v in overshoot_by_limit.items() if k in ("rpm", "rps")]
        return MockStats(
            elapsed_s=round(now - self.started_at, 6),
            requests_total=self.requests_total,
            accepted=self.accepted,
            rejected_429=sum(self.rejected_by.values()),
            rejected_by=dict(self.rejected_by),
            errors_4xx=self.errors_4xx,
            errors_5xx=self.errors_5xx,
            faults=dict(self.faults),
            length_stops=self.length_stops,
            length_faults=self.length_faults,
            max_in_flight=self.max_in_flight,
            max_generating=self.max_generating,
            accepted_tokens=self.accepted_prompt_tokens + self.accepted_completion_tokens,
            accepted_prompt_tokens=self.accepted_prompt_tokens,
            accepted_completion_tokens=self.accepted_completion_tokens,
            accepted_per_second=tuple(self.per_second),
            max_requests_1s=self.window_1s.max_requests,
            max_tokens_1s=self.window_1s.max_tokens,
            max_requests_60s=self.window_60s.max_requests,
            max_tokens_60s=self.window_60s.max_tokens,
            overshoot_requests=max(request_overshoot, default=0.0),
            overshoot_tokens=overshoot_by_limit.get("tpm", 0.0),
            overshoot_by_limit=dict(overshoot_by_limit),
        )


def request_digest(messages: Sequence[Mapping[str, Any]], max_tokens: int | None) -> str:
    """A chat request's identity in the request log: SHA-256 of its messages (role, content) and max_tokens,
    which a client computes alike from what it sent, so that an attempt is found even when no answer came."""
    payload = {
        "messages": [{"role": m.get("role"), "content": m.get("content")} for m in messages],
        "max_tokens": max_tokens,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class RequestLogEntry:
    """One chat request as the server handled it.

    Attributes:
        seq: 1-based arrival order since the last reset (gaps never occur; old entries fall off the front).
        arrived_at: wall-clock time (Unix seconds) when the request arrived.
        at: wall-clock time (Unix seconds) when the answer left or the connection was dropped.
        status: the HTTP status sent; None when the connection was dropped without an answer.
        outcome: ``ok``, ``length``, a fault kind (`FAULT_KINDS`), ``rejected_<limit>``, ``bad_request``,
            ``stream_refused``, ``unauthorized``, ``context_overflow`` or ``client_left`` (gave up while queued,
            or went away during a stream).
        request_digest: `request_digest` of the request; None when its body did not parse.
        max_tokens: the output budget asked for.
        completion_id: the ``id`` of the completion sent, where one was generated.
        detail: which variant a fault took (docs/simulator.md), None otherwise.
        completion_tokens_sent: completion tokens that reached the wire as ``usage`` counts them: all of an
            answer sent whole, those up to the last chunk written of a stream cut off or left, 0 for a body cut
            in half, None where no answer was generated.
    """

    seq: int
    arrived_at: float
    at: float
    status: int | None
    outcome: str
    request_digest: str | None
    max_tokens: int | None
    completion_id: str | None = None
    detail: str | None = None
    completion_tokens_sent: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RequestLogEntry:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class RequestLog:
    """The last ``size`` chat requests, in arrival order. ``total`` counts every request logged since reset, so
    that a reader knows how many fell off the front and never mistakes a truncated log for a complete one."""

    __slots__ = ("_entries", "total")

    def __init__(self, size: int) -> None:
        self._entries: deque[RequestLogEntry] = deque(maxlen=size)
        self.total = 0

    def next_seq(self) -> int:
        self.total += 1
        return self.total

    def add(self, entry: RequestLogEntry) -> None:
        self._entries.append(entry)

    def to_dict(self) -> dict[str, Any]:
        entries = sorted(self._entries, key=lambda entry: entry.seq)
        return {
            "size": self._entries.maxlen,
            "total": self.total,
            "dropped": self.total - len(entries),
            "entries": [entry.to_dict() for entry in entries],
        }
