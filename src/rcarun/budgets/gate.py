"""The one object the runner calls around every attempt on one backbone, so nothing else minds limits.

Admission, in this order: wait out a pause, take a concurrency slot, take rate, reserve the worst-case cost in
the shared ledger (docs/reliability.md, "The gate"). One gate per backbone, so a 429 on one never slows another.
Use: ``async with gate.admit(...) as ticket:`` around the call, then ``ticket.settle(usage)`` or ``on_error``.
"""

from __future__ import annotations

import asyncio
import math
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

from rcarun.backends.types import PromptSize, RateLimitInfo, Usage
from rcarun.errors import BudgetExhausted, CallError, ConfigError, RateLimited

from .concurrency import AdaptiveConcurrency, ConcurrencySlot
from .estimate import TokenEstimator
from .following import LimitFollower
from .learned_rate import RateChange
from .ledger import Reservation, SpendLedger
from .limits import MAX_BURST_S, Clock, Grant, RateLimiter
from .prices import PriceTable
from .retry import RetryDecision, RetryPolicy

__all__ = ["BackboneGate", "BackboneLimits", "GateStats", "Ticket"]


@dataclass(frozen=True, slots=True)
class BackboneLimits:
    """A backbone's declared limits (rpm, tpm: per minute, or None; burst_s: bucket size in seconds of quota).

    ``arrival_jitter_s`` shrinks the client's burst so that requests arriving closer than they left meet no 429;
    ``meters_output_budget``: the provider counts the whole ``max_tokens`` on arrival (OpenAI), never refunded;
    ``window_s``: the provider's counting window (None: a plain token bucket); ``learns_from_refusals``: False
    where refusals are about concurrency (DeepSeek). Details: docs/reliability.md ("The gate").
    """

    concurrency: int
    rpm: float | None = None
    tpm: float | None = None
    burst_s: float = 1.0
    min_concurrency: int = 1
    arrival_jitter_s: float = 0.05
    meters_output_budget: bool = False
    window_s: float | None = 60.0
    learns_from_refusals: bool = True

    @property
    def client_burst_s(self) -> float:
        """The burst the client's own buckets use: the declared one less the jitter allowance."""
        return max(self.burst_s - self.arrival_jitter_s, self.burst_s / 2)

    def __post_init__(self) -> None:
        if self.concurrency < 1 or not 1 <= self.min_concurrency <= self.concurrency:
            raise ConfigError(
                f"concurrency must be >= 1 and min_concurrency in [1, concurrency], got {self.concurrency} "
                f"and {self.min_concurrency}"
            )
        for label, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and not value > 0:
                raise ConfigError(f"{label} must be positive when set, got {value}")
        if not 0 < self.burst_s <= MAX_BURST_S:
            raise ConfigError(f"burst_s must be in (0, {MAX_BURST_S:g}] seconds, got {self.burst_s}")
        if self.arrival_jitter_s < 0:
            raise ConfigError(f"arrival_jitter_s must be >= 0, got {self.arrival_jitter_s}")
        if self.window_s is not None and not self.burst_s < self.window_s < math.inf:
            raise ConfigError(f"window_s must be longer than burst_s and finite, got {self.window_s}")


@dataclass(frozen=True, slots=True)
class GateStats:
    """What a progress bar shows for one backbone (``waiting``: queued for a slot or for rate)."""

    in_flight: int
    waiting: int
    admitted: int
    rate_limited: int
    concurrency_limit: int
    paused_for_s: float


