"""Sweep and backbone configuration as typed models, unknown keys rejected (files are read by `loading`).

A config that cannot work is refused before any run exists: URLs must be http(s) with a host, numbers finite,
price windows ``HH:MM``, and no header or body field may carry a literal credential (results.db echoes the
config; keys come only from the environment variables named by ``api_key_env``).
"""

from __future__ import annotations

import math
import re
import shlex
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from rcarun.backends.presets import PRESETS
from rcarun.backends.transports import transport_names
from rcarun.data import LONGRCA_MINI
from rcarun.serving import RESERVED_FLAGS as _SERVE_RESERVED_FLAGS

__all__ = [
    "BackboneConfig",
    "FieldProblem",
    "LimitsConfig",
    "LocalModelConfig",
    "MethodConfig",
    "PriceWindowConfig",
    "PricesConfig",
    "RetryConfig",
    "ServeConfig",
    "SpendBudgetConfig",
    "StageConfig",
    "SweepConfig",
    "SweepSection",
]


def _one_of(value: str, what: str, known: Sequence[str]) -> str:
    """`value` when it names one of `known`; a one-line refusal listing them otherwise."""
    if value not in known:
        raise FieldProblem(f"unknown {what} {value!r} (known: {', '.join(sorted(known))})")
    return value


class _Strict(BaseModel):
    # TOML allows inf and nan; no setting of rcarun means either (timeout_s = inf overflows every call).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FieldProblem(ValueError):
    """A validator's finding at ``where`` below the field (a header, a body key), reported without pydantic's
    "Value error, " prefix (`rcarun.runner.loading`)."""

    def __init__(self, problem: str, where: tuple[str | int, ...] = ()) -> None:
        super().__init__(problem)
        self.where = where


def _http_url(value: str) -> str:
    """Refuse anything an HTTP client cannot POST to: other schemes, no host, stray whitespace or controls."""
    if any(char.isspace() or unicodedata.category(char) == "Cc" for char in value):
        raise FieldProblem(f"{value!r} contains whitespace or control characters")
    parts = urlsplit(value)
    try:
        _ = parts.port  # parsing it is the check: "http://h:abc" raises
    except ValueError:
        raise FieldProblem(f"{value!r} has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FieldProblem(
            f"{value!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000/v1)"
        )
    return value


_HttpUrl = Annotated[str, AfterValidator(_http_url)]

_HH_MM = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")

# Header names that carry credentials (Authorization, X-Api-Key, X-Auth-Token, ...), matched case-insensitively.
_CREDENTIAL_HEADER_PARTS = ("auth", "key", "token", "secret")
# Values that look like a pasted secret wherever they appear: a bearer token, or an OpenAI-style sk- key.
_SECRET_VALUE = re.compile(r"Bearer\s+\S{10,}|sk-[A-Za-z0-9_-]{16,}", re.IGNORECASE)
_USE_THE_ENVIRONMENT = "secrets come only from environment variables: use api_key_env"


