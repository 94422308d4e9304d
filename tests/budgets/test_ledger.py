"""SpendLedger: reservations count against budgets; commit replaces them with actuals; totals by kind."""

from __future__ import annotations

import pytest

from rcarun.backends.types import Usage
from rcarun.budgets import Budget, SpendLedger
from rcarun.errors import BudgetExhausted


def test_budget_stop_counts_spent_plus_reserved_plus_this_call() -> None:
    ledger = SpendLedger(per_backbone={"gpt": Budget(max_usd=1.00)})
    first = ledger.reserve("gpt", 0.40, 1_000)
    ledger.reserve("gpt", 0.40, 1_000)
    with pytest.raises(BudgetExhausted, match="backbone 'gpt' USD budget"):
        ledger.reserve("gpt", 0.40, 1_000)  # 0.80 reserved + 0.40 > 1.00
    ledger.commit(first, 0.05, Usage(prompt_tokens=500, completion_tokens=100))
    third = ledger.reserve("gpt", 0.40, 1_000)  # 0.05 spent + 0.40 reserved + 0.40 fits now
    assert ledger.totals("gpt").reserved_usd == pytest.approx(0.80)
    ledger.release(third)
    ledger.reserve("gpt", 0.54, 1_000)  # 1.00 - 0.05 spent - 0.40 reserved leaves 0.55
    with pytest.raises(BudgetExhausted):
        ledger.reserve("gpt", 0.02, 1_000)


def test_overall_budget_spans_backbones_and_other_backbones_are_unaffected_by_one_backbones_budget() -> None:
    ledger = SpendLedger(overall=Budget(max_tokens=10_000), per_backbone={"a": Budget(max_tokens=3_000)})
    ledger.reserve("a", 0.0, 3_000)
    with pytest.raises(BudgetExhausted, match="backbone 'a' token budget"):
        ledger.reserve("a", 0.0, 1)
    ledger.reserve("b", 0.0, 7_000)  # b has no own budget; the run still has 7,000
    with pytest.raises(BudgetExhausted, match="run token budget"):
        ledger.reserve("c", 0.0, 1)


def test_commit_records_actuals_by_kind_per_backbone_and_overall() -> None:
    ledger = SpendLedger()
    usage = Usage(prompt_tokens=1_000, cached_prompt_tokens=600, completion_tokens=300, reasoning_tokens=200)
    for backbone in ("a", "a", "b"):
        ledger.commit(ledger.reserve(backbone, 1.0, 5_000), 0.25, usage)
    a = ledger.totals("a")
    assert (a.calls, a.prompt_tokens, a.cached_prompt_tokens, a.completion_tokens, a.reasoning_tokens) == (
        2,
        2_000,
        1_200,
        600,
        400,
    )
    assert a.usd == pytest.approx(0.5) and a.total_tokens == 2_600
    assert (a.reserved_usd, a.reserved_tokens) == (0.0, 0)
    overall = ledger.totals()
    assert overall.calls == 3 and overall.usd == pytest.approx(0.75)
    assert ledger.backbones() == ("a", "b")
    assert ledger.totals("never-used").calls == 0


def test_actual_above_the_reservation_is_recorded_and_counts_against_later_reservations() -> None:
    ledger = SpendLedger(overall=Budget(max_usd=1.0))
    ledger.commit(ledger.reserve("a", 0.1, 10), 0.95, Usage(prompt_tokens=10))
    with pytest.raises(BudgetExhausted):
        ledger.reserve("a", 0.1, 10)


def test_release_is_idempotent_and_commit_after_release_does_not_unreserve_twice() -> None:
    ledger = SpendLedger()
    first = ledger.reserve("a", 0.3, 100)
    second = ledger.reserve("a", 0.2, 50)
    ledger.release(first)
    ledger.release(first)
    assert ledger.totals("a").reserved_tokens == 50
    ledger.commit(first, 0.1, Usage(prompt_tokens=10))
    assert ledger.totals("a").reserved_tokens == 50
    ledger.release(second)
    assert ledger.totals().reserved_usd == 0.0


def test_prior_spend_of_a_resumed_run_counts_against_its_budgets() -> None:
    ledger = SpendLedger(overall=Budget(max_usd=10.0), per_backbone={"a": Budget(max_tokens=1_000)})
    ledger.record_prior_spend("a", 9.0, Usage(prompt_tokens=600, completion_tokens=300))
    assert ledger.totals("a").usd == 9.0 and ledger.totals().total_tokens == 900
    assert ledger.totals().calls == 0
    with pytest.raises(BudgetExhausted):
        ledger.reserve("a", 0.5, 200)  # 900 + 200 tokens > 1,000 for backbone a
    with pytest.raises(BudgetExhausted):
        ledger.reserve("b", 1.5, 10)  # 9 + 1.5 USD > 10 for the run
    ledger.reserve("b", 0.5, 10)