class Ticket:
    """One admitted attempt. `settle` it with the reported usage on success; the gate cleans up otherwise."""

    __slots__ = (
        "_cost_usd",
        "_gate",
        "_grant",
        "_reservation",
        "_settled",
        "_slot_released",
        "estimated_prompt_tokens",
        "max_tokens",
        "prompt",
        "slot",
    )

    def __init__(
        self,
        gate: BackboneGate,
        slot: ConcurrencySlot,
        grant: Grant,
        reservation: Reservation,
        estimated_prompt_tokens: int,
        max_tokens: int,
        prompt: PromptSize | None,
    ) -> None:
        self._gate = gate
        self.slot = slot
        self._grant = grant
        self._reservation = reservation
        self.estimated_prompt_tokens = estimated_prompt_tokens
        self.max_tokens = max_tokens
        self.prompt = prompt
        self._settled = False
        self._slot_released = False
        self._cost_usd = 0.0

    @property
    def slot_released(self) -> bool:
        return self._slot_released

    def release_slot(self) -> None:
        """Hand the slot on before the block ends: the provider has answered, the next call may go out."""
        if not self._slot_released:
            self._slot_released = True
            self._gate.concurrency.release(self.slot)

    @property
    def cost_usd(self) -> float:
        """USD charged at settlement (0 before, or without a price table)."""
        return self._cost_usd

    @property
    def reserved_tokens(self) -> int:
        """Tokens taken from the rate limiter at admission."""
        return self._grant.tokens

    def settle(
        self, usage: Usage, *, at: datetime | None = None, reported: bool = True, completed: bool = True
    ) -> float:
        """Record what an exchange cost (``completed`` False: cut short) once, and return it in USD; only a
        ``reported`` usage calibrates the estimator (an estimate must not calibrate itself)."""
        if self._settled:
            raise RuntimeError("ticket already settled")
        self._settled = True
        gate = self._gate
        metered = (
            usage.prompt_tokens + max(self.max_tokens, usage.completion_tokens)
            if gate.meters_output_budget
            else usage.total_tokens
        )
        gate.limiter.settle(self._grant, metered)
        gate._follower.note_call_tokens(metered)
        if completed:
            gate._note_completion(usage.completion_tokens)
        gate._follower.accepted()
        if gate.prices is not None:
            self._cost_usd = gate.prices.cost_usd(usage, at if at is not None else datetime.now(UTC))
        gate.ledger.commit(self._reservation, self._cost_usd, usage)
        if completed:
            gate.concurrency.on_success()
            if reported:
                gate.estimator.calibrate_output(self.max_tokens, usage.completion_tokens)
                if self.prompt is not None:
                    gate.estimator.calibrate(self.prompt.utf8_bytes, usage.prompt_tokens)
            else:
                gate.estimator.note_unreported()
        return self._cost_usd

    def _abandon(self) -> None:
        """The attempt ended unsettled: free the budget, keep the tokens (the provider may count them)."""
        if not self._settled:
            self._gate.ledger.release(self._reservation)


class _Admission:
    """`BackboneGate.admit`'s block; a class, as every attempt enters one and a generator costs more."""

    __slots__ = ("_estimated_prompt_tokens", "_gate", "_max_tokens", "_prompt", "_slot", "_ticket")

    def __init__(
        self, gate: BackboneGate, estimated_prompt_tokens: int, max_tokens: int, prompt: PromptSize | None
    ) -> None:
        self._gate = gate
        self._estimated_prompt_tokens = estimated_prompt_tokens
        self._max_tokens = max_tokens
        self._prompt = prompt
        self._slot: ConcurrencySlot | None = None
        self._ticket: Ticket | None = None

    async def __aenter__(self) -> Ticket:
        gate = self._gate
        estimated_prompt_tokens = self._estimated_prompt_tokens
        max_tokens = self._max_tokens
        prompt = self._prompt
        await gate._wait_out_pause()
        slot = await gate.concurrency.acquire()
        try:
            grant = await gate.limiter.acquire(
                estimated_prompt_tokens + gate.expected_output_tokens(max_tokens)
            )
            try:
                reservation = await gate._reserve_when_budget_allows(
                    estimated_prompt_tokens, max_tokens, prompt
                )
            except BaseException:
                gate.limiter.give_back(grant)
                raise
            ticket = Ticket(gate, slot, grant, reservation, estimated_prompt_tokens, max_tokens, prompt)
        except BaseException:
            gate.concurrency.release(slot)
            raise
        gate._admitted += 1
        gate._in_flight += 1
        self._slot, self._ticket = slot, ticket
        return ticket

    async def __aexit__(self, *exc_info: object) -> None:
        gate, ticket, slot = self._gate, self._ticket, self._slot
        assert ticket is not None and slot is not None, "left an admission that was never entered"
        try:
            gate._in_flight -= 1
            ticket._abandon()
        finally:
            if not ticket.slot_released:
                gate.concurrency.release(slot)


