"""BackboneGate: pause -> slot -> rate -> ledger, per backbone; 429s on one gate leave others alone."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

import pytest

from rcarun.backends.types import ChatMessage, ChatRequest, RateLimitInfo, Usage
from rcarun.budgets import (
    BackboneGate,
    BackboneLimits,
    Budget,
    Price,
    PriceTable,
    RetryPolicy,
    SpendLedger,
    Ticket,
)
from rcarun.errors import BudgetExhausted, ConfigError, RateLimited, ServerError

from .conftest import run_virtual

NOON = datetime(2026, 3, 1, 12, tzinfo=UTC)
PRICES = PriceTable(default=Price(input_per_mtok=1.0, cached_input_per_mtok=0.5, output_per_mtok=4.0))


def now() -> float:
    return asyncio.get_running_loop().time()


def admit(backbone: BackboneGate, request: ChatRequest) -> AbstractAsyncContextManager[Ticket]:
    """Admit `request` as the runner does: the prompt estimated by the gate's own estimator."""
    prompt = request.prompt_size()
    return backbone.admit(backbone.estimator.estimate(prompt.utf8_bytes), request.max_tokens, prompt=prompt)


def gate(name: str, **limits: float) -> BackboneGate:
    return BackboneGate(
        name,
        BackboneLimits(**{"concurrency": 8, "rpm": 600.0, "tpm": 600_000.0, **limits}),  # type: ignore[arg-type]
        prices=PRICES,
        retry=RetryPolicy(jitter=0.0),
    )


def test_a_429_on_one_gate_pauses_and_shrinks_only_that_gate() -> None:
    limited, other = gate("limited"), gate("other")  # built outside any loop: asyncio objects come later

    async def main() -> tuple[float, float, int, int]:
        async with limited.admit(100, 100) as ticket:
            decision = limited.on_error(RateLimited("429", retry_after_s=30.0), 1, ticket)
        assert decision.retry and decision.pause_backbone_s == 30.0
        async with other.admit(100, 100):
            other_admitted_at = now()
        async with limited.admit(100, 100):
            limited_admitted_at = now()
        return other_admitted_at, limited_admitted_at, limited.concurrency.limit, other.concurrency.limit

    assert run_virtual(main) == (0.0, 30.0, 4, 8)
    assert limited.stats().rate_limited == 1 and other.stats().rate_limited == 0
    assert limited.stats().paused_for_s == 0.0  # outside the loop nothing is paused any more


def test_paused_callers_hold_no_slot_and_resume_in_arrival_order() -> None:
    backbone = gate("b", concurrency=2)

    async def main() -> tuple[list[int], int]:
        backbone.pause_for(10.0)
        order: list[int] = []

        async def call(index: int) -> None:
            async with backbone.admit(10, 10):
                order.append(index)
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(call(index)) for index in range(6)]
        await asyncio.sleep(5.0)
        in_flight_while_paused = backbone.concurrency.in_flight
        waiting = backbone.stats().waiting
        assert waiting == 6
        await asyncio.gather(*tasks)
        return order, in_flight_while_paused

    order, in_flight_while_paused = run_virtual(main)
    assert order == [0, 1, 2, 3, 4, 5]
    assert in_flight_while_paused == 0


def test_cancelling_one_paused_caller_does_not_cancel_the_others() -> None:
    backbone = gate("b")

    async def main() -> list[float]:
        backbone.pause_for(3.0)
        times: list[float] = []

        async def call() -> None:
            async with backbone.admit(1, 1):
                times.append(now())

        first, second = asyncio.create_task(call()), asyncio.create_task(call())
        await asyncio.sleep(1.0)
        first.cancel()
        await second
        return times

    assert run_virtual(main) == [3.0]


