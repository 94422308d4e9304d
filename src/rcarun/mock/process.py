"""A loopback server in a child process, so that a benchmark's client and the server each get a core.

`ServerProcess` starts a ``python -m MODULE --port 0 --watch-stdin ...`` child, reads the address from its first
stdout line (``{"base_url": ..., "port": ...}``), waits until it answers and terminates it on exit. The child
also exits when its stdin closes, so a parent that dies without cleaning up leaves no server behind.
`MockProcess` is the simulator run that way; the benchmarks' window server (benchmarks/rcarun_bench) is another.
An API key in the simulator's config never appears on the child's command line: it travels in an environment
variable.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import IO, Any, Protocol, Self

from .config import MockConfig
from .stats import MockStats

__all__ = ["MockProcess", "MockStartError", "ServerProcess", "child_environment", "serve_until_stopped"]

_KEY_VARIABLE = "RCARUN_MOCK_API_KEY"
_STDERR_TAIL_CHARS = 4000
# The directory that holds the `rcarun` package (src/ in a checkout).
_RCARUN_ROOT = str(Path(__file__).resolve().parents[2])


class MockStartError(RuntimeError):
    """A server process did not come up (its stderr tail is in the message)."""


def child_environment(roots: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment with ``roots`` and rcarun's own root first on ``PYTHONPATH``, so that a child
    imports this very code, installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*roots, _RCARUN_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


class ServerProcess:
    """A server in a child process (``with`` or ``async with``); subclasses say what to run in `command`.

    Args:
        label: how messages name the server ("mock server process").
        probe_path: a GET path that answers once the server is up.
        host: a loopback address.
        startup_timeout_s: how long to wait for the child to listen and answer.
    """

    def __init__(self, label: str, probe_path: str, *, host: str, startup_timeout_s: float) -> None:
        self.label = label
        self.probe_path = probe_path
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._base_url: str | None = None
        self._port: int | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The child's command line and environment."""
        raise NotImplementedError

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"the {self.label} is not started")
        return self._process.pid

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"the {self.label} is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        if self._base_url is None:
            raise RuntimeError(f"the {self.label} is not started")
        return self._base_url

    @property
    def root_url(self) -> str:
        return self.base_url.removesuffix("/v1")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the child and wait until it answers.

        Raises:
            MockStartError: the child exited, printed something unexpected or did not answer in time.
        """
        if self._process is not None:
            raise RuntimeError(f"the {self.label} is already started")
        command, env = self.command()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child, closed in stop()
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env
        )
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            announcement = self._read_announcement(deadline)
            self._base_url = str(announcement["base_url"])
            self._port = int(announcement["port"])
            self._wait_until_answering(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate the child (gracefully, then by force) and release its pipes. Safe to call twice."""
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5.0)
            if process.stdout is not None:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self._base_url = None
        self._port = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)

    def _read_announcement(self, deadline: float) -> dict[str, Any]:
        process = self._process
        assert process is not None and process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise MockStartError(self._failure("did not announce its port in time"))
        line = process.stdout.readline()
        if not line:
            process.wait(timeout=5.0)
            raise MockStartError(self._failure(f"exited with code {process.returncode} before listening"))
        try:
            announcement = json.loads(line)
        except ValueError:
            raise MockStartError(self._failure(f"printed an unexpected first line: {line[:200]!r}")) from None
        if not isinstance(announcement, dict) or "base_url" not in announcement or "port" not in announcement:
            raise MockStartError(self._failure(f"printed an unexpected first line: {line[:200]!r}"))
        return announcement

    def _wait_until_answering(self, deadline: float) -> None:
        while True:
            try:
                self._call("GET", self.probe_path, timeout_s=1.0)
                return
            except (OSError, urllib.error.URLError) as exc:
                if time.monotonic() > deadline or not self.running:
                    raise MockStartError(self._failure(f"does not answer: {exc}")) from exc
                time.sleep(0.05)

    def _call(self, method: str, path: str, timeout_s: float = 10.0) -> dict[str, Any]:
        request = urllib.request.Request(
            self.root_url + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body: dict[str, Any] = json.loads(response.read())
        return body

    def _failure(self, what: str) -> str:
        tail = ""
        if self._stderr is not None:
            self._stderr.flush()
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-_STDERR_TAIL_CHARS:]
        return f"{self.label} {what}" + (f"; its stderr ends with:\n{tail}" if tail.strip() else "")


class MockProcess(ServerProcess):
    """The simulator running in its own process.

    Use as ``with MockProcess(config) as mock:`` (or ``async with``) and point a client at ``mock.base_url``.

    Args:
        config: how the simulated backbone behaves.
        host: a loopback address.
        startup_timeout_s: how long to wait for the child to listen and answer.
    """

    def __init__(
        self, config: MockConfig | None = None, *, host: str = "127.0.0.1", startup_timeout_s: float = 20.0
    ) -> None:
        super().__init__("mock server process", "/mock/stats", host=host, startup_timeout_s=startup_timeout_s)
        self.config = config if config is not None else MockConfig()

    def command(self) -> tuple[list[str], dict[str, str]]:
        config_values = self.config.to_dict()
        env = child_environment()
        command = [sys.executable, "-m", "rcarun.mock", "--host", self.host, "--port", "0", "--watch-stdin"]
        if config_values.pop("api_key") is not None:
            env[_KEY_VARIABLE] = str(self.config.api_key)
            command += ["--api-key-env", _KEY_VARIABLE]
        command += ["--config-json", json.dumps(config_values, separators=(",", ":"))]
        return command, env

    def stats(self) -> MockStats:
        """The child's counters (``GET /mock/stats``)."""
        return MockStats.from_dict(self._call("GET", "/mock/stats"))

    def request_log(self) -> dict[str, Any]:
        """The child's request log (``GET /mock/log``); see `MockServer.request_log`."""
        return self._call("GET", "/mock/log")

    def reset(self) -> None:
        """Zero the child's counters and restore its limits (``POST /mock/reset``)."""
        self._call("POST", "/mock/reset")

    async def astats(self) -> MockStats:
        return await asyncio.to_thread(self.stats)

    async def areset(self) -> None:
        await asyncio.to_thread(self.reset)


class _Listening(Protocol):
    @property
    def base_url(self) -> str: ...

    @property
    def port(self) -> int: ...


async def serve_until_stopped(
    server: AbstractAsyncContextManager[_Listening], *, watch_stdin: bool, name: str, told: str | None = None
) -> None:
    """The child's side of `ServerProcess`: start ``server``, announce its port as one JSON line on stdout (and
    ``told`` on stderr), and serve until SIGINT, SIGTERM or, with ``watch_stdin``, the parent closing stdin."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if watch_stdin:

        def wait_for_stdin_eof() -> None:
            while sys.stdin.buffer.read(65536):
                pass
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_stdin_eof, name=f"{name}-stdin", daemon=True).start()
    async with server as started:
        announcement = {
            "event": "listening",
            "base_url": started.base_url,
            "port": started.port,
            "pid": os.getpid(),
        }
        print(json.dumps(announcement), flush=True)
        if told is not None:
            print(told.format(base_url=started.base_url), file=sys.stderr, flush=True)
        await stop.wait()
