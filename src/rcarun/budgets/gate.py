"""The one object the runner calls around every attempt on one backbone, so nothing else minds limits.

A gate composes, in this order: wait out a pause (after a 429), take an adaptive concurrency slot, take one
request and the estimated tokens from the rate limiter, reserve the worst-case cost in the spend ledger. The
order matters: a paused backbone holds no slots; a call holds its slot while it waits for rate so that the
concurrency limit bounds what is queued at the provider; the ledger is asked last, just before sending, so
that waiting calls hold no budget. Each backbone has its own gate, so a 429 on one never slows another; the
ledger is shared, so run-wide budgets hold across backbones.

Typical use by the runner::

    prompt = request.prompt_size()
    estimated = gate.estimator.estimate(prompt.utf8_bytes)
    async with gate.admit(estimated, request.max_tokens, prompt=prompt) as ticket:
        try:
            result = await backend.chat(request)
        except CallError as error:
            decision = gate.on_error(error, attempt, ticket)
            ...  # store the attempt; if decision.retry, sleep decision.delay_s outside this block
        else:
            ticket.settle(result.usage)
"""

from __future__ import annotations

import asyncio
import math
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

from rcarun.backends.types import PromptSize, RateLimitInfo, Usage
from rcarun.errors import BudgetExhausted, CallError, ConfigError, RateLimited, ReportedLimits

from .concurrency import AdaptiveConcurrency, ConcurrencySlot
from .estimate import TokenEstimator
from .learned_rate import LearnedRate, RateChange
from .ledger import Reservation, SpendLedger
from .limits import MAX_BURST_S, Clock, Grant, RateLimiter
from .prices import PriceTable
from .retry import RetryDecision, RetryPolicy

__all__ = ["BackboneGate", "BackboneLimits", "GateStats", "Ticket"]


@dataclass(frozen=True, slots=True)
class BackboneLimits:
    """A backbone's declared limits.

    Attributes:
        concurrency: ceiling on calls in flight (the adaptive limit starts here and never exceeds it).
        rpm: requests per minute, or None.
        tpm: tokens per minute (prompt + output budget, reconciled to reported usage), or None.
        burst_s: bucket capacity in seconds of quota.
        min_concurrency: the adaptive limit never drops below this.
        arrival_jitter_s: how much the gaps between requests may shrink on the way to the provider. The
            client's buckets are this much smaller than the declared burst, so the provider's bucket keeps that
            much slack: two requests admitted back to back, exactly at the limit, that arrive closer together
            than they left do not meet a 429. Only the burst shrinks; the steady rate stays the declared one. A
            request larger than the whole burst also waits until the client's bucket has been full for twice
            this long, by which time the provider's (larger) bucket is full as well.
        meters_output_budget: the provider counts a request's whole ``max_tokens`` against tokens/min when it
            arrives, used or not (OpenAI: "the maximum of max_tokens and the estimated tokens"). Settling then
            corrects only the prompt estimate and never refunds unused output, which the provider's meter
            would not refund either.
        window_s: the window over which the provider counts its per-minute limits (a strict sliding minute:
            60). The limiter keeps every window this long within the limit (`rcarun.budgets.limits`), and the
            learned rate counts answers over it (`rcarun.budgets.learned_rate`). None: pace as a plain token
            bucket, and count answers over a minute.
        learns_from_refusals: a refusal that states no limit may teach a request rate
            (`rcarun.budgets.learned_rate`); False where refusals are about concurrency (DeepSeek).
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
    """What a progress bar shows for one backbone.

    Attributes:
        in_flight: admitted attempts not yet finished.
        waiting: callers queued for a concurrency slot or for rate.
        admitted: attempts admitted so far.
        rate_limited: 429s (or provider equivalents) reported through `BackboneGate.on_error`.
        concurrency_limit: the adaptive limit now.
        paused_for_s: seconds until the current pause ends (0 when not paused).
    """

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
        """Hand the concurrency slot on now, before the block ends: the provider has answered, and the next
        waiting call can go out while this one is settled and recorded. The block's end releases it otherwise."""
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
        """Record what an exchange cost and return it in USD: an answer (a length stop included), or, with
        ``completed`` False, a generation cut short, charged an estimate (the provider may have billed it).

        Reconciles the rate limiter with the tokens, commits the cost to the ledger, and for an answer counts a
        clean completion for the concurrency limit and calibrates the gate's estimator when the prompt's
        size is known and ``usage`` is the provider's (``reported``; an estimate must not calibrate
        itself).

        Raises:
            RuntimeError: the ticket was already settled.
        """
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
        gate._note_call_tokens(metered)
        if completed:
            gate._note_completion(usage.completion_tokens)
        gate._note_accepted()
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
    """`BackboneGate.admit`'s block: a class rather than a generator-based context manager, since every attempt
    enters one (`contextlib.asynccontextmanager` costs a generator and several calls more per attempt)."""

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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        gate, ticket, slot = self._gate, self._ticket, self._slot
        assert ticket is not None and slot is not None, "left an admission that was never entered"
        try:
            gate._in_flight -= 1
            ticket._abandon()
        finally:
            if not ticket.slot_released:
                gate.concurrency.release(slot)


