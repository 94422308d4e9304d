"""The clients the benchmark compares, each running one scenario's workload against the scenario's server.

``rcarun`` (its real runner end to end, into a fresh results.db), ``rcarun-unstreamed``, ``naive-gather`` (the
plain AsyncOpenAI + semaphore loop), ``aiolimiter-loop`` (what a careful engineer writes) and
``litellm-router`` (LiteLLM's Router as its documentation sets up rate limits): each described in
benchmarks/README.md, "Clients". The peers send the very bodies rcarun sends (`rcarun_bench.workload`); every
client prices its tokens with the same `PRICES`. A peer whose package is missing (`OPTIONAL_PACKAGES`, the
``peers`` extra of rcarun-bench) is skipped with a one-line reason (`unavailable_reason`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .metrics import Attempt, Completion, QueueDelay, peak_rss_mb_now
from .scenarios import Scenario
from .workload import MODEL, BenchRequest, request_bodies

__all__ = [
    "CLIENTS",
    "OPTIONAL_PACKAGES",
    "PRICES",
    "RCARUN_CLIENTS",
    "ClientOutcome",
    "Price",
    "import_optional_packages",
    "run_aiolimiter_loop",
    "run_litellm_router",
    "run_naive_gather",
    "run_rcarun",
    "unavailable_reason",
]

# Tokens the simulator charges per message beyond its text (as OpenAI's accounting does).
_MESSAGE_OVERHEAD_TOKENS = 4
_CHARS_PER_TOKEN = 4.0
# A first guess of completion tokens for the aiolimiter peer, before any answer has been seen.
_INITIAL_COMPLETION_GUESS = 256
_MAX_429_RETRIES = 50
# Statuses the peers treat as "slow down": 429, and the 503 overload Kimi sends for the same.
_SLOW_DOWN_STATUSES = frozenset({429, 503})
# The LiteLLM Router's retries per call: enough that no call of a bench run gives up.
_LITELLM_RETRIES = 10
# How long to wait for LiteLLM's callbacks (run as tasks) to report the last answers after the calls return.
_LITELLM_CALLBACK_DRAIN_S = 5.0

OPTIONAL_PACKAGES: dict[str, str] = {
    "aiolimiter-loop": "aiolimiter",
    "litellm-router": "litellm",
}
"""The module each peer needs beyond rcarun's dependencies (rcarun-bench's ``peers`` extra installs them)."""


def unavailable_reason(client: str) -> str | None:
    """Why ``client`` cannot run here (its package is not installed), in one line; None when it can."""
    module = OPTIONAL_PACKAGES.get(client)
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"{client}: {module} is not installed (pip install -e './benchmarks[peers]')"


def import_optional_packages(client: str) -> None:
    """Import ``client``'s optional package before the clock starts: litellm alone takes seconds to import,
    which would otherwise be counted as its CPU per call. LiteLLM is kept off the network (its model-price
    map is read from the package, not fetched) and quiet."""
    module = OPTIONAL_PACKAGES.get(client)
    if module is None:
        return
    if module == "litellm":
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_LOG", "ERROR")
    imported: Any = importlib.import_module(module)
    if module == "litellm":
        imported.suppress_debug_info = True
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
        logging.getLogger("LiteLLM Router").setLevel(logging.ERROR)


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens; cached prompt tokens cost the same, so the server's totals price exactly."""

    input_per_mtok: float
    output_per_mtok: float

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1_000_000


# Illustrative (DeepSeek-like) prices; only the agreement between client and server matters.
PRICES = Price(input_per_mtok=0.28, output_per_mtok=1.10)


