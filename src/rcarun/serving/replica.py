"""One managed replica's processes: its guard (the process-group leader), the server under it, its log file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from typing import IO

from rcarun.serving import guard
from rcarun.serving.ports import running
from rcarun.serving.spec import ReplicaPlan, ServeError, ServeSpec

__all__ = ["Replica"]

_LOG_TAIL_LINES = 6
_LOG_TAIL_CHARS = 1200
# How long a server SIGKILLed with its group may take to end after its guard has (they die in either order).
_SERVER_GONE_S = 2.0


class Replica:
    """One replica: its guard (the process-group leader, `process`), the server under it (`pid`), its log file."""

    def __init__(self, plan: ReplicaPlan, spec: ServeSpec, env: dict[str, str]) -> None:
        self.plan = plan
        self.spec = spec
        self.env = env
        self.log_path = spec.log_dir / f"{spec.backbone}-{plan.index}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self._log: IO[bytes] | None = None

    @property
    def root_url(self) -> str:
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"http://{host}:{self.plan.port}"

    @property
    def label(self) -> str:
        gpus = ",".join(str(gpu) for gpu in self.plan.gpus)
        return f"replica {self.plan.index} (GPUs {gpus}, port {self.plan.port})"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is not None:
            self._log.close()
        # Held for the process's life (its stdout and stderr), closed in close().
        self._log = self.log_path.open("ab")
        self._log.write(f"=== rcarun: {' '.join(self.plan.argv)}\n".encode())
        self._log.flush()
        env = {**self.env, "CUDA_VISIBLE_DEVICES": self.plan.cuda_visible_devices}
        self.pid = None
        # The guard reads nothing of rcarun (-I: no PYTHONPATH, no user site); the replica gets env as it is.
        argv = [
            sys.executable,
            "-I",
            guard.__file__,
            "--owner",
            str(os.getpid()),
            "--grace",
            f"{self.spec.grace_s:g}",
        ]
        self.process = await asyncio.create_subprocess_exec(
            *argv,
            "--",
            *self.plan.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,  # one line: the replica's pid, or why it could not be run
            stderr=self._log,  # the guard's own lines and the replica's output
            env=env,
            start_new_session=True,  # its own process group: one signal reaches vLLM's workers too
        )
        assert self.process.stdout is not None
        word, _, rest = (await self.process.stdout.readline()).decode(errors="replace").strip().partition(" ")
        if word == "pid" and rest.isdigit():
            self.pid = int(rest)
            return
        status = await self.process.wait()
        where = f"backbone {self.spec.backbone!r}: cannot start {self.label}"
        if word == "error":
            raise ServeError(
                f"{where}: {self.plan.argv[0]}: {rest}; install vLLM or set [backbones.X.serve] command"
            )
        raise ServeError(
            f"{where}: its guard exited with status {status}; the log {self.log_path} ends: {self.log_tail()}"
        )

    def signal_group(self, signum: int) -> None:
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the group, SIGKILL after ``grace_s``, then SIGKILL again for children left behind; returns
        once the server has ended (its guard may be reaped first)."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace_s)
            except TimeoutError:
                self.signal_group(signal.SIGKILL)
                await process.wait()
        self.signal_group(signal.SIGKILL)
        deadline = time.monotonic() + _SERVER_GONE_S
        while self.pid is not None and running(self.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.close()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def failed(self, what: str) -> ServeError:
        """One line: which backbone's replica, ``what`` went wrong, and how its log ends."""
        return ServeError(
            f"backbone {self.spec.backbone!r}: {self.label} {what}; its log {self.log_path} ends: {self.log_tail()}"
        )

    def log_tail(self) -> str:
        """The log's last lines on one line (`` | `` between them), for a one-line message."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 16_384))
                text = handle.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        lines = [line.strip() for line in text.splitlines() if line.strip()][-_LOG_TAIL_LINES:]
        tail = " | ".join(lines)
        return tail[-_LOG_TAIL_CHARS:] if tail else "(empty log)"
