"""The three clients the benchmark compares, each running one scenario's workload against the simulator.

- ``rcarun``: rcarun's real runner end to end — `rcarun.runner.run_sweep` over the synthetic dataset with the
  all-at-once method and one ``simulated`` backbone whose limits are declared as the scenario says, into a fresh
  results.db. Nothing is bypassed: dataset loading, the session, the gate, the aiohttp backend, the store writer.
- ``naive-gather``: the script most people write — `asyncio.gather` over every call, an `asyncio.Semaphore`
  around `AsyncOpenAI.chat.completions.create` (``max_retries=0``), and on a 429 a sleep of Retry-After (or 1 s)
  and a retry. No pacing: it learns about limits only from 429s.
- ``aiolimiter-loop``: what a careful engineer writes — one `aiohttp.ClientSession` (pool as large as the
  concurrency), worker tasks pulling from one iterator, `aiolimiter.AsyncLimiter` for requests per second and a
  second one acquired with each call's estimated token weight for tokens per second. The estimate is the exact
  prompt count the way the server counts it (characters / 4 per message + 4 per message, what a tokenizer gives)
  plus the running mean of completion tokens seen so far — aiolimiter cannot take back an over-reservation, so
  reserving the full ``max_tokens`` (8,000) would waste most of the budget. A 429, should one come, is retried
  after ``retry-after-ms`` (or Retry-After, or 1 s).

The peers send the very bodies rcarun sends (`rcarun.bench.workload.request_bodies`), built before the clock
starts for the peers' requests but inside the measured run, as rcarun reads its dataset inside `run_sweep`.
Each returns the completions it saw; the caller (`rcarun.bench.client`) times the run and measures the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .metrics import Completion
from .scenarios import Scenario
from .workload import MODEL, BenchRequest, request_bodies

__all__ = ["CLIENTS", "ClientOutcome", "run_aiolimiter_loop", "run_naive_gather", "run_rcarun"]

# Tokens the simulator charges per message beyond its text (as OpenAI's accounting does).
_MESSAGE_OVERHEAD_TOKENS = 4
_CHARS_PER_TOKEN = 4.0
# A first guess of completion tokens for the aiolimiter peer, before any answer has been seen.
_INITIAL_COMPLETION_GUESS = 256
_MAX_429_RETRIES = 50


@dataclass(frozen=True, slots=True)
class ClientOutcome:
    """What a client saw.

    Attributes:
        completions: every successful call (times on ``time.time()``'s clock, server-charged tokens).
        failed: calls that gave up.
        retries_429: 429s the client saw (and retried).
        recorded_calls: successful calls stored durably (rows with status ok/length in results.db).
    """

    completions: list[Completion]
    failed: int
    retries_429: int
    recorded_calls: int


ClientRunner = Callable[[Scenario, Path, str, Path], Coroutine[Any, Any, ClientOutcome]]


# --------------------------------------------------------------------------------------------------- rcarun


def _sweep_config(scenario: Scenario, dataset: Path, base_url: str) -> Any:
    # Imported here: the peers' processes never load the runner (their RSS must not include it).
    from rcarun.runner import BackboneConfig, LimitsConfig, MethodConfig, SweepConfig, SweepSection

    return SweepConfig(
        sweep=SweepSection(dataset=str(dataset), realizations=1),
        methods=(MethodConfig(name="all-at-once"),),
        backbones={
            "sim": BackboneConfig(
                provider="simulated",
                model=MODEL,
                base_url=base_url,
                limits=LimitsConfig(
                    concurrency=scenario.concurrency,
                    min_concurrency=1,
                    rpm=scenario.rpm,
                    tpm=scenario.tpm,
                    burst_s=scenario.burst_s,
                ),
            )
        },
    )


def _epoch_s(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


async def run_rcarun(scenario: Scenario, dataset: Path, base_url: str, workdir: Path) -> ClientOutcome:
    """One sweep into a fresh ``workdir/results.db``; completions are read back from its ``calls`` table."""
    from rcarun.runner import run_sweep

    db_path = workdir / "results.db"
    outcome = await run_sweep(
        _sweep_config(scenario, dataset, base_url),
        db_path=db_path,
        run_name=f"bench-{scenario.name}",
        show_progress=False,
    )
    counters = outcome.counters["sim"]
    with contextlib.closing(sqlite3.connect(db_path)) as connection:
        rows = connection.execute(
            "SELECT started_at, ended_at, COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0) FROM calls "
            "WHERE run_id = ? AND status IN ('ok', 'length')",
            (outcome.run_id,),
        ).fetchall()
        retries_429 = connection.execute(
            "SELECT COUNT(*) FROM calls WHERE run_id = ? AND status = 'rate_limited'", (outcome.run_id,)
        ).fetchone()[0]
    completions = [
        Completion(sent=_epoch_s(started_at), at=_epoch_s(ended_at), tokens=int(tokens))
        for started_at, ended_at, tokens in rows
    ]
    return ClientOutcome(
        completions=completions,
        failed=counters.items_failed + counters.items_skipped_budget + counters.items_interrupted,
        retries_429=int(retries_429),
        recorded_calls=len(rows),
    )


# ---------------------------------------------------------------------------------------------- naive-gather


async def run_naive_gather(scenario: Scenario, dataset: Path, base_url: str, workdir: Path) -> ClientOutcome:
    """asyncio.gather + Semaphore over AsyncOpenAI; sleeps Retry-After (or 1 s) on a 429 and tries again."""
    import openai
    from openai import AsyncOpenAI

    requests = list(request_bodies(dataset, base_url))
    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    semaphore = asyncio.Semaphore(scenario.concurrency)
    completions: list[Completion] = []
    retries_429 = 0

    async def one(request: BenchRequest) -> bool:
        nonlocal retries_429
        async with semaphore:
            for _ in range(_MAX_429_RETRIES):
                sent = time.time()
                try:
                    response = await client.chat.completions.create(**request.body)
                except openai.RateLimitError as error:
                    retries_429 += 1
                    await asyncio.sleep(_retry_after_s(error.response.headers.get("retry-after"), None))
                    continue
                usage = response.usage
                tokens = usage.prompt_tokens + usage.completion_tokens if usage is not None else 0
                completions.append(Completion(sent=sent, at=time.time(), tokens=tokens))
                return True
        return False

    try:
        results = await asyncio.gather(*(one(request) for request in requests), return_exceptions=True)
    finally:
        await client.close()
    failed = sum(1 for result in results if result is not True)
    return ClientOutcome(completions=completions, failed=failed, retries_429=retries_429, recorded_calls=0)


# -------------------------------------------------------------------------------------------- aiolimiter-loop


def _prompt_tokens(request: BenchRequest) -> int:
    messages = request.body["messages"]
    return sum(
        math.ceil(len(m["content"]) / _CHARS_PER_TOKEN) for m in messages
    ) + _MESSAGE_OVERHEAD_TOKENS * len(messages)


async def run_aiolimiter_loop(
    scenario: Scenario, dataset: Path, base_url: str, workdir: Path
) -> ClientOutcome:
    """Workers over one aiohttp session, paced by aiolimiter for requests and weighted tokens."""
    import aiohttp
    from aiolimiter import AsyncLimiter

    requests = list(request_bodies(dataset, base_url))
    # One second of quota per limiter: the same burst the server allows.
    request_limiter = AsyncLimiter(scenario.requests_per_s, 1.0) if scenario.requests_per_s else None
    token_limiter = AsyncLimiter(scenario.tokens_per_s, 1.0) if scenario.tokens_per_s else None
    url = f"{base_url}/chat/completions"
    headers = {"Authorization": "Bearer bench", "Content-Type": "application/json"}
    completions: list[Completion] = []
    retries_429 = 0
    failed = 0
    completion_tokens_seen = 0
    answers_seen = 0
    pending: Iterator[BenchRequest] = iter(requests)

    async def send(session: aiohttp.ClientSession, request: BenchRequest, data: bytes) -> bool:
        nonlocal retries_429, completion_tokens_seen, answers_seen
        for _ in range(_MAX_429_RETRIES):
            if request_limiter is not None:
                await request_limiter.acquire()
            if token_limiter is not None:
                expected = (
                    completion_tokens_seen / answers_seen if answers_seen else _INITIAL_COMPLETION_GUESS
                )
                weight = _prompt_tokens(request) + expected
                # aiolimiter refuses a weight above its capacity; such a call waits for a full bucket instead.
                await token_limiter.acquire(min(weight, token_limiter.max_rate))
            sent = time.time()
            async with session.post(url, data=data, headers=headers) as response:
                payload = await response.read()
                if response.status == 429:
                    retries_429 += 1
                    await asyncio.sleep(
                        _retry_after_s(
                            response.headers.get("retry-after"), response.headers.get("retry-after-ms")
                        )
                    )
                    continue
                response.raise_for_status()
            usage = json.loads(payload).get("usage") or {}
            completion_tokens = int(usage.get("completion_tokens", 0))
            completion_tokens_seen += completion_tokens
            answers_seen += 1
            completions.append(
                Completion(
                    sent=sent, at=time.time(), tokens=int(usage.get("prompt_tokens", 0)) + completion_tokens
                )
            )
            return True
        return False

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failed
        for request in pending:
            try:
                ok = await send(session, request, json.dumps(request.body, ensure_ascii=False).encode())
            except aiohttp.ClientError:
                ok = False
            if not ok:
                failed += 1

    connector = aiohttp.TCPConnector(limit=scenario.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session, asyncio.TaskGroup() as group:
        for _ in range(scenario.concurrency):
            group.create_task(worker(session))
    return ClientOutcome(completions=completions, failed=failed, retries_429=retries_429, recorded_calls=0)


def _retry_after_s(seconds: str | None, milliseconds: str | None) -> float:
    for value, scale in ((milliseconds, 0.001), (seconds, 1.0)):
        if value is not None:
            with contextlib.suppress(ValueError):
                return max(0.0, float(value) * scale)
    return 1.0


CLIENTS: dict[str, ClientRunner] = {
    "rcarun": run_rcarun,
    "naive-gather": run_naive_gather,
    "aiolimiter-loop": run_aiolimiter_loop,
}