@dataclass(slots=True)
class ClientOutcome:
    """What a client saw.

    Attributes:
        completions: every answered attempt, length stops included (times on ``time.time()``'s clock,
            server-charged tokens).
        attempts: every request sent, 429s included.
        delays: each item's queueing delay before its first request (`QueueDelay`).
        items: work items in the workload.
        succeeded: items that got a complete answer (finish_reason other than "length").
        failed: items that gave up on an error.
        retries_429: refusals the client saw and retried: 429s, and 503 overloads where the server sends them.
        recorded_calls: answered attempts stored durably (rows with status ok/length in results.db).
        wasted_tokens: prompt + completion tokens of attempts cut by a length stop.
        cost_usd: the client's own account of what it spent.
        peak_rss_mb: the process's peak when the client's own work ended, when the benchmark's bookkeeping
            after it would add to it (rcarun's calls read back); None: read it at the end.
        cpu_done_s: the process's CPU clock (``time.process_time``) when the client's own work ended, for the
            same reason; None: read it at the end.
    """

    completions: list[Completion] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    delays: list[QueueDelay] = field(default_factory=list)
    items: int = 0
    succeeded: int = 0
    failed: int = 0
    retries_429: int = 0
    recorded_calls: int = 0
    wasted_tokens: int = 0
    cost_usd: float = 0.0
    peak_rss_mb: float | None = None
    cpu_done_s: float | None = None


ClientRunner = Callable[[Scenario, Path, str, Path], Coroutine[Any, Any, ClientOutcome]]


# --------------------------------------------------------------------------------------------------- rcarun


def _sweep_config(scenario: Scenario, dataset: Path, base_url: str, stream: bool | None = None) -> Any:
    # Imported here: the peers' processes never load the runner (their RSS must not include it).
    from rcarun.runner import BackboneConfig, LimitsConfig, MethodConfig, SweepConfig, SweepSection
    from rcarun.runner.config import PricesConfig, StageConfig
    from rcarun_bench.timed import TIMED_METHOD

    # Against the window server rcarun is configured as a user would for that provider: its preset, the default
    # burst (the simulator's scenarios declare the simulator's own 1-s burst), and the window the provider counts
    # its limits over (60 s; the --quick runs shrink it, and say so to every client that can be told).
    burst: dict[str, float] = (
        {"burst_s": scenario.burst_s} if scenario.server == "simulator" else {"window_s": scenario.window_s}
    )
    return SweepConfig(
        sweep=SweepSection(dataset=str(dataset), realizations=scenario.realizations),
        methods=(MethodConfig(name=TIMED_METHOD, label="all-at-once"),),
        stages={"attribution": StageConfig(length_retries=scenario.length_retries)},
        backbones={
            "sim": BackboneConfig(
                provider=scenario.provider,
                model=MODEL,
                base_url=base_url,
                # The window server answers unstreamed requests only (`rcarun_bench.window_server`).
                stream=False if scenario.server == "window" else stream,
                limits=LimitsConfig(
                    concurrency=scenario.concurrency,
                    min_concurrency=1,
                    rpm=scenario.rpm,
                    tpm=scenario.tpm,
                    **burst,
                ),
                prices=PricesConfig(
                    input_per_mtok=PRICES.input_per_mtok,
                    cached_input_per_mtok=PRICES.input_per_mtok,
                    output_per_mtok=PRICES.output_per_mtok,
                ),
            )
        },
    )


