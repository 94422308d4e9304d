"""A stop interrupts only waits: items waiting for admission end as interrupted, calls in flight finish."""

from __future__ import annotations

import asyncio

import pytest

from helpers.sweeps import make_config
from rcarun.backends import BackendSettings, create_backend
from rcarun.budgets import BackboneGate, BackboneLimits
from rcarun.errors import StopRequested
from rcarun.runner.runtime import BackboneRuntime


def _runtime() -> BackboneRuntime:
    config = make_config({"sim": {"base_url": "http://127.0.0.1:9/v1"}}).backbones["sim"]
    return BackboneRuntime(
        name="sim",
        config=config,
        backend=create_backend(
            BackendSettings(name="sim", provider="simulated", model="m", base_urls=("http://127.0.0.1:9/v1",))
        ),
        gate=BackboneGate("sim", BackboneLimits(concurrency=1)),
    )


async def test_a_stop_ends_waits_as_stop_requested_and_lets_the_admitted_call_finish() -> None:
    runtime = _runtime()
    finished: list[str] = []

    async def call(name: str, seconds: float) -> str:
        with runtime.stop_guard() as guard:
            async with runtime.gate.admit(10, 10) as _ticket:
                guard.disarm()
                await asyncio.sleep(seconds)  # the request in flight
                finished.append(name)
        return name

    in_flight = asyncio.create_task(call("in-flight", 0.2))
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(call(f"waiting-{index}", 0.0)) for index in range(3)]
    await asyncio.sleep(0.01)
    assert runtime.stop("provider asked to wait a day")
    assert not runtime.stop("again")  # only the first stop counts
    results = await asyncio.gather(in_flight, *waiting, return_exceptions=True)
    assert results[0] == "in-flight" and finished == ["in-flight"]
    assert all(isinstance(result, StopRequested) for result in results[1:])
    assert "provider asked to wait a day" in str(results[1])
    assert runtime.gate.concurrency.in_flight == 0 and runtime.gate.concurrency.waiting == 0
    with pytest.raises(StopRequested):
        runtime.stop_guard()  # nothing new is admitted
    await runtime.backend.aclose()


async def test_someone_elses_cancel_of_a_waiting_task_is_never_swallowed_by_a_stop() -> None:
    runtime = _runtime()

    async def wait_forever() -> None:
        with runtime.stop_guard():
            await asyncio.Event().wait()

    task = asyncio.create_task(wait_forever())
    await asyncio.sleep(0)
    task.cancel()  # a task group or a second Ctrl-C, say
    runtime.stop("and a stop at the same moment")
    with pytest.raises(asyncio.CancelledError):
        await task
    await runtime.backend.aclose()