class BackboneGate:
    """Admission, adaptation and accounting for one backbone.

    asyncio objects are created lazily by the parts, inside the running loop, so a gate may be built anywhere.

    Args:
        name: the backbone's name, as used in the ledger and in results.db.
        limits: its declared limits.
        prices: its price table; None records zero cost and reserves no USD.
        ledger: the run's shared ledger; a private one without budgets when None.
        retry: the retry policy; the defaults when None.
        estimator: prompt-token estimator (which `Ticket.settle` calibrates); a fresh 4-bytes-per-token one when None.
        clock: monotonic seconds; the running loop's time when None.
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
        # The request rate learned from refusals that state no limit, and the lowest one the provider stated:
        # the limiter paces requests at the lowest of these and the declared rpm.
        self._learned = LearnedRate(limits.window_s or 60.0)
        self._stated_rpm: float | None = None
        # Changes of the learned rate not yet taken by the runner (`take_rate_changes`).
        self._rate_changes: list[RateChange] = []
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
        # Smoothed tokens per settled call, for pausing on a spent token quota nobody declared.
        self._mean_call_tokens = 0.0
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
        """Wait until this backbone may take one more attempt, and hold its resources for the block.

        Raises:
            BudgetExhausted: on entering the block, the ledger refused the worst-case reservation; nothing is
                held.
        """
        return _Admission(self, estimated_prompt_tokens, max_tokens, prompt)

    def on_error(self, error: CallError, attempt: int, ticket: Ticket | None = None) -> RetryDecision:
        """Decide about a failed attempt and apply its consequences to this backbone only.

        A rate-limit refusal also sets the limits this backbone is paced by (`learn_from_refusal`), and asks
        the retry policy for the pause the refusal itself calls for.

        Args:
            error: what the backend raised.
            attempt: 1-based number of the attempt that failed.
            ticket: the attempt's ticket; with it, a burst of 429s from one overload cuts concurrency once.
        """
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
        """Follow the provider's own account of its limits, from the headers of an answer.

        A limit the provider states is paced by the limiter from then on: below a declared one, the provider
        is right (never up: a declaration below the provider's limit is deliberate); where nothing was
        declared, it becomes the limit (`_adopt_stated`). When the answer reports the requests (or tokens)
        remaining at zero on a limit the limiter does not pace (none stated), nothing more is admitted until
        the provider's window holds one more request (`_one_more_s`). Returns the pause in seconds (0 for
        none). A pause the retry policy finds too long (`RetryPolicy.too_long`) is not applied: the caller is
        to stop the backbone instead.
        """
        if info is None:
            return 0.0
        self._adopt_stated(info)
        pause = 0.0
        if (
            self.limiter.requests_per_minute is None
            and info.remaining_requests is not None
            and info.remaining_requests <= 0
        ):
            pause = max(pause, self._one_more_s(1.0, info.limit_requests, info.reset_requests_s))
        if (
            self.limiter.tokens_per_minute is None
            and info.remaining_tokens is not None
            and info.remaining_tokens <= 0
        ):
            pause = max(
                pause, self._one_more_s(self._mean_call_tokens, info.limit_tokens, info.reset_tokens_s)
            )
        if pause > 0 and not self.retry.too_long(pause):
            self.pause_for(pause)
        return pause

    def learn_from_refusal(self, error: RateLimited) -> float | None:
        """Follow what a rate-limit refusal says; return the pause it calls for.

        Which limit refused: the one the headers report exhausted (``remaining`` at zero); when they say
        nothing, tokens if only tokens are declared, else requests. A limit the headers state is adopted
        (`_adopt_stated`); a refusal that states nothing (no Retry-After, no limit headers) may teach a request
        rate (`rcarun.budgets.learned_rate`). A refusal never raises a limit.

        The pause: ``Retry-After`` when the provider sends it. Else, from the headers, the time until the
        provider's window holds one more unit of each exhausted limit (`_one_more_s`): a reset within
        ``window_s`` is OpenAI's "back to the initial state", the time until everything counted has left the
        window, an upper bound and no pause to wait out whole (issue 17); a reset beyond it belongs to a
        longer limit (per hour or day) and is waited out whole, or the backbone stopped when it is more than
        the retry policy waits. None when the refusal says nothing (a bare 429, an overload 503): the policy's
        backoff.
        """
        info = error.rate_limit
        requests_out = (
            info is not None and info.remaining_requests is not None and info.remaining_requests <= 0
        )
        tokens_out = info is not None and info.remaining_tokens is not None and info.remaining_tokens <= 0
        if not (requests_out or tokens_out):
            if self.limits.tpm is not None and self.limits.rpm is None:
                tokens_out = True
            else:
                requests_out = True
        if info is not None:
            self._adopt_stated(info)
        # The headers are None when the refusal carries none of them (`parse_rate_limit_headers`).
        bare = error.retry_after_s is None and info is None
        change = self._learned.refused(
            self._now(), states_limit=not (bare and self.limits.learns_from_refusals)
        )
        if change is not None:
            self._follow(change)
        # The provider's window is full now: what the buckets still hold was refused, not available.
        self.limiter.drain(requests=requests_out, tokens=tokens_out)

        if error.retry_after_s is not None:
            return error.retry_after_s
        if info is None:
            return None
        pauses = []
        if requests_out and info.reset_requests_s is not None:
            pauses.append(self._one_more_s(1.0, self.limiter.requests_per_minute, info.reset_requests_s))
        if tokens_out and info.reset_tokens_s is not None:
            pauses.append(
                self._one_more_s(self._mean_call_tokens, self.limiter.tokens_per_minute, info.reset_tokens_s)
            )
        return max(pauses) if pauses else None

    @property
    def learned_limits(self) -> tuple[float | None, float | None]:
        """(requests, tokens) per minute the limiter paces to now, declared, stated or learned."""
        return self.limiter.requests_per_minute, self.limiter.tokens_per_minute

    def take_rate_changes(self) -> list[RateChange]:
        """The changes of the learned request rate since the last call, oldest first (for events and lines)."""
        changes, self._rate_changes = self._rate_changes, []
        return changes

    def _note_accepted(self) -> None:
        change = self._learned.accepted(self._now())
        if change is not None:
            self._follow(change)

    def _follow(self, change: RateChange) -> None:
        """Pace requests at the lowest of the declared, the stated and the learned rate, and keep the change."""
        self._rate_changes.append(change)
        rates = [
            rate for rate in (self.limits.rpm, self._stated_rpm, self._learned.held_rpm) if rate is not None
        ]
        rpm = min(rates) if rates else None
        if rpm == self.limiter.requests_per_minute:
            return
        if rpm is None:
            self.limiter.drop_request_limit()
        else:
            self.limiter.set_limits(
                rpm, None, sent={"requests": self._learned.accepted_in_window(self._now())}
            )

    def _adopt_stated(self, info: ReportedLimits) -> None:
        """A limit the provider states: lowers a declared one, or becomes the limit where none was declared."""
        requests = (
            info.limit_requests if info.limit_requests is not None and info.limit_requests > 0 else None
        )
        tokens = info.limit_tokens if info.limit_tokens is not None and info.limit_tokens > 0 else None
        if requests is not None:
            self._stated_rpm = requests if self._stated_rpm is None else min(self._stated_rpm, requests)
        if requests is not None or tokens is not None:
            # A request limit set where none was paced starts its window log with what the provider accepted.
            unpaced = requests is not None and self.limiter.requests_per_minute is None
            sent = {"requests": self._learned.accepted_in_window(self._now())} if unpaced else None
            self.limiter.lower_limits(requests, tokens, set_unpaced=True, sent=sent)

    def _one_more_s(self, amount: float, limit_per_minute: float | None, reset_s: float | None) -> float:
        """Seconds until a provider's window holds ``amount`` more at ``limit_per_minute``.

        A stated reset within the window is an upper bound (the time until the whole window is free); beyond
        it, the reset of a longer limit, which is the time to wait.
        """
        window = self.limits.window_s or 60.0
        if reset_s is not None and reset_s > window:
            return reset_s
        if limit_per_minute is None or limit_per_minute <= 0:
            return reset_s or 0.0
        refill = amount * 60.0 / limit_per_minute
        return min(refill, reset_s) if reset_s else refill

    def expected_output_tokens(self, max_tokens: int) -> int:
        """The output tokens a call takes from tokens/min at admission.

        Where the provider meters the whole budget at arrival, the budget. Otherwise what this backbone's calls
        have produced (their smoothed mean, with a quarter more as headroom), never more than the budget; the
        whole budget until the first report. Settling charges a call that produced more as debt, which later
        admissions wait out, so the admitted stream still keeps the limit; reserving every call's whole budget
        instead would hold a thinking model's 8,000-token budget for a 500-token answer and leave a token limit
        mostly unused (issue 17's tokens scenario: 0.40 of the limit, no refusal).
        """
        if self.meters_output_budget or self._mean_completion_tokens is None:
            return max_tokens
        return min(max_tokens, math.ceil(self._mean_completion_tokens * _OUTPUT_HEADROOM))

    def _note_completion(self, completion_tokens: int) -> None:
        mean = self._mean_completion_tokens
        self._mean_completion_tokens = (
            float(completion_tokens) if mean is None else 0.9 * mean + 0.1 * completion_tokens
        )

    def _note_call_tokens(self, tokens: int) -> None:
        self._mean_call_tokens = (
            float(tokens) if self._mean_call_tokens == 0 else 0.9 * self._mean_call_tokens + 0.1 * tokens
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
        """Reserve the call's worst case; while calls in flight hold reservations, wait for them to settle.

        Reservations are worst cases (the whole output budget); a call usually settles for much less, so a
        refusal while others are in flight may be temporary. Only a refusal with nothing in flight is final.
        Prompt and output are reserved for what the call may cost, not what it will likely cost
        (`TokenEstimator.reservation` and `reserved_output`: before the backbone's first report, the most a bill
        is believed to be), asked again after each wait: the reports that came in meanwhile may have brought it
        down.

        Raises:
            BudgetExhausted: the budget cannot take this call even with every reservation settled (nor, before the
                backbone's first answer, at one token per UTF-8 byte).
        """
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
                    # Nothing in flight, nothing known of this backbone's bills, and the most one is believed to
                    # be does not fit: this call alone goes at the most a tokenizer bills (a token per UTF-8 byte,
                    # the output budget), so that a budget smaller than that belief runs at all; its answer then
                    # sets what the calls after it reserve.
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
