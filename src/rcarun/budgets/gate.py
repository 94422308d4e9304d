"""The one object the runner calls around every attempt on one backbone, so nothing else minds limits.

A gate composes, in this order: wait out a pause (after a 429), take an adaptive concurrency slot, take one
request and the estimated tokens from the rate limiter, reserve the worst-case cost in the spend ledger. The
order matters: a paused backbone holds no slots; a call holds its slot while it waits for rate so that the
concurrency limit bounds what is queued at the provider; the ledger is asked last, just before sending, so
that waiting calls hold no budget. Each backbone has its own gate, so a 429 on one never slows another; the
ledger is shared, so run-wide budgets hold across backbones.

Typical use by the runner::

    async with gate.admit_request(request) as ticket:
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
from collections import deque
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

from rcarun.backends.types import ChatRequest, PromptSize, RateLimitInfo, Usage
from rcarun.errors import BudgetExhausted, CallError, ConfigError, RateLimited, ReportedLimits

from .concurrency import AdaptiveConcurrency, ConcurrencySlot
from .estimate import TokenEstimator
from .ledger import Reservation, SpendLedger
from .limits import MAX_BURST_S, Clock, Grant, RateLimiter
from .prices import PriceTable
from .refusals import RefusalCounting
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
            60). The limiter keeps every window this long within the limit (`rcarun.budgets.limits`), and a
            limit learned after a refusal is what the provider accepted in the last window this long. None:
            pace as a plain token bucket.
        learns_from_refusals: a refusal that states no limit may set one from what was accepted in the last
            window (`BackboneGate.learn_from_refusal`); False where refusals are about concurrency (DeepSeek).
        meters_finer_than_window: the provider also enforces its per-minute limits over shorter spans (OpenAI:
            "60,000 requests/minute may be enforced as 1,000 requests/second"). Then a limit lowered below the
            declared one (stated or learned) paces the buckets at limit / 60. Otherwise it caps only the window,
            and the buckets keep the declared pace, so what leaves the provider's window is sent again as fast
            as it leaves (`RateLimiter`, ``window_catch_up``). A refusal while the window holds well under the
            limit shows the finer metering, and the gate turns it on.
        counts_refused_requests: the provider counts the requests it refuses against its window (OpenAI:
            "unsuccessful requests contribute to your per-minute limit"), so the limiter keeps them in its window
            log; False: it counts only what it accepts, so they leave the log. None: asked once, with one
            request, after the first refusals (`rcarun.budgets.refusals`).
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
    meters_finer_than_window: bool = False
    counts_refused_requests: bool | None = None

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
    def settled(self) -> bool:
        return self._settled

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
        if gate._refusals.deciding:
            gate._refusals.settled(self._grant, gate._now(), gate._round_trip_s)
        if gate._probe_to:
            gate._probe_answered(self._grant, accepted=True)
        gate._note_call_tokens(metered)
        if completed:
            gate._note_completion(usage.completion_tokens)
        gate._note_accepted(
            self._grant.admitted_at,
            usage.total_tokens,
            usage.prompt_tokens + max(self.max_tokens, usage.completion_tokens),
        )
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
            self._gate._never_sent(self._grant)


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
            if gate._refusals.watching:
                gate._refusals.admitted(grant, gate._now())
            try:
                reservation = await gate._reserve_when_budget_allows(
                    estimated_prompt_tokens, max_tokens, prompt
                )
            except BaseException:
                gate.limiter.give_back(grant)
                gate._never_sent(grant)
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
        estimator: prompt-token estimator for `admit_request`; a fresh 4-bytes-per-token one when None.
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
            window_catch_up=not limits.meters_finer_than_window,
        )
        # What the provider accepted in the last window, summed per slot of window / _ACCEPTED_SLOTS seconds:
        # [slot, calls, tokens used, tokens with the whole output budget], oldest first, with the three sums,
        # so the count follows whichever way tokens are metered. Per slot, not per call: a fast backbone
        # settles thousands of calls a window, and this holds at most _ACCEPTED_SLOTS + 1 entries.
        self._accepted: deque[list[int]] = deque()
        self._accepted_calls = 0
        self._accepted_used = 0
        self._accepted_budgeted = 0
        # Limits learned from a refusal by counting what was accepted (not stated by the provider): these are
        # probed upward now and then, since the count is only a lower bound of what the provider allows.
        self._probing: set[str] = set()
        # The limit each kind was probed up from, until the next refusal tells whether it was the provider's.
        self._probed_from: dict[str, float] = {}
        # The limit each kind's probe climbs to, one accepted request at a time (`_probe_answered`).
        self._probe_to: dict[str, float] = {}
        # Kinds whose limit now is one the provider stated or one counted over a whole window: a window that
        # holds well under it when the provider refuses shows metering finer than the window.
        self._window_limits: set[str] = set()
        self._last_refusal_at = -math.inf
        # Whether the provider counts refused requests in its window, and the limiter's log kept to match.
        self._refusals = RefusalCounting(
            self.limiter, limits.window_s or 60.0, counted=limits.counts_refused_requests
        )
        # When the last refusal came (`_last_refusal_at` also moves at each probe step, for its own pacing).
        self._last_refused_at = -math.inf
        # Smoothed seconds from admission to an accepted answer (None before the first).
        self._round_trip_s: float | None = None
        # When a limit the limiter paces by last changed (learned, stated, probed).
        self._limits_changed_at = -math.inf
        # When the refusals since the last accepted call began (None: the last call answered was accepted).
        self._refusing_since: float | None = None
        self._first_accepted_at: float | None = None
        # Starts as declared (or as the preset says); a token refusal can show the provider meters more.
        self.meters_output_budget = limits.meters_output_budget
        self._counted_at = -math.inf
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

    def admit_request(self, request: ChatRequest) -> AbstractAsyncContextManager[Ticket]:
        """`admit` with the prompt estimated by the gate's estimator (which `Ticket.settle` calibrates)."""
        prompt = request.prompt_size()
        return self.admit(self.estimator.estimate(prompt.utf8_bytes), request.max_tokens, prompt=prompt)

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
            asked_s = self.learn_from_refusal(error, grant=ticket._grant if ticket is not None else None)
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
        if self.limiter.catches_up and self._provider_counts_more(info):
            self.limiter.pace_at_limits()
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

    def learn_from_refusal(
        self, error: RateLimited, *, sent_at: float | None = None, grant: Grant | None = None
    ) -> float | None:
        """Set this backbone's limits from a rate-limit refusal; return the pause the refusal calls for.

        Which limit refused: the one the headers report exhausted (``remaining`` at zero); when they say
        nothing, tokens if only tokens are declared, else requests. Its limit: the one the provider states in
        the headers; else what the provider accepted from this backbone in the last ``window_s`` (requests, or
        metered tokens), scaled to a minute when this backbone has been sending for less than that — a lower
        bound of the real limit, probed upward by up to 5 % after every refusal-free window (`_note_accepted`),
        one accepted request over it at a time (`_probe_answered`), never above a declared limit; a refusal
        while a probe is out sets the limit back to the one the probe started from. A refusal lowers a limit,
        or sets one nothing declared; it never raises one.

        The pause: ``Retry-After`` when the provider sends it. Else, from the headers, the time until the
        provider's window holds one more unit of each exhausted limit (`_one_more_s`): a reset within
        ``window_s`` is OpenAI's "back to the initial state", the time until everything counted has left the
        window, an upper bound and no pause to wait out whole (issue 17); a reset beyond it belongs to a
        longer limit (per hour or day) and is waited out whole, or the backbone stopped when it is more than
        the retry policy waits. None when the refusal says nothing (a bare 429, an overload 503): the policy's
        backoff, with the limit just learned pacing what follows.

        ``grant``, the refused request's admission (its time is ``sent_at``), keeps the window log as the
        provider counts refusals (`rcarun.budgets.refusals`).
        """
        now = self._now()
        if grant is not None:
            sent_at = grant.admitted_at
        # A request sent a while into a run of refusals with nothing accepted since its first may show the
        # provider's window still full (`_accepted_per_minute`).
        if self._refusing_since is None:
            self._refusing_since = now
        quiet_s = sent_at - self._refusing_since if sent_at is not None else None
        self._last_refusal_at = now
        self._drop_old_accepted(now)
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
        of_trial = False
        if grant is not None:
            explained = bool(self._probed_from) or grant.admitted_at <= max(
                self._last_refused_at, self._limits_changed_at
            )
            of_trial = self._refusals.refused(
                grant, now, requests=requests_out, tokens=tokens_out, explained=explained
            )
        self._last_refused_at = now
        if (
            not of_trial
            and self.limiter.catches_up
            and self._refused_under_window_limit(requests_out, tokens_out)
        ):
            self.limiter.pace_at_limits()
        if info is not None:
            self._adopt_stated(info)
            if tokens_out and info.limit_tokens is not None:
                self._check_token_metering(info.limit_tokens, now)
        counted_rpm = counted_tpm = None
        if not of_trial and self._may_count(now):
            wait = error.retry_after_s
            if requests_out and (info is None or info.limit_requests is None):
                counted_rpm = self._accepted_per_minute(
                    float(self._accepted_calls), now, 1.0, wait, quiet_s=quiet_s
                )
            if tokens_out and (info is None or info.limit_tokens is None):
                counted_tpm = self._accepted_per_minute(
                    float(self._accepted_tokens), now, self._mean_call_tokens, wait, quiet_s=quiet_s
                )
        # A refusal while a probe climbs above a counted limit: the limit it started from, which held a whole
        # window, is the provider's (a strict window), unless the window now holds well under it: then the
        # provider changed, and the count is news. (What the probe climbed to is not: a request over the old
        # limit may be accepted because the provider's window freed one just before it arrived. And the count
        # alone reads low by the calls accepted but not answered yet.) Probing again would only draw a refusal
        # every window.
        found: set[str] = set()
        counts = {"requests": counted_rpm, "tokens": counted_tpm}
        for kind in self._probe_to:
            self.limiter.allow_one_beyond(kind, 0.0)
        self._probe_to.clear()
        for kind, count in counts.items():
            probed_from = self._probed_from.pop(kind, None)
            if probed_from is not None and (count is None or count >= _PROBE_HELD * probed_from):
                counts[kind] = probed_from
                found.add(kind)
        counted_rpm, counted_tpm = counts["requests"], counts["tokens"]
        lowered = self._lower_to(counted_rpm, counted_tpm, probe=True)
        self._probing -= found
        if found:
            self._counted_at = now  # the count for this window is taken: the rest of the burst is not news
        window = self.limits.window_s or 60.0
        if lowered and self._first_accepted_at is not None and now - self._first_accepted_at >= window:
            # A count over a whole window; in the first window each refusal may lower the estimate again, as
            # the time the count covers grows (module docstring of `_accepted_per_minute`).
            self._counted_at = now
            self._window_limits |= {
                kind
                for kind, count in (("requests", counted_rpm), ("tokens", counted_tpm))
                if count is not None
            }
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

    def _check_token_metering(self, stated_tpm: int, now: float) -> None:
        """A token refusal while the provider's stated limit is well above what this backbone counted as
        accepted in the window: the provider meters more than the usage it reports. The known cause is a
        provider that charges the whole output budget at arrival (OpenAI: "the maximum of max_tokens and the
        estimated tokens") while the backbone refunds what was not used: stop refunding. When it already does
        not, pace by the count in this backbone's own units (the provider's ratio, learned)."""
        accepted = self._accepted_per_minute(float(self._accepted_tokens), now, self._mean_call_tokens, None)
        if accepted is None or accepted >= _METERING_AGREES * stated_tpm:
            return
        if not self.meters_output_budget:
            self.meters_output_budget = True
        elif self._lower_to(None, accepted, probe=True):
            self._counted_at = now

    def _provider_counts_more(self, info: RateLimitInfo) -> bool:
        """The provider's window holds (limit - remaining) well beyond what this backbone sent in it: others
        share the quota, or the provider meters more than this backbone counts. Catching up on the window then
        relies on a log that misses part of the provider's count, so the limiter paces at the limits instead."""
        checks = (
            ("requests", info.limit_requests, info.remaining_requests, 1.0),
            ("tokens", info.limit_tokens, info.remaining_tokens, self._mean_call_tokens),
        )
        for kind, limit, remaining, per_call in checks:
            if limit is None or remaining is None:
                continue
            sent = self.limiter.counted_in_window(kind)
            held = limit - remaining
            if sent is not None and sent + self._in_flight * per_call < _METERING_AGREES * held:
                return True
        return False

    def _refused_under_window_limit(self, requests_out: bool, tokens_out: bool) -> bool:
        """A refusal on a limit paced below the declared one (stated or learned), while what the provider can
        have counted in the window (accepted, plus everything in flight) is well under it: the provider meters a
        shorter span than the window, and catching up on the window is what it refused. Only for a limit the
        provider stated or one counted over a whole window (``_window_limits``): one scaled up from the first
        window's count may be above what the provider's window holds, whatever its metering."""
        window = self.limits.window_s or 60.0
        checks = (
            (
                "requests",
                requests_out,
                self.limiter.requests_per_minute,
                self.limits.rpm,
                1.0,
                self._accepted_calls,
            ),
            (
                "tokens",
                tokens_out,
                self.limiter.tokens_per_minute,
                self.limits.tpm,
                self._mean_call_tokens,
                self._accepted_tokens,
            ),
        )
        for kind, out, limit, declared, per_call, accepted in checks:
            if not out or kind not in self._window_limits or limit is None:
                continue
            if declared is not None and limit >= declared:
                continue
            counted = accepted + self._in_flight * per_call
            if counted < _METERING_AGREES * limit * window / 60.0:
                return True
        return False

    @property
    def learned_limits(self) -> tuple[float | None, float | None]:
        """(requests, tokens) per minute the limiter paces to now, declared, stated or learned."""
        return self.limiter.requests_per_minute, self.limiter.tokens_per_minute

    def _adopt_stated(self, info: ReportedLimits) -> None:
        """A limit the provider states: lowers a declared one, or becomes the limit where none was declared."""
        requests = (
            info.limit_requests if info.limit_requests is not None and info.limit_requests > 0 else None
        )
        tokens = info.limit_tokens if info.limit_tokens is not None and info.limit_tokens > 0 else None
        if requests is not None:
            self._probing.discard("requests")
            self._window_limits.add("requests")
        if tokens is not None:
            self._probing.discard("tokens")
            self._window_limits.add("tokens")
        self._lower_to(requests, tokens, probe=False)

    def _lower_to(self, rpm: float | None, tpm: float | None, *, probe: bool) -> bool:
        """Pace to these limits where they are lower than today's (or where nothing is paced); True if any was."""
        lowered = self.limiter.lower_limits(rpm, tpm, set_unpaced=True, sent=self._sent_in_window())
        if lowered:
            self._limits_changed_at = self._now()
        if probe:
            self._probing |= lowered
        return bool(lowered)

    def _may_count(self, now: float) -> bool:
        """Whether a refusal may set a limit from counts now: where refusals mean a per-minute limit, and once
        per window, so that the count after one lowering is taken at the new pace over a whole window (refusals
        that are not about the rate — a burst, an overload — would otherwise lower it again and again)."""
        window = self.limits.window_s or 60.0
        return self.limits.learns_from_refusals and now - self._counted_at >= window

    def _accepted_per_minute(
        self,
        amount: float,
        now: float,
        unit: float,
        retry_after_s: float | None,
        *,
        quiet_s: float | None = None,
    ) -> float | None:
        """``amount`` accepted in the last window, as a per-minute limit; None when nothing was accepted.

        In a backbone's first window the count covers only the time since its first acceptance. A provider
        that counts a strict window refused because that count is its limit; one that meters a token bucket
        allows that count scaled to a minute. The refusal's ``Retry-After`` tells them apart: a bucket asks
        for about one unit's refill at the scaled rate, a window for the time until its oldest arrival leaves.
        Without one, the count is scaled (the higher reading), unless the request refused now was sent
        ``quiet_s`` into a run of refusals with nothing accepted since it began, long enough for a bucket at
        the scaled rate to refill two units and for a provider metering per second to start a new second: a
        bucket would have accepted it, a full window does not.
        """
        if amount <= 0 or self._first_accepted_at is None:
            return None
        window = self.limits.window_s or 60.0
        # The provider's window has seen this backbone only since its first acceptance; a pause since then
        # does not shorten what the window holds.
        span = min(max(now - self._first_accepted_at, self.limits.burst_s), window)
        scaled = amount * 60.0 / span
        refill_s = max(unit, 1.0) * 60.0 / scaled
        if quiet_s is not None and quiet_s >= 2 * refill_s + _METERED_SECOND_S:
            return amount * 60.0 / window
        if retry_after_s is not None:
            # A short wait is a bucket near this rate, or a refusal that is not about the rate at all (the
            # provider says when to come back; nothing to learn). A long one is a full window: its count.
            return amount * 60.0 / window if retry_after_s > 2 * refill_s else None
        return scaled

    @property
    def _accepted_tokens(self) -> int:
        """Tokens accepted in the last window, metered as this backbone meters them now."""
        return self._accepted_budgeted if self.meters_output_budget else self._accepted_used

    def _note_accepted(self, admitted_at: float, used_tokens: int, budgeted_tokens: int) -> None:
        """Remember an accepted call for `learn_from_refusal`, and probe learned limits after a quiet window."""
        now = self._now()
        if self._first_accepted_at is None:
            self._first_accepted_at = admitted_at
        window = self.limits.window_s or 60.0
        slot = math.floor(admitted_at * _ACCEPTED_SLOTS / window)
        accepted = self._accepted
        if accepted and accepted[-1][0] >= slot:
            # Calls settle out of admission order: a late settler counts in the newest slot, so the log stays
            # in slot order (it then leaves the window up to the call's own latency late).
            newest = accepted[-1]
            newest[1] += 1
            newest[2] += used_tokens
            newest[3] += budgeted_tokens
        else:
            accepted.append([slot, 1, used_tokens, budgeted_tokens])
        self._accepted_calls += 1
        self._refusing_since = None
        round_trip = now - admitted_at
        previous = self._round_trip_s
        self._round_trip_s = round_trip if previous is None else previous + 0.1 * (round_trip - previous)
        self._accepted_used += used_tokens
        self._accepted_budgeted += budgeted_tokens
        self._drop_old_accepted(now)
        if self._probing and now - self._last_refusal_at >= window:
            self._last_refusal_at = now  # one probe step per refusal-free window
            rpm, tpm = self.limiter.requests_per_minute, self.limiter.tokens_per_minute
            raised_rpm = _probe(rpm, self.limits.rpm) if "requests" in self._probing else None
            raised_tpm = _probe(tpm, self.limits.tpm) if "tokens" in self._probing else None
            if raised_rpm is None or (self.limits.rpm is not None and raised_rpm >= self.limits.rpm):
                self._probing.discard("requests")
            if raised_tpm is None or (self.limits.tpm is not None and raised_tpm >= self.limits.tpm):
                self._probing.discard("tokens")
            for kind, before, raised in (("requests", rpm, raised_rpm), ("tokens", tpm, raised_tpm)):
                if before is None or raised is None or not raised > before:
                    self._probed_from.pop(kind, None)
                    self._probe_to.pop(kind, None)
                    continue
                self._probed_from[kind] = before
                self._probe_to[kind] = raised
                # The limit climbs one accepted request at a time (`_probe_answered`): where it was the
                # provider's, one request is refused, not all the raised limit would let out at once (the window
                # frees in bursts where it filled in bursts).
                self.limiter.allow_one_beyond(kind, self._probe_step(kind, raised - before))

    def _never_sent(self, grant: Grant) -> None:
        """An admission that ends without an answer (given back before it was sent, or unsettled): a trial or a
        probe that counted on its answer does not wait for it."""
        if self._refusals.deciding:
            self._refusals.abandoned(grant)
        if self._probe_to:
            self._probe_answered(grant, accepted=False)

    def _probe_step(self, kind: str, per_minute: float) -> float:
        """What one request may take the window log over its limit by while a probe climbs: one request, or
        the probe's whole token step."""
        return 1.0 if kind == "requests" else per_minute * (self.limits.window_s or 60.0) / 60.0

    def _probe_answered(self, grant: Grant, *, accepted: bool) -> None:
        """A call answered (or ended unanswered) while a probe climbs: if it was the one request over the limit,
        accepted raises the limit by it, up to the probe's target, and lets the next one go over; unanswered
        lets another try."""
        window = self.limits.window_s or 60.0
        for kind, target in list(self._probe_to.items()):
            if self.limiter.beyond_serial(kind) != grant.serial:
                continue
            current = (
                self.limiter.requests_per_minute if kind == "requests" else self.limiter.tokens_per_minute
            )
            if current is None:
                continue
            if accepted:
                current = min(target, current + grant.amount(kind) * 60.0 / window)
                self.limiter.set_limits(
                    current if kind == "requests" else None, current if kind == "tokens" else None
                )
                self._limits_changed_at = self._now()
            if current < target:
                self.limiter.allow_one_beyond(kind, self._probe_step(kind, target - current))
            else:
                del self._probe_to[kind]

    def _sent_in_window(self) -> dict[str, list[tuple[float, float]]]:
        """What the provider accepted in the window, as (time, amount) per slot (each at its slot's end, so it
        leaves the window no earlier than its calls did), for a limit the limiter starts pacing only now."""
        window = self.limits.window_s or 60.0
        slot_s = window / _ACCEPTED_SLOTS
        tokens = 3 if self.meters_output_budget else 2
        return {
            "requests": [((entry[0] + 1) * slot_s, float(entry[1])) for entry in self._accepted],
            "tokens": [((entry[0] + 1) * slot_s, float(entry[tokens])) for entry in self._accepted],
        }

    def _drop_old_accepted(self, now: float) -> None:
        window = self.limits.window_s or 60.0
        # A slot leaves once all of it is older than the window.
        horizon = math.floor((now - window) * _ACCEPTED_SLOTS / window)
        accepted = self._accepted
        while accepted and accepted[0][0] < horizon:
            _, calls, used, budgeted = accepted.popleft()
            self._accepted_calls -= calls
            self._accepted_used -= used
            self._accepted_budgeted -= budgeted

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


_PROBE_STEP = 1.05
# The shortest span a provider is known to meter a per-minute limit over (OpenAI's per-second quantization).
_METERED_SECOND_S = 1.0
_OUTPUT_HEADROOM = 1.25
# A provider's token count within this share of the backbone's own agrees with it (estimate noise, the window's
# edges); below it, the provider meters something the backbone does not.
_METERING_AGREES = 0.9
# A refused probe's window holding at least this share of the limit it started from: that limit is the provider's.
_PROBE_HELD = 0.9
# Slots per window in the log of accepted calls: a count off by at most one slot's calls (0.4 % of a window).
_ACCEPTED_SLOTS = 240


def _probe(current: float | None, declared: float | None) -> float | None:
    """The next limit to try above ``current``, never above ``declared``."""
    if current is None:
        return None
    raised = current * _PROBE_STEP
    return min(raised, declared) if declared is not None else raised


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
