"""The simulated backbone: an OpenAI-compatible chat-completions server on loopback.

Every test, the demo and the benchmark talk to it instead of a provider. It answers from the JSON schema the
request carries (`answers`), as one body or streamed as server-sent events (`streaming`), enforces limits the way
providers do (`limits`), injects reproducible faults (`faults`) and measures what clients offered (`stats`). The
request path (`chat`) is kept lean (no per-request logging unless the request log is on, stdlib JSON, O(1)
bookkeeping) so that the benchmark can drive ~1,000 requests/s on one core. Routes and wire behaviour:
docs/simulator.md.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .chat import ChatRoute
from .config import MockConfig
from .http import error_response, is_authorized, json_response
from .limits import FifoSlots
from .refusals import UNAUTHORIZED
from .state import ServerState
from .stats import MockStats

__all__ = ["MockServer", "is_loopback_host"]

_CLIENT_MAX_SIZE = 64 * 1024 * 1024


def is_loopback_host(host: str) -> bool:
    """True for "localhost" and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class MockServer:
    """The simulator running inside the caller's event loop.

    Use as ``async with MockServer(config) as server:`` and point a client at ``server.base_url``.

    Args:
        config: how the simulated backbone behaves.
        host: a loopback address (anything else is refused).
        port: TCP port; 0 picks a free one (read it back from ``server.port``).
        clock: monotonic seconds; replaceable for tests.
    """

    def __init__(
        self,
        config: MockConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not is_loopback_host(host):
            raise ValueError(f"the mock server only listens on loopback, not on {host!r}")
        self._config = config if config is not None else MockConfig()
        self.host = host
        self._requested_port = port
        self._clock = clock
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._state = ServerState(self.config, clock())
        self._started_at = clock()
        self._slots = FifoSlots(self.config.max_concurrency) if self.config.max_concurrency else None
        self._expected_authorization = (
            f"Bearer {self.config.api_key}".encode() if self.config.api_key is not None else None
        )
        self._chat = ChatRoute(self.config, clock, self._slots, self._expected_authorization)

    @property
    def config(self) -> MockConfig:
        """How the simulated backbone behaves. Replacing it between requests changes how the next ones are
        answered (a test gives the server a larger model, say); faults' rates and slots stay as first built."""
        return self._config

    @config.setter
    def config(self, config: MockConfig) -> None:
        self._config = config
        self._chat.config = config

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the mock server is not started")
        return self._port

    @property
    def root_url(self) -> str:
        """``http://HOST:PORT`` (the ``/mock/*`` routes live here)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        return f"{self.root_url}/v1"

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=_CLIENT_MAX_SIZE)
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_get("/mock/stats", self._handle_stats)
        app.router.add_get("/mock/log", self._handle_log)
        app.router.add_post("/mock/reset", self._handle_reset)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/version", self._handle_version)
        app.router.add_get("/metrics", self._handle_metrics)
        return app

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the mock server is already started")
        self._chat.closing = asyncio.Event()
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
        self._started_at = self._clock()
        self.reset()

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        # Wake hanging ("timeout" fault) handlers so that shutdown does not wait for them.
        self._chat.closing.set()
        await runner.cleanup()

    async def __aenter__(self) -> MockServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ---------------------------------------------------------------------------------------- measurement

    def stats(self) -> MockStats:
        """Counters since the last reset (or start)."""
        state = self._state
        return state.stats.snapshot(self._clock(), state.offered.overshoot())

    @property
    def prefix_hits(self) -> int:
        """Requests since the last reset whose first message the prefix cache held (``prefix_cache_entries``
        > 0 only): how a benchmark sees whether its routing kept prefixes warm."""
        return self._state.prefix_hits

    @property
    def prefix_misses(self) -> int:
        """Requests since the last reset whose first message the prefix cache did not hold."""
        return self._state.prefix_misses

    def request_log(self) -> dict[str, Any]:
        """The request log since the last reset: ``{"size", "total", "dropped", "entries": [...]}``.

        Raises:
            RuntimeError: the log is off (``request_log_size`` is 0).
        """
        log = self._state.request_log
        if log is None:
            raise RuntimeError("the request log is off; set MockConfig.request_log_size")
        return log.to_dict()

    def reset(self) -> None:
        """Zero the counters and restore limits, random streams and the prefix cache to their initial state.

        Requests in flight when this is called finish against the old counters.
        """
        self._state = ServerState(self.config, self._clock())

    # ------------------------------------------------------------------------------------------- handlers

    async def _handle_models(self, request: web.Request) -> web.Response:
        if not is_authorized(request, self._expected_authorization):
            return error_response(*UNAUTHORIZED, {})
        config = self.config
        card = {
            "id": config.model,
            "object": "model",
            "created": 0,
            "owned_by": "rcarun-mock",
            "root": config.model_root or config.model,
            "parent": None,
            "max_model_len": config.context_window,
            "permission": [],
        }
        return json_response(200, {"object": "list", "data": [card]})

    async def _handle_health(self, request: web.Request) -> web.Response:
        if self._clock() - self._started_at < self.config.startup_delay_s:
            return web.Response(status=503)
        return web.Response(status=200)

    async def _handle_version(self, request: web.Request) -> web.Response:
        return json_response(200, {"version": self.config.server_version})

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(status=200, text=self.metrics_text(), content_type="text/plain", charset="utf-8")

    def metrics_text(self) -> str:
        """vLLM's scheduler and KV-cache gauges in Prometheus text format, labelled as vLLM labels them."""
        config = self.config
        state = self._state
        running = max(0, state.stats.generating)
        waiting = self._slots.waiting if self._slots is not None else 0
        if config.kv_cache_tokens is not None:
            usage = min(1.0, state.kv_tokens / config.kv_cache_tokens)
        elif config.max_concurrency:
            usage = min(1.0, running / config.max_concurrency)
        else:
            usage = 0.0
        labels = f'{{engine="0",model_name="{_label_value(config.model)}"}}'
        gauges = (
            ("num_requests_running", "Number of requests in model execution batches.", float(running)),
            ("num_requests_waiting", "Number of requests waiting to be processed.", float(waiting)),
            (config.kv_cache_metric, "KV-cache usage. 1 means 100 percent usage.", usage),
        )
        lines: list[str] = []
        for name, help_text, value in gauges:
            lines += [
                f"# HELP vllm:{name} {help_text}",
                f"# TYPE vllm:{name} gauge",
                f"vllm:{name}{labels} {value!r}",
            ]
        return "\n".join(lines) + "\n"

    async def _handle_stats(self, request: web.Request) -> web.Response:
        return json_response(200, self.stats().to_dict())

    async def _handle_log(self, request: web.Request) -> web.Response:
        log = self._state.request_log
        if log is None:
            return error_response(
                404, "the request log is off; set request_log_size", "invalid_request_error", None, {}
            )
        return json_response(200, log.to_dict())

    async def _handle_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return json_response(200, {"reset": True})

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._chat.handle(request, self._state)


def _label_value(text: str) -> str:
    """``text`` escaped for a Prometheus label value (backslash, quote, newline)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
