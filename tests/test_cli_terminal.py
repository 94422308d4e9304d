"""Nothing a model or a trajectory wrote steers the terminal `rcarun show` prints to.

A loopback server answers with answers and reasoning full of terminal control sequences, on a trajectory whose
question and steps hold them too (so prompts quote them). `rcarun show` then runs as a child process on a real
pseudo-terminal, and the test reads what reached the terminal: no ESC, no C1 CSI, no BEL, no backspace, no
carriage return but the terminal's own before each newline, and each payload still readable as visible escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import rcarun
from helpers.badinput import good_trajectory
from rcarun.runner import load_sweep_config, run_sweep
from rcarun.text import terminal_safe

# What an agent log or a model answer may hold, each with readable text around it.
CLEAR = "before\x1b[2Jafter-clear"
TITLE = "\x1b]0;pwned title\x07"
CLIPBOARD = "\x1b]52;c;cGF5bG9hZA==\x07"
LINK = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
C1_CSI = "\u009b31mred"
OVERWRITE = "shown\rhidden"
BACKSPACE = "abc\b\b\bxyz"
BIDI = "\u202eevil"
PAYLOAD = " ".join((CLEAR, TITLE, CLIPBOARD, LINK, C1_CSI, OVERWRITE, BACKSPACE, BIDI))
RUN = "escapes"
QID = "src/x1"


async def _answer(request: web.Request) -> web.Response:
    body = await request.json()
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    answer: dict[str, Any] = {"reason": PAYLOAD, "responsible_role": "A1", "root_step": 1}
    answer = {key: value for key, value in answer.items() if key in schema.get("properties", answer)}
    completion = {
        "id": "chatcmpl-escapes",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "escape-model",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": json.dumps(answer, ensure_ascii=False),
                    "reasoning_content": PAYLOAD,
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }
    return web.json_response(completion, dumps=lambda value: json.dumps(value, ensure_ascii=False))


async def _refuse(request: web.Request) -> web.Response:
    """A 400 whose error message is `PAYLOAD`: what a provider says ends up in rcarun's own lines."""
    return web.json_response({"error": {"message": PAYLOAD}}, status=400)


async def _serve(handler: Any) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _write_sweep(root: Path, port: int) -> Path:
    """One trajectory whose question and steps hold `PAYLOAD`, all-at-once on the server at ``port``."""
    (root / "data" / "src").mkdir(parents=True)
    record = good_trajectory(3, content=PAYLOAD, question=f"question {PAYLOAD}")
    (root / "data" / "src" / "x1.json").write_text(json.dumps(record))
    config = root / "sweep.toml"
    config.write_text(
        f"""
[sweep]
dataset = "{root / "data"}"

[[methods]]
name = "all-at-once"

[backbones.esc]
provider = "openai-compatible"
model = "escape-model"
base_url = "http://127.0.0.1:{port}/v1"
timeout_s = 5
retry = {{max_attempts = 1}}
"""
    )
    return config


