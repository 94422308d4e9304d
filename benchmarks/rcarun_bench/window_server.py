"""A strict sliding-window rate-limit server of the bench's own: a provider's per-minute limits, in loopback.

The simulator's limits are token buckets with a 1-s burst; a provider counts per minute and states resets of
tens of seconds. This server refuses an arrival when the requests — or the tokens — accepted in the last
``window_s`` seconds, this one included, would exceed the limit; refused arrivals count against nothing. Limits
are per minute (the window admits ``rpm × window_s / 60``). Tokens are charged at arrival (``metering``) and a
refusal is signalled one of five ways (``signal``), each after a provider: see "Against a provider's 60-s
window" in docs/performance.md and benchmarks/README.md. It logs every arrival (`GET /window/stats`), the ground
truth of `rcarun_bench.metrics.window_figures`, and shares only its stats record with the simulator.

    async with WindowServer(WindowConfig(rpm=300)) as server:     # in this event loop
    with WindowServerProcess(WindowConfig(rpm=300)) as server:    # in a child process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from rcarun.mock import MockStats
from rcarun.mock.process import ServerProcess, child_environment, serve_until_stopped

from .metrics import Arrival
from .scenarios import Metering, Signal, WindowConfig

__all__ = [
    "Metering",
    "Signal",
    "SlidingWindow",
    "WindowConfig",
    "WindowServer",
    "WindowServerProcess",
    "answer_content",
    "format_go_duration",
    "main",
    "prompt_tokens",
]

# Tokens a message costs beyond its text (as OpenAI's accounting and rcarun's simulator count).
_MESSAGE_OVERHEAD_TOKENS = 4
# The answer's free-text fields: long enough to be a realistic short explanation (about 50 tokens).
_REASON = (
    "The first step whose output contradicts the task is where the run went wrong; every later step builds "
    "on that result, so the agent that produced it is responsible."
)
_FENCED_JSON = re.compile(r"```json\s*(.*?)```", re.DOTALL)
# The directory that holds the `rcarun_bench` package, for the child's PYTHONPATH.
_BENCH_ROOT = str(Path(__file__).resolve().parents[1])


class SlidingWindow:
    """Units accepted in the last ``window_s`` seconds (an event at ``now - window_s`` has left), against a
    limit. Pure: every method takes the time, so tests drive it with any clock."""

    __slots__ = ("_events", "_used", "limit", "window_s")

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._used = 0

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        events = self._events
        while events and events[0][0] <= horizon:
            self._used -= events.popleft()[1]

    def used(self, now: float) -> int:
        self._expire(now)
        return self._used

    def admits(self, now: float, units: int) -> bool:
        """Whether ``units`` more, counted now, stay within the limit."""
        return self.used(now) + units <= self.limit

    def add(self, now: float, units: int) -> None:
        self._expire(now)
        self._events.append((now, units))
        self._used += units

    def remaining(self, now: float) -> int:
        return max(0, self.limit - self.used(now))

    def reset_s(self, now: float) -> float:
        """Seconds until everything now counted has left the window (OpenAI's "initial state")."""
        self._expire(now)
        return self._events[-1][0] + self.window_s - now if self._events else 0.0

    def wait_s(self, now: float, units: int) -> float:
        """Seconds until ``units`` more would fit; ``window_s`` when they never can (above the limit)."""
        if units > self.limit:
            return self.window_s
        self._expire(now)
        excess = self._used + units - self.limit
        if excess <= 0:
            return 0.0
        for at, size in self._events:
            excess -= size
            if excess <= 0:
                return at + self.window_s - now
        return self.window_s


def format_go_duration(seconds: float) -> str:
    """A duration as OpenAI writes its resets: "200ms", "59.87s", "1m2s", "1m0.5s" ("0s" for none)."""
    milliseconds = round(seconds * 1000)
    if milliseconds <= 0:
        return "0s"
    if milliseconds < 1000:
        return f"{milliseconds}ms"
    minutes, rest_ms = divmod(milliseconds, 60_000)
    secs = f"{rest_ms / 1000:.2f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def prompt_tokens(messages: Sequence[Mapping[str, Any]], chars_per_token: float) -> int:
    """⌈characters / chars_per_token⌉ per message + 4 per message."""
    total = 0
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
        total += math.ceil(len(text) / chars_per_token) + _MESSAGE_OVERHEAD_TOKENS
    return total


def _schema_of(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        json_schema = response_format.get("json_schema")
        if isinstance(json_schema, Mapping) and isinstance(json_schema.get("schema"), Mapping):
            schema: Mapping[str, Any] = json_schema["schema"]
            return schema
    # JSON mode (``{"type": "json_object"}``): the prompt carries the schema in a fenced block.
    for message in reversed(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in reversed(_FENCED_JSON.findall(content) if isinstance(content, str) else ()):
            with contextlib.suppress(ValueError):
                value = json.loads(block)
                if isinstance(value, dict) and isinstance(value.get("properties"), dict):
                    return value
    return None


def _value(schema: Mapping[str, Any]) -> Any:
    """The simplest value that meets ``schema``: the first enum value, the minimum, the reason text."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _value(sub) for name, sub in properties.items() if isinstance(sub, Mapping)}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return _REASON


def answer_content(body: Mapping[str, Any]) -> str:
    """The answer's text: the request's schema filled in, or a small JSON object without one."""
    schema = _schema_of(body)
    value = _value(schema) if schema is not None else {"reason": _REASON}
    return json.dumps(value, separators=(",", ":"))


def _output_budget(body: Mapping[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(slots=True)
class _Counters:
    requests_total: int = 0
    accepted: int = 0
    rejected_429: int = 0
    rejected_503: int = 0
    rejected_by: dict[str, int] = field(default_factory=dict)
    errors_4xx: int = 0
    length_stops: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    accepted_prompt_tokens: int = 0
    accepted_completion_tokens: int = 0


class _BadRequest(Exception):
    """A request answered with a 400 (never leaves this module)."""


class WindowServer:
    """The window server in this event loop (``async with``), on a free loopback port.

    Args:
        config: limits, window, latency, metering and signalling.
        host: a loopback address.
        port: 0 picks a free port.
        clock: seconds on a monotonic clock; tests pass a fake one.
    """

    def __init__(
        self,
        config: WindowConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config if config is not None else WindowConfig()
        self.host = host
        self._requested_port = port
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        config = self.config
        requests, tokens = config.requests_per_window, config.tokens_per_window
        self._requests = None if requests is None else SlidingWindow(requests, config.window_s)
        self._tokens = None if tokens is None else SlidingWindow(tokens, config.window_s)
        self._counters = _Counters()
        self._arrivals: list[Arrival] = []
        self._first_arrival: float | None = None
        self._reset_at = self._clock()
        self._served = 0

    # ------------------------------------------------------------------------------------------- lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the window server is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/window/stats", self._stats_view)
        app.router.add_post("/window/reset", self._reset_view)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the window server is already started")
        runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._requested_port, backlog=2048)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._port = None

    async def __aenter__(self) -> WindowServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # ---------------------------------------------------------------------------------------------- counts

    def reset(self) -> None:
        """Empty the windows and zero every counter and the arrival log."""
        self._reset_state()

    def arrivals(self) -> list[Arrival]:
        """Every chat request since the reset, in arrival order (times from the first arrival)."""
        return list(self._arrivals)

    def stats(self) -> MockStats:
        """The counters in the simulator's shape (what `rcarun_bench.throughput.result_row` reads).

        ``rejected_429`` counts 429s only; a 503 ("overload-503") is in ``errors_5xx``. ``max_requests_60s`` /
        ``max_tokens_60s`` are the most accepted in any window of ``window_s``; ``overshoot_requests`` /
        ``overshoot_tokens`` the most that every arrival, refused ones included, asked for in any such window
        beyond the limit (0: the client never asked for more than the window allows).
        """
        counters = self._counters
        accepted = [a for a in self._arrivals if a.status == 200]
        window_s = self.config.window_s
        limits = self.config.requests_per_window, self.config.tokens_per_window
        overshoot = {
            name: max(0.0, _most_in_window(self._arrivals, window_s, by_tokens) - limit)
            for name, limit, by_tokens in (("rpm", limits[0], False), ("tpm", limits[1], True))
            if limit is not None
        }
        return MockStats(
            elapsed_s=self._clock() - self._reset_at,
            requests_total=counters.requests_total,
            accepted=counters.accepted,
            rejected_429=counters.rejected_429,
            rejected_by=dict(counters.rejected_by),
            errors_4xx=counters.errors_4xx,
            errors_5xx=counters.rejected_503,
            length_stops=counters.length_stops,
            max_in_flight=counters.max_in_flight,
            max_generating=counters.max_in_flight,
            accepted_tokens=counters.accepted_prompt_tokens + counters.accepted_completion_tokens,
            accepted_prompt_tokens=counters.accepted_prompt_tokens,
            accepted_completion_tokens=counters.accepted_completion_tokens,
            max_requests_60s=round(_most_in_window(accepted, window_s, by_tokens=False)),
            max_tokens_60s=round(_most_in_window(accepted, window_s, by_tokens=True)),
            overshoot_requests=overshoot.get("rpm", 0.0),
            overshoot_tokens=overshoot.get("tpm", 0.0),
            overshoot_by_limit=overshoot,
        )

    # ------------------------------------------------------------------------------------------------ HTTP

    async def _stats_view(self, request: web.Request) -> web.Response:
        values = self.stats().to_dict()
        values["arrivals"] = [[a.at, a.status, a.tokens] for a in self._arrivals]
        return web.json_response(values)

    async def _reset_view(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        counters = self._counters
        try:
            body = await request.json()
            reply = self._answer(body)
        except (ValueError, _BadRequest) as exc:
            counters.errors_4xx += 1
            return _error(400, str(exc) or "invalid JSON body", "invalid_request_error")
        # Everything from the arrival's time to its admission runs without an await: one decision at a time.
        now = self._clock()
        counters.requests_total += 1
        if self._first_arrival is None:
            self._first_arrival = now
        at = now - self._first_arrival
        metered = reply.metered_tokens
        refused_by = [
            name
            for name, window, units in (("rpm", self._requests, 1), ("tpm", self._tokens, metered))
            if window is not None and not window.admits(now, units)
        ]
        if refused_by:
            return self._refuse(now, at, metered, refused_by)
        for window, units in ((self._requests, 1), (self._tokens, metered)):
            if window is not None:
                window.add(now, units)
        self._arrivals.append(Arrival(at=at, status=200, tokens=metered))
        counters.accepted += 1
        counters.accepted_prompt_tokens += reply.prompt_tokens
        counters.accepted_completion_tokens += reply.completion_tokens
        counters.length_stops += reply.finish_reason == "length"
        headers = self._limit_headers(now) if self.config.signal in ("openai-headers", "both") else {}
        counters.in_flight += 1
        counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
        try:
            if self.config.latency_s > 0:
                await asyncio.sleep(self.config.latency_s)
        finally:
            counters.in_flight -= 1
        self._served += 1
        payload = {
            "id": f"chatcmpl-window-{self._served}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.config.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
        return web.json_response(payload, headers=headers)

    def _answer(self, body: Any) -> _Reply:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise _BadRequest("the body must be a JSON object with a non-empty messages list")
        if body.get("stream"):
            raise _BadRequest("this server answers non-streaming requests only")
        config = self.config
        prompt = prompt_tokens(body["messages"], config.chars_per_token)
        content = answer_content(body)
        completion = math.ceil(len(content) / config.chars_per_token)
        budget = _output_budget(body)
        finish_reason = "stop"
        if budget is not None and completion > budget:
            completion = budget
            content = content[: math.floor(budget * config.chars_per_token)]
            finish_reason = "length"
        charged_output = budget if config.metering == "max_tokens" and budget is not None else completion
        return _Reply(content, finish_reason, prompt, completion, prompt + charged_output)

    def _refuse(self, now: float, at: float, metered: int, refused_by: Sequence[str]) -> web.Response:
        config = self.config
        counters = self._counters
        for name in refused_by:
            counters.rejected_by[name] = counters.rejected_by.get(name, 0) + 1
        if config.signal == "overload-503":
            self._arrivals.append(Arrival(at=at, status=503, tokens=metered))
            counters.rejected_503 += 1
            return _error(
                503,
                "The engine is currently overloaded, please try again later",
                "engine_overloaded_error",
            )
        self._arrivals.append(Arrival(at=at, status=429, tokens=metered))
        counters.rejected_429 += 1
        headers: dict[str, str] = {}
        if config.signal in ("openai-headers", "both"):
            headers.update(self._limit_headers(now))
        if config.signal in ("retry-after", "both"):
            waits = [
                window.wait_s(now, units)
                for window, units in ((self._requests, 1), (self._tokens, metered))
                if window is not None
            ]
            headers["retry-after"] = str(max(1, math.ceil(max(waits, default=1.0))))
        what = "tokens" if "tpm" in refused_by else "requests"
        return _error(
            429,
            f"Rate limit reached for {what} per min on model {config.model}: please try again later.",
            what,
            code="rate_limit_exceeded",
            headers=headers,
        )

    def _limit_headers(self, now: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        for suffix, window, per_minute in (
            ("requests", self._requests, self.config.rpm),
            ("tokens", self._tokens, self.config.tpm),
        ):
            if window is None:
                continue
            headers[f"x-ratelimit-limit-{suffix}"] = str(per_minute)
            headers[f"x-ratelimit-remaining-{suffix}"] = str(window.remaining(now))
            headers[f"x-ratelimit-reset-{suffix}"] = format_go_duration(window.reset_s(now))
        return headers


@dataclass(frozen=True, slots=True)
class _Reply:
    content: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    metered_tokens: int


def _error(
    status: int, message: str, kind: str, *, code: str | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=dict(headers or {}))


def _most_in_window(arrivals: Sequence[Arrival], window_s: float, by_tokens: bool) -> float:
    """The most requests (or tokens) among ``arrivals`` in any window of ``window_s`` ending at one of them."""
    most = 0
    total = 0
    start = 0
    for arrival in arrivals:
        total += arrival.tokens if by_tokens else 1
        while arrivals[start].at <= arrival.at - window_s:
            total -= arrivals[start].tokens if by_tokens else 1
            start += 1
        most = max(most, total)
    return float(most)


# ----------------------------------------------------------------------------------------------- process


class WindowServerProcess(ServerProcess):
    """The window server in a child process (``with``), so that it has a core of its own, as the simulator.

    ``python -m rcarun_bench.window_server --config-json ... --port 0 --watch-stdin`` prints its address as
    its first stdout line and exits when its stdin closes (`rcarun.mock.process.ServerProcess`).
    """

    def __init__(
        self, config: WindowConfig, *, host: str = "127.0.0.1", startup_timeout_s: float = 20.0
    ) -> None:
        super().__init__(
            "window server process", "/window/stats", host=host, startup_timeout_s=startup_timeout_s
        )
        self.config = config

    def command(self) -> tuple[list[str], dict[str, str]]:
        config_json = json.dumps(self.config.to_dict(), separators=(",", ":"))
        command = [
            sys.executable,
            "-m",
            "rcarun_bench.window_server",
            "--host",
            self.host,
            "--port",
            "0",
            "--watch-stdin",
        ]
        return [*command, "--config-json", config_json], child_environment([_BENCH_ROOT])

    def stats(self) -> MockStats:
        return MockStats.from_dict(self._call("GET", "/window/stats", timeout_s=30.0))

    def arrivals(self) -> list[Arrival]:
        rows = self._call("GET", "/window/stats", timeout_s=30.0)["arrivals"]
        return [Arrival(at=float(at), status=int(status), tokens=int(tokens)) for at, status, tokens in rows]

    def reset(self) -> None:
        self._call("POST", "/window/reset", timeout_s=30.0)


async def _serve(config: WindowConfig, host: str, port: int, watch_stdin: bool) -> None:
    await serve_until_stopped(
        WindowServer(config, host=host, port=port), watch_stdin=watch_stdin, name="window-server"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rcarun_bench.window_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    parser.add_argument("--config-json", default="{}", help="a JSON object of WindowConfig fields")
    parser.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes")
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "::1", "localhost"):
        parser.error("the window server listens on loopback only")
    config = WindowConfig.from_dict(json.loads(args.config_json))
    asyncio.run(_serve(config, args.host, args.port, args.watch_stdin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
