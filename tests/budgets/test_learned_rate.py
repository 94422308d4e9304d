"""The one rule for a rate learned from bare refusals (`rcarun.budgets.learned_rate`), alone and in the gate.

Issue 35, N6: one bare 429 on the first request, or a sporadic 1-2 % of them, used to hold a backbone to a
fraction of its speed for the rest of the run. Here the rule is checked on its own (times given by hand) and in a
`BackboneGate` driven by workers in virtual time (`conftest.run_virtual`).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from rcarun.backends.types import RateLimitInfo, Usage
from rcarun.budgets import BackboneGate, BackboneLimits, RetryPolicy
from rcarun.budgets.learned_rate import LearnedRate
from rcarun.errors import RateLimited

from .conftest import run_virtual
from .test_learned_limits import WindowServer


def test_a_refusal_of_the_first_request_teaches_nothing() -> None:
    rate = LearnedRate()
    assert rate.refused(0.05, states_limit=False) is None
    for step in range(1_000):
        assert rate.accepted(0.1 + step * 0.01) is None
    assert rate.held_rpm is None


def test_a_near_empty_window_teaches_nothing_however_many_of_it_were_refused() -> None:
    rate = LearnedRate()
    for step in range(10):
        rate.accepted(float(step))
    # 19 answered, 9 refused: under the 20 answers a window needs to teach anything.
    assert all(rate.refused(10.0 + step, states_limit=False) is None for step in range(9))
    assert rate.held_rpm is None
    # The 20th answer, refused, with a tenth or more refused: the window accepted 10, held at 10 a minute.
    change = rate.refused(20.0, states_limit=False)
    assert change is not None and (change.kind, change.rpm, change.accepted, change.refused) == (
        "learned",
        10.0,
        10,
        10,
    )


def test_a_refusal_that_states_a_limit_teaches_nothing_here() -> None:
    rate = LearnedRate()
    for step in range(30):
        rate.accepted(step * 0.1)
    assert all(rate.refused(3.0 + step * 0.1, states_limit=True) is None for step in range(30))
    assert rate.held_rpm is None


def test_a_held_rate_rises_a_quarter_each_quiet_window_and_is_released_once_doubled() -> None:
    rate = LearnedRate(window_s=60.0)
    for step in range(100):
        rate.accepted(step * 0.5)
    for step in range(20):
        rate.refused(50.0 + step * 0.1, states_limit=False)
    assert rate.held_rpm == pytest.approx(100.0)
    kinds: list[tuple[str, float | None]] = []
    now = 52.0
    while now < 400.0:
        change = rate.accepted(now)
        if change is not None:
            kinds.append((change.kind, change.rpm))
        now += 1.0
    assert kinds == [
        ("raised", pytest.approx(125.0)),
        ("raised", pytest.approx(156.25)),
        ("raised", pytest.approx(195.3125)),
        ("released", None),
    ]
    assert rate.held_rpm is None


def test_a_rate_is_learned_at_most_once_a_window_and_never_raised_by_a_refusal() -> None:
    rate = LearnedRate()
    for step in range(60):
        rate.accepted(float(step))
    learned = [rate.refused(60.0 + step * 0.01, states_limit=False) for step in range(20)]
    assert [change.kind for change in learned if change is not None] == ["learned"]
    held = rate.held_rpm
    # Thirty seconds on, more refusals: still within the window of the learn, nothing changes.
    assert all(rate.refused(90.0 + step * 0.01, states_limit=False) is None for step in range(20))
    assert rate.held_rpm == held


def test_the_window_is_counted_per_slot_however_fast_answers_come() -> None:
    rate = LearnedRate(window_s=60.0)
    for step in range(120_000):
        rate.accepted(step * 0.001)  # 1,000 a second for two minutes
    assert len(rate._slots) <= 62
    assert sum(count for _, count in rate.accepted_in_window(120.0)) == pytest.approx(60_000, rel=0.02)


def _run_sporadic(share: float, seconds: float, seed: int) -> tuple[BackboneGate, int, int]:
    """16 workers at 50 ms a call against a server that refuses ``share`` of all requests with a bare 429."""
    gate = BackboneGate("b", BackboneLimits(concurrency=16), retry=RetryPolicy(max_attempts=1_000))
    draw = random.Random(seed)
    counts = {"sent": 0, "refused": 0}

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def worker() -> None:
            attempt = 0
            while loop.time() < seconds:
                delay = 0.0
                async with gate.admit(100, 100) as ticket:
                    await asyncio.sleep(0.05)
                    counts["sent"] += 1
                    if draw.random() >= share:
                        ticket.settle(Usage(prompt_tokens=100, completion_tokens=10))
                        attempt = 0
                    else:
                        counts["refused"] += 1
                        attempt += 1
                        delay = gate.on_error(RateLimited("429"), attempt, ticket).delay_s
                await asyncio.sleep(delay)

        await asyncio.gather(*(worker() for _ in range(16)))

    run_virtual(main)
    return gate, counts["sent"], counts["refused"]


@pytest.mark.parametrize("share", [0.01, 0.02])
def test_sporadic_bare_refusals_never_lower_the_rate(share: float) -> None:
    gate, sent, refused = _run_sporadic(share, seconds=600.0, seed=35)
    assert refused > 0.5 * share * sent  # the refusals did come
    assert gate.take_rate_changes() == []
    assert gate.learned_limits == (None, None)
    # Adaptive concurrency (halved by a 429, one more per clean round) and backoff absorb them: a tenth or more of
    # the 320 a second that 16 in flight at 50 ms allow, far above any rate a window of them could teach.
    assert sent > 0.1 * 320 * 600


def test_a_real_undeclared_limit_is_learned_then_released_after_refusal_free_minutes() -> None:
    server = WindowServer(rpm=200, signal="bare")
    gate = BackboneGate("b", BackboneLimits(concurrency=8), retry=RetryPolicy(max_attempts=1_000, jitter=0.0))

    async def main() -> list[tuple[str, float | None, float]]:
        loop = asyncio.get_running_loop()
        changes: list[tuple[str, float | None, float]] = []

        async def worker() -> None:
            attempt = 0
            while loop.time() < 600.0:
                if loop.time() >= 150.0:
                    server.rpm = 1_000_000  # the provider lifts its limit
                delay = 0.0
                async with gate.admit(100, 100) as ticket:
                    await asyncio.sleep(0.05)
                    refusal = server.arrive(loop.time())
                    if refusal is None:
                        ticket.settle(Usage(prompt_tokens=100, completion_tokens=10))
                        attempt = 0
                    else:
                        attempt += 1
                        delay = gate.on_error(refusal, attempt, ticket).delay_s
                changes.extend((change.kind, change.rpm, loop.time()) for change in gate.take_rate_changes())
                await asyncio.sleep(delay)

        await asyncio.gather(*(worker() for _ in range(8)))
        return changes

    changes = run_virtual(main)
    learned = [rpm for kind, rpm, _ in changes if kind == "learned"]
    assert learned and learned[0] == pytest.approx(200.0, rel=0.02)
    released = [at for kind, _, at in changes if kind == "released"]
    assert len(released) == 1 and changes[-1][0] == "released"
    # Four refusal-free minutes after the limit was lifted (1.25 ** 4 > 2), nothing learned is held.
    assert 150.0 + 3 * 60.0 < released[0] < 150.0 + 6 * 60.0
    assert gate.learned_limits == (None, None)


def test_a_learned_rate_never_lifts_the_declared_one_and_release_returns_to_it() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=8, rpm=600.0), retry=RetryPolicy(jitter=0.0))

    async def main() -> list[float | None]:
        seen = []
        for _ in range(120):
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(0.5)
        for _ in range(20):
            gate.on_error(RateLimited("429"), 1)
        seen.append(gate.learned_limits[0])
        for _ in range(600):
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(0.5)
        seen.append(gate.learned_limits[0])
        return seen

    held, released = run_virtual(main)
    assert held == pytest.approx(120.0, rel=0.02)
    assert released == 600.0


def test_a_stated_limit_stays_when_a_learned_rate_is_released() -> None:
    gate = BackboneGate("b", BackboneLimits(concurrency=8), retry=RetryPolicy(jitter=0.0))

    async def main() -> tuple[float | None, float | None]:
        gate.on_rate_limit_headers(RateLimitInfo(limit_requests=500, remaining_requests=400))
        for _ in range(120):
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(0.5)
        for _ in range(20):
            gate.on_error(RateLimited("429"), 1)
        held = gate.learned_limits[0]
        for _ in range(600):
            async with gate.admit(10, 10) as ticket:
                ticket.settle(Usage(prompt_tokens=10, completion_tokens=1))
            await asyncio.sleep(0.5)
        return held, gate.learned_limits[0]

    held, released = run_virtual(main)
    assert held == pytest.approx(120.0, rel=0.02)
    assert released == 500.0
