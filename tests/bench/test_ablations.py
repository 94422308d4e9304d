"""`benchmarks/ablations.py`, behind docs/performance.md's table of what each part of a call costs: every variant
runs the whole workload (the simulator answers every call), a variant that keeps the store records every call and
one that writes nothing records none, and the medians compare each variant with the run as it ships."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ablations.py"
CALLS = 200


@pytest.mark.slow  # runs a benchmark in miniature: with the slow tests (make test), not make check
def test_each_variant_answers_every_call_and_records_what_it_keeps() -> None:
    done = subprocess.run(
        [
            *(sys.executable, str(SCRIPT), "--calls", str(CALLS), "--rounds", "1"),
            *("--variant", "bare-http", "--variant", "no-store-writes"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    runs = {
        match[1]: (float(match[2]), int(match[3]), int(match[4]))
        for line in lines
        if (
            match := re.match(
                r"round 1  (\S+)\s+([\d.]+) ms of CPU a call; (\d+) answered, (\d+) recorded$", line
            )
        )
    }
    assert list(runs) == ["none", "bare-http", "no-store-writes"], lines
    # The server counted every call of every variant; bare HTTP's answers went through rcarun's parser into
    # results.db like aiohttp's, and the variant without store writes left nothing there.
    assert {variant: figures[1:] for variant, figures in runs.items()} == {
        "none": (CALLS, CALLS),
        "bare-http": (CALLS, CALLS),
        "no-store-writes": (CALLS, 0),
    }
    assert all(figures[0] > 0 for figures in runs.values())
    medians = {
        match[1]: (float(match[2]), float(match[3]))
        for line in lines
        if (match := re.match(r"  (\S+)\s+([\d.]+) ms a call  ([+-][\d.]+) \([+-]?\d+%\)$", line))
    }
    assert list(medians) == ["none", "bare-http", "no-store-writes"], lines
    assert medians["none"][1] == 0
    for variant, (median, difference) in medians.items():
        assert median == runs[variant][0]  # one round: the median is that round's figure
        assert abs(median - medians["none"][0] - difference) < 0.0015, (variant, median, difference)


def test_a_lost_connection_is_a_transport_error_as_rcarun_transports_raise() -> None:
    """The bare transport against a server that answers the first request and hangs up, and hangs up on every
    later one without answering: the post on the connection closed while idle and the post cut off both fail with
    the error rcarun's runner records a failed call by (`TransportError`), not a hang or a stray error."""
    done = subprocess.run(
        [sys.executable, "-c", _LOST_CONNECTION_RUN, str(SCRIPT.parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "200",
        "TransportError: bare-http lost",
        "TransportError: bare-http lost",
    ]


_LOST_CONNECTION_RUN = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from ablations import BareTransport
from rcarun.errors import TransportError

async def main():
    answered = []
    async def answer_once_then_hang_up(reader, writer):
        await reader.readuntil(b"\\r\\n\\r\\n")
        if not answered:
            answered.append(True)
            writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\n{}")
            await writer.drain()
        writer.close()
    server = await asyncio.start_server(answer_once_then_hang_up, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    transport = BareTransport(None, None)
    async with transport.post_chat(url, {"model": "m", "messages": []}) as response:
        print(response.status)
    await asyncio.sleep(0.2)  # the hang-up reaches the idle connection
    for _ in range(2):  # the idle connection, then a new one cut off before its answer
        try:
            async with asyncio.timeout(10), transport.post_chat(url, {"model": "m", "messages": []}):
                pass
        except TransportError as error:
            print("TransportError:", str(error).split(":")[0], "lost" if "connection lost" in str(error) else error)
    await transport.aclose()
    server.close()

asyncio.run(main())
"""


def test_the_pyreqwest_variant_answers_and_records_every_call() -> None:
    pytest.importorskip("pyreqwest")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--calls", str(CALLS), "--rounds", "1", "--variant", "pyreqwest-http"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(
        rf"round 1  pyreqwest-http\s+[\d.]+ ms of CPU a call; {CALLS} answered, {CALLS} recorded$",
        done.stdout,
        re.MULTILINE,
    ), done.stdout