class BackboneGate:
    """Admission, adaptation and accounting for one backbone; may be built outside a loop.

    ``prices`` None records zero cost; ``ledger`` None is a private one without budgets; ``clock`` None is the
    running loop's time.
    """

    def __init__(
        self,
        name: str,
        limits: BackboneLimits,
        *,
        prices: PriceTable | None = None,
        ledger: SpendLedger | None = None,
        retry: RetryPolicy | None = None,
        estimator: TokenEstimator | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self.prices = prices
        self.ledger = ledger if ledger is not None else SpendLedger()
        self.retry = retry if retry is not None else RetryPolicy()
        self.estimator = estimator if estimator is not None else TokenEstimator()
        self.concurrency = AdaptiveConcurrency(limits.concurrency, limits.min_concurrency)
        self.limiter = RateLimiter(
            limits.rpm,
            limits.tpm,
            limits.client_burst_s,
            clock,
            full_slack_s=2 * limits.arrival_jitter_s,
            window_s=limits.window_s,
        )
        self._follower = LimitFollower(
            self.limiter,
            rpm=limits.rpm,
            tpm=limits.tpm,
            window_s=limits.window_s,
            learns_from_refusals=limits.learns_from_refusals,
            now=self._now,
        )
        self.meters_output_budget = limits.meters_output_budget
        self._clock = clock
        self._paused_until = -math.inf
        self._pauses_started = 0
        # One shared future per pause, so that paused callers resume in arrival order.
        self._pause_over: asyncio.Future[None] | None = None
        self._pause_waiting = 0
        self._in_flight = 0
        self._admitted = 0
        self._rate_limited = 0
        # Smoothed completion tokens per settled call, for the output a call reserves (None before any).
        self._mean_completion_tokens: float | None = None
        # Set when any reservation of the shared ledger ends; created inside the loop on first need.
        self._budget_freed: asyncio.Event | None = None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    @property
    def paused_until(self) -> float:
        """Clock time before which the backbone admits nothing (-inf when never paused)."""
        return self._paused_until

    def stats(self) -> GateStats:
        """Counters for progress bars (outside the loop, with the default clock, ``paused_for_s`` reads 0)."""
        try:
            paused_for_s = max(0.0, self._paused_until - self._now())
        except RuntimeError:
            paused_for_s = 0.0
        return GateStats(
            in_flight=self._in_flight,
            waiting=self._pause_waiting + self.concurrency.waiting + self.limiter.waiting,
            admitted=self._admitted,
            rate_limited=self._rate_limited,
            concurrency_limit=self.concurrency.limit,
            paused_for_s=paused_for_s,
        )

    def admit(
        self, estimated_prompt_tokens: int, max_tokens: int, *, prompt: PromptSize | None = None
    ) -> AbstractAsyncContextManager[Ticket]:
        """Wait until this backbone may take one more attempt and hold its resources for the block
        (`BudgetExhausted` on entering when the ledger refuses; nothing is held then)."""
        return _Admission(self, estimated_prompt_tokens, max_tokens, prompt)

    def on_error(self, error: CallError, attempt: int, ticket: Ticket | None = None) -> RetryDecision:
        """Decide about a failed attempt (1-based) and apply its consequences to this backbone only (with
        ``ticket``, a burst of 429s cuts concurrency once)."""
        asked_s = None
        if isinstance(error, RateLimited):
            self._rate_limited += 1
            asked_s = self.learn_from_refusal(error)
        decision = self.retry.decide(error, attempt, asked_s=asked_s)
        if decision.stop_backbone:
            return decision
        if decision.pause_backbone_s > 0:
            self.pause_for(decision.pause_backbone_s)
        if decision.shrink_concurrency:
            self.concurrency.on_rate_limited(ticket.slot if ticket is not None else None)
        return decision

    def on_rate_limit_headers(self, info: RateLimitInfo | None) -> float:
        """Follow the limits an answer's headers state; return the pause (0: none; one `RetryPolicy.too_long`
        finds too long is not applied: the caller stops the backbone)."""
        if info is None:
            return 0.0
        pause = self._follower.headers_pause(info)
        if pause > 0 and not self.retry.too_long(pause):
            self.pause_for(pause)
        return pause

    def learn_from_refusal(self, error: RateLimited) -> float | None:
        """Follow what a rate-limit refusal says; return the pause it calls for (None: the policy's backoff)."""
        return self._follower.refusal_pause(error)

    def take_rate_changes(self) -> list[RateChange]:
        """The changes of the learned request rate since the last call, oldest first (for events and lines)."""
        return self._follower.take_rate_changes()

    @property
    def learned_limits(self) -> tuple[float | None, float | None]:
        """(requests, tokens) per minute the limiter paces to now, declared, stated or learned."""
        return self.limiter.requests_per_minute, self.limiter.tokens_per_minute

    def expected_output_tokens(self, max_tokens: int) -> int:
        """The output tokens a call takes from tokens/min at admission: the budget where the provider meters it
        on arrival or before the first report, else the smoothed mean output plus a quarter (docs/reliability.md)."""
        if self.meters_output_budget or self._mean_completion_tokens is None:
            return max_tokens
        return min(max_tokens, math.ceil(self._mean_completion_tokens * _OUTPUT_HEADROOM))

    def _note_completion(self, completion_tokens: int) -> None:
        mean = self._mean_completion_tokens
        self._mean_completion_tokens = (
            float(completion_tokens) if mean is None else 0.9 * mean + 0.1 * completion_tokens
        )

    def pause_for(self, seconds: float) -> bool:
        """Admit nothing on this backbone for ``seconds`` from now (pauses only ever extend, and never beyond
        the retry policy's ``max_pause_s``). Returns True when this starts a pause (none was running)."""
        now = self._now()
        until = now + min(seconds, self.retry.max_pause_s)
        started = self._paused_until <= now
        if until > self._paused_until:
            self._paused_until = until
            self.limiter.pause_until(until)
            if started:
                self._pauses_started += 1
            return started
        return False

    @property
    def pauses_started(self) -> int:
        """How many pauses began while none was running (a burst of 429s extending one pause counts once)."""
        return self._pauses_started

    async def _reserve_when_budget_allows(
        self, estimated_prompt_tokens: int, max_tokens: int, prompt: PromptSize | None
    ) -> Reservation:
        """Reserve the call's worst case; a refusal waits for calls in flight to settle (usually for much less)
        and is final (`BudgetExhausted`) only with nothing in flight."""
        while True:
            reserved_prompt = (
                max(estimated_prompt_tokens, self.estimator.reservation(prompt))
                if prompt is not None
                else estimated_prompt_tokens
            )
            try:
                return self._reserve(reserved_prompt, self.estimator.reserved_output(max_tokens))
            except BudgetExhausted:
                if self.ledger.open_reservations == 0:
                    if prompt is None or self.estimator.answered:
                        raise
                    # Nothing known of this backbone's bills yet: this call alone goes at the most a tokenizer
                    # bills, so that a budget smaller than the belief runs at all; its answer sets the rest.
                    return self._reserve(
                        max(estimated_prompt_tokens, self.estimator.unreported(prompt)), max_tokens
                    )
            if self._budget_freed is None:
                self._budget_freed = asyncio.Event()
                self.ledger.on_reservation_ended(self._budget_freed.set)
            self._budget_freed.clear()
            await self._budget_freed.wait()

    def _reserve(self, prompt_tokens: int, output_tokens: int) -> Reservation:
        usd = self.prices.worst_case_usd(prompt_tokens, output_tokens) if self.prices is not None else 0.0
        return self.ledger.reserve(self.name, usd, prompt_tokens + output_tokens)

    async def _wait_out_pause(self) -> None:
        while (remaining := self._paused_until - self._now()) > 0:
            if self._pause_over is None or self._pause_over.done():
                loop = asyncio.get_running_loop()
                self._pause_over = loop.create_future()
                loop.call_at(loop.time() + remaining, _resolve, self._pause_over)
            self._pause_waiting += 1
            try:
                # Shielded: one caller's cancellation must not cancel the future everyone else waits on.
                await asyncio.shield(self._pause_over)
            finally:
                self._pause_waiting -= 1


_OUTPUT_HEADROOM = 1.25


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
