"""What the simulator says when it refuses a chat request, in the providers' own words and error shapes."""

from __future__ import annotations

from aiohttp import web

from .config import MockConfig
from .headers import retry_after_headers
from .http import error_response
from .limits import Admission

__all__ = [
    "QUOTA",
    "REFUSED_STREAM",
    "UNAUTHORIZED",
    "concurrency_rejection",
    "context_overflow_message",
    "limit_rejection",
]

# (status, message, type, code) of OpenAI's refusals.
UNAUTHORIZED = (401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
QUOTA = (
    429,
    "You exceeded your current quota, please check your plan and billing details.",
    "insufficient_quota",
    "insufficient_quota",
)
REFUSED_STREAM = (400, "stream is not supported by this server", "invalid_request_error", None)


def context_overflow_message(window: int, prompt_tokens: int, max_tokens: int) -> str:
    """vLLM's message for a request whose prompt and completion budget exceed the context window."""
    return (
        f"This model's maximum context length is {window} tokens. "
        f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
        f"{max_tokens} in the completion). "
        "Please reduce the length of the messages or completion."
    )


def limit_rejection(
    config: MockConfig, headers: dict[str, str], admission: Admission, model: str, tokens: int
) -> web.Response:
    """The 429 for a request a rate limit refused, with its Retry-After."""
    headers.update(retry_after_headers(admission.retry_after_s))
    spec = admission.spec
    assert spec is not None
    period = "min" if spec.period_s == 60.0 else "s"
    label = f"{spec.unit} per {period} ({spec.name.upper()})"
    requested = tokens if spec.unit == "tokens" else 1
    if admission.too_large:
        message = (
            f"Request too large for {model} on {label}: Limit {spec.limit}, Requested {requested}. "
            "The input or output tokens must be reduced in order to run successfully."
        )
    else:
        message = (
            f"Rate limit reached for {model} on {label}: Limit {spec.limit}, Requested {requested}. "
            f"Please try again in {admission.retry_after_s * 1000:.0f}ms."
        )
    if config.headers == "moonshot":
        return error_response(429, message, "rate_limit_reached_error", None, headers)
    return error_response(429, message, spec.unit, "rate_limit_exceeded", headers)


def concurrency_rejection(config: MockConfig, headers: dict[str, str]) -> web.Response:
    """The 429 for a request over ``max_concurrency`` (``over_concurrency`` "429")."""
    headers.update(retry_after_headers(config.latency_s))
    message = f"Too many concurrent requests: the limit is {config.max_concurrency}."
    error_type = "rate_limit_reached_error" if config.headers == "moonshot" else "requests"
    return error_response(429, message, error_type, "rate_limit_exceeded", headers)
