"""What the simulator remembers between requests (`ServerState`), and what it found out about one chat request
(`ChatCall`) and decided (`RequestNotes`)."""

from __future__ import annotations

import itertools
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .completion import Completion
from .config import MockConfig
from .faults import DETAILED_OUTCOMES
from .limits import OfferedLoad, RateLimiter, bucket_specs
from .stats import RequestLog, RequestLogEntry, StatsRecorder

__all__ = ["ChatCall", "RequestNotes", "ServerState"]


class ServerState:
    """Everything `MockServer.reset` restores: limits, meters, random streams and caches."""

    def __init__(self, config: MockConfig, now: float) -> None:
        specs = bucket_specs(config.rpm, config.rps, config.tpm, config.burst_s)
        self.limiter = RateLimiter(specs, now)
        self.offered = OfferedLoad(specs, now)
        self.stats = StatsRecorder(now)
        # Separate streams so that fault draws, sampling noise, length cuts and fault variants never shift
        # one another.
        self.fault_rng = random.Random(f"faults:{config.seed}")
        self.sample_rng = random.Random(f"sampling:{config.seed}")
        self.length_rng = random.Random(f"length:{config.seed}")
        self.variant_rng = random.Random(f"variants:{config.seed}")
        self.request_log = RequestLog(config.request_log_size) if config.request_log_size > 0 else None
        self.seen_first_messages: set[int] = set()
        # The capacity-bounded prefix cache (``prefix_cache_entries`` > 0): first-message keys, oldest use first.
        self.prefix_cache: OrderedDict[int, None] = OrderedDict()
        self.prefix_hits = 0
        self.prefix_misses = 0
        self.completion_ids = itertools.count(1)
        # Prompt + completion tokens of the requests generating now: what the simulated KV cache holds.
        self.kv_tokens = 0

    def next_completion_id(self) -> str:
        return f"chatcmpl-mock{next(self.completion_ids):012x}"

    def prefix_cache_hit(self, key: int, capacity: int) -> bool:
        """Look ``key`` up in the LRU prefix cache and mark it most recently used (inserted on a miss, the least
        recently used entry evicted beyond ``capacity``), as vLLM keeps a prefix's blocks until memory runs
        short. The entry is made at admission, so calls that share a prefix and arrive together mostly hit."""
        cache = self.prefix_cache
        if key in cache:
            cache.move_to_end(key)
            self.prefix_hits += 1
            return True
        self.prefix_misses += 1
        cache[key] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
        return False


class RequestNotes:
    """What the handler decided about one chat request, for the request log (filled on the deciding paths)."""

    __slots__ = ("completion_id", "completion_tokens_sent", "detail", "digest", "max_tokens", "outcome")

    def __init__(self) -> None:
        self.outcome: str | None = None
        self.digest: str | None = None
        self.max_tokens: int | None = None
        self.completion_id: str | None = None
        self.detail: str | None = None
        self.completion_tokens_sent: int | None = None

    def log_entry(self, seq: int, arrived_at: float, response: web.StreamResponse | None) -> RequestLogEntry:
        outcome = self.outcome
        dropped = response is None or outcome in ("timeout", "reset", "client_left")
        if outcome is None:
            outcome = "cancelled" if response is None else f"http_{response.status}"
        return RequestLogEntry(
            seq=seq,
            arrived_at=arrived_at,
            at=time.time(),
            status=None if dropped or response is None else response.status,
            outcome=outcome,
            request_digest=self.digest,
            max_tokens=self.max_tokens,
            completion_id=self.completion_id,
            # A hostile answer that a limit refused (or a queue lost) went out as that, not as the fault.
            detail=self.detail if outcome in DETAILED_OUTCOMES else None,
            completion_tokens_sent=self.completion_tokens_sent,
        )


_NO_COMPLETION = Completion("", 0, 0, "stop")


@dataclass(slots=True)
class ChatCall:
    """One chat request on its way through the pipeline: what each step found out for the next ones."""

    request: web.Request
    state: ServerState
    notes: RequestNotes
    arrived: float  # where the answer time starts: arrival, or the moment a queue slot came free
    body: dict[str, Any] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # each message's text
    prompt_tokens: int = 0
    model: str = ""
    answer_fault: str | None = None  # served as a hostile answer
    cut_fault: str | None = None  # served as an answer cut off on the wire
    length_fault: bool = False
    completion: Completion = _NO_COMPLETION  # until the compose step sets it
    charged_tokens: int = 0
    cached_tokens: int = 0
    uncached_tokens: int = 0  # what the prefill time counts
    holds_slot: bool = False
    queued: web.StreamResponse | None = None  # the response the queue already started