def _check_extra_value(value: Any, where: tuple[str | int, ...]) -> None:
    """Walk an ``extra_headers`` or ``extra_body`` value; refuse secret-looking strings (named by their path,
    never quoted) and non-finite numbers (the JSON body could not carry them)."""
    if isinstance(value, str):
        if _SECRET_VALUE.search(value):
            raise FieldProblem(
                f"looks like a secret (Bearer token or sk- key); {_USE_THE_ENVIRONMENT}", where
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise FieldProblem("Input should be a finite number", where)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_extra_value(item, (*where, str(key)))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_extra_value(item, (*where, index))


# Settings of the rate-limit learning that issue 35 replaced by one rule (`rcarun.budgets.learned_rate`).
_RETIRED_LIMITS = ("meters_finer_than_window", "counts_refused_requests")


class LimitsConfig(_Strict):
    """What the provider allows this account for this model; the runner never exceeds it."""

    concurrency: int = Field(16, ge=1, description="in-flight calls (DeepSeek's limit is exactly this)")
    min_concurrency: int = Field(1, ge=1)
    rpm: float | None = Field(None, gt=0, description="requests per minute")
    tpm: float | None = Field(None, gt=0, description="tokens per minute (prompt + completion)")
    burst_s: float = Field(2.0, gt=0, le=10, description="seconds of quota that may go out at once")
    arrival_jitter_s: float = Field(0.05, ge=0, description="burst held back for gaps shrinking in transit")
    meters_output_budget: bool | None = Field(
        None, description="max_tokens counts against tpm; None: preset's"
    )
    window_s: float = Field(60.0, gt=0, le=3600, description="the window rpm/tpm are counted over")

    @model_validator(mode="before")
    @classmethod
    def _no_retired_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key in _RETIRED_LIMITS:
                if key in data:
                    raise ValueError(
                        f"limits.{key} was removed: rcarun no longer learns how a provider counts its limits; "
                        "declare the provider's rpm and tpm in [backbones.NAME.limits] instead"
                    )
        return data

    @model_validator(mode="after")
    def _window_longer_than_burst(self) -> LimitsConfig:
        if self.window_s <= self.burst_s:
            raise ValueError(f"window_s ({self.window_s:g}) must be longer than burst_s ({self.burst_s:g})")
        return self


class PriceWindowConfig(_Strict):
    """A time-of-day window (UTC, may wrap midnight) with its own prices, e.g. DeepSeek's off-peak discount."""

    start: str = Field(description="UTC HH:MM, 00:00 .. 23:59")
    end: str = Field(description="UTC HH:MM; before start: the window wraps midnight")
    weekdays: tuple[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], ...] | None = Field(
        None, description="UTC days the window starts on; None: every day"
    )
    input_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(None, ge=0)
    output_per_mtok: float = Field(ge=0)

    @field_validator("start", "end")
    @classmethod
    def _hh_mm(cls, value: str) -> str:
        if not _HH_MM.fullmatch(value):
            raise FieldProblem(f"{value!r} is not a UTC time of day HH:MM (00:00 .. 23:59)")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> PriceWindowConfig:
        if self.start == self.end:
            raise FieldProblem(f"start and end are both {self.start}: the window is empty", ("end",))
        return self


class PricesConfig(_Strict):
    """USD per million tokens (``taken``: when they were read off the provider's page). ``gpu_hour_usd`` prices
    the GPU time of ``[serve]`` replicas, which the report charges by tokens; budgets count token prices only,
    since GPU time is not known per call."""

    input_per_mtok: float = Field(0.0, ge=0)
    cached_input_per_mtok: float | None = Field(None, ge=0)
    output_per_mtok: float = Field(0.0, ge=0)
    gpu_hour_usd: float = Field(0.0, ge=0, description="USD per GPU per hour of [serve] replicas")
    taken: str | None = None
    source: str | None = None
    windows: tuple[PriceWindowConfig, ...] = ()


class SpendBudgetConfig(_Strict):
    max_usd: float | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, gt=0)


class RetryConfig(_Strict):
    max_attempts: int = Field(
        6, ge=1, description="attempts per call for retryable errors, the first included"
    )
    base_s: float = Field(0.5, gt=0)
    cap_s: float = Field(60.0, gt=0)
    max_pause_s: float = Field(300.0, gt=0, description="longest pause a provider may ask; longer stops it")
    fail_fast_after: int = Field(3, ge=1, description="calls in a row refused with 401/403/402/404 stop it")
    connection_failures: int = Field(8, ge=1, description="attempts in a row that cannot connect stop it")
    cut_retries: int = Field(1, ge=0, description="resends of a call whose generation was cut (each charged)")


