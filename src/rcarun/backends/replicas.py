"""Spreading one backbone's calls over several replicas of the same server (self-hosted vLLM).

`ReplicaBalancer` sends each call to the least loaded replica, by our own outstanding calls and the scraped
vLLM ``/metrics`` (`MetricsPoller`); with ``affinity``, calls sharing a first message go to one home replica so
its prefix cache serves them. All on one event loop, so no lock. Rule: docs/reliability.md ("Balancing
replicas").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp

__all__ = ["MetricsPoller", "ReplicaBalancer", "ReplicaLoad", "parse_vllm_metrics", "prefix_key"]

# vLLM's gauges. The KV-cache one was renamed (gpu_cache_usage_perc until the V0 engine went, kv_cache_usage_perc
# since); both are read, the current name first.
_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What one replica reported: requests in its running batch and in its queue, KV-cache usage (0..1)."""

    running: float
    waiting: float
    kv_usage: float | None = None

    @property
    def requests(self) -> float:
        return self.running + self.waiting


def parse_vllm_metrics(text: str) -> ReplicaLoad | None:
    """The scheduler gauges of a Prometheus text page, summed over label sets (one per engine under data
    parallelism); None when the page has neither requests gauge (not a vLLM server)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        found = _SAMPLE.match(line)
        if found is None:
            continue
        name = found.group(1)
        if name != _RUNNING and name != _WAITING and name not in _KV_USAGE:
            continue
        try:
            value = float(found.group(2))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        # Gauges of several engines add up; usage is a share, so the fullest engine speaks for the replica.
        sums[name] = max(sums.get(name, 0.0), value) if name in _KV_USAGE else sums.get(name, 0.0) + value
    if _RUNNING not in sums and _WAITING not in sums:
        return None
    kv = next((sums[name] for name in _KV_USAGE if name in sums), None)
    return ReplicaLoad(running=sums.get(_RUNNING, 0.0), waiting=sums.get(_WAITING, 0.0), kv_usage=kv)


def prefix_key(role: str, content: str) -> int:
    """The affinity key of a call whose first message is ``role``/``content``: a stable 64-bit digest (not
    Python's salted ``hash``), so every process, and every sweep sharing ``rcarun serve`` replicas, sends a
    prefix to the same home replica."""
    digest = hashlib.blake2b(
        content.encode("utf-8", "surrogatepass"), digest_size=8, person=role[:16].encode()
    )
    return int.from_bytes(digest.digest(), "big")


def _rendezvous_weight(key: int, index: int) -> int:
    return int.from_bytes(
        hashlib.blake2b(key.to_bytes(8, "big") + index.to_bytes(4, "big"), digest_size=8).digest(), "big"
    )


class ReplicaBalancer:
    """Chooses the base URL for each call: the least loaded, or with ``affinity`` the key's home replica unless
    its load exceeds ``affinity_factor`` times the mean plus one; scrapes older than ``stale_after_s`` are unused."""

    __slots__ = (
        "_available",
        "_clock",
        "_cursor",
        "_outstanding",
        "_reported",
        "_reported_at",
        "_sent_since",
        "_urls",
        "affinity",
        "affinity_factor",
        "stale_after_s",
    )

    def __init__(
        self,
        urls: tuple[str, ...],
        *,
        stale_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        affinity: bool = False,
        affinity_factor: float = 1.0,
    ) -> None:
        if not urls:
            raise ValueError("ReplicaBalancer needs at least one URL")
        self._urls = urls
        count = len(urls)
        self._outstanding = [0] * count
        self._reported: list[ReplicaLoad | None] = [None] * count
        self._reported_at = [-math.inf] * count
        # Our calls sent to each replica since its last scrape, less those that came back (may go negative).
        self._sent_since = [0] * count
        self._available = [True] * count
        self._cursor = 0
        self._clock = clock
        self.stale_after_s = stale_after_s
        self.affinity = affinity
        self.affinity_factor = affinity_factor

    @property
    def urls(self) -> tuple[str, ...]:
        return self._urls

    def outstanding(self) -> tuple[int, ...]:
        """Calls currently in flight per replica, in `urls` order."""
        return tuple(self._outstanding)

    def report(self, index: int, load: ReplicaLoad | None) -> None:
        """A scrape of replica ``index`` (None: it has no metrics; the outstanding count decides for it)."""
        self._reported[index] = load
        self._reported_at[index] = self._clock() if load is not None else -math.inf
        self._sent_since[index] = 0

    def set_available(self, index: int, up: bool) -> None:
        """Mark replica ``index`` down (it gets no calls while another is up) or up again."""
        self._available[index] = up
        if not up:
            self._reported[index] = None
            self._reported_at[index] = -math.inf

    def load(self, index: int) -> float:
        """The load the balancer sees on replica ``index`` now."""
        own = self._outstanding[index]
        reported = self._reported[index]
        if reported is None or self._clock() - self._reported_at[index] > self.stale_after_s:
            return float(own)
        return max(float(own), reported.requests + self._sent_since[index])

    def home(self, key: int) -> int:
        """The replica a key belongs to among those up (all of them when none is): highest rendezvous weight."""
        count = len(self._urls)
        candidates = [i for i in range(count) if self._available[i]] or list(range(count))
        return max(candidates, key=lambda index: _rendezvous_weight(key, index))

    def acquire(self, key: int | None = None) -> int:
        """Index of the replica for the next call (``key``: its `prefix_key`); `release` it when the call ends."""
        count = len(self._urls)
        if count == 1:
            best = 0
        elif self.affinity and key is not None and not self._home_overloaded(home := self.home(key)):
            best = home
        else:
            candidates = [i for i in range(count) if self._available[i]] or list(range(count))
            best = -1
            best_rank = (math.inf, math.inf, math.inf)
            for index in candidates:
                reported = self._reported[index]
                kv = reported.kv_usage if reported is not None and reported.kv_usage is not None else 0.0
                # Distance from the cursor last: the first minimum met from the cursor on wins (round-robin).
                rank = (self.load(index), kv, float((index - self._cursor) % count))
                if rank < best_rank:
                    best, best_rank = index, rank
            self._cursor = (best + 1) % count
        self._outstanding[best] += 1
        self._sent_since[best] += 1
        return best

    def _home_overloaded(self, home: int) -> bool:
        """Whether the home replica carries more than its share: ``affinity_factor`` × the mean load over the
        replicas up, plus one (so that a few calls on an idle fleet never count as a pile-up)."""
        up = [i for i in range(len(self._urls)) if self._available[i]] or [home]
        mean = sum(self.load(i) for i in up) / len(up)
        return self.load(home) > self.affinity_factor * mean + 1.0

    def release(self, index: int) -> None:
        self._outstanding[index] -= 1
        self._sent_since[index] -= 1

    @contextmanager
    def lease(self, key: int | None = None) -> Iterator[str]:
        """The chosen base URL for the duration of one call (``key``: its `prefix_key`, for affinity)."""
        index = self.acquire(key)
        try:
            yield self._urls[index]
        finally:
            self.release(index)


class MetricsPoller:
    """Scrapes every replica's ``/metrics`` each ``interval_s`` into a `ReplicaBalancer`, for an ``async with``;
    a failed scrape leaves the balancer counting outstanding requests alone."""

    def __init__(
        self, balancer: ReplicaBalancer, *, interval_s: float = 0.25, timeout_s: float = 1.0
    ) -> None:
        self.balancer = balancer
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.scrapes = 0
        self.failures = 0
        self._task: asyncio.Task[None] | None = None
        self._urls = tuple(_metrics_url(url) for url in balancer.urls)

    async def __aenter__(self) -> MetricsPoller:
        self._task = asyncio.create_task(self._run(), name="rcarun-replica-metrics")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await asyncio.gather(*(self._scrape(session, i, url) for i, url in enumerate(self._urls)))
                await asyncio.sleep(self.interval_s)

    async def _scrape(self, session: aiohttp.ClientSession, index: int, url: str) -> None:
        load: ReplicaLoad | None = None
        try:
            async with session.get(url) as response:
                if response.status == 200:
                    load = parse_vllm_metrics(await response.text(errors="replace"))
        except (aiohttp.ClientError, TimeoutError, OSError):
            load = None
        self.scrapes += 1
        if load is None:
            self.failures += 1
        self.balancer.report(index, load)


def _metrics_url(base_url: str) -> str:
    """``http://h:p/v1`` → ``http://h:p/metrics`` (vLLM serves its metrics beside the API, not under it)."""
    root = base_url.rstrip("/")
    return (root.removesuffix("/v1") or root) + "/metrics"