def _epoch_s(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _read_calls(
    rows: Iterable[tuple[Any, ...]],
    outcome: ClientOutcome,
    first_sent: dict[str, list[float]],
    seen_items: set[tuple[str, int]],
    answered: set[tuple[str, int]],
) -> None:
    """Fold rcarun's ``calls`` rows, streamed in send order, into ``outcome``."""
    for qid, realization, status, started_at, ended_at, prompt, completion, cost in rows:
        sent = _epoch_s(started_at)
        outcome.attempts.append(Attempt(sent=sent, rate_limited=status == "rate_limited"))
        if (qid, realization) not in seen_items:
            seen_items.add((qid, realization))
            first_sent[qid].append(sent)
        if status in ("ok", "length"):
            outcome.completions.append(
                Completion(sent=sent, at=_epoch_s(ended_at), tokens=prompt + completion)
            )
            outcome.cost_usd += cost
        if status == "length":
            outcome.wasted_tokens += prompt + completion
        elif status == "ok":
            answered.add((qid, realization))
        elif status == "rate_limited":
            outcome.retries_429 += 1


async def run_rcarun(
    scenario: Scenario, dataset: Path, base_url: str, workdir: Path, stream: bool | None = None
) -> ClientOutcome:
    """One sweep into a fresh ``workdir/results.db``; what it did is read back from its ``calls`` table.

    ``stream`` None streams (the preset's default); False asks for whole bodies (``rcarun-unstreamed``).
    """
    from rcarun.runner import run_sweep
    from rcarun_bench.timed import asked_at, register_timed_method

    register_timed_method()
    asked_at.clear()
    db_path = workdir / "results.db"
    sweep = await run_sweep(
        _sweep_config(scenario, dataset, base_url, stream),
        db_path=db_path,
        run_name=f"bench-{scenario.name}",
        show_progress=False,
    )
    # The sweep's own peak and CPU time, before the benchmark's bookkeeping below reads every call back.
    outcome = ClientOutcome(
        items=scenario.calls, peak_rss_mb=peak_rss_mb_now(), cpu_done_s=time.process_time()
    )
    counters = sweep.counters["sim"]
    first_sent: dict[str, list[float]] = defaultdict(list)
    seen_items: set[tuple[str, int]] = set()
    answered: set[tuple[str, int]] = set()
    with contextlib.closing(sqlite3.connect(db_path)) as connection:
        rows = connection.execute(
            "SELECT qid, realization, status, started_at, ended_at, COALESCE(prompt_tokens, 0), "
            "COALESCE(completion_tokens, 0), COALESCE(cost_usd, 0) FROM calls WHERE run_id = ? "
            "ORDER BY started_at",
            (sweep.run_id,),
        )
        _read_calls(rows, outcome, first_sent, seen_items, answered)
    outcome.succeeded = len(answered)
    outcome.recorded_calls = len(outcome.completions)
    outcome.failed = counters.items_failed + counters.items_skipped_budget + counters.items_interrupted
    # Pair each item's first request with the moment it asked, per trajectory in order (one per realization).
    for qid, sends in first_sent.items():
        for (asked, prompt_chars), sent in zip(sorted(asked_at.get(qid, ())), sorted(sends), strict=False):
            outcome.delays.append(QueueDelay(prompt_chars, max(0.0, sent - asked)))
    return outcome


# ---------------------------------------------------------------------------------------------- naive-gather


def _workload(scenario: Scenario, dataset: Path, base_url: str) -> list[BenchRequest]:
    """Every call of the workload: each trajectory's body once per realization (the same object, repeated)."""
    return list(request_bodies(dataset, base_url, scenario.provider)) * scenario.realizations


async def run_naive_gather(scenario: Scenario, dataset: Path, base_url: str, workdir: Path) -> ClientOutcome:
    """asyncio.gather + Semaphore over AsyncOpenAI; sleeps Retry-After (or 1 s) on a 429 or 503 and tries
    again."""
    import openai
    from openai import AsyncOpenAI

    requests = _workload(scenario, dataset, base_url)
    client = AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    semaphore = asyncio.Semaphore(scenario.concurrency)
    outcome = ClientOutcome(items=len(requests))

    async def one(request: BenchRequest) -> bool:
        runnable = time.time()
        async with semaphore:
            for attempt in range(_MAX_429_RETRIES):
                sent = time.time()
                if attempt == 0:
                    outcome.delays.append(QueueDelay(request.prompt_chars, sent - runnable))
                try:
                    response = await client.chat.completions.create(**request.body)
                except openai.APIStatusError as error:
                    if error.status_code not in _SLOW_DOWN_STATUSES:
                        raise
                    outcome.attempts.append(Attempt(sent=sent, rate_limited=True))
                    outcome.retries_429 += 1
                    await asyncio.sleep(_retry_after_s(error.response.headers.get("retry-after"), None))
                    continue
                outcome.attempts.append(Attempt(sent=sent, rate_limited=False))
                usage = response.usage
                prompt = usage.prompt_tokens if usage is not None else 0
                completion = usage.completion_tokens if usage is not None else 0
                outcome.completions.append(Completion(sent=sent, at=time.time(), tokens=prompt + completion))
                outcome.cost_usd += PRICES.cost_usd(prompt, completion)
                if response.choices[0].finish_reason == "length":
                    outcome.wasted_tokens += prompt + completion
                else:
                    outcome.succeeded += 1
                return True
        return False

    try:
        results = await asyncio.gather(*(one(request) for request in requests), return_exceptions=True)
    finally:
        await client.close()
    outcome.failed = sum(1 for result in results if result is not True)
    return outcome


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

    requests = _workload(scenario, dataset, base_url)
    # One second of quota per limiter: the same burst the server allows.
    request_limiter = AsyncLimiter(scenario.requests_per_s, 1.0) if scenario.requests_per_s else None
    token_limiter = AsyncLimiter(scenario.tokens_per_s, 1.0) if scenario.tokens_per_s else None
    url = f"{base_url}/chat/completions"
    headers = {"Authorization": "Bearer bench", "Content-Type": "application/json"}
    outcome = ClientOutcome(items=len(requests))
    completion_tokens_seen = 0
    answers_seen = 0
    pending: Iterator[BenchRequest] = iter(requests)

    async def send(
        session: aiohttp.ClientSession, request: BenchRequest, data: bytes, runnable: float
    ) -> bool:
        nonlocal completion_tokens_seen, answers_seen
        length_retries_left = scenario.length_retries
        first = True
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
            if first:
                outcome.delays.append(QueueDelay(request.prompt_chars, sent - runnable))
                first = False
            async with session.post(url, data=data, headers=headers) as response:
                payload = await response.read()
                if response.status in _SLOW_DOWN_STATUSES:
                    outcome.attempts.append(Attempt(sent=sent, rate_limited=True))
                    outcome.retries_429 += 1
                    await asyncio.sleep(
                        _retry_after_s(
                            response.headers.get("retry-after"), response.headers.get("retry-after-ms")
                        )
                    )
                    continue
                response.raise_for_status()
            outcome.attempts.append(Attempt(sent=sent, rate_limited=False))
            answer = json.loads(payload)
            usage = answer.get("usage") or {}
            prompt = int(usage.get("prompt_tokens", 0))
            completion = int(usage.get("completion_tokens", 0))
            completion_tokens_seen += completion
            answers_seen += 1
            outcome.completions.append(Completion(sent=sent, at=time.time(), tokens=prompt + completion))
            outcome.cost_usd += PRICES.cost_usd(prompt, completion)
            if answer["choices"][0].get("finish_reason") == "length":
                outcome.wasted_tokens += prompt + completion
                if length_retries_left > 0:
                    length_retries_left -= 1
                    continue
                return True
            outcome.succeeded += 1
            return True
        return False

    async def worker(session: aiohttp.ClientSession) -> None:
        for request in pending:
            runnable = time.time()
            try:
                ok = await send(
                    session, request, json.dumps(request.body, ensure_ascii=False).encode(), runnable
                )
            except aiohttp.ClientError:
                ok = False
            if not ok:
                outcome.failed += 1

    connector = aiohttp.TCPConnector(limit=scenario.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session, asyncio.TaskGroup() as group:
        for _ in range(scenario.concurrency):
            group.create_task(worker(session))
    return outcome


# --------------------------------------------------------------------------------------------- litellm-router


async def run_litellm_router(
    scenario: Scenario, dataset: Path, base_url: str, workdir: Path
) -> ClientOutcome:
    """LiteLLM's Router with one rate-limited deployment, under a semaphore (module docstring)."""
    import_optional_packages("litellm-router")
    # Through importlib: litellm's types are its own business, and the bench type-checks without it.
    litellm: Any = importlib.import_module("litellm")
    custom_logger: Any = importlib.import_module("litellm.integrations.custom_logger").CustomLogger
    requests = _workload(scenario, dataset, base_url)
    outcome = ClientOutcome(items=len(requests))
    answered: list[tuple[float, float, int, int]] = []
    # Set once the success callbacks have reported as many answers as the calls returned (known at the end).
    all_reported = asyncio.Event()
    expected_answers: int | None = None

    # LiteLLM calls these with keyword arguments of these names, once per attempt sent to the server.
    async def on_success(self: Any, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        usage = getattr(response_obj, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        answered.append((_epoch(start_time), _epoch(end_time), prompt, completion))
        if expected_answers is not None and len(answered) >= expected_answers:
            all_reported.set()

    async def on_failure(self: Any, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        status = getattr(kwargs.get("exception"), "status_code", None)
        if status in _SLOW_DOWN_STATUSES:
            outcome.attempts.append(Attempt(sent=_epoch(start_time), rate_limited=True))
            outcome.retries_429 += 1

    recorder = type(
        "BenchRecorder",
        (custom_logger,),
        {"async_log_success_event": on_success, "async_log_failure_event": on_failure},
    )()
    litellm.callbacks = [recorder]
    deployment: dict[str, Any] = {"model": f"openai/{MODEL}", "api_base": base_url, "api_key": "bench"}
    if scenario.rpm is not None:
        deployment["rpm"] = scenario.rpm
    if scenario.tpm is not None:
        deployment["tpm"] = scenario.tpm
    router = litellm.Router(
        model_list=[{"model_name": "bench", "litellm_params": deployment}],
        routing_strategy="usage-based-routing-v2",
        num_retries=_LITELLM_RETRIES,
    )
    semaphore = asyncio.Semaphore(scenario.concurrency)

    async def one(request: BenchRequest) -> bool:
        runnable = time.time()
        arguments = {name: value for name, value in request.body.items() if name != "model"}
        async with semaphore:
            outcome.delays.append(QueueDelay(request.prompt_chars, time.time() - runnable))
            response = await router.acompletion(model="bench", **arguments)
        if response.choices[0].finish_reason == "length":
            usage = response.usage
            outcome.wasted_tokens += int(usage.prompt_tokens) + int(usage.completion_tokens)
        else:
            outcome.succeeded += 1
        return True

    results = await asyncio.gather(*(one(request) for request in requests), return_exceptions=True)
    successes = sum(1 for result in results if result is True)
    # LiteLLM runs its success callbacks as tasks of their own: let the last ones report.
    expected_answers = successes
    if len(answered) < successes:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_reported.wait(), _LITELLM_CALLBACK_DRAIN_S)
    for sent, at, prompt, completion in answered:
        outcome.attempts.append(Attempt(sent=sent, rate_limited=False))
        outcome.completions.append(Completion(sent=sent, at=at, tokens=prompt + completion))
        outcome.cost_usd += PRICES.cost_usd(prompt, completion)
    outcome.failed = len(results) - successes
    litellm.callbacks = []
    return outcome


def _epoch(moment: Any) -> float:
    """LiteLLM's callback times (naive local datetimes, or epoch seconds) as ``time.time()`` seconds."""
    return float(moment.timestamp()) if isinstance(moment, datetime) else float(moment)


def _retry_after_s(seconds: str | None, milliseconds: str | None) -> float:
    for value, scale in ((milliseconds, 0.001), (seconds, 1.0)):
        if value is not None:
            with contextlib.suppress(ValueError):
                return max(0.0, float(value) * scale)
    return 1.0


async def run_rcarun_unstreamed(
    scenario: Scenario, dataset: Path, base_url: str, workdir: Path
) -> ClientOutcome:
    """rcarun with ``stream = false``: the same sweep, each answer one body."""
    return await run_rcarun(scenario, dataset, base_url, workdir, stream=False)


RCARUN_CLIENTS = ("rcarun", "rcarun-unstreamed")
"""The clients that are rcarun itself (its runner, its loop, results.db), not peers it is compared with."""

CLIENTS: dict[str, ClientRunner] = {
    "rcarun": run_rcarun,
    "rcarun-unstreamed": run_rcarun_unstreamed,
    "naive-gather": run_naive_gather,
    "aiolimiter-loop": run_aiolimiter_loop,
    "litellm-router": run_litellm_router,
}