class LocalModelConfig(_Strict):
    """How a ``provider = "local"`` backbone loads its model (the ``local`` extra). Its ``model`` is a directory,
    a hub name, or ``"tiny"`` / ``"tiny:SEED"`` (3 layers of seeded random weights, for tests and the demo)."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when present, else the CPU"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="auto: bf16 on CUDA")
    context_tokens: int = Field(
        8192, ge=16, description="the most tokens of one pass, chat template included"
    )
    revision: str | None = Field(None, description="a hub branch, tag or commit")
    local_files_only: bool = Field(True, description="never reach the hub: a local or cached model only")
    trust_remote_code: bool = False


class ServeConfig(_Strict):
    """How a ``provider = "vllm"`` backbone serves itself (``[backbones.X.serve]``): rcarun starts one
    ``vllm serve`` per group of ``tensor_parallel`` GPUs, checks and supervises them (`rcarun.serving`)."""

    model: str = Field(min_length=1, description="hub name or model directory vLLM loads")
    gpus: tuple[int, ...] = Field(min_length=1, description="GPU indices, cut in order into replicas")
    tensor_parallel: int = Field(1, ge=1, description="GPUs per replica")
    max_model_len: int | None = Field(None, gt=0, description="default: the backbone's context_window")
    extra_args: tuple[str, ...] = Field((), description="more vllm serve flags, as written")
    command: str | tuple[str, ...] = Field(
        "vllm", description="the vllm program (a string: split as a shell)"
    )
    host: str = "127.0.0.1"
    port_base: int | None = Field(
        None, ge=1, le=65535, description="replica i on port_base + i; default: free"
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="per replica, to answer /health and /v1/models")
    restarts: int = Field(2, ge=0, description="restarts of each replica that dies mid-run")
    grace_s: float = Field(30.0, gt=0, description="after SIGTERM, before SIGKILL")
    env: dict[str, str] = Field(default_factory=dict, description="for every replica; never a key")

    @model_validator(mode="after")
    def _coherent(self) -> ServeConfig:
        for name, value in self.env.items():
            if any(part in name.lower() for part in _CREDENTIAL_HEADER_PARTS):
                raise FieldProblem(
                    f"a credential in the serve environment; {_USE_THE_ENVIRONMENT}", ("env", name)
                )
            _check_extra_value(value, ("env", name))
        if len(set(self.gpus)) != len(self.gpus) or any(gpu < 0 for gpu in self.gpus):
            raise FieldProblem(f"GPU indices must be distinct and >= 0, got {list(self.gpus)}", ("gpus",))
        if len(self.gpus) % self.tensor_parallel:
            raise FieldProblem(
                f"{len(self.gpus)} GPUs do not split into replicas of tensor_parallel = {self.tensor_parallel}",
                ("gpus",),
            )
        if self.port_base is not None and self.port_base + self.replicas - 1 > 65535:
            raise FieldProblem(f"port_base {self.port_base} leaves no port for every replica", ("port_base",))
        for index, arg in enumerate(self.extra_args):
            if arg.split("=", 1)[0] in _SERVE_RESERVED_FLAGS:
                where = ("extra_args", index)
                raise FieldProblem(
                    f"{arg} is set by rcarun for each replica; use the serve table's keys", where
                )
        if not self.command_argv:
            raise FieldProblem("command is empty", ("command",))
        return self

    @property
    def replicas(self) -> int:
        return len(self.gpus) // self.tensor_parallel

    @property
    def command_argv(self) -> tuple[str, ...]:
        return tuple(shlex.split(self.command)) if isinstance(self.command, str) else self.command


_TINY = re.compile(r"tiny(?::(-?[0-9]+))?")


def tiny_seed(model: str) -> int | None:
    """The seed of a ``"tiny"`` / ``"tiny:SEED"`` model name (0 for ``"tiny"``), None for any other name."""
    found = _TINY.fullmatch(model)
    if found is None:
        return None
    return int(found.group(1) or 0)


class BackboneConfig(_Strict):
    provider: str = Field(description="a provider preset (rcarun.backends.presets), or 'local'")
    model: str
    base_url: _HttpUrl | None = None
    base_urls: tuple[_HttpUrl, ...] = ()
    api_key_env: str | None = Field(None, description="NAME of the environment variable holding the key")
    transport: str = Field("aiohttp", description="a registered transport (rcarun.backends.transports)")
    stream: bool | None = Field(None, description="server-sent events; None: the preset's default (true)")
    timeout_s: float = Field(600.0, gt=0, description="longest silence before or within an answer, seconds")
    max_call_s: float = Field(10_800.0, gt=0, description="a whole call's deadline, seconds")
    max_response_mb: float = Field(32.0, gt=0, description="larger responses are stored as errors, MiB")
    balance: Literal["outstanding", "metrics", "affinity"] = Field(
        "outstanding", description="how calls spread over replicas (docs/performance.md)"
    )
    context_window: int | None = Field(None, gt=0)
    max_output_tokens: int | None = Field(None, gt=0)
    thinking: bool | None = None
    reasoning_effort: str | None = None
    supports_response_format: bool = True
    chars_per_token: float = Field(4.0, gt=0)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    extra_headers: dict[str, str] = Field(default_factory=dict)
    limits: LimitsConfig = LimitsConfig()
    prices: PricesConfig = PricesConfig()
    budget: SpendBudgetConfig = SpendBudgetConfig()
    retry: RetryConfig = RetryConfig()
    local: LocalModelConfig | None = Field(None, description="provider 'local' only: how the model loads")
    serve: ServeConfig | None = Field(None, description="provider 'vllm' only: rcarun starts the replicas")

    @model_validator(mode="after")
    def _one_endpoint_at_least(self) -> BackboneConfig:
        if self.serve is not None:
            if self.provider != "vllm":
                raise ValueError(
                    f"[serve] starts vLLM replicas: provider must be 'vllm', not {self.provider!r}"
                )
            if self.base_url or self.base_urls:
                raise ValueError(
                    "a backbone with [serve] gets its URLs from its replicas: remove base_url / base_urls"
                )
            window, served = self.context_window, self.serve.max_model_len
            if window is not None and served is not None and window != served:
                raise ValueError(
                    f"context_window ({window}) and serve.max_model_len ({served}) differ: the runner would cut "
                    "prompts to one window while the server holds another; make them equal (or set one)"
                )
            return self
        if self.prices.gpu_hour_usd:
            raise ValueError(
                "prices.gpu_hour_usd charges the GPU time of replicas rcarun runs: add a [serve] table, or leave "
                "the price out (the GPU time of servers started elsewhere is not known to rcarun)"
            )
        if self.provider == "local":
            # Forward passes on this machine: no endpoint, no key, nothing priced.
            if self.base_url or self.base_urls:
                raise ValueError("a local backbone runs on this machine: remove base_url / base_urls")
            if self.api_key_env is not None:
                raise ValueError("a local backbone needs no key: remove api_key_env")
            return self
        if self.local is not None:
            raise ValueError(f"[local] applies to provider 'local' only, not {self.provider!r}")
        if not self.base_url and not self.base_urls:
            raise ValueError("set base_url (or base_urls for several replicas)")
        if self.base_url and self.base_urls:
            raise ValueError("set either base_url or base_urls, not both")
        return self

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        # "local" runs a model in-process (`is_local`), through no preset.
        return _one_of(value, "provider", (*PRESETS, "local"))

    @field_validator("transport")
    @classmethod
    def _known_transport(cls, value: str) -> str:
        return _one_of(value, "transport", transport_names())

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_a_name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "").isalnum():
            # Guards against pasting the key itself where its variable name belongs.
            raise ValueError("api_key_env must be the NAME of an environment variable (letters, digits, _)")
        return value

    @field_validator("extra_headers")
    @classmethod
    def _no_credential_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if any(part in name.lower() for part in _CREDENTIAL_HEADER_PARTS):
                raise FieldProblem(f"a literal credential header; {_USE_THE_ENVIRONMENT}", (name,))
            _check_extra_value(value, (name,))
        return headers

    @field_validator("extra_body")
    @classmethod
    def _no_secrets_in_body(cls, body: dict[str, Any]) -> dict[str, Any]:
        _check_extra_value(body, ())
        return body

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The configured URLs (none for a managed backbone: its replicas' come when they are started)."""
        return self.base_urls or ((self.base_url,) if self.base_url else ())

    @property
    def is_managed(self) -> bool:
        """rcarun starts and stops this backbone's vLLM replicas (``[serve]``)."""
        return self.serve is not None

    @property
    def is_local(self) -> bool:
        """Forward passes over a model on this machine (methods that read a model), not chat over HTTP."""
        return self.provider == "local"

    @property
    def local_settings(self) -> LocalModelConfig:
        """The ``local`` table, its defaults where the config leaves it out."""
        return self.local or _DEFAULT_LOCAL

    @property
    def model_label(self) -> str:
        """The model as a table or a line should show it: a tiny model says it is random."""
        seed = tiny_seed(self.model) if self.is_local else None
        return (
            self.model
            if seed is None
            else f"{self.model} (random weights, seed {seed}: its answers mean nothing)"
        )


