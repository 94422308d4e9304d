"""The runner's side of self-hosted backbones: managed replicas for the length of a sweep, and their balancing.

Joins `rcarun.serving` (processes, no configs) and `rcarun.backends.replicas` (URLs, no processes) for the
scheduler and ``rcarun serve``: a ``[serve]`` table becomes a `ServeSpec`, replicas start together and stop
together, and each balancer hears of deaths and restarts (with a `MetricsPoller` for ``balance = "metrics"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from rcarun.backends import Backend
from rcarun.backends.replicas import MetricsPoller, ReplicaBalancer
from rcarun.errors import RcarunError
from rcarun.runner.config import BackboneConfig, SweepConfig
from rcarun.serving import ManagedReplicas, ServeError, ServeSpec

__all__ = [
    "METRICS_INTERVAL_S",
    "REPLICAS_STARTED",
    "REPLICAS_STOPPED",
    "managed_backbones",
    "replica_balancing",
    "serve_spec",
]

# The run_events kinds that record what served a managed backbone and, at the session's end, how long its
# replicas held their GPUs (``held_s``) and could serve (``up_s``): the report charges GPU time from them.
REPLICAS_STARTED = "replicas_started"
REPLICAS_STOPPED = "replicas_stopped"
# How often each replica's /metrics is read: a few hundred milliseconds, so a burst is seen within a call or two.
METRICS_INTERVAL_S = 0.25

EventSink = Callable[[str, dict[str, Any]], None]


def serve_spec(name: str, backbone: BackboneConfig, log_dir: Path) -> ServeSpec:
    """The `ServeSpec` of a managed backbone: its serve table, its model as the served name, and the context
    window as ``--max-model-len`` when the table does not set one (the two must agree; the config checks)."""
    serve = backbone.serve
    if serve is None:
        raise ValueError(f"backbone {name!r} has no [serve] table")
    return ServeSpec(
        backbone=name,
        served_model=backbone.model,
        model=serve.model,
        gpus=serve.gpus,
        tensor_parallel=serve.tensor_parallel,
        max_model_len=serve.max_model_len or backbone.context_window,
        extra_args=serve.extra_args,
        command=serve.command_argv,
        host=serve.host,
        port_base=serve.port_base,
        startup_timeout_s=serve.startup_timeout_s,
        restarts=serve.restarts,
        grace_s=serve.grace_s,
        log_dir=log_dir,
        api_key_env=backbone.api_key_env,
        env=dict(serve.env),
    )


@contextlib.asynccontextmanager
async def managed_backbones(
    config: SweepConfig,
    *,
    log_dir: Path,
    on_event: EventSink,
    on_exit: Callable[[Callable[[], None]], None],
    announce: Callable[[str], None],
) -> AsyncIterator[dict[str, ManagedReplicas]]:
    """Start the replicas of every managed backbone of ``config`` together; stop them all on the way out.

    Args:
        log_dir: where each replica's log goes.
        on_event: hears ``replicas_started`` (with `FleetRecord.to_detail`, the GPU count and price), the
            supervisors' events, and ``replicas_stopped`` once the replicas of a started backbone are stopped.
        on_exit: registers a synchronous kill for a process about to exit at once (`StopController.on_exit`).
        announce: one line for the user per start.

    Raises:
        ServeError: a replica did not come up or does not match its backbone (the first such line).
    """
    fleets = {
        name: ManagedReplicas(serve_spec(name, backbone, log_dir), on_event=on_event)
        for name, backbone in config.backbones.items()
        if backbone.serve is not None
    }
    prices = {name: config.backbones[name].prices.gpu_hour_usd for name in fleets}
    # Pairs a start with its stop even where sessions interleave (a run merged from several machines).
    sessions = {name: uuid.uuid4().hex[:16] for name in fleets}

    async with contextlib.AsyncExitStack() as stack:
        for name, fleet in fleets.items():
            on_exit(fleet.kill_now)
            stack.push_async_callback(_stop, name, fleet, sessions[name], prices[name], on_event)
            announce(
                f"backbone {name!r}: starting {fleet.spec.replicas} vLLM replicas on GPUs {list(fleet.spec.gpus)} "
                f"(logs in {log_dir})"
            )
        await _start_all(fleets)
        for name, fleet in fleets.items():
            record = fleet.record
            slowest = max(replica.startup_s for replica in record.replicas)
            announce(
                f"backbone {name!r}: {len(record.replicas)} replicas of {record.served_model!r} up in {slowest:.1f} s "
                f"(vLLM {record.version}, max_model_len {record.max_model_len})"
            )
            on_event(
                REPLICAS_STARTED,
                {
                    **record.to_detail(),
                    "session": sessions[name],
                    "gpus": fleet.spec.gpu_count,
                    "gpu_hour_usd": prices[name],
                },
            )
        yield fleets


async def _start_all(fleets: Mapping[str, ManagedReplicas]) -> None:
    """Start every fleet at once; the first failure (its own one line) cancels the other starts."""
    if not fleets:
        return
    try:
        async with asyncio.TaskGroup() as group:
            for fleet in fleets.values():
                group.create_task(fleet.start())
    except BaseExceptionGroup as errors:
        found = _first_rcarun_error(errors)
        if found is None:
            raise
        raise found from None


async def _stop(
    name: str, fleet: ManagedReplicas, session: str, gpu_hour_usd: float, on_event: EventSink
) -> None:
    try:
        await fleet.stop()
    finally:
        # Only replicas that came up served the run; a start that failed stopped the sweep before any call.
        if fleet.started:
            on_event(
                REPLICAS_STOPPED,
                {
                    "backbone": name,
                    "session": session,
                    "replicas": fleet.spec.replicas,
                    "gpus": fleet.spec.gpu_count,
                    "held_s": round(fleet.held_s, 3),
                    "up_s": round(fleet.up_s, 3),
                    "restarts": sum(fleet.restarts_used),
                    "gpu_hour_usd": gpu_hour_usd,
                },
            )


@contextlib.asynccontextmanager
async def replica_balancing(
    backbones: Mapping[str, tuple[BackboneConfig, Backend]],
    fleets: Mapping[str, ManagedReplicas],
    *,
    interval_s: float = METRICS_INTERVAL_S,
) -> AsyncIterator[dict[str, MetricsPoller]]:
    """For the block's length: a metrics poller per vLLM backbone with several replicas, and each managed
    backbone's deaths and restarts told to its balancer."""
    async with contextlib.AsyncExitStack() as stack:
        pollers: dict[str, MetricsPoller] = {}
        for name, (backbone, backend) in backbones.items():
            balancer = getattr(backend, "replicas", None)
            if not isinstance(balancer, ReplicaBalancer):
                continue
            fleet = fleets.get(name)
            if fleet is not None:
                fleet.on_availability = balancer.set_available
            # Any backbone with several URLs may keep prefixes on one replica (a prefix cache is vLLM's, but
            # an unmanaged OpenAI-compatible fleet may have one too).
            balancer.affinity = backbone.balance == "affinity"
            if backbone.provider == "vllm" and backbone.balance == "metrics" and len(balancer.urls) > 1:
                pollers[name] = await stack.enter_async_context(
                    MetricsPoller(balancer, interval_s=interval_s)
                )
        yield pollers


def _first_rcarun_error(group: BaseExceptionGroup[BaseException]) -> RcarunError | None:
    for error in group.exceptions:
        if isinstance(error, ServeError | RcarunError):
            return error
        if isinstance(error, BaseExceptionGroup):
            found = _first_rcarun_error(error)
            if found is not None:
                return found
    return None
