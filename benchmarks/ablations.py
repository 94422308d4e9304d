"""What each part of rcarun's call costs, by taking it away: the latency-bound run with one part changed, beside
the run as it ships and the leanest peer, in alternating rounds.

Issue 17 asks for 0.6 ms of CPU per call in the bench's latency-bound scenario. Profiles (docs/performance.md,
"CPU per call") spread what is left over many small parts; this script measures the larger ones in place, as
the difference they make to the whole run, which no profiler's attribution can distort. Each variant is one run
of the bench's latency-bound workload through rcarun's real runner (`rcarun_bench.client.measure`, 6,400 calls,
64 in flight, 100 ms simulated latency), in a process of its own with the one change applied:

- ``none``: rcarun as it ships.
- ``no-store-writes``: the store writer's thread commits nothing (every row is still built and queued): what
  writing results.db costs. Nothing is recorded, so the run is no sweep; the figure is what SQLite takes.
- ``no-calls-indexes``: the ``calls`` table's three indexes (cache key, backbone, item) dropped once the writer
  opens results.db: what keeping them up to date costs.
- ``no-json-screen``: `rcarun.jsonfast` hands every value to orjson without first checking that orjson renders
  it as the standard library does (the bench's requests render the same either way).
- ``bare-http``: rcarun's aiohttp transport replaced by `http_client_floor.BareConnection`s (one keep-alive
  connection per request in flight, a request in one write, a ``Content-Length`` response; no timeouts, TLS,
  chunking or error handling): what aiohttp costs in the run, against a floor no real client reaches.
- ``bare-http+no-store-writes``: both; what rcarun's own Python costs.
- ``pyreqwest-http``: rcarun's transport replaced by pyreqwest's client (Rust's reqwest: its own connection
  pool, timeouts and TLS on threads of its own, whose CPU the figure includes): what a real client leaner than
  aiohttp would give. Skipped where pyreqwest is not installed (``pip install pyreqwest``; not one of rcarun's
  dependencies).
- ``aiolimiter-loop``: the bench's leanest peer (a plain asyncio loop paced by aiolimiter), for the ratio;
  skipped where aiolimiter is not installed (``pip install -e './benchmarks[peers]'``).

None of these is a way to run rcarun: each takes away something a sweep needs. Each round runs every variant once
(in the order given), against the same simulator (reset before each run); the table gives each variant's median
and its difference from ``none``'s median. Usage:

    .venv/bin/python benchmarks/ablations.py --pin                 # every variant, three rounds
    .venv/bin/python benchmarks/ablations.py --pin --variant bare-http --rounds 5
    .venv/bin/python benchmarks/ablations.py --calls 1600          # shorter runs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from http_client_floor import BareConnection  # this script's folder is first on sys.path
from rcarun.backends.transports import WholeResponse
from rcarun.errors import TransportError
from rcarun.jsonfast import dumps_compact

VARIANTS = (
    "none",
    "no-store-writes",
    "no-calls-indexes",
    "no-json-screen",
    "bare-http",
    "bare-http+no-store-writes",
    "pyreqwest-http",
    "aiolimiter-loop",
)
_CALLS_INDEXES = ("calls_cache_key", "calls_run_backbone", "calls_run_item")


class BareTransport:
    """rcarun's `Transport` over `http_client_floor.BareConnection`s: idle connections kept per base URL, a new
    one opened when none is idle. A lost or unreadable connection raises `TransportError` (the call is recorded
    as failed, which the run's figures show)."""

    def __init__(self, settings: Any, api_key: Any) -> None:
        self._idle: dict[str, list[Any]] = {}
        self._heads: dict[str, bytes] = {}

    @contextlib.asynccontextmanager
    async def post_chat(self, base_url: str, body: Mapping[str, Any]) -> AsyncIterator[WholeResponse]:
        idle = self._idle.setdefault(base_url, [])
        head = self._heads.get(base_url)
        if head is None:
            url = urlsplit(base_url)
            head = self._heads[base_url] = (
                f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
                "Content-Type: application/json\r\nAccept: application/json\r\n"
            ).encode()
        if idle:
            connection = idle.pop()
        else:
            url = urlsplit(base_url)
            _, connection = await asyncio.get_running_loop().create_connection(
                BareConnection, url.hostname, url.port
            )
        payload = dumps_compact(body)
        try:
            status, headers, answer = await connection.post(
                head + b"Content-Length: %d\r\n\r\n" % len(payload) + payload
            )
        except ConnectionError as error:
            connection.transport.close()
            raise TransportError(f"bare-http: {base_url}: {error}") from None
        idle.append(connection)
        yield WholeResponse(status, headers, answer)

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.transport.close()
        self._idle.clear()


class PyreqwestTransport:
    """rcarun's `Transport` over one pyreqwest client (64 connections), opened on the first post."""

    _HEADERS: ClassVar[dict[str, str]] = {"Content-Type": "application/json", "Accept": "application/json"}

    def __init__(self, settings: Any, api_key: Any) -> None:
        self._client: Any = None

    @contextlib.asynccontextmanager
    async def post_chat(self, base_url: str, body: Mapping[str, Any]) -> AsyncIterator[WholeResponse]:
        if self._client is None:
            from pyreqwest.client import ClientBuilder

            self._client = await ClientBuilder().max_connections(64).build().__aenter__()
        request = self._client.post(f"{base_url}/chat/completions").body_bytes(dumps_compact(body))
        response = await request.headers(self._HEADERS).build().send()
        answer = await response.bytes()
        yield WholeResponse(response.status, dict(response.headers.items()), bytes(answer))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.__aexit__(None, None, None)


def _apply(variant: str) -> None:
    """Change the one part ``variant`` names, in this process (a child run), before rcarun runs."""
    parts = set(variant.split("+"))
    if "no-store-writes" in parts:
        from rcarun.store import writer

        writer._BatchWriter.write = lambda self, batch: None  # type: ignore[method-assign]
    if "no-calls-indexes" in parts:
        from rcarun.store import writer

        opened = writer._BatchWriter.__init__

        def open_without_indexes(self: Any, *args: Any, **kwargs: Any) -> None:
            opened(self, *args, **kwargs)
            for index in _CALLS_INDEXES:
                self.connection.execute(f"DROP INDEX IF EXISTS {index}")

        writer._BatchWriter.__init__ = open_without_indexes  # type: ignore[method-assign]
    if "no-json-screen" in parts:
        from rcarun import jsonfast

        jsonfast._orjson_renders_as_json = lambda value: True
    if "bare-http" in parts or "pyreqwest-http" in parts:
        from rcarun.backends import transports

        transports._TRANSPORTS["aiohttp"] = BareTransport if "bare-http" in parts else PyreqwestTransport


def _child(variant: str, calls: int, pin: bool) -> None:
    """One run of ``variant``; prints one JSON line: its CPU per call, the calls the server answered, the calls
    results.db holds."""
    from rcarun_bench.client import measure
    from rcarun_bench.scenarios import get_scenario
    from rcarun_bench.throughput import scenario_server
    from rcarun_bench.workload import write_dataset

    # Unstreamed: the bare and pyreqwest clients read whole bodies, and the peer sends unstreamed requests.
    client = variant if variant == "aiolimiter-loop" else "rcarun-unstreamed"
    if client == "rcarun-unstreamed":
        _apply(variant)
    scenario = dataclasses.replace(get_scenario("latency-bound", quick=False), calls=calls)
    with tempfile.TemporaryDirectory(prefix="rcarun-ablation-") as tmp:
        root = Path(tmp)
        dataset = write_dataset(scenario, root / "dataset")
        workdir = root / "run"
        workdir.mkdir()
        with scenario_server(scenario) as server:
            if pin:
                os.sched_setaffinity(server.pid, {0})
                os.sched_setaffinity(0, {1})
            run = measure(scenario, client, server.base_url, dataset, workdir)
            served = server.stats().requests_total
    figures = {"cpu_ms": run.cpu_s * 1000 / calls, "served": served, "recorded": run.recorded_calls}
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variant",
        action="append",
        choices=VARIANTS,
        help="a variant to run beside none (repeatable; default: all)",
    )
    parser.add_argument("--calls", type=int, default=6400, help="calls in each run (default 6,400)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant (default 3)")
    parser.add_argument("--pin", action="store_true", help="the simulator on CPU 0, the client on CPU 1")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.calls, args.pin)
        return
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("ablations.py: --pin needs two CPUs")
    from rcarun_bench.clients import unavailable_reason

    variants = ["none", *(v for v in (args.variant or VARIANTS) if v != "none")]
    if (reason := unavailable_reason("aiolimiter-loop")) is not None and "aiolimiter-loop" in variants:
        print(f"skipped: {reason}")
        variants.remove("aiolimiter-loop")
    if importlib.util.find_spec("pyreqwest") is None and "pyreqwest-http" in variants:
        print("skipped: pyreqwest-http: pyreqwest is not installed (pip install pyreqwest)")
        variants.remove("pyreqwest-http")
    cpu_ms: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_number in range(1, args.rounds + 1):
        for variant in variants:
            command = [sys.executable, __file__, "--child", variant, "--calls", str(args.calls)]
            done = subprocess.run(
                [*command, *(["--pin"] if args.pin else [])], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"ablations.py: the {variant} run failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.splitlines()[-1])
            cpu_ms[variant].append(figures["cpu_ms"])
            print(
                f"round {round_number}  {variant:<26} {figures['cpu_ms']:.3f} ms of CPU a call; "
                f"{figures['served']} answered, {figures['recorded']} recorded",
                flush=True,
            )
    base = statistics.median(cpu_ms["none"])
    print(f"medians of {args.rounds} rounds, {args.calls} calls a run, and the difference from none:")
    for variant, values in cpu_ms.items():
        median = statistics.median(values)
        print(f"  {variant:<26} {median:.3f} ms a call  {median - base:+.3f} ({(median - base) / base:+.0%})")


if __name__ == "__main__":
    main()
