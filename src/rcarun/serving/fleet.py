"""A managed backbone's replicas: start one ``vllm serve`` per GPU group, check them, keep them up, stop them.

A self-hosted run used to depend on servers started by hand, whose model and context length nobody checked and
whose version nobody recorded. `ManagedReplicas` owns the processes instead: it starts every replica in a
process group of its own (vLLM's engine and workers are child processes; a group signal reaches them all),
led by a guard (`rcarun.serving.guard`) that ends the group when rcarun dies without a word (SIGKILL, the OOM
killer). It refuses a port some other process holds, in one line naming it, and ends a replica left there by
a killed rcarun (`rcarun.serving.ports`: every replica carries its rcarun's identity); it waits for
``/health`` and then ``/v1/models`` within ``startup_timeout_s`` (a replica that exits or stays silent fails
the start with one line ending in its log's last lines), checks that the socket answering belongs to the
replica's own process group, refuses a replica whose served model or ``max_model_len`` is not what the
backbone says, and records the server's version (``GET /version``, vLLM's, or ``COMMAND --version``) with
every command line.

While it runs, a replica that dies is reported (``on_availability(index, False)``, so the balancer sends it
nothing), its group is killed (orphaned workers hold GPU memory), and it is started again on the same GPUs and
port up to ``restarts`` times. On the way out, on every path (an error, a cancel, Ctrl-C), each group gets
SIGTERM, then SIGKILL after ``grace_s``; `kill_now` is the synchronous last resort for a process about to
exit at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import aiohttp

from rcarun.errors import RcarunError
from rcarun.serving import guard
from rcarun.serving.ports import (
    MARKER,
    PortHolder,
    end_marked,
    port_free,
    port_holders,
    process_identity,
    running,
)
from rcarun.serving.spec import ReplicaPlan, ServeSpec

__all__ = ["FleetRecord", "ManagedReplicas", "ServeError", "ServedReplica", "replica_log_dir"]

_LOG_TAIL_LINES = 6
_LOG_TAIL_CHARS = 1200
_PROBE_TIMEOUT_S = 2.0
_VERSION_TIMEOUT_S = 60.0
# How long a server SIGKILLed with its group may take to end after its guard has (they die in either order).
_SERVER_GONE_S = 2.0
# How long the processes of a stale replica, once SIGKILLed, may take to end and close their sockets.
_STALE_GONE_S = 10.0
# How long a port whose socket no visible process holds may take to close (its holder was exiting).
_HOLDER_EXITING_S = 1.0
# A shell's VLLM_API_KEY would make every replica require a key the client does not send: the replicas get a
# key only from api_key_env, the one the client sends too.
_SERVER_KEY = "VLLM_API_KEY"

EventSink = Callable[[str, dict[str, Any]], None]


class ServeError(RcarunError):
    """A managed replica did not come up, or serves something other than its backbone's config says."""


@dataclass(frozen=True, slots=True)
class ServedReplica:
    """One replica as it came up: where it answers and how long it took."""

    index: int
    gpus: tuple[int, ...]
    port: int
    base_url: str
    pid: int
    startup_s: float
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FleetRecord:
    """What served a backbone: recorded with the run (a ``replicas_started`` event) and shown by ``rcarun serve``."""

    backbone: str
    served_model: str
    model_root: str | None
    max_model_len: int | None
    version: str
    version_source: str
    replicas: tuple[ServedReplica, ...]

    def to_detail(self) -> dict[str, Any]:
        return {
            "backbone": self.backbone,
            "served_model": self.served_model,
            "model_root": self.model_root,
            "max_model_len": self.max_model_len,
            "vllm_version": self.version,
            "version_source": self.version_source,
            "replicas": [
                {
                    "index": r.index,
                    "gpus": list(r.gpus),
                    "port": r.port,
                    "base_url": r.base_url,
                    "pid": r.pid,
                    "startup_s": round(r.startup_s, 3),
                    "argv": list(r.argv),
                }
                for r in self.replicas
            ],
        }


@dataclass(frozen=True, slots=True)
class _Card:
    model_root: str | None
    max_model_len: int | None


class _Replica:
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