_DEFAULT_LOCAL = LocalModelConfig()


class StageConfig(_Strict):
    """Output budget policy of one stage (e.g. ``attribution``), overriding what the method asks for, except
    where the method's own settings fix the stage's budget (`first_budget`)."""

    max_tokens: int | None = Field(None, gt=0, description="first attempt's budget; None: the method's")
    length_retries: int = Field(1, ge=0, description="retries with the budget doubled after a length stop")
    length_cap: int = Field(65_536, gt=0)
    shareable: bool = Field(False, description="calls may be served from the cache across method labels")

    def first_budget(self, requested: int, *, method_sets_it: bool) -> int:
        """The first attempt's output budget: the method's own when its settings fix it (RCTA's presets, App. H;
        the sweep says so at start), else the stage's ``max_tokens``, else what the method asked for."""
        return requested if method_sets_it else self.max_tokens or requested


# A stage the sweep does not configure (frozen, so one instance serves every call).
_DEFAULT_STAGE = StageConfig()


class MethodConfig(_Strict):
    name: str
    label: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @property
    def resolved_label(self) -> str:
        return self.label or self.name


class SweepSection(_Strict):
    dataset: str
    manifest: str | None = Field(
        None, description=f"only the trajectories listed (a file, or {LONGRCA_MINI!r})"
    )
    realizations: int = Field(1, ge=1)
    cache: Literal["run", "db"] = Field(
        "run", description="serve finished calls from this run only, or any run"
    )
    strict_data: bool = False
    simulated: bool = Field(False, description="the backbones are rcarun's simulator (reports say so)")
    drain_timeout_s: float = Field(30.0, ge=0)
    write_wait_s: float = Field(
        120.0, ge=0, description="how long results.db may refuse writes before a stop"
    )
    lease_stale_s: float = Field(30.0, ge=2, description="a lease whose heartbeat is this old is taken over")
    items_in_flight: int | None = Field(
        None, ge=1, description="per backbone; default: concurrency and a quarter"
    )
    forward_cache: Literal["float16", "float32", "off"] = Field(
        "float16", description="how local backbones keep their passes beside results.db (`ForwardCache`)"
    )


class SweepConfig(_Strict):
    sweep: SweepSection
    methods: tuple[MethodConfig, ...]
    backbones: dict[str, BackboneConfig] = Field(default_factory=dict)
    backbones_file: str | None = None
    use: tuple[str, ...] = ()
    budget: SpendBudgetConfig = SpendBudgetConfig()
    stages: dict[str, StageConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _has_work(self) -> SweepConfig:
        if not self.methods:
            raise ValueError("no [[methods]] given")
        return self

    def stage(self, name: str) -> StageConfig:
        return self.stages.get(name) or _DEFAULT_STAGE
