"""``rcarun serve``: start a managed backbone's vLLM replicas alone and keep them up until Ctrl-C.

A sweep starts and stops its managed replicas itself; loading a large model takes minutes, so several sweeps in
a row (or at once) can share replicas started once by this command instead. It prints the ``base_urls`` line a
backbone without ``[serve]`` takes, the vLLM version and each replica's command line, restarts replicas that die
(``restarts``), and on Ctrl-C or SIGTERM stops them all (SIGTERM, then SIGKILL after ``grace_s``); a second
Ctrl-C kills them at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rcarun.errors import ConfigError
from rcarun.runner import SweepConfig, load_sweep_config, narrow_sweep
from rcarun.runner.managed import managed_backbones
from rcarun.text import terminal_safe

__all__ = ["add_serve_command", "cmd_serve"]

EXIT_REPLICAS_LOST = 1


def add_serve_command(commands: Any) -> None:
    """Register ``rcarun serve`` on the top-level subparsers."""
    serve = commands.add_parser(
        "serve",
        help="start a backbone's managed vLLM replicas ([backbones.X.serve]) until Ctrl-C",
        description="Start the vLLM replicas of the config's managed backbones (those with a [serve] table), "
        "check their model and max_model_len, print their base_urls, keep them up (restarting one that dies) "
        "and stop them on Ctrl-C. Exit 0 after Ctrl-C; 1 when every replica died for good; 2 when they could "
        "not start.",
    )
    serve.add_argument("--config", required=True, help="sweep TOML file defining the backbone")
    serve.add_argument(
        "--backbone",
        action="append",
        metavar="NAME",
        help="serve this backbone (repeatable; default: every managed)",
    )
    serve.add_argument("--log-dir", help="replica logs (default: ./rcarun-serve-logs)")


def cmd_serve(args: argparse.Namespace) -> int:
    config = load_sweep_config(Path(args.config))
    managed = [name for name, backbone in config.backbones.items() if backbone.is_managed]
    wanted = args.backbone or managed
    unmanaged = [name for name in wanted if name not in managed]
    if not wanted or unmanaged:
        raise ConfigError(
            f"{args.config}: {'backbones ' + ', '.join(unmanaged) + ' have' if unmanaged else 'no backbone has'} "
            f"no [serve] table (managed here: {', '.join(managed) or 'none'})"
        )
    config = narrow_sweep(config, backbones=wanted)
    log_dir = Path(args.log_dir or "rcarun-serve-logs").resolve()
    return asyncio.run(_serve(config, log_dir))


async def _serve(config: SweepConfig, log_dir: Path) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    kills: list[Callable[[], None]] = []

    def on_signal() -> None:
        if stop.is_set():
            _say("rcarun serve: killing the replicas now")
            for kill in kills:
                kill()
            os._exit(130)
        _say(
            "rcarun serve: stopping the replicas (SIGTERM, then SIGKILL after grace_s); Ctrl-C again kills them"
        )
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)

    def on_event(kind: str, detail: dict[str, Any]) -> None:
        if kind != "replicas_started":
            _say(f"rcarun serve: {kind}: {json.dumps(detail, default=str)}")

    async with managed_backbones(
        config, log_dir=log_dir, on_event=on_event, on_exit=kills.append, announce=_say
    ) as fleets:
        for name, fleet in fleets.items():
            record = fleet.record
            print(f"[backbones.{name}]  # served by rcarun serve (vLLM {record.version})")
            print(f"base_urls = {json.dumps(list(fleet.base_urls))}")
            for replica in record.replicas:
                gpus = ",".join(str(gpu) for gpu in replica.gpus)
                print(f"# replica {replica.index}: CUDA_VISIBLE_DEVICES={gpus} {' '.join(replica.argv)}")
        sys.stdout.flush()
        waiting = asyncio.ensure_future(stop.wait())
        lost = [asyncio.ensure_future(fleet.wait_lost()) for fleet in fleets.values()]
        done, _ = await asyncio.wait([waiting, *lost], return_when=asyncio.FIRST_COMPLETED)
        for task in (waiting, *lost):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if waiting not in done:
            _say("rcarun serve: a backbone's replicas all died with no restart left; stopping the rest")
            return EXIT_REPLICAS_LOST
    return 0


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(terminal_safe(text), file=sys.stderr, flush=True)
