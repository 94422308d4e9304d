"""A kept-alive connection the server closes as it is reused costs no attempt; a new connection that fails does.

The server here is raw sockets (`KeepAliveServer`): it answers the first request of each connection with
``Connection: keep-alive`` and then either closes the connection when the next request arrives on it, unanswered
(``close-2nd-request``), or closes it a few milliseconds after the answer, whatever the client is sending
(``close-after-keepalive``, the race of a server's idle timeout), or closes every connection on its first
request, unanswered (``close-unanswered``).
Its count of requests per connection is the ground truth: a request that died on a reused connection must be sent
again without a calls row (not an attempt), and a request that died on a new connection must be an attempt with
its row (no silent second send).
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.conftest import MODEL, backbone, item_statuses, run_cli, sweep_args, write_sweep
from faults.hostile import Request, db_rows, schema_instance

ITEMS = 8
CLOSE_AFTER_S = 0.002  # about the time the client takes to send the next request on the connection


class KeepAliveServer(socketserver.ThreadingTCPServer):
    """An OpenAI-compatible chat endpoint on 127.0.0.1 written on raw sockets, one thread per connection.

    Attributes:
        mode: ``close-2nd-request``, ``close-after-keepalive`` or ``close-unanswered`` (module docstring).
        answered: requests answered with a 200.
        dropped: requests whose connection was closed unanswered; ``dropped_reused`` those that were not the
            first request of their connection.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Connection)
        self.mode = mode
        self.lock = threading.Lock()
        self.answered = 0
        self.dropped = 0
        self.dropped_reused = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Connection(socketserver.StreamRequestHandler):
    server: KeepAliveServer

    def handle(self) -> None:
        served = 0
        while (body := self._read_request()) is not None:
            server = self.server
            if server.mode == "close-unanswered" or served >= 1:
                with server.lock:
                    server.dropped += 1
                    server.dropped_reused += served >= 1
                return  # closing the connection is the fault
            self.wfile.write(_answer(body))
            self.wfile.flush()
            served += 1
            with server.lock:
                server.answered += 1
            if server.mode == "close-after-keepalive":
                time.sleep(CLOSE_AFTER_S)
                return

    def _read_request(self) -> bytes | None:
        length = 0
        line = self.rfile.readline(65536)
        if not line:
            return None
        while (line := self.rfile.readline(65536)) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return self.rfile.read(length)


def _answer(raw: bytes) -> bytes:
    body = json.loads(raw)
    request = Request(seq=0, path="/v1/chat/completions", body=body, authorization=None, arrived_at=0.0)
    schema = request.schema
    answer = (
        schema_instance(schema)
        if schema is not None
        else {"reason": "kept alive", "responsible_role": (request.agents or ["unknown"])[0], "root_step": 0}
    )
    completion: dict[str, Any] = {
        "id": f"chatcmpl-{request.digest}",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps(answer)},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    payload = json.dumps(completion).encode()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


@pytest.fixture
def keepalive_server() -> Iterator[Callable[[str], KeepAliveServer]]:
    started: list[KeepAliveServer] = []

    def start(mode: str) -> KeepAliveServer:
        server = KeepAliveServer(mode)
        threading.Thread(target=server.serve_forever, name=f"keepalive-{mode}", daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def _sweep(server: KeepAliveServer, dataset: Callable[..., Path], tmp_path: Path, transport: str) -> Path:
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={
            "fx": backbone(
                server.base_url,
                transport=transport,
                limits={"concurrency": 2},
                retry={"max_attempts": 2},
            )
        },
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "keepalive"), cwd=tmp_path)
    assert result.returncode in (0, 4), result.describe()
    return db


@pytest.mark.parametrize("mode", ["close-2nd-request", "close-after-keepalive"])
@pytest.mark.parametrize("transport", ["aiohttp", "openai-sdk"])
def test_a_reused_connection_closed_by_the_server_is_sent_again_without_an_attempt(
    keepalive_server: Callable[[str], KeepAliveServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    transport: str,
    mode: str,
) -> None:
    server = keepalive_server(mode)
    db = _sweep(server, dataset, tmp_path, transport)

    assert item_statuses(db) == {"done": ITEMS}, f"items: {dict(item_statuses(db))}"
    if mode == "close-2nd-request":  # the other one's race is met only now and then
        assert server.dropped_reused >= 1, "no kept-alive connection was reused: the fault was not exercised"
    # Every item's answer came at its first attempt; each send the stale connection lost has its own row too
    # (the same attempt number: it did not count), so every request that left is recorded.
    calls = [tuple(row) for row in db_rows(db, "SELECT status, attempt, error_kind FROM calls")]
    answers = [row for row in calls if row[0] == "ok"]
    lost = [row for row in calls if row[0] != "ok"]
    assert answers == [("ok", 1, None)] * ITEMS, f"calls rows: {calls}"
    assert set(lost) <= {("error", 1, "stale_connection")}, f"calls rows: {calls}"
    assert server.answered == ITEMS
    if mode == "close-2nd-request":
        assert len(lost) == server.dropped_reused, (server.dropped_reused, calls)


@pytest.mark.parametrize("transport", ["aiohttp", "openai-sdk"])
def test_a_new_connection_closed_unanswered_is_a_counted_attempt(
    keepalive_server: Callable[[str], KeepAliveServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    transport: str,
) -> None:
    server = keepalive_server("close-unanswered")
    db = _sweep(server, dataset, tmp_path, transport)

    assert item_statuses(db) == {"failed": ITEMS}, f"items: {dict(item_statuses(db))}"
    calls = db_rows(db, "SELECT attempt FROM calls")
    assert server.dropped == len(calls), (
        f"the server saw {server.dropped} requests, results.db holds {len(calls)} attempts"
    )
    attempts = sorted(row[0] for row in calls)
    assert attempts == sorted([1, 2] * ITEMS), f"attempt numbers: {attempts}"