def test_settle_reconciles_rate_ledger_estimator_and_counters() -> None:
    ledger = SpendLedger()
    backbone = BackboneGate("b", BackboneLimits(concurrency=4, tpm=60_000.0), prices=PRICES, ledger=ledger)
    request = ChatRequest(messages=(ChatMessage("user", "x" * 40_000),), max_tokens=2_000)

    async def main() -> tuple[float, float]:
        async with admit(backbone, request) as ticket:
            assert ticket.estimated_prompt_tokens == 10_500  # 40,000 chars / 4, plus the 5 % margin
            # The budget reserves the worst case: before any report, the most a bill is believed to be (four
            # tokens a character, twice the output budget).
            assert ledger.totals("b").reserved_usd == pytest.approx((160_000 * 1.0 + 4_000 * 4.0) / 1e6)
            assert backbone.stats().in_flight == 1
            cost = ticket.settle(
                Usage(prompt_tokens=8_000, cached_prompt_tokens=2_000, completion_tokens=500), at=NOON
            )
        # The client's bucket is 950 tokens (1 s of quota less the 0.05 s jitter allowance). 12,500 reserved
        # from it leaves 11,550 of debt; 8,500 used, so 4,000 come back. The next call (1,000 tokens, more than
        # the bucket) waits for 7,550 + 950 tokens at 1,000 per second, then 0.1 s of staying full.
        async with backbone.admit(500, 500):
            next_at = now()
        return cost, next_at

    cost, next_at = run_virtual(main)
    assert cost == pytest.approx((6_000 * 1.0 + 2_000 * 0.5 + 500 * 4.0) / 1e6)
    assert next_at == pytest.approx(8.6)
    totals = ledger.totals("b")
    assert (
        totals.usd == pytest.approx(cost)
        and totals.prompt_tokens == 8_000
        and totals.completion_tokens == 500
    )
    # 40,000 bytes were 8,000 tokens (5 per token): the ratio relaxes slowly, 4.0 -> 4.05.
    assert backbone.estimator.bytes_per_token == pytest.approx(4.05)
    stats = backbone.stats()
    assert (stats.in_flight, stats.admitted, stats.rate_limited, stats.concurrency_limit) == (0, 2, 0, 4)


def test_budget_stop_raises_before_sending_and_returns_the_slot_and_the_rate_grant() -> None:
    ledger = SpendLedger(per_backbone={"b": Budget(max_usd=0.01)})
    backbone = BackboneGate(
        "b", BackboneLimits(concurrency=1, rpm=60.0, burst_s=1.0), prices=PRICES, ledger=ledger
    )

    async def main() -> float:
        with pytest.raises(BudgetExhausted):
            async with backbone.admit(1_000, 10_000):  # worst case $0.041 > $0.01
                pytest.fail("admitted over budget")
        assert backbone.concurrency.in_flight == 0 and backbone.stats().in_flight == 0
        async with backbone.admit(1_000, 1_000):  # fits; the request given back means no 1 s wait
            return now()

    assert run_virtual(main) == 0.0
    totals = ledger.totals("b")
    # The second call ended without a settlement: its reservation was released, nothing was spent.
    assert (totals.reserved_usd, totals.reserved_tokens, totals.calls, totals.usd) == (0.0, 0, 0, 0.0)


def test_a_burst_of_429s_from_one_overload_halves_concurrency_once_and_counts_every_429() -> None:
    backbone = gate("b", concurrency=16, rpm=6_000.0)

    async def main() -> tuple[int, float]:
        async def call() -> None:
            async with backbone.admit(10, 10) as ticket:
                await asyncio.sleep(1.0)
                backbone.on_error(RateLimited("429", retry_after_s=2.0), 1, ticket)

        await asyncio.gather(*(call() for _ in range(16)))
        return backbone.concurrency.limit, backbone.paused_until

    limit, paused_until = run_virtual(main)
    assert limit == 8
    assert paused_until == pytest.approx(3.0)
    assert backbone.stats().rate_limited == 16


def test_server_errors_back_off_without_pausing_or_shrinking() -> None:
    backbone = gate("b")

    async def main() -> tuple[float, float, int]:
        decision = backbone.on_error(ServerError("503", status=503), 2)
        async with backbone.admit(1, 1):
            return decision.delay_s, now(), backbone.concurrency.limit

    assert run_virtual(main) == (1.0, 0.0, 8)


def test_limits_are_validated_as_config() -> None:
    with pytest.raises(ConfigError):
        BackboneLimits(concurrency=0)
    with pytest.raises(ConfigError):
        BackboneLimits(concurrency=4, rpm=0.0)
    with pytest.raises(ConfigError):
        BackboneLimits(concurrency=4, burst_s=60.0)


