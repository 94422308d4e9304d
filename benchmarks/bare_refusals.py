"""Requests per minute that `rcarun sweep` keeps after bare 429s (issue 35, N6), on a loopback server of its own.

A bare 429 states no limit: no Retry-After, no ``x-ratelimit-*`` headers. Two cases of the 2026-12-04 chaos
report: ``first`` refuses only the very first request, ``sporadic`` refuses a seeded 1.3 % of all requests (a
gateway's transient overload). Every other request gets a valid chat completion with usage after ``--latency``
seconds; a refusal comes after twice that, so the client has seen answers before it. The sweep runs as a child process (``--src`` chooses whose code: a worktree's ``src``) with one
``openai-compatible`` backbone at ``--concurrency`` and nothing declared, and is stopped with SIGINT after
``--seconds``. Printed: requests answered per minute over the measured span (from ``--skip`` seconds after the
first arrival to the stop), the 429s sent, and the requests in each 10-s slice::

    python benchmarks/bare_refusals.py first --seconds 75
    python benchmarks/bare_refusals.py sporadic --seconds 75 --src /work/main/src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web


class BareRefusalServer:
    """OpenAI chat completions on loopback, refusing the first request (``first``) or a seeded share
    (``sporadic``) with a bare 429; records each arrival as (time, status)."""

    def __init__(self, mode: str, latency_s: float, share: float, seed: int) -> None:
        self.mode = mode
        self.latency_s = latency_s
        # A refusal is answered after the first completions (twice their latency), as a real server's is when the
        # refused request was not the first one answered: the client has then seen answers before the 429.
        self.refusal_latency_s = 2 * latency_s
        self.share = share
        self.random = random.Random(seed)
        self.arrivals: list[tuple[float, int]] = []

    def refuses(self) -> bool:
        if self.mode == "first":
            return not self.arrivals
        return self.random.random() < self.share

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        if self.refuses():
            self.arrivals.append((time.monotonic(), 429))
            await asyncio.sleep(self.refusal_latency_s)
            return web.json_response({"error": {"message": "rate limited", "type": "rate_limit"}}, status=429)
        self.arrivals.append((time.monotonic(), 200))
        await asyncio.sleep(self.latency_s)
        body = {
            "id": f"c{len(self.arrivals)}",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": '{"agent": "A1", "step": 1, "reason": "x"}'},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }
        return web.json_response(body)


def write_inputs(root: Path, items: int, url: str, concurrency: int) -> Path:
    data = root / "data" / "src"
    data.mkdir(parents=True)
    for index in range(items):
        history = [
            {"role": "assistant", "name": f"A{step % 2}", "content": f"item {index} step {step}"}
            for step in range(3)
        ]
        record = {"question": f"task {index}", "history": history, "mistake_agent": "A1", "mistake_step": 1}
        (data / f"{index}.json").write_text(json.dumps(record))
    config = root / "sweep.toml"
    config.write_text(
        f'[sweep]\ndataset = "{root / "data"}"\nrealizations = 1\ndrain_timeout_s = 2\n\n'
        '[[methods]]\nname = "all-at-once"\n\n'
        f'[backbones.b]\nprovider = "openai-compatible"\nmodel = "m"\nbase_url = "{url}"\n'
        f"limits = {{ concurrency = {concurrency} }}\n"
        "retry = { max_attempts = 20, base_s = 0.05, cap_s = 1.0 }\n"
    )
    return config


async def measure(args: argparse.Namespace) -> None:
    server = BareRefusalServer(args.mode, args.latency, args.share, args.seed)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_inputs(root, args.items, f"http://127.0.0.1:{port}/v1", args.concurrency)
        env = {**os.environ, "PYTHONPATH": str(Path(args.src).resolve())}
        command = [sys.executable, "-m", "rcarun.cli", "sweep", "--config", str(config)]
        command += ["--db", str(root / "r.db"), "--run", "r", "--no-progress"]
        child = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        started = time.monotonic()
        while child.poll() is None and (
            not server.arrivals or time.monotonic() - server.arrivals[0][0] < args.seconds
        ):
            await asyncio.sleep(0.2)
            if time.monotonic() - started > args.seconds + 120:
                break
        stopped = time.monotonic()
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        stderr = await asyncio.to_thread(child.communicate)
        await runner.cleanup()
    report(server.arrivals, stopped, args.skip, stderr[1])


def report(arrivals: list[tuple[float, int]], stopped: float, skip: float, stderr: str) -> None:
    if not arrivals:
        print("no request arrived\n" + stderr[-2000:])
        return
    first = arrivals[0][0]
    skip = skip if stopped - first > skip + 1.0 else 0.0  # a sweep that ended early is measured whole
    measured = [(at, code) for at, code in arrivals if at >= first + skip]
    span = max(stopped - (first + skip), 1e-9)
    answered = sum(1 for _, code in measured if code == 200)
    refused = sum(1 for _, code in arrivals if code == 429)
    slices = [0] * (int((stopped - first) // 10) + 1)
    for at, _ in arrivals:
        slices[int((at - first) // 10)] += 1
    print(f"answered per minute over [{skip:g} s, {stopped - first:.0f} s): {answered * 60 / span:,.0f}")
    print(f"429s sent: {refused} of {len(arrivals)} requests")
    print("requests per 10-s slice: " + " ".join(str(count) for count in slices))
    lines = [line for line in stderr.splitlines() if "holding it to" in line]
    print("rcarun said: " + (" | ".join(lines[:3]) if lines else "(nothing about a rate)"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("first", "sporadic"))
    parser.add_argument(
        "--seconds", type=float, default=75.0, help="stop the sweep this long after it starts"
    )
    parser.add_argument(
        "--skip", type=float, default=5.0, help="measure from this long after the first arrival"
    )
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--share", type=float, default=0.013, help="share of 429s in sporadic mode")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--items", type=int, default=40_000)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"))
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
