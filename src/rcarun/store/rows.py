"""The plain rows that go into results.db, one frozen dataclass per table.

The store works on these rows alone so that it depends on nothing of rcarun's but its errors: the runner
translates its own values (replies, usage, work items) into rows, and the writer only checks and inserts
them. Field names are the column names, so a row and its table cannot drift apart silently (a test checks it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal, NamedTuple

__all__ = [
    "CALL_STATUSES",
    "ITEM_STATUSES",
    "METHOD_PREPARED",
    "RUN_STATUSES",
    "BackboneSummary",
    "CachedCall",
    "CallRow",
    "CallStatus",
    "EventRow",
    "ItemRow",
    "ItemStatus",
    "PredictionRow",
    "RunRow",
    "RunStatus",
    "TrajectoryRow",
    "UsageSource",
    "WorkKey",
    "WorkNames",
    "utc_timestamp",
]


class WorkKey(NamedTuple):
    """One work item within a run: resume, merge and the writer's poisoned items key by it."""

    backbone: str
    method: str
    qid: str
    realization: int


CallStatus = Literal["ok", "length", "rate_limited", "error", "cached", "cancelled"]
# "estimated": the provider sent no usage, or usage no bill can be (see `rcarun.budgets.implausible_usage`).
UsageSource = Literal["reported", "estimated"]
ItemStatus = Literal["done", "failed", "skipped_budget", "interrupted"]
RunStatus = Literal["running", "finished", "stopped", "failed"]

# The same sets are CHECK constraints in the schema; the writer checks them at enqueue time too, so one bad
# row is refused on its own instead of failing the whole batch it would have landed in.
CALL_STATUSES: Final[frozenset[str]] = frozenset(
    ("ok", "length", "rate_limited", "error", "cached", "cancelled")
)
ITEM_STATUSES: Final[frozenset[str]] = frozenset(("done", "failed", "skipped_budget", "interrupted"))
RUN_STATUSES: Final[frozenset[str]] = frozenset(("running", "finished", "stopped", "failed"))


METHOD_PREPARED: Final = "method_prepared"
"""The `EventRow` kind of a model-reading method's preparation (SOAP's splits and selection) for one backbone and
realization. Its detail holds ``backbone``, ``method``, ``realization`` and ``items``, the trajectory ids that
realization answers (SOAP: its test split), which the report scores it on; the rest is the method's record."""


def utc_timestamp() -> str:
    """Now as ISO-8601 UTC text with milliseconds cut (``2025-01-31T12:00:00.123Z``), every timestamp's format;
    the part down to the second is formatted once a second (a sweep stamps every attempt twice)."""
    global _this_second
    second, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    stamped = _this_second  # one read of a (second, text) pair: threads stamp too, and swap it whole
    if stamped[0] != second:
        stamped = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S."))
        _this_second = stamped
    return f"{stamped[1]}{nanoseconds // 1_000_000:03d}Z"


_this_second: tuple[int, str] = (-1, "")


@dataclass(frozen=True, slots=True)
class CallRow:
    """One attempt of one chat call (retries, length re-asks and cache hits are attempts too); columns are
    explained in docs/schema.md. The writer assigns ``call_id``; ``attempt == 1`` rows count logical calls."""

    run_id: int
    item_id: str
    backbone: str
    model: str
    method: str
    qid: str
    realization: int
    stage: str
    attempt: int
    max_tokens: int | None
    status: CallStatus
    started_at: str
    ended_at: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: float | None = None
    error: str | None = None
    error_kind: str | None = None
    http_status: int | None = None
    cache_key: str | None = None
    request_sha256: str | None = None
    response_sha256: str | None = None
    response_text_sha256: str | None = None
    reasoning_text_sha256: str | None = None
    endpoint: str | None = None
    usage_source: UsageSource = "reported"
    streamed: bool | None = None
    ttft_ms: float | None = None
    decode_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class PredictionRow:
    """A method's final answer for one work item, unique per work key (columns: docs/schema.md)."""

    run_id: int
    item_id: str
    backbone: str
    method: str
    qid: str
    realization: int
    pred_role: str | None
    pred_step: int | None
    role_valid: bool
    step_valid: bool
    abstained: bool
    output_json: str | None
    error: str | None = None
    created_at: str = field(default_factory=utc_timestamp)
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class ItemRow:
    """Where one work item stands; unique on (run_id, backbone, method, qid, realization), last write wins."""

    run_id: int
    item_id: str
    backbone: str
    method: str
    qid: str
    realization: int
    status: ItemStatus
    error: str | None = None
    attempts: int = 0
    updated_at: str = field(default_factory=utc_timestamp)


@dataclass(frozen=True, slots=True)
class TrajectoryRow:
    """The reference facts of one trajectory a run used, so results.db can be analysed on its own."""

    run_id: int
    qid: str
    source: str
    n_steps: int
    roles_json: str
    ref_role: str | None
    ref_step: int | None
    sha256: str
    task_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class EventRow:
    """Why a run behaved as it did (a 429 pause, a budget stop, ...): a stable ``kind`` and a JSON detail."""

    run_id: int
    kind: str
    detail_json: str = "{}"
    at: str = field(default_factory=utc_timestamp)


@dataclass(frozen=True, slots=True)
class RunRow:
    run_id: int
    name: str
    created_at: str
    updated_at: str
    config_json: str
    status: RunStatus


@dataclass(frozen=True, slots=True)
class CachedCall:
    """Everything needed to answer a chat call again from an earlier attempt without sending it: the text where
    it was stored as blobs of its own, else (``text`` None) the raw body for the runner to parse again with the
    backbone's preset; and the blob keys, so a ``cached`` row points at the same blobs."""

    call_id: int
    run_id: int
    status: str
    text: str | None
    reasoning_text: str
    finish_reason: str | None
    model: str
    max_tokens: int | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    request_sha256: str | None
    response_sha256: str | None
    response_text_sha256: str | None
    reasoning_text_sha256: str | None
    raw_body: bytes | None = None


@dataclass(frozen=True, slots=True)
class BackboneSummary:
    """One backbone's totals within one run: ``calls`` counts rows with ``attempt == 1``, ``attempts`` every row;
    token and USD sums leave out ``cached`` rows (counted in ``cached_calls``); ``rate_limited``,
    ``length_retries`` and ``errors`` count attempts of status ``rate_limited``, ``length`` and ``error``."""

    backbone: str
    items_done: int
    items_failed: int
    items_skipped: int
    items_interrupted: int
    calls: int
    attempts: int
    cached_calls: int
    errors: int
    rate_limited: int
    length_retries: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost_usd: float
    predictions: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens (reasoning and provider-cached tokens are already inside them)."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class WorkNames:
    """The names a run's work items carry (items and predictions alike), each sorted: what flags may name."""

    backbones: tuple[str, ...]
    methods: tuple[str, ...]