def test_client_buckets_leave_the_provider_a_jitter_allowance() -> None:
    limits = BackboneLimits(concurrency=4, rpm=600, tpm=60_000, burst_s=1.0, arrival_jitter_s=0.05)
    assert limits.client_burst_s == pytest.approx(0.95)

    async def admitted_at(tokens: tuple[int, ...]) -> list[float]:
        limiter = BackboneGate("a", limits).limiter
        times: list[float] = []
        for amount in tokens:
            await limiter.acquire(amount)
            times.append(now())
        return times

    # 9.5 requests at once: nine go at once, the tenth waits half a request at 10 a second.
    assert run_virtual(lambda: admitted_at((1,) * 10)) == [0.0] * 9 + [pytest.approx(0.05)]
    # 950 tokens at once: the next 100 wait 0.1 s at 1,000 a second.
    assert run_virtual(lambda: admitted_at((950, 100))) == [0.0, pytest.approx(0.1)]
    assert BackboneLimits(concurrency=1, burst_s=0.06).client_burst_s == pytest.approx(0.03)


@pytest.mark.parametrize(("meters_output_budget", "next_at"), [(False, 0.05), (True, 1.95)])
def test_unused_output_is_refunded_only_where_the_provider_does_not_meter_the_whole_budget(
    meters_output_budget: bool, next_at: float
) -> None:
    limits = BackboneLimits(concurrency=4, tpm=60_000.0, meters_output_budget=meters_output_budget)
    backbone = BackboneGate("b", limits)

    async def main() -> float:
        # 1,000 estimated prompt + 2,000 budget from a full 950-token bucket: 2,050 of debt.
        async with backbone.admit(1_000, 2_000) as ticket:
            ticket.settle(Usage(prompt_tokens=800, completion_tokens=100))
        # Metered by usage: 900 used, 2,100 come back, the bucket holds 50 and 100 more take 0.05 s.
        # Metered by budget (OpenAI): only the prompt's 200 come back; 1,850 of debt + 100 take 1.95 s.
        async with backbone.admit(0, 100):
            return now()

    assert run_virtual(main) == pytest.approx(next_at)


def test_an_undeclared_limit_the_headers_state_is_paced_from_then_on() -> None:
    backbone = BackboneGate("b", BackboneLimits(concurrency=4))

    async def main() -> tuple[float, float, float, tuple[float | None, float | None]]:
        # 600 requests/min stated with none left: the limiter paces to it, starting from an empty bucket (the
        # provider's window is full), so the next request waits for one request's refill; no pause.
        spent = RateLimitInfo(
            limit_requests=600, remaining_requests=0, reset_requests_s=1.5, remaining_tokens=900
        )
        plenty = RateLimitInfo(remaining_requests=3, reset_requests_s=0.02, remaining_tokens=10)
        assert backbone.on_rate_limit_headers(None) == 0.0
        assert backbone.on_rate_limit_headers(plenty) == 0.0
        first = backbone.on_rate_limit_headers(spent)
        async with backbone.admit(10, 10):
            admitted_at = now()
        stated_tokens = backbone.on_rate_limit_headers(
            RateLimitInfo(limit_tokens=60_000, remaining_tokens=0, reset_tokens_s=30.0)
        )
        return first, admitted_at, stated_tokens, backbone.learned_limits

    first, admitted_at, stated_tokens, limits = run_virtual(main)
    assert first == 0.0 and stated_tokens == 0.0
    assert admitted_at == pytest.approx(0.1)
    assert limits == (600, 60_000)


def test_a_spent_quota_nobody_states_pauses_until_the_reset_at_most() -> None:
    backbone = BackboneGate("b", BackboneLimits(concurrency=4))

    async def main() -> tuple[float, float]:
        async with backbone.admit(10, 10) as ticket:
            ticket.settle(Usage(prompt_tokens=1_000, completion_tokens=200))
        unknown = RateLimitInfo(remaining_requests=0, reset_requests_s=0.7)
        daily = RateLimitInfo(remaining_tokens=0, reset_tokens_s=7_200.0)
        return backbone.on_rate_limit_headers(unknown), backbone.on_rate_limit_headers(daily)

    unknown, daily = run_virtual(main)
    assert unknown == pytest.approx(0.7)
    # A reset beyond the minute belongs to a longer limit: waited out whole (here more than the policy waits,
    # so the caller stops the backbone instead).
    assert daily == pytest.approx(7_200.0)