async def _sweep(root: Path, db: Path) -> None:
    runner, port = await _serve(_answer)
    try:
        config = load_sweep_config(_write_sweep(root, port))
        outcome = await run_sweep(config, db_path=db, run_name=RUN, show_progress=False)
        assert outcome.status == "finished", outcome
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results.db whose answers, reasoning, prompts and trajectory hold `PAYLOAD`."""
    root = tmp_path_factory.mktemp("escapes")
    db = root / "results.db"
    asyncio.run(_sweep(root, db))
    return db


@contextlib.contextmanager
def _serving_in_thread(handler: Any) -> Iterator[int]:
    """The handler on a loopback port, served from a thread of its own while a child process calls it."""
    loop = asyncio.new_event_loop()
    started: list[tuple[web.AppRunner, int]] = []
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        started.append(loop.run_until_complete(_serve(handler)))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "the loopback server did not start"
    runner, port = started[0]
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _through_a_terminal(*args: str, cwd: Path, expect: int = 0) -> bytes:
    """What ``rcarun ARGS`` writes to a pseudo-terminal (stdout and stderr both), to the end."""
    master, slave = os.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(rcarun.__file__).resolve().parents[1]), "COLUMNS": "200"}
    process = subprocess.Popen(
        [sys.executable, "-m", "rcarun.cli", *args], stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert returncode == expect, f"rcarun {' '.join(args)} exited {returncode}: {b''.join(chunks)!r}"
    return b"".join(chunks)


def _assert_inert(shown: bytes) -> str:
    text = shown.decode("utf-8")
    escapes = shown.count(b"\x1b")
    assert escapes == 0, f"{escapes} ESC bytes reached the terminal"
    assert "\u009b" not in text and "\u202e" not in text
    assert b"\x07" not in shown and b"\x08" not in shown
    # The terminal turns each newline into CRLF; any other carriage return came from the data.
    assert "\r" not in text.replace("\r\n", "\n")
    return text.replace("\r\n", "\n")


@pytest.mark.parametrize("flags", [(), ("--full",)], ids=["show", "show-full"])
def test_show_on_a_terminal_prints_control_sequences_as_visible_text(
    results: Path, flags: tuple[str, ...]
) -> None:
    text = _assert_inert(
        _through_a_terminal(
            "show", "--db", str(results), "--run", RUN, "--qid", QID, *flags, cwd=results.parent
        )
    )
    # Readable: every payload is there, its control characters spelled out.
    for payload in (CLEAR, TITLE, CLIPBOARD, C1_CSI, OVERWRITE, BACKSPACE, BIDI):
        assert terminal_safe(payload) in text, f"{terminal_safe(payload)!r} is not shown"
    assert "   prompt (" in text and "   reasoning (" in text and "   answer (" in text
    assert text.count("before\\x1b[2Jafter-clear") >= 3  # in the prompt (steps), the reasoning and the answer


def test_show_json_on_a_terminal_is_inert_and_parses_back_to_the_stored_texts(results: Path) -> None:
    text = _assert_inert(
        _through_a_terminal(
            "show", "--db", str(results), "--run", RUN, "--qid", QID, "--json", cwd=results.parent
        )
    )
    document = json.loads(text)
    calls = [call for item in document["items"] for call in item["calls"]]
    assert calls and all(call["reasoning"] == PAYLOAD for call in calls)
    assert all(PAYLOAD in call["prompt"] for call in calls)
    assert all(json.loads(call["answer"])["reason"] == PAYLOAD for call in calls)


def test_terminal_safe_escapes_what_steers_a_terminal_and_nothing_else() -> None:
    ordinary = (
        "line one\n\tindented, CRLF\r\nCJK 日本語, emoji 🚀✅, accents éü, quotes \"'`, a backslash \\x"
    )
    assert terminal_safe(ordinary) == ordinary
    assert terminal_safe(CLEAR) == "before\\x1b[2Jafter-clear"
    assert terminal_safe(TITLE) == "\\x1b]0;pwned title\\x07"
    assert terminal_safe("a\x00b\x7fc\u0085d\u009be\u2066f\u2069g") == (
        "a\\x00b\\u007fc\\u0085d\\u009be\\u2066f\\u2069g"
    )
    assert terminal_safe(OVERWRITE) == "shown\\x0dhidden"
    # JSON with what json.dumps leaves raw stays valid and reads back the same.
    document = json.dumps({"text": PAYLOAD + "\x7f\u0085"}, ensure_ascii=False)
    assert json.loads(terminal_safe(document)) == json.loads(document)


def test_a_sweep_on_a_terminal_quotes_what_the_server_said_as_visible_text(tmp_path: Path) -> None:
    with _serving_in_thread(_refuse) as port:
        config = _write_sweep(tmp_path, port)
        shown = _through_a_terminal(
            "sweep",
            "--config",
            str(config),
            "--db",
            str(tmp_path / "results.db"),
            "--run",
            RUN,
            "--no-progress",
            cwd=tmp_path,
            expect=4,  # the item failed
        )
    text = _assert_inert(shown)
    assert "failed items by cause" in text and terminal_safe(CLIPBOARD) in text, text
