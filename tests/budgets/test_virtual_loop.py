"""The virtual-time loop itself: sleeps take no real time and land exactly."""

from __future__ import annotations

import asyncio

from .conftest import run_virtual


def test_sleep_advances_virtual_time_exactly_without_waiting() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = []
        for delay in (3600.0, 0.25, 1e-3):
            await asyncio.sleep(delay)
            seen.append(loop.time())
        return seen

    assert run_virtual(main) == [3600.0, 3600.25, 3600.251]
