"""The simulator's knobs in one frozen value, so a test, the demo and the benchmark describe a backbone alike.

One `MockConfig` says how the simulated backbone behaves: how fast it answers, which limits it enforces and
how it signals them, which faults it injects, how it reports usage and reasoning. It crosses process borders
as JSON (`to_json` / `from_json`): that is how `MockProcess` hands it to a server in its own process.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = [
    "HeaderStyle",
    "KvCacheMetric",
    "MockConfig",
    "OverConcurrency",
    "ReasoningField",
    "UsageStyle",
]

HeaderStyle = Literal["openai", "moonshot", "none"]
OverConcurrency = Literal["429", "queue"]
ReasoningField = Literal["reasoning_content", "reasoning"]
UsageStyle = Literal["openai", "deepseek"]
# vLLM renamed its KV-cache gauge (``vllm:gpu_cache_usage_perc`` until the V0 engine went, then
# ``vllm:kv_cache_usage_perc``); the simulator serves either, so clients are tested against both.
KvCacheMetric = Literal["kv_cache_usage_perc", "gpu_cache_usage_perc"]

# The order of the one fault draw per request: kinds are only ever appended, so that a seed's requests meet the
# same earlier faults whatever the later rates are (and rate 0 leaves a kind out).
FAULT_RATE_FIELDS = (
    "error_500_rate",
    "error_503_rate",
    "timeout_rate",
    "reset_rate",
    "malformed_rate",
    "rate_limit_rate",
    "huge_step_rate",
    "surrogate_rate",
    "bad_usage_rate",
    "long_pause_rate",
    "stream_stall_rate",
    "stream_drop_rate",
    "bare_rate_limit_rate",
    "control_rate",
)


@dataclass(frozen=True, slots=True)
class MockConfig:
    """How the simulated backbone behaves (docs/simulator.md tells what each behaviour looks like on the wire).

    Attributes:
        model: the model name listed by ``/v1/models`` and reported when a request names none.
        seed: seeds the server's own random draws (faults, sampling noise) so that a run is reproducible.
        latency_s: seconds to answer an accepted request, counted from its arrival (or from when its queue slot
            came free), so the server's own handling is inside it.
        latency_per_token_s: extra seconds per generated (completion) token.
        chars_per_token: characters per token when counting prompt and completion tokens.
        rpm / tpm / rps: requests per minute, tokens per minute (prompt + completion), requests per second, each
            a token bucket refilled at limit/period; None disables it.
        burst_s: bucket capacity in seconds of quota (rpm 600 with burst 1 s admits 10 requests at once).
        max_concurrency: most requests generating at once; None for no cap.
        over_concurrency: "429" rejects requests above the cap; "queue" holds them FIFO, kept alive with blank
            lines every ``keepalive_s``, as DeepSeek does.
        headers: which rate-limit headers every chat response carries ("none" like DeepSeek).
        error_500_rate ... control_rate: the probability of each fault kind per request (together at most 1),
            one draw walking `FAULT_RATE_FIELDS` in order; ``rate_limit_retry_after_s`` is a "rate_limit"
            fault's Retry-After, ``hang_s`` how long a "timeout" or "stream_stall" holds the connection.
        length_rate: probability that an accepted answer is cut short with finish_reason "length" at a tenth of
            its budget, as if the model had rambled (its own random stream: it shifts no other draw).
        request_log_size: keep the last this many chat requests in the log at ``GET /mock/log`` (0: no log).
        reasoning_tokens: simulated thinking tokens per answer, carried in ``reasoning_field`` (None hides the
            text; usage still counts it).
        usage_style: "openai" (prompt/completion_tokens_details) or "deepseek" (prompt_cache_hit/miss_tokens).
        context_window: vLLM-style context limit in tokens; None for no limit.
        api_key: when set, requests must carry ``Authorization: Bearer <api_key>`` (never shown in reprs).
        quota_exhausted: every chat request gets OpenAI's ``insufficient_quota`` 429.
        tool_rounds_max: most tool rounds a conversation offered tools makes before answering.
        tokens_per_chunk: completion tokens per content-bearing chunk of a streamed answer.
        refuse_stream: answer ``"stream": true`` with a 400 naming ``stream``, as a server that cannot stream.
        startup_delay_s: ``/health`` answers 503 for this long after the start, as vLLM loading its engine.
        model_root / server_version: the ``root`` of the ``/v1/models`` card (None: ``model``) and what
            ``GET /version`` reports, as vLLM's.
        kv_cache_tokens: KV-cache capacity in tokens that ``/metrics`` reports usage against (None: the share of
            ``max_concurrency`` slots in use); ``kv_cache_metric`` names the gauge (vLLM renamed it).
        prefix_cache_entries: distinct first messages this replica keeps, least recently used evicted first (0:
            every first message seen counts as cached and none makes a request faster).
        latency_per_prompt_token_s: extra seconds per prompt token not served from the prefix cache.
    """

    model: str = "sim-model"
    seed: int = 0
    latency_s: float = 0.05
    latency_per_token_s: float = 0.0
    chars_per_token: float = 4.0
    rpm: int | None = None
    tpm: int | None = None
    rps: int | None = None
    burst_s: float = 1.0
    max_concurrency: int | None = None
    over_concurrency: OverConcurrency = "429"
    keepalive_s: float = 0.5
    headers: HeaderStyle = "openai"
    error_500_rate: float = 0.0
    error_503_rate: float = 0.0
    timeout_rate: float = 0.0
    reset_rate: float = 0.0
    malformed_rate: float = 0.0
    rate_limit_rate: float = 0.0
    huge_step_rate: float = 0.0
    surrogate_rate: float = 0.0
    bad_usage_rate: float = 0.0
    long_pause_rate: float = 0.0
    stream_stall_rate: float = 0.0
    stream_drop_rate: float = 0.0
    bare_rate_limit_rate: float = 0.0
    control_rate: float = 0.0
    rate_limit_retry_after_s: float = 1.0
    hang_s: float = 30.0
    length_rate: float = 0.0
    request_log_size: int = 0
    reasoning_tokens: int = 0
    reasoning_field: ReasoningField | None = "reasoning_content"
    usage_style: UsageStyle = "openai"
    context_window: int | None = None
    api_key: str | None = field(default=None, repr=False)
    quota_exhausted: bool = False
    tool_rounds_max: int = 3
    startup_delay_s: float = 0.0
    model_root: str | None = None
    server_version: str = "0.0.0+rcarun.sim"
    kv_cache_tokens: int | None = None
    kv_cache_metric: KvCacheMetric = "kv_cache_usage_perc"
    prefix_cache_entries: int = 0
    latency_per_prompt_token_s: float = 0.0
    tokens_per_chunk: int = 1
    refuse_stream: bool = False

    def __post_init__(self) -> None:
        problems = [problem for check in _CHECKS for problem in check(self)]
        if problems:
            raise ValueError("invalid MockConfig: " + "; ".join(problems))

    @property
    def fault_rate(self) -> float:
        """Probability that a request meets any fault."""
        return float(sum(getattr(self, name) for name in FAULT_RATE_FIELDS))

    def replace(self, **changes: Any) -> MockConfig:
        """A copy with ``changes`` applied (validated like a new config)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field, including ``api_key`` (the config is handed to a child process this way)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MockConfig:
        """Build a config from plain values, rejecting unknown keys.

        Raises:
            ValueError: an unknown key or an invalid value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown MockConfig keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return cls(**dict(values))

    @classmethod
    def from_json(cls, text: str) -> MockConfig:
        """Parse `to_json` output (or any JSON object of config fields).

        Raises:
            ValueError: the text is not a JSON object of known, valid fields.
        """
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"config JSON does not parse: {exc}") from exc
        if not isinstance(values, dict):
            raise ValueError("config JSON must be an object")
        return cls.from_mapping(values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_durations(config: MockConfig) -> Iterator[str]:
    for name in _NON_NEGATIVE_NUMBERS:
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0):
            yield f"{name} must be a finite number >= 0, got {value!r}"
    for name in _POSITIVE_NUMBERS:
        value = getattr(config, name)
        if not (math.isfinite(value) and value > 0):
            yield f"{name} must be a finite number > 0, got {value!r}"


def _check_limits(config: MockConfig) -> Iterator[str]:
    for name in _POSITIVE_INTEGERS_OR_NONE:
        value = getattr(config, name)
        if value is not None and not (_is_int(value) and value >= 1):
            yield f"{name} must be a positive integer or None, got {value!r}"


def _non_negative_integer(name: str) -> Callable[[MockConfig], Iterator[str]]:
    def check(config: MockConfig) -> Iterator[str]:
        value = getattr(config, name)
        if not _is_int(value):
            yield f"{name} must be an integer, got {value!r}"
        elif value < 0:
            yield f"{name} must be >= 0, got {value}"

    return check


def _check_rates(config: MockConfig) -> Iterator[str]:
    rates = [getattr(config, name) for name in FAULT_RATE_FIELDS]
    for name, rate in [*zip(FAULT_RATE_FIELDS, rates, strict=True), ("length_rate", config.length_rate)]:
        if not (0.0 <= rate <= 1.0):
            yield f"{name} must be within [0, 1], got {rate!r}"
    if sum(rates) > 1.0 + 1e-9:
        yield f"fault rates sum to {sum(rates):.3f}, more than 1"


def _check_sizes(config: MockConfig) -> Iterator[str]:
    for name in ("prefix_cache_entries", "request_log_size"):
        value = getattr(config, name)
        if not (_is_int(value) and value >= 0):
            yield f"{name} must be an integer >= 0, got {value!r}"


def _check_choices(config: MockConfig) -> Iterator[str]:
    for name, allowed in _CHOICES.items():
        if getattr(config, name) not in allowed:
            yield f"{name} must be one of {allowed!r}, got {getattr(config, name)!r}"


def _check_names(config: MockConfig) -> Iterator[str]:
    if not config.model:
        yield "model must be a non-empty string"
    if config.model_root is not None and not config.model_root:
        yield "model_root must be None or a non-empty string"


def _check_streaming(config: MockConfig) -> Iterator[str]:
    if not (_is_int(config.tokens_per_chunk) and config.tokens_per_chunk >= 1):
        yield f"tokens_per_chunk must be a positive integer, got {config.tokens_per_chunk!r}"
    if not isinstance(config.refuse_stream, bool):
        yield f"refuse_stream must be true or false, got {config.refuse_stream!r}"


_NON_NEGATIVE_NUMBERS = (
    "latency_s",
    "latency_per_token_s",
    "hang_s",
    "rate_limit_retry_after_s",
    "startup_delay_s",
    "latency_per_prompt_token_s",
)
_POSITIVE_NUMBERS = ("chars_per_token", "burst_s", "keepalive_s")
_POSITIVE_INTEGERS_OR_NONE = ("rpm", "tpm", "rps", "max_concurrency", "context_window", "kv_cache_tokens")
_CHOICES: dict[str, tuple[Any, ...]] = {
    "over_concurrency": get_args(OverConcurrency),
    "headers": get_args(HeaderStyle),
    "reasoning_field": (*get_args(ReasoningField), None),
    "usage_style": get_args(UsageStyle),
    "kv_cache_metric": get_args(KvCacheMetric),
}
# Each names what is wrong; all problems are reported at once, in this order.
_CHECKS: tuple[Callable[[MockConfig], Iterator[str]], ...] = (
    _check_durations,
    _check_limits,
    _non_negative_integer("reasoning_tokens"),
    _check_rates,
    _check_sizes,
    _check_choices,
    _check_names,
    _non_negative_integer("tool_rounds_max"),
    _check_streaming,
)
