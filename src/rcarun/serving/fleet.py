"""A managed backbone's replicas: start one ``vllm serve`` per GPU group, check them, keep them up, stop them.

Each replica runs in a process group of its own under a guard that ends it if rcarun dies (`replica`). A start
claims the port (`ports`), waits for ``/health`` and ``/v1/models``, checks the served model and
``max_model_len`` against the config, and records the server's version. A replica that dies is reported, its
group killed and restarted up to ``restarts`` times; on every way out each group gets SIGTERM, then SIGKILL.
Details: docs/reliability.md ("Managed replicas").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from rcarun.serving.ports import MARKER, choose_ports, claim_port, process_identity, stranger_on
from rcarun.serving.replica import Replica
from rcarun.serving.spec import ServeError, ServeSpec

__all__ = ["FleetRecord", "ManagedReplicas", "ServeError", "ServedReplica", "replica_log_dir"]

_PROBE_TIMEOUT_S = 2.0
_VERSION_TIMEOUT_S = 60.0
# A shell's VLLM_API_KEY would make every replica require a key the client does not send: the replicas get a
# key only from api_key_env, the one the client sends too.
_SERVER_KEY = "VLLM_API_KEY"

EventSink = Callable[[str, dict[str, Any]], None]


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


class ManagedReplicas:
    """A backbone's replicas for the length of an ``async with``; ``on_event`` hears ``replica_died`` and the
    like, ``on_availability`` is told ``(index, up)``; ``poll_s`` paces the start-up probes."""

    def __init__(self, spec: ServeSpec, *, on_event: EventSink | None = None, poll_s: float = 0.1) -> None:
        self.spec = spec
        self.on_availability: Callable[[int, bool], None] | None = None
        self._on_event = on_event
        self._poll_s = poll_s
        self._replicas: list[Replica] = []
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

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start every replica, wait until each answers and matches the config, then supervise them; on a
        `ServeError` every replica started is stopped first."""
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
        ports = choose_ports(spec.host, spec.port_base, spec.replicas)
        self._replicas = [Replica(plan, spec, env) for plan in spec.plan(ports)]
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
        """Stop every replica (SIGTERM, SIGKILL after ``grace_s``; a cancel meanwhile kills at once); idempotent."""
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

    async def _claim_port(self, replica: Replica) -> None:
        """Free ``replica``'s port of a stale replica, or refuse whoever else holds it (`ports.claim_port`)."""
        index, port = replica.plan.index, replica.plan.port

        def ended(owner: str, pids: list[int], command: str) -> None:
            killed = owner.partition(":")[0]
            self._event(
                "stale_replica_ended",
                index=index,
                port=port,
                killed_rcarun=killed,
                pids=pids,
                command=command,
            )

        where = f"backbone {self.spec.backbone!r}: {replica.label}: port {port} is already in use"
        await claim_port(self.spec.host, port, where, poll_s=self._poll_s, on_ended=ended)

    async def _check_own(self, replica: Replica) -> None:
        """Fail unless the socket answering on ``replica``'s port belongs to its process group (Linux)."""
        process = replica.process
        assert process is not None
        who = await asyncio.to_thread(stranger_on, self.spec.host, replica.plan.port, process.pid)
        if who is None:
            return
        raise replica.failed(
            f"answers /health, but the server on port {replica.plan.port} is {who}, not this replica; "
            "stop it or change port_base"
        )

    async def _wait_ready(self, replica: Replica) -> _Card:
        """Wait for ``/health`` then read and check ``/v1/models``, within ``startup_timeout_s``."""
        spec = self.spec
        deadline = time.monotonic() + spec.startup_timeout_s
        session = self._session
        assert session is not None
        while True:
            process = replica.process
            if process is not None and process.returncode is not None:
                raise replica.failed(f"exited with status {process.returncode} before answering /health")
            if time.monotonic() > deadline:
                raise replica.failed(
                    f"did not answer /health within startup_timeout_s = {spec.startup_timeout_s:g} s "
                    "(raise it for a large model)"
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
            raise replica.failed(f"answered /health but not /v1/models ({exc})") from None
        if status != 200:
            raise ServeError(
                f"backbone {spec.backbone!r}: {replica.label} answered /v1/models with HTTP {status} "
                f"(a key the server does not accept? check api_key_env); its log ends: {replica.log_tail()}"
            )
        return self._check_card(replica, body)

    def _check_card(self, replica: Replica, body: bytes) -> _Card:
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

    async def _supervise(self, replica: Replica) -> None:
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


def replica_log_dir(base: Path) -> Path:
    """The directory for replica logs beside ``base`` (results.db): ``<db>.serve-logs/``."""
    return base.with_name(base.name + ".serve-logs")
