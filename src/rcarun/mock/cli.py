"""``python -m rcarun.mock`` (and ``rcarun mock-server``): the simulator as a process.

`MockProcess` starts it with ``--config-json`` and ``--port 0`` and reads the address from the first stdout
line, a JSON object ``{"event": "listening", "base_url": ..., "port": ..., "pid": ...}``; nothing else is
written to stdout. Hosts other than loopback are refused: the simulator is a test fixture, never a service.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from .config import MockConfig
from .process import serve_until_stopped
from .server import MockServer, is_loopback_host

__all__ = ["build_parser", "config_from_args", "main"]

# Flags named otherwise than their MockConfig field; every other flag that names a field sets it.
_RENAMED_FLAGS = {"latency": "latency_s", "latency_per_token": "latency_per_token_s", "burst": "burst_s"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rcarun.mock",
        description="Run rcarun's OpenAI-compatible simulator on loopback. Flags override --config-json.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)"
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default 0)")
    parser.add_argument("--config-json", help="a JSON object of MockConfig fields")
    parser.add_argument("--model", help="model name to list and report")
    parser.add_argument("--latency", type=float, help="base latency per accepted request, seconds")
    parser.add_argument("--latency-per-token", type=float, help="extra latency per completion token, seconds")
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute (prompt + completion)")
    parser.add_argument("--rps", type=int, help="requests per second (the sub-minute tier)")
    parser.add_argument("--burst", type=float, help="bucket capacity in seconds of quota (default 1)")
    parser.add_argument("--max-concurrency", type=int, help="most requests generating at once")
    parser.add_argument("--over-concurrency", choices=["429", "queue"], help="reject or queue above the cap")
    parser.add_argument("--headers", choices=["openai", "moonshot", "none"], help="rate-limit header style")
    parser.add_argument(
        "--fault-rate", type=float, help="probability of a 5xx, split evenly over 500 and 503"
    )
    parser.add_argument(
        "--rate-limit-rate", type=float, help="probability of a 429 no limit asked for (provider overload)"
    )
    for kind, what in (
        ("huge-step", "a 200 answer whose step fields say 10**26"),
        ("surrogate", "a 200 answer holding a lone UTF-16 surrogate"),
        ("bad-usage", "a 200 answer whose usage is missing, huge, Infinity or negative"),
        ("long-pause", "a 429 whose Retry-After asks for a day or more"),
        ("stream-stall", "an answer that stops about half way and then hangs until the connection drops"),
        ("stream-drop", "an answer whose connection closes about half way"),
        ("bare-rate-limit", "a 429 with no Retry-After and no limit headers (a gateway briefly overloaded)"),
        ("control", "a 200 answer holding terminal control sequences (clear screen, title, clipboard)"),
    ):
        parser.add_argument(f"--{kind}-rate", type=float, help=f"probability of {what}")
    parser.add_argument(
        "--length-rate", type=float, help="probability that an answer is cut short (finish_reason length)"
    )
    parser.add_argument(
        "--request-log-size", type=int, help="keep the last N requests at GET /mock/log (default 0: off)"
    )
    parser.add_argument("--reasoning-tokens", type=int, help="simulated thinking tokens per answer")
    parser.add_argument(
        "--reasoning-field",
        choices=["reasoning_content", "reasoning", "none"],
        help="field of the thinking text",
    )
    parser.add_argument("--usage-style", choices=["openai", "deepseek"], help="shape of usage details")
    parser.add_argument(
        "--tokens-per-chunk", type=int, help="completion tokens per streamed chunk (default 1)"
    )
    parser.add_argument(
        "--refuse-stream",
        action="store_true",
        default=None,
        help='answer "stream": true with a 400, as a server that cannot stream',
    )
    parser.add_argument("--context-window", type=int, help="vLLM-style context limit in tokens")
    parser.add_argument("--api-key-env", help="name of an environment variable holding the key to require")
    parser.add_argument("--seed", type=int, help="seed of the server's random draws")
    # Used by MockProcess: exit when the parent closes our stdin (or dies), so no server is ever orphaned.
    parser.add_argument("--watch-stdin", action="store_true", help=argparse.SUPPRESS)
    return parser


def config_from_args(args: argparse.Namespace) -> MockConfig:
    """The config of parsed flags: defaults, then --config-json, then individual flags.

    Raises:
        ValueError: invalid JSON, unknown keys, invalid values or a missing key variable.
    """
    values: dict[str, Any] = {}
    if args.config_json:
        values.update(MockConfig.from_json(args.config_json).to_dict())
    known = {field.name for field in dataclasses.fields(MockConfig)}
    for dest, value in vars(args).items():
        name = _RENAMED_FLAGS.get(dest, dest)
        if value is not None and name in known and name != "reasoning_field":
            values[name] = value
    if args.reasoning_field is not None:
        values["reasoning_field"] = None if args.reasoning_field == "none" else args.reasoning_field
    if args.fault_rate is not None:
        values["error_500_rate"] = args.fault_rate / 2
        values["error_503_rate"] = args.fault_rate / 2
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ValueError(f"environment variable {args.api_key_env} is not set or empty")
        values["api_key"] = key
    return MockConfig.from_mapping(values)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulator until SIGINT/SIGTERM (or stdin EOF with --watch-stdin). Returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not is_loopback_host(args.host):
        print(
            f"error: refusing to listen on {args.host!r}: the simulator serves loopback only", file=sys.stderr
        )
        return 2
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(config, args.host, args.port, args.watch_stdin))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(config: MockConfig, host: str, port: int, watch_stdin: bool) -> None:
    await serve_until_stopped(
        MockServer(config, host=host, port=port),
        watch_stdin=watch_stdin,
        name="rcarun-mock",
        told="rcarun mock server listening on {base_url} (Ctrl-C to stop)",
    )
