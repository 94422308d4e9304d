"""Tokens and USD spent per backbone and per run, and the budgets that stop admission.

To promise "no more than $X", a call's worst case is reserved before it is sent and replaced by its cost after,
so concurrent calls cannot overshoot together. Pure bookkeeping (no awaits, no clock), shared by a run's gates.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rcarun.backends.types import Usage
from rcarun.errors import BudgetExhausted, ConfigError

__all__ = ["Budget", "Reservation", "SpendLedger", "SpendTotals"]


@dataclass(frozen=True, slots=True)
class Budget:
    """USD and prompt + completion token limits for one backbone or the run; None means unlimited."""

    max_usd: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.max_usd is not None and self.max_usd < 0) or (
            self.max_tokens is not None and self.max_tokens < 0
        ):
            raise ConfigError(f"budgets must be >= 0, got {self}")


@dataclass(frozen=True, slots=True)
class Reservation:
    """A held worst-case amount; `SpendLedger.commit` or `SpendLedger.release` it exactly once."""

    serial: int
    backbone: str
    usd: float
    tokens: int


@dataclass(frozen=True, slots=True)
class SpendTotals:
    """Committed spend (and what is currently reserved) for one backbone or the whole run."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    usd: float = 0.0
    reserved_usd: float = 0.0
    reserved_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens committed."""
        return self.prompt_tokens + self.completion_tokens


class _Account:
    __slots__ = (
        "cached_prompt_tokens",
        "calls",
        "completion_tokens",
        "open_reservations",
        "prompt_tokens",
        "reasoning_tokens",
        "reserved_tokens",
        "reserved_usd",
        "usd",
    )

    def __init__(self) -> None:
        self.calls = 0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.completion_tokens = 0
        self.reasoning_tokens = 0
        self.usd = 0.0
        self.reserved_usd = 0.0
        self.reserved_tokens = 0
        self.open_reservations = 0

    def snapshot(self) -> SpendTotals:
        return SpendTotals(
            calls=self.calls,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            completion_tokens=self.completion_tokens,
            reasoning_tokens=self.reasoning_tokens,
            usd=self.usd,
            reserved_usd=self.reserved_usd,
            reserved_tokens=self.reserved_tokens,
        )


class SpendLedger:
    """Reservations and committed spend, checked against per-backbone and ``overall`` budgets."""

    def __init__(
        self, overall: Budget | None = None, per_backbone: Mapping[str, Budget] | None = None
    ) -> None:
        self._overall_budget = overall or Budget()
        self._budgets = dict(per_backbone or {})
        self._overall = _Account()
        self._accounts: dict[str, _Account] = {}
        self._open: dict[int, Reservation] = {}
        # Called whenever a reservation ends (commit or release): budget may have come free.
        self._listeners: list[Callable[[], None]] = []
        self._serials = itertools.count(1)

    def reserve(self, backbone: str, usd: float, tokens: int) -> Reservation:
        """Hold ``usd`` and ``tokens`` for one call (`BudgetExhausted` when a budget cannot take them)."""
        account = self._account(backbone)
        self._check(f"backbone {backbone!r}", self._budgets.get(backbone), account, usd, tokens)
        self._check("run", self._overall_budget, self._overall, usd, tokens)
        reservation = Reservation(serial=next(self._serials), backbone=backbone, usd=usd, tokens=tokens)
        self._open[reservation.serial] = reservation
        for held in (account, self._overall):
            held.reserved_usd += usd
            held.reserved_tokens += tokens
            held.open_reservations += 1
        return reservation

    def commit(self, reservation: Reservation, usd: float, usage: Usage) -> None:
        """Replace the reservation with what the call cost (recorded in full even if above it)."""
        self._drop(reservation)
        self._add(reservation.backbone, usd, usage)

    def record_prior_spend(self, backbone: str, usd: float, usage: Usage) -> None:
        """Count what an earlier session of the run spent (no check: it is spent), so budgets cover the whole run."""
        self._add(backbone, usd, usage, calls=0)

    def _add(self, backbone: str, usd: float, usage: Usage, *, calls: int = 1) -> None:
        for account in (self._account(backbone), self._overall):
            account.calls += calls
            account.prompt_tokens += usage.prompt_tokens
            account.cached_prompt_tokens += usage.cached_prompt_tokens
            account.completion_tokens += usage.completion_tokens
            account.reasoning_tokens += usage.reasoning_tokens
            account.usd += usd

    def release(self, reservation: Reservation) -> None:
        """Drop a reservation whose call was never billed. Releasing twice is harmless."""
        self._drop(reservation)

    def totals(self, backbone: str | None = None) -> SpendTotals:
        """Totals for one backbone, or for the whole run when ``backbone`` is None."""
        if backbone is None:
            return self._overall.snapshot()
        account = self._accounts.get(backbone)
        return account.snapshot() if account is not None else SpendTotals()

    def backbones(self) -> tuple[str, ...]:
        """Backbones that have reserved or spent anything, in first-use order."""
        return tuple(self._accounts)

    def _account(self, backbone: str) -> _Account:
        account = self._accounts.get(backbone)
        if account is None:
            account = self._accounts[backbone] = _Account()
        return account

    @property
    def open_reservations(self) -> int:
        """Reservations held by calls in flight (their worst case may be released when they settle)."""
        return len(self._open)

    def on_reservation_ended(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments, must not raise) each time a reservation is committed or released."""
        self._listeners.append(listener)

    def _drop(self, reservation: Reservation) -> None:
        if self._open.pop(reservation.serial, None) is None:
            return
        for listener in self._listeners:
            listener()
        for account in (self._account(reservation.backbone), self._overall):
            account.reserved_usd -= reservation.usd
            account.reserved_tokens -= reservation.tokens
            account.open_reservations -= 1
            if account.open_reservations == 0:
                # Adding and subtracting many floats drifts; nothing held must read as exactly zero.
                account.reserved_usd = 0.0

    @staticmethod
    def _check(scope: str, budget: Budget | None, account: _Account, usd: float, tokens: int) -> None:
        if budget is None:
            return
        if budget.max_usd is not None and account.usd + account.reserved_usd + usd > budget.max_usd:
            raise BudgetExhausted(
                f"{scope} USD budget would be exceeded: spent ${account.usd:.4f} + reserved "
                f"${account.reserved_usd:.4f} + this call ${usd:.4f} > ${budget.max_usd:.4f}"
            )
        spent_tokens = account.prompt_tokens + account.completion_tokens
        if (
            budget.max_tokens is not None
            and spent_tokens + account.reserved_tokens + tokens > budget.max_tokens
        ):
            raise BudgetExhausted(
                f"{scope} token budget would be exceeded: spent {spent_tokens} + reserved "
                f"{account.reserved_tokens} + this call {tokens} > {budget.max_tokens}"
            )