def test_headers_do_not_pause_a_backbone_whose_limits_are_declared() -> None:
    backbone = gate("b", concurrency=4, rpm=600.0, tpm=60_000.0)
    spent = RateLimitInfo(limit_requests=600, remaining_requests=0, reset_requests_s=1.0, remaining_tokens=0)
    assert run_virtual(lambda: _headers(backbone, spent)) == 0.0


async def _headers(backbone: BackboneGate, info: RateLimitInfo) -> float:
    return backbone.on_rate_limit_headers(info)


def test_a_budget_refusal_waits_while_calls_in_flight_may_still_settle_for_less() -> None:
    ledger = SpendLedger(per_backbone={"b": Budget(max_usd=0.1)})
    backbone = BackboneGate("b", BackboneLimits(concurrency=4), prices=PRICES, ledger=ledger)

    async def main() -> tuple[float, float]:
        # Worst case per call before any report: 1,000 prompt at $1/M + twice the 10,000 output budget at $4/M =
        # $0.081; two do not fit in $0.1. Once a report shows output within its budget, $0.041.
        async def first() -> None:
            async with backbone.admit(1_000, 10_000) as ticket:
                await asyncio.sleep(1.0)
                ticket.settle(Usage(prompt_tokens=1_000, completion_tokens=100), at=NOON)  # $0.0014

        async def second() -> float:
            async with backbone.admit(1_000, 10_000) as ticket:
                ticket.settle(Usage(prompt_tokens=1_000, completion_tokens=100), at=NOON)
                return now()

        running = asyncio.create_task(first())
        await asyncio.sleep(0)
        admitted_at = await second()
        await running
        # Nothing in flight any more: a call whose worst case cannot fit is refused at once.
        with pytest.raises(BudgetExhausted):
            async with backbone.admit(1_000, 30_000):
                pass
        return admitted_at, now()

    admitted_at, refused_at = run_virtual(main)
    assert admitted_at == pytest.approx(1.0)  # waited for the first call to settle, not refused
    assert refused_at == pytest.approx(1.0)


def test_a_budget_below_the_believed_ceiling_sends_the_first_call_alone_at_a_token_a_byte() -> None:
    ledger = SpendLedger(per_backbone={"b": Budget(max_usd=0.01)})
    backbone = BackboneGate("b", BackboneLimits(concurrency=4), prices=PRICES, ledger=ledger)
    # The ceiling, 16,000 prompt tokens + 200 output at $1/M and $4/M, is $0.0168: more than the whole budget.
    request = ChatRequest(messages=(ChatMessage("user", "x" * 4_000),), max_tokens=100)

    async def main() -> tuple[float, float]:
        async with admit(backbone, request) as ticket:
            alone = ledger.totals("b").reserved_usd
            ticket.settle(Usage(prompt_tokens=1_000, completion_tokens=50), at=NOON)
        async with admit(backbone, request):
            calibrated = ledger.totals("b").reserved_usd
        return alone, calibrated

    alone, calibrated = run_virtual(main)
    assert alone == pytest.approx((4_000 * 1.0 + 100 * 4.0) / 1e6)  # a token a byte, the output budget
    assert calibrated == pytest.approx(
        (1_050 * 1.0 + 100 * 4.0) / 1e6
    )  # what the report showed, margin on top


@pytest.mark.parametrize(("meters_output_budget", "second"), [(False, 1_000 + 625), (True, 1_000 + 8_000)])
def test_a_call_reserves_the_output_calls_produce_not_its_whole_budget(
    meters_output_budget: bool, second: int
) -> None:
    limits = BackboneLimits(concurrency=4, tpm=6_000_000.0, meters_output_budget=meters_output_budget)
    backbone = BackboneGate("b", limits)

    async def main() -> tuple[int, int]:
        async with backbone.admit(1_000, 8_000) as ticket:
            first = ticket.reserved_tokens
            ticket.settle(Usage(prompt_tokens=1_000, completion_tokens=500))
        async with backbone.admit(1_000, 8_000) as ticket:
            return first, ticket.reserved_tokens

    # Before any report the whole budget; then the mean output with a quarter more (500 -> 625), unless the
    # provider meters the whole budget at arrival.
    assert run_virtual(main) == (9_000, second)
