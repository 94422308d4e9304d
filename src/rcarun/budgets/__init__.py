"""Rate and token limits, adaptive concurrency, retries, output budgets, prices and spend.

The runner wraps each attempt in a `BackboneGate` and asks it what to do after a failure; methods never see
any of this. Everything here reacts to rcarun's error classes and the backends' value types, nothing else.
"""

from .concurrency import AdaptiveConcurrency, ConcurrencySlot
from .estimate import TokenEstimator, cut_usage, estimated_usage, implausible_usage
from .gate import BackboneGate, BackboneLimits, GateStats, Ticket
from .learned_rate import LearnedRate, RateChange
from .ledger import Budget, Reservation, SpendLedger, SpendTotals
from .length import (
    DEFAULT_CONTEXT_SAFETY_TOKENS,
    DEFAULT_LENGTH_CAP,
    clamp_to_context,
    next_length_budget,
)
from .limits import MAX_BURST_S, Clock, Grant, RateLimiter
from .prices import Price, PriceTable, PriceWindow
from .retry import RetryDecision, RetryPolicy

__all__ = [
    "DEFAULT_CONTEXT_SAFETY_TOKENS",
    "DEFAULT_LENGTH_CAP",
    "MAX_BURST_S",
    "AdaptiveConcurrency",
    "BackboneGate",
    "BackboneLimits",
    "Budget",
    "Clock",
    "ConcurrencySlot",
    "GateStats",
    "Grant",
    "LearnedRate",
    "Price",
    "PriceTable",
    "PriceWindow",
    "RateChange",
    "RateLimiter",
    "Reservation",
    "RetryDecision",
    "RetryPolicy",
    "SpendLedger",
    "SpendTotals",
    "Ticket",
    "TokenEstimator",
    "clamp_to_context",
    "cut_usage",
    "estimated_usage",
    "implausible_usage",
    "next_length_budget",
]
