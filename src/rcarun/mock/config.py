"""The simulator's knobs in one frozen value, so a test, the demo and the benchmark describe a backbone alike.

One `MockConfig` says how the simulated backbone behaves: how fast it answers, which limits it enforces and
how it signals them, which faults it injects, how it reports usage and reasoning. It crosses process borders
as JSON (`to_json` / `from_json`): that is how `MockProcess` hands it to a server in its own process.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
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

FAULT_RATE_FIELDS = (
    "error_500_rate",
    "error_503_rate",
    "timeout_rate",
    "reset_rate",
    "malformed_rate",
    "rate_limit_rate",
    # Appended after the original kinds: one draw per request walks this table in order, so a request that met
    # an original fault meets the same one whatever these rates are (and rate 0 leaves them out entirely).
    "huge_step_rate",
    "surrogate_rate",
    "bad_usage_rate",
    "long_pause_rate",
    # Appended after those for the same reason: a seed's earlier faults stay where they were.
    "stream_stall_rate",
    "stream_drop_rate",
    # And these after those (the second outside campaign's kinds).
    "bare_rate_limit_rate",
    "control_rate",
)


@dataclass(frozen=True, slots=True)
class MockConfig:
    """How the simulated backbone behaves.

    Attributes:
        model: the model name listed by ``/v1/models`` and reported when a request names none.
        seed: seeds the server's own random draws (faults, sampling noise) so that a run is reproducible.
        latency_s: base time to answer an accepted request, in seconds, counted from its arrival (or from the
            moment its queue slot came free), so the server's own handling is inside it.
        latency_per_token_s: extra seconds per generated (completion) token.
        chars_per_token: characters per token when counting prompt and completion tokens.
        rpm / tpm / rps: requests per minute, tokens per minute (prompt + completion), requests per second;
            None disables that limit. Each is a token bucket refilled at limit/period.
        burst_s: bucket capacity in seconds of quota (rpm 600 with burst 1 s admits 10 requests at once).
        max_concurrency: most requests generating at once; None for no cap.
        over_concurrency: "429" rejects requests above the cap at once; "queue" holds them FIFO and keeps the
            connection alive with blank lines, as DeepSeek does.
        keepalive_s: interval of the blank lines written while a request is queued.
        headers: which rate-limit headers every chat response carries ("none" like DeepSeek).
        error_500_rate / error_503_rate / timeout_rate / reset_rate / malformed_rate / rate_limit_rate:
            probability of each fault per request (their sum at most 1). Faulted requests are not charged
            against limits. A "rate_limit" fault is a 429 with Retry-After whatever the limits say, as a
            provider answers when it is overloaded.
        huge_step_rate / surrogate_rate / bad_usage_rate / long_pause_rate: probability of each hostile answer
            per request, drawn with the faults above (all rates together at most 1; these four come after the
            others in the draw, so they never shift which requests meet the others). The first three are normal
            200 answers, admitted and charged against limits like any answer:
            - "huge_step": every integer field named like a step (``root_step``, ``failure_step``, ``step``,
              ``step_id``, ``mistake_step`` ...) of the JSON answer says ``10**26``, written as a JSON integer;
              an answer with no such field (or tool calls) is served plainly;
            - "surrogate": a lone UTF-16 surrogate (``\\ud800`` in the body) ends the answer's longest string
              field, or the answer text when it is not JSON, as when an answer is cut mid-emoji; tool calls are
              served plainly;
            - "bad_usage": ``usage`` is nonsense, one of (a seeded draw): missing, ``prompt_tokens`` 10**20,
              ``prompt_tokens`` written ``Infinity``, negative counts; the stats count what would have been
              billed.
            A "huge_step" or "surrogate" answer that the output budget cuts before the fault is served as a
            plain one. "long_pause" is a 429 whose ``Retry-After`` asks for far longer than any client should
            wait ("86400", an HTTP date in 2099, or "1e400"; a seeded draw), as in an outage; not charged.
        stream_stall_rate / stream_drop_rate: probability of an answer cut off on the wire, drawn after all the
            kinds above (so a seed's earlier faults never move). The answer is admitted and charged like any
            (the provider generated it); a streamed one stops after about half of its chunks and then either
            goes silent for ``hang_s`` before the connection is dropped ("stream_stall") or has its connection
            closed at once, without ``[DONE]`` ("stream_drop"). An unstreamed one sends the first half of its
            JSON body (Content-Length says the whole) and then stalls or closes the same way. The request log
            says how many completion tokens went out before the cut (``completion_tokens_sent``).
        bare_rate_limit_rate / control_rate: drawn after all the kinds above. "bare_rate_limit" is a 429 with
            no Retry-After and no rate-limit headers, as a gateway answers when briefly overloaded (not charged);
            "control" is a 200 answer whose text starts with a line of terminal control sequences (prose before
            the JSON, which methods read past): clear screen, a window title, a clipboard write (OSC 52), a hyperlink, a C1 CSI,
            a carriage return and backspaces, as a trajectory or a model can quote them.
        rate_limit_retry_after_s: the Retry-After of a "rate_limit" fault, in seconds.
        hang_s: how long a "timeout" fault holds the request before dropping the connection.
        length_rate: probability that an accepted answer is cut short with finish_reason "length" at a tenth of
            its budget (``max_tokens``, or the whole answer when none is given), as if the model had rambled;
            drawn from its own random stream, so it shifts neither fault draws nor sampling.
        request_log_size: keep the last this many chat requests in a log served at ``GET /mock/log`` (0: no
            log). Each entry says what the request was and what it got, so a client's own records can be
            reconciled against what the server really served.
        reasoning_tokens: simulated thinking tokens per answer.
        reasoning_field: message field carrying the thinking text; None hides it (usage still counts it).
        usage_style: "openai" (prompt/completion_tokens_details) or "deepseek" (prompt_cache_hit/miss_tokens).
        context_window: vLLM-style context limit in tokens; None for no limit.
        api_key: when set, requests must carry ``Authorization: Bearer <api_key>`` (never shown in reprs).
        quota_exhausted: every chat request gets OpenAI's ``insufficient_quota`` 429.
        tool_rounds_max: most tool rounds a conversation offered tools makes before answering (a seeded draw
            in 0..max per conversation; see `rcarun.mock.answers.simulate_tool_calls`).

    Streaming (a request with ``"stream": true`` is answered as server-sent events in OpenAI's chunk shape; see
    `rcarun.mock.server`):
        tokens_per_chunk: completion tokens (``chars_per_token`` characters each) per content-bearing chunk. The
            first one goes out ``latency_s`` (plus the prefill) after arrival, each further token
            ``latency_per_token_s`` later, so a stream ends when the unstreamed answer would have.
        refuse_stream: answer ``"stream": true`` with a 400 naming ``stream``, as a server that cannot stream;
            unstreamed requests are served as usual.

    The vLLM face (``/health``, ``/version``, ``/metrics``, and ``max_model_len`` in ``/v1/models``):
        startup_delay_s: ``/health`` answers 503 for this long after the server starts, as a server that listens
            before its engine is ready.
        model_root: the ``root`` of the ``/v1/models`` card (vLLM: the model path behind a served name); None
            repeats ``model``.
        server_version: what ``GET /version`` reports.
        kv_cache_tokens: KV-cache capacity in tokens: ``/metrics`` reports the prompt and completion tokens of the
            requests generating over it. None: the share of ``max_concurrency`` slots in use (0 without a cap).
        kv_cache_metric: the KV-cache gauge's name (vLLM renamed it; see `KvCacheMetric`).

    The prefix cache (off by default, so that nothing else changes; it exists to measure prefix affinity):
        prefix_cache_entries: how many distinct first messages (role + text: the prefix a trajectory's calls
            share) this replica keeps, least recently used evicted first. 0: no capacity model; every first
            message seen is reported as cached in ``usage`` and none makes a request faster.
        latency_per_prompt_token_s: extra seconds per prompt token not served from the prefix cache (the
            prefill), so that a hit on a long first message answers sooner and frees its slot sooner.
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
        problems: list[str] = []
        for name in (
            "latency_s",
            "latency_per_token_s",
            "hang_s",
            "rate_limit_retry_after_s",
            "startup_delay_s",
            "latency_per_prompt_token_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("chars_per_token", "burst_s", "keepalive_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("rpm", "tpm", "rps", "max_concurrency", "context_window", "kv_cache_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                problems.append(f"{name} must be a positive integer or None, got {value!r}")
        if isinstance(self.reasoning_tokens, bool) or not isinstance(self.reasoning_tokens, int):
            problems.append(f"reasoning_tokens must be an integer, got {self.reasoning_tokens!r}")
        elif self.reasoning_tokens < 0:
            problems.append(f"reasoning_tokens must be >= 0, got {self.reasoning_tokens}")
        rates = [getattr(self, name) for name in FAULT_RATE_FIELDS]
        for name, rate in zip(FAULT_RATE_FIELDS, rates, strict=True):
            if not (0.0 <= rate <= 1.0):
                problems.append(f"{name} must be within [0, 1], got {rate!r}")
        if not (0.0 <= self.length_rate <= 1.0):
            problems.append(f"length_rate must be within [0, 1], got {self.length_rate!r}")
        if sum(rates) > 1.0 + 1e-9:
            problems.append(f"fault rates sum to {sum(rates):.3f}, more than 1")
        if (
            isinstance(self.prefix_cache_entries, bool)
            or not isinstance(self.prefix_cache_entries, int)
            or self.prefix_cache_entries < 0
        ):
            problems.append(
                f"prefix_cache_entries must be an integer >= 0, got {self.prefix_cache_entries!r}"
            )
        if (
            isinstance(self.request_log_size, bool)
            or not isinstance(self.request_log_size, int)
            or self.request_log_size < 0
        ):
            problems.append(f"request_log_size must be an integer >= 0, got {self.request_log_size!r}")
        choices: dict[str, tuple[Any, ...]] = {
            "over_concurrency": get_args(OverConcurrency),
            "headers": get_args(HeaderStyle),
            "reasoning_field": (*get_args(ReasoningField), None),
            "usage_style": get_args(UsageStyle),
            "kv_cache_metric": get_args(KvCacheMetric),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed!r}, got {getattr(self, name)!r}")
        if not self.model:
            problems.append("model must be a non-empty string")
        if self.model_root is not None and not self.model_root:
            problems.append("model_root must be None or a non-empty string")
        if isinstance(self.tool_rounds_max, bool) or not isinstance(self.tool_rounds_max, int):
            problems.append(f"tool_rounds_max must be an integer, got {self.tool_rounds_max!r}")
        elif self.tool_rounds_max < 0:
            problems.append(f"tool_rounds_max must be >= 0, got {self.tool_rounds_max}")
        if (
            isinstance(self.tokens_per_chunk, bool)
            or not isinstance(self.tokens_per_chunk, int)
            or self.tokens_per_chunk < 1
        ):
            problems.append(f"tokens_per_chunk must be a positive integer, got {self.tokens_per_chunk!r}")
        if not isinstance(self.refuse_stream, bool):
            problems.append(f"refuse_stream must be true or false, got {self.refuse_stream!r}")
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
