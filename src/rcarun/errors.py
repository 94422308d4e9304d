"""rcarun's own error types, so that every layer above the backends reacts to one vocabulary.

Backends translate HTTP statuses, SDK exceptions and provider quirks into these classes at their boundary;
budgets decide what to do from the class alone (pause, back off, give up); the runner stores the message as
data. Messages never contain secrets: they name the backbone, the call or the file, never a key.

    RcarunError
    ├── ConfigError              a config file or flag is wrong (file and key named)
    ├── DataError                a trajectory file or record is unusable (file, record and field named)
    ├── StoreError               results.db cannot be opened or migrated
    ├── BudgetExhausted          a run's USD or token budget would be exceeded; admission stops
    ├── StopRequested            admission stopped (Ctrl-C, a drain deadline, a stopped backbone): left for resume
    └── CallError                one attempt at one chat call failed
        ├── RetryableError       worth another attempt after a backoff
        │   ├── RateLimited      429 or a provider's equivalent: pause the backbone and shrink concurrency
        │   ├── ServerError      5xx other than a rate-limit signal
        │   ├── TransportError   no complete answer: connection reset or refused, an answer cut off
        │   │   ├── ConnectionFailed  no connection could be made at all (refused, unknown host)
        │   │   ├── SilenceTimeout    nothing arrived for ``timeout_s`` (before the answer or within it)
        │   │   └── CallDeadline      the call ran past ``max_call_s``
        │   └── MalformedResponse  a body that is not a chat completion
        └── FatalCallError       another attempt would fail the same way; stored and the item moves on
            ├── BadRequest       400/422: bad parameters
            │   ├── ContextOverflow  prompt + max_tokens exceed the context window
            │   ├── ModelNotFound    404: no such model (or no such endpoint) at this base URL
            │   └── StreamRefused    the server does not stream: the call is sent again unstreamed
            ├── ResponseTooLarge a response past ``max_response_mb``: read no further
            ├── AuthError        401/403
            └── QuotaExhausted   the account is out of credit (a 429 that must not be retried)

`ConnectionFailed`, `ModelNotFound`, `AuthError` and `QuotaExhausted` are about the backbone, not the call: the
runner stops a backbone that keeps meeting them (`BACKBONE_FAULTS`) instead of failing every item in turn.

A `TransportError` other than `ConnectionFailed`, or a `ResponseTooLarge`, after the request went out is a cut
generation: the provider may have generated (and billed) the answer, so the runner stores what arrived and
charges an estimate for it.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "BACKBONE_FAULTS",
    "AuthError",
    "BadRequest",
    "BudgetExhausted",
    "CallDeadline",
    "CallError",
    "ConfigError",
    "ConnectionFailed",
    "ContextOverflow",
    "DataError",
    "FatalCallError",
    "MalformedResponse",
    "ModelNotFound",
    "QuotaExhausted",
    "RateLimited",
    "RcarunError",
    "ReportedLimits",
    "ResponseTooLarge",
    "RetryableError",
    "ServerError",
    "SilenceTimeout",
    "StopRequested",
    "StoreError",
    "StreamRefused",
    "TransportError",
    "data_location",
]


class RcarunError(Exception):
    """Root of every error rcarun raises on purpose."""


class ConfigError(RcarunError):
    """A configuration file, key or flag is invalid."""


class DataError(RcarunError):
    """A dataset file or record cannot be used.

    Attributes:
        path: the file, as given.
        record: the record inside the file (qid or line number), when known.
        field: the offending field, when known.
    """

    def __init__(self, message: str, *, path: str = "", record: str = "", field: str = "") -> None:
        where = data_location(path, record, field)
        super().__init__(f"{where}: {message}" if where else message)
        self.message = message
        self.path = path
        self.record = record
        self.field = field


def data_location(path: str = "", record: str = "", field: str = "") -> str:
    """``"<path>, record <record>, field '<field>'"`` with the unknown parts left out."""
    return ", ".join(
        part
        for part in (path, f"record {record}" if record else "", f"field {field!r}" if field else "")
        if part
    )


class StoreError(RcarunError):
    """results.db cannot be opened, migrated or written."""


class BudgetExhausted(RcarunError):
    """Admitting another call would exceed a configured USD or token budget."""


class StopRequested(RcarunError):
    """Admission has stopped (Ctrl-C, a drain deadline, or this backbone stopped); the item is left for resume."""


class CallError(RcarunError):
    """One attempt of one chat call failed.

    Attributes:
        status: HTTP status when there was one, else None.
        kind: a short stable label stored in results.db (``rate_limited``, ``server_error``, ...).
    """

    kind = "error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RetryableError(CallError):
    """Another attempt, after a backoff, may succeed."""

    kind = "retryable"


class ReportedLimits(Protocol):
    """What a provider's rate-limit headers said (`rcarun.backends.types.RateLimitInfo` is one): declared here,
    by shape, because errors sit below the backends and import nothing from them."""

    @property
    def limit_requests(self) -> int | None: ...
    @property
    def remaining_requests(self) -> int | None: ...
    @property
    def reset_requests_s(self) -> float | None: ...
    @property
    def limit_tokens(self) -> int | None: ...
    @property
    def remaining_tokens(self) -> int | None: ...
    @property
    def reset_tokens_s(self) -> float | None: ...


class RateLimited(RetryableError):
    """The provider refused the call for rate or concurrency reasons.

    Attributes:
        retry_after_s: the provider's Retry-After, in seconds, if it sent one.
        reset_s: the longest ``x-ratelimit-reset-*`` value, in seconds, if sent.
        rate_limit: every rate-limit header of the refusal as read (limits, remaining counts, resets), None
            when it sent none: the gate paces by the remaining counts and limits, not by the resets alone.
    """

    kind = "rate_limited"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = 429,
        retry_after_s: float | None = None,
        reset_s: float | None = None,
        rate_limit: ReportedLimits | None = None,
    ) -> None:
        super().__init__(message, status=status)
        self.retry_after_s = retry_after_s
        self.reset_s = reset_s
        self.rate_limit = rate_limit


class ServerError(RetryableError):
    """The provider failed (5xx)."""

    kind = "server_error"


class TransportError(RetryableError):
    """The request did not complete: connection reset or refused, an answer cut off, a deadline."""

    kind = "transport_error"


class ConnectionFailed(TransportError):
    """No connection could be made to the endpoint (refused, unreachable, unknown host): nothing was sent."""

    kind = "connection_failed"


class SilenceTimeout(TransportError):
    """Nothing arrived for ``timeout_s``: no first byte, or a pause within the answer that long."""

    kind = "silence_timeout"


class CallDeadline(TransportError):
    """The call ran longer than ``max_call_s``, however steadily its answer was arriving."""

    kind = "call_deadline"


class MalformedResponse(RetryableError):
    """The provider answered 200 with a body that is not a chat completion."""

    kind = "malformed_response"


class FatalCallError(CallError):
    """Retrying would fail the same way; the attempt is stored and the item gives up."""

    kind = "fatal"


class BadRequest(FatalCallError):
    """The provider rejected the request's parameters."""

    kind = "bad_request"


class ContextOverflow(BadRequest):
    """The prompt plus the output budget do not fit in the model's context window."""

    kind = "context_overflow"


class ModelNotFound(BadRequest):
    """404 from the chat endpoint: the model (or the endpoint path) does not exist at this base URL."""

    kind = "model_not_found"


class StreamRefused(BadRequest):
    """The server refused the request for asking to stream (a 400 naming ``stream``): the backbone stops
    streaming and the call is sent again unstreamed."""

    kind = "stream_refused"


class ResponseTooLarge(FatalCallError):
    """The response grew past the backbone's ``max_response_mb``: an endless or oversized answer, not read on."""

    kind = "response_too_large"


class AuthError(FatalCallError):
    """The key is missing, wrong or not allowed to use this model."""

    kind = "auth_error"


class QuotaExhausted(FatalCallError):
    """The account has no credit left; retrying cannot help."""

    kind = "quota_exhausted"


BACKBONE_FAULTS: tuple[type[CallError], ...] = (AuthError, QuotaExhausted, ModelNotFound, ConnectionFailed)
"""Errors that say nothing about the request and everything about the backbone: another item will meet them too."""
