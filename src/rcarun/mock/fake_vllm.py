"""A stand-in for the ``vllm`` command: ``serve`` starts the simulator with vLLM's face, so that rcarun's managed
replicas (start, health wait, checks, death and restart, shutdown) are tested on machines without a GPU.

It takes the flags rcarun passes as ``vllm serve`` does, accepts (and logs as ignored) any other, and misbehaves
as the ``RCARUN_FAKE_VLLM`` JSON object says: docs/simulator.md lists its keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import MockConfig
from .server import MockServer

__all__ = ["FAKE_VLLM_VERSION", "main"]

FAKE_VLLM_VERSION = "0.0.0+rcarun.fake"
_ENV = "RCARUN_FAKE_VLLM"
_KNOWN = frozenset(
    (
        "startup_s",
        "die_after",
        "die_once_file",
        "ignore_sigterm",
        "spawn_child",
        "pid_dir",
        "mock",
        "report_model",
        "report_max_model_len",
        "devices",
    )
)


def _log(level: str, text: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [fake_vllm.py] {text}", file=sys.stderr, flush=True)


def _behaviour() -> dict[str, Any]:
    """The ``RCARUN_FAKE_VLLM`` object, with the entry for this replica's ``CUDA_VISIBLE_DEVICES`` applied."""
    raw = os.environ.get(_ENV, "").strip()
    values: dict[str, Any] = json.loads(raw) if raw else {}
    if not isinstance(values, dict):
        raise ValueError(f"{_ENV} must be a JSON object")
    devices = values.pop("devices", {}) or {}
    own = devices.get(os.environ.get("CUDA_VISIBLE_DEVICES", ""), {})
    merged = {**values, **own}
    unknown = sorted(set(merged) - _KNOWN)
    if unknown:
        raise ValueError(f"{_ENV}: unknown keys {unknown} (known: {sorted(_KNOWN)})")
    return merged


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm (rcarun fake)")
    parser.add_argument("--version", action="store_true")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``serve`` until SIGTERM/SIGINT, or print the version. Returns the exit status."""
    args, unknown = _parser().parse_known_args(argv)
    if args.version:
        print(FAKE_VLLM_VERSION)
        return 0
    if args.command != "serve":
        print("usage: python -m rcarun.mock.fake_vllm serve MODEL [flags] | --version", file=sys.stderr)
        return 2
    try:
        behaviour = _behaviour()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _log("INFO", f"vLLM API server version {FAKE_VLLM_VERSION}")
    _log(
        "INFO",
        f"args: model={args.model!r} served_model_name={args.served_model_name} "
        f"max_model_len={args.max_model_len} tensor_parallel_size={args.tensor_parallel_size} "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}",
    )
    if unknown:
        _log("WARNING", f"ignoring flags a real vllm would apply: {' '.join(unknown)}")
    try:
        return asyncio.run(_serve(args, behaviour))
    except OSError as exc:
        _log("ERROR", f"cannot listen on {args.host}:{args.port}: {exc}")
        return 1


async def _serve(args: argparse.Namespace, behaviour: dict[str, Any]) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        if behaviour.get("ignore_sigterm") and signum == signal.SIGTERM:
            _log("WARNING", "SIGTERM received; ignoring it (ignore_sigterm)")
            return
        _log("INFO", f"{signal.Signals(signum).name} received; shutting down")
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    child = (
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        if behaviour.get("spawn_child")
        else None
    )
    pid_dir = behaviour.get("pid_dir")
    if pid_dir:
        pids = [os.getpid()] + ([child.pid] if child is not None else [])
        Path(pid_dir, f"{os.getpid()}.pid").write_text(" ".join(map(str, pids)))
    try:
        startup_s = float(behaviour.get("startup_s", 0.0))
        if startup_s > 0:
            _log("INFO", f"loading weights and profiling memory ({startup_s:g} s)")
            try:
                await asyncio.wait_for(stop.wait(), startup_s)
                return 0
            except TimeoutError:
                pass
        name = behaviour.get("report_model") or (args.served_model_name or [args.model])[0]
        window = behaviour.get("report_max_model_len", args.max_model_len)
        config = MockConfig.from_mapping(
            {
                "headers": "none",
                **behaviour.get("mock", {}),
                "model": name,
                "model_root": args.model,
                "context_window": window,
                "server_version": FAKE_VLLM_VERSION,
                "api_key": os.environ.get("VLLM_API_KEY") or None,
            }
        )
        async with MockServer(config, host=args.host, port=args.port) as server:
            _log("INFO", f"Starting vLLM API server on http://{args.host}:{server.port}")
            _log("INFO", "Application startup complete.")
            die_after = behaviour.get("die_after")
            if die_after is not None:
                once_file = behaviour.get("die_once_file")
                if once_file and Path(once_file).exists():
                    die_after = None
            while not stop.is_set():
                if die_after is not None and server.stats().requests_total >= int(die_after):
                    if behaviour.get("die_once_file"):
                        Path(behaviour["die_once_file"]).touch()
                    # The child is left behind, as a crashed vLLM may leave its workers: the caller's
                    # process-group kill is what must clean it up.
                    _log("ERROR", f"EngineCore died after {die_after} requests (die_after)")
                    os._exit(1)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.01)
        _log("INFO", "Shutdown complete.")
        return 0
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    sys.exit(main())