class ManagedReplicas:
    """A backbone's replicas for the length of an ``async with``.

    Args:
        spec: what to serve and how.
        on_event: hears ``stale_replica_ended``, ``replica_died``, ``replica_restarted``, ``replica_lost`` with a
            detail dict.
        poll_s: interval of the start-up probes.

    Attributes:
        on_availability: told ``(index, False)`` when a replica dies and ``(index, True)`` when it is back.
    """

    def __init__(self, spec: ServeSpec, *, on_event: EventSink | None = None, poll_s: float = 0.1) -> None:
        self.spec = spec
        self.on_availability: Callable[[int, bool], None] | None = None
        self._on_event = on_event
        self._poll_s = poll_s
        self._replicas: list[_Replica] = []
        self._supervisors: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}
        self._closing = False
        self._record: FleetRecord | None = None
        self.restarts_used: list[int] = []
        # Monotonic seconds: the first replica launched, all of them ready, all of them stopped. GPU time is
        # charged from launch (the GPUs are held while weights load) to stop.
        self._launched_at: float | None = None
        self._ready_at: float | None = None
        self._stopped_at: float | None = None

    @property
    def record(self) -> FleetRecord:
        if self._record is None:
            raise RuntimeError("the replicas are not started")
        return self._record

    @property
    def started(self) -> bool:
        """Every replica came up once (the record exists), whatever happened since."""
        return self._record is not None

    @property
    def base_urls(self) -> tuple[str, ...]:
        return tuple(replica.base_url for replica in self.record.replicas)

    @property
    def held_s(self) -> float:
        """Seconds the replicas have held their GPUs: from the first launch to the end of the stop (or now)."""
        if self._launched_at is None:
            return 0.0
        return (self._stopped_at or time.monotonic()) - self._launched_at

    @property
    def up_s(self) -> float:
        """Seconds from every replica answering to the end of the stop (or now): the time they could serve."""
        if self._ready_at is None:
            return 0.0
        return (self._stopped_at or time.monotonic()) - self._ready_at

    def pids(self) -> tuple[int, ...]:
        """The live replicas' server process ids (each in the process group of its guard)."""
        return tuple(r.pid for r in self._replicas if r.pid is not None and r.alive)

    async def __aenter__(self) -> ManagedReplicas:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start every replica, wait until each answers and matches the config, then supervise them.

        Raises:
            ServeError: a replica could not start, did not answer within ``startup_timeout_s``, or serves
                another model or context length (every replica started is stopped first).
        """
        spec = self.spec
        env = {name: value for name, value in os.environ.items() if name != _SERVER_KEY}
        env.update(spec.env)
        env[MARKER] = process_identity(os.getpid())
        if spec.api_key_env is not None:
            key = os.environ.get(spec.api_key_env)
            if not key:
                raise ServeError(
                    f"backbone {spec.backbone!r}: environment variable {spec.api_key_env} (api_key_env) is not set"
                )
            env[_SERVER_KEY] = key
            self._headers = {"Authorization": f"Bearer {key}"}
        ports = _ports(spec)
        self._replicas = [_Replica(plan, spec, env) for plan in spec.plan(ports)]
        self.restarts_used = [0] * len(self._replicas)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S))
        try:
            for replica in self._replicas:
                await self._claim_port(replica)
            started = self._launched_at = time.monotonic()
            self._stopped_at = None
            for replica in self._replicas:
                await replica.start()
            cards = await asyncio.gather(*(self._wait_ready(replica) for replica in self._replicas))
            ready_at = self._ready_at = time.monotonic()
            version, source = await self._version()
            card = cards[0]
            self._record = FleetRecord(
                backbone=spec.backbone,
                served_model=spec.served_model,
                model_root=card.model_root,
                max_model_len=card.max_model_len,
                version=version,
                version_source=source,
                replicas=tuple(
                    ServedReplica(
                        index=replica.plan.index,
                        gpus=replica.plan.gpus,
                        port=replica.plan.port,
                        base_url=f"{replica.root_url}/v1",
                        pid=replica.pid or 0,
                        startup_s=ready_at - started,
                        argv=replica.plan.argv,
                    )
                    for replica in self._replicas
                ),
            )
            self._supervisors = [
                asyncio.create_task(self._supervise(replica), name=f"rcarun-serve-{spec.backbone}-{index}")
                for index, replica in enumerate(self._replicas)
            ]
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every replica (SIGTERM, SIGKILL after ``grace_s``); safe to call twice and on any path.

        A cancel while waiting out the grace period (a second Ctrl-C) kills every group at once instead, so no
        replica outlives the call.
        """
        self._closing = True
        try:
            await asyncio.shield(self._stop())
        except asyncio.CancelledError:
            self.kill_now()
            raise

    async def _stop(self) -> None:
        supervisors, self._supervisors = self._supervisors, []
        for task in supervisors:
            task.cancel()
        for task in supervisors:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(
            *(replica.stop(self.spec.grace_s) for replica in self._replicas), return_exceptions=True
        )
        if self._launched_at is not None and self._stopped_at is None:
            self._stopped_at = time.monotonic()
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def kill_now(self) -> None:
        """SIGKILL every replica's group at once, from any thread (for a process about to exit regardless)."""
        self._closing = True
        for replica in self._replicas:
            replica.signal_group(signal.SIGKILL)

    async def wait_lost(self) -> None:
        """Return when every replica is gone for good (each died with no restart left)."""
        if self._supervisors:
            await asyncio.gather(*self._supervisors, return_exceptions=True)

    # -------------------------------------------------------------------------------------------- internals

    async def _claim_port(self, replica: _Replica) -> None:
        """Make sure ``replica``'s port is free: end a replica a killed rcarun left there, refuse anything else.

        Raises:
            ServeError: the port is held by a process that is not a stale replica (one line naming it).
        """
        host, port = self.spec.host, replica.plan.port
        if await asyncio.to_thread(port_free, host, port):
            return
        where = f"backbone {self.spec.backbone!r}: {replica.label}: port {port} is already in use"
        holders = await asyncio.to_thread(port_holders, host, port)
        if holders is None:
            raise ServeError(f"{where}; stop what listens there or change port_base")
        if not holders:
            # A process dying at this moment still shows its socket but no longer its descriptors.
            if await self._port_freed(host, port, _HOLDER_EXITING_S):
                return
            raise ServeError(f"{where} by a process this user cannot see; stop it or change port_base")
        live = [holder for holder in holders if not holder.stale]
        if live:
            raise ServeError(f"{where} by {_who(live[0])}; stop it or change port_base")
        ended: list[int] = []
        for owner in sorted({holder.owner for holder in holders if holder.owner is not None}):
            pids = await asyncio.to_thread(end_marked, owner)
            ended += pids
            self._event(
                "stale_replica_ended",
                index=replica.plan.index,
                port=port,
                killed_rcarun=owner.partition(":")[0],
                pids=pids,
                command=holders[0].command,
            )
        # Every process ended, not only this port's holder, so that the next replica's port is free too.
        deadline = time.monotonic() + _STALE_GONE_S
        while any(running(pid) for pid in ended) and time.monotonic() < deadline:
            await asyncio.sleep(self._poll_s)
        if not await self._port_freed(host, port, max(0.0, deadline - time.monotonic())):
            raise ServeError(
                f"{where}: a stale replica's socket is still open {_STALE_GONE_S:g} s after SIGKILL"
            )

    async def _port_freed(self, host: str, port: int, within_s: float) -> bool:
        """Whether ``host:port`` is free now or becomes free within ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while not await asyncio.to_thread(port_free, host, port):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self._poll_s)
        return True

    async def _check_own(self, replica: _Replica) -> None:
        """Fail unless the socket answering on ``replica``'s port belongs to its process group (Linux)."""
        process = replica.process
        assert process is not None
        holders = await asyncio.to_thread(port_holders, self.spec.host, replica.plan.port)
        if holders is None:
            return  # no /proc: its exit, looked at before every probe, is what is known
        strangers = [holder for holder in holders if holder.pgid != process.pid]
        if holders and not strangers:
            return
        who = _who(strangers[0]) if strangers else "a process this user cannot see"
        raise ServeError(
            f"backbone {self.spec.backbone!r}: {replica.label} answers /health, but the server on port "
            f"{replica.plan.port} is {who}, not this replica; stop it or change port_base; its log "
            f"{replica.log_path} ends: {replica.log_tail()}"
        )

    async def _wait_ready(self, replica: _Replica) -> _Card:
        """Wait for ``/health`` then read and check ``/v1/models``, within ``startup_timeout_s``."""
        spec = self.spec
        deadline = time.monotonic() + spec.startup_timeout_s
        session = self._session
        assert session is not None
        while True:
            process = replica.process
            if process is not None and process.returncode is not None:
                raise ServeError(
                    f"backbone {spec.backbone!r}: {replica.label} exited with status {process.returncode} "
                    f"before answering /health; its log {replica.log_path} ends: {replica.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ServeError(
                    f"backbone {spec.backbone!r}: {replica.label} did not answer /health within "
                    f"startup_timeout_s = {spec.startup_timeout_s:g} s (raise it for a large model); its log "
                    f"{replica.log_path} ends: {replica.log_tail()}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with session.get(f"{replica.root_url}/health") as response:
                    if response.status == 200:
                        break
            await asyncio.sleep(self._poll_s)
        await self._check_own(replica)
        try:
            async with session.get(f"{replica.root_url}/v1/models", headers=self._headers) as response:
                status = response.status
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ServeError(
                f"backbone {spec.backbone!r}: {replica.label} answered /health but not /v1/models ({exc}); "
                f"its log {replica.log_path} ends: {replica.log_tail()}"
            ) from None
        if status != 200:
            raise ServeError(
                f"backbone {spec.backbone!r}: {replica.label} answered /v1/models with HTTP {status} "
                f"(a key the server does not accept? check api_key_env); its log ends: {replica.log_tail()}"
            )
        return self._check_card(replica, body)

    def _check_card(self, replica: _Replica, body: bytes) -> _Card:
        spec = self.spec
        try:
            cards = json.loads(body)["data"]
            by_id = {str(card["id"]): card for card in cards}
        except (ValueError, KeyError, TypeError):
            raise ServeError(
                f"backbone {spec.backbone!r}: {replica.label} answered /v1/models with no model list: "
                f"{body[:200]!r}"
            ) from None
        card = by_id.get(spec.served_model)
        if card is None:
            raise ServeError(
                f"backbone {spec.backbone!r}: {replica.label} serves {sorted(by_id)}, not the backbone's model "
                f"{spec.served_model!r}; make [backbones.{spec.backbone}] model the served name, or fix the "
                "serve command"
            )
        served_len = card.get("max_model_len")
        if spec.max_model_len is not None and served_len != spec.max_model_len:
            raise ServeError(
                f"backbone {spec.backbone!r}: {replica.label} serves {spec.served_model!r} with max_model_len "
                f"{served_len}, but the config says {spec.max_model_len} (context_window / serve.max_model_len); "
                "make them agree, or the runner would cut prompts to the wrong window"
            )
        root = card.get("root")
        return _Card(
            model_root=str(root) if root is not None else None,
            max_model_len=int(served_len) if isinstance(served_len, int) else None,
        )

    async def _version(self) -> tuple[str, str]:
        """The server's version: vLLM's ``GET /version``, else ``COMMAND --version``, else "unknown"."""
        session = self._session
        assert session is not None
        replica = self._replicas[0]
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError):
            async with session.get(f"{replica.root_url}/version") as response:
                if response.status == 200:
                    return str(json.loads(await response.read())["version"]), "GET /version"
        try:
            process = await asyncio.create_subprocess_exec(
                *self.spec.command,
                "--version",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            out, _ = await asyncio.wait_for(process.communicate(), _VERSION_TIMEOUT_S)
        except (OSError, TimeoutError):
            return "unknown", "none"
        lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
        return (lines[-1], f"{self.spec.command[0]} --version") if lines else ("unknown", "none")

    def _event(self, kind: str, **detail: Any) -> None:
        if self._on_event is not None:
            self._on_event(kind, {"backbone": self.spec.backbone, **detail})

    def _available(self, index: int, up: bool) -> None:
        if self.on_availability is not None:
            self.on_availability(index, up)

    async def _supervise(self, replica: _Replica) -> None:
        """Restart ``replica`` each time it dies, up to ``restarts`` times; report what happens."""
        index = replica.plan.index
        while True:
            process = replica.process
            assert process is not None
            code = await process.wait()
            if self._closing:
                return
            died_at = time.monotonic()
            self._available(index, False)
            replica.signal_group(signal.SIGKILL)  # workers left behind still hold GPU memory
            tail = replica.log_tail()
            self._event("replica_died", index=index, port=replica.plan.port, status=code, log_tail=tail)
            while True:
                if self.restarts_used[index] >= self.spec.restarts:
                    self._event(
                        "replica_lost", index=index, port=replica.plan.port, restarts=self.spec.restarts
                    )
                    return
                self.restarts_used[index] += 1
                try:
                    await replica.start()
                    await self._wait_ready(replica)
                except ServeError as error:
                    await replica.stop(self.spec.grace_s)
                    self._event("replica_restart_failed", index=index, message=str(error)[:1000])
                    continue
                break
            self._available(index, True)
            self._event(
                "replica_restarted",
                index=index,
                port=replica.plan.port,
                restart=self.restarts_used[index],
                down_s=round(time.monotonic() - died_at, 3),
                pid=replica.pid,
            )


def _who(holder: PortHolder) -> str:
    """A port's holder in a few words: which process, and whose replica it is if it is one."""
    if holder.owner is None:
        return f"{holder.describe()}, which rcarun did not start"
    rcarun_pid = holder.owner.partition(":")[0]
    if rcarun_pid == str(os.getpid()):
        return f"{holder.describe()}, a process of this rcarun's replicas"
    return f"{holder.describe()}, a replica of rcarun pid {rcarun_pid}, which still runs"


def _ports(spec: ServeSpec) -> tuple[int, ...]:
    """``port_base + i`` per replica, or free ports the system hands out (all held open while choosing)."""
    if spec.port_base is not None:
        return tuple(spec.port_base + index for index in range(spec.replicas))
    family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
    sockets = []
    try:
        for _ in range(spec.replicas):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((spec.host, 0))
        return tuple(int(sock.getsockname()[1]) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def replica_log_dir(base: Path) -> Path:
    """The directory for replica logs beside ``base`` (results.db): ``<db>.serve-logs/``."""
    return base.with_name(base.name + ".serve-logs")
