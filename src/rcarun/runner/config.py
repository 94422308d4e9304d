"""Sweep and backbone configuration: TOML files parsed into typed models, unknown keys rejected.

A sweep names a dataset, methods (with options), backbones, realizations, spend budgets and per-stage output
budgets. Backbones are defined inline (``[backbones.NAME]``) or taken by name from a shared backbones file
(``backbones_file`` + ``use``), so one ``configs/backbones.toml`` with endpoints, limits and prices serves every
sweep. ``sweep.manifest`` restricts a sweep to the trajectories a manifest lists (``"longrca-mini"`` names the
official LongRCA-Mini list shipped with rcarun). Relative paths are resolved against the config file's directory. API keys never appear here: only the
*name* of the environment variable that holds each key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rcarun.data import LONGRCA_MINI
from rcarun.errors import ConfigError
from rcarun.methods import create_method

__all__ = [
    "BackboneConfig",
    "LimitsConfig",
    "MethodConfig",
    "PriceWindowConfig",
    "PricesConfig",
    "RetryConfig",
    "SpendBudgetConfig",
    "StageConfig",
    "SweepConfig",
    "SweepSection",
    "load_backbones_file",
    "load_sweep_config",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsConfig(_Strict):
    """What the provider allows this account for this model; the runner never exceeds it."""

    concurrency: int = Field(16, ge=1, description="in-flight calls (DeepSeek's limit is exactly this)")
    min_concurrency: int = Field(1, ge=1)
    rpm: float | None = Field(None, gt=0, description="requests per minute")
    tpm: float | None = Field(None, gt=0, description="tokens per minute (prompt + completion)")
    burst_s: float = Field(2.0, gt=0, le=10, description="seconds of quota that may go out at once")
    arrival_jitter_s: float = Field(0.05, ge=0, description="burst held back for gaps shrinking in transit")
    meters_output_budget: bool | None = Field(
        None, description="the provider counts max_tokens against tpm at arrival; None: the preset's answer"
    )


class PriceWindowConfig(_Strict):
    """A time-of-day window (UTC, may wrap midnight) with its own prices, e.g. DeepSeek's off-peak discount."""

    start: str
    end: str
    weekdays: tuple[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], ...] | None = Field(
        None, description="UTC days the window starts on; None: every day"
    )
    input_per_mtok: float = Field(ge=0)
    cached_input_per_mtok: float | None = Field(None, ge=0)
    output_per_mtok: float = Field(ge=0)


class PricesConfig(_Strict):
    """USD per million tokens. ``taken`` records the date the prices were read off the provider's page."""

    input_per_mtok: float = Field(0.0, ge=0)
    cached_input_per_mtok: float | None = Field(None, ge=0)
    output_per_mtok: float = Field(0.0, ge=0)
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


class BackboneConfig(_Strict):
    provider: Literal["openai", "deepseek", "kimi", "vllm", "simulated", "openai-compatible"]
    model: str
    base_url: str | None = None
    base_urls: tuple[str, ...] = ()
    api_key_env: str | None = Field(None, description="NAME of the environment variable holding the key")
    transport: Literal["aiohttp", "openai-sdk"] = "aiohttp"
    timeout_s: float = Field(600.0, gt=0)
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

    @model_validator(mode="after")
    def _one_endpoint_at_least(self) -> BackboneConfig:
        if not self.base_url and not self.base_urls:
            raise ValueError("set base_url (or base_urls for several replicas)")
        if self.base_url and self.base_urls:
            raise ValueError("set either base_url or base_urls, not both")
        return self

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_a_name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "").isalnum():
            # Guards against pasting the key itself where its variable name belongs.
            raise ValueError("api_key_env must be the NAME of an environment variable (letters, digits, _)")
        return value

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self.base_urls or ((self.base_url,) if self.base_url else ())


class StageConfig(_Strict):
    """Output budget policy of one stage (e.g. ``attribution``), overriding what the method asks for."""

    max_tokens: int | None = Field(None, gt=0, description="first attempt's budget; None keeps the method's")
    length_retries: int = Field(1, ge=0, description="retries with the budget doubled after a length stop")
    length_cap: int = Field(65_536, gt=0)
    shareable: bool = Field(False, description="calls may be served from the cache across method labels")


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
        None,
        description=f"run only the trajectories a manifest lists (a file, or {LONGRCA_MINI!r} for the official list)",
    )
    realizations: int = Field(1, ge=1)
    cache: Literal["run", "db"] = Field(
        "run", description="serve finished calls from this run only, or any run"
    )
    strict_data: bool = False
    simulated: bool = Field(
        False,
        description="the backbones are rcarun's simulator (reports say so); implied by provider 'simulated'",
    )
    drain_timeout_s: float = Field(30.0, ge=0)
    items_in_flight: int | None = Field(
        None, ge=1, description="per backbone; default: its concurrency plus a quarter, to keep calls busy"
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
        return self.stages.get(name) or StageConfig()


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _explain(path: Path, exc: ValidationError, table: str = "") -> ConfigError:
    problems = "; ".join(
        f"{'.'.join(str(part) for part in ((table,) if table else ()) + tuple(error['loc'])) or '(top)'}: "
        f"{error['msg']}"
        for error in exc.errors()
    )
    return ConfigError(f"{path}: {problems}")


def load_backbones_file(path: Path) -> dict[str, BackboneConfig]:
    """Every ``[NAME]`` table of a backbones file, validated."""
    raw = _read_toml(path)
    backbones: dict[str, BackboneConfig] = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {name!r} must be a table")
        try:
            backbones[name] = BackboneConfig.model_validate(table)
        except ValidationError as exc:
            raise _explain(path, exc, table=name) from None
    return backbones


def load_sweep_config(path: Path) -> SweepConfig:
    """Parse a sweep TOML, pull the named backbones from ``backbones_file`` and resolve relative paths."""
    raw = _read_toml(path)
    try:
        config = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        raise _explain(path, exc) from None
    for index, method in enumerate(config.methods):
        try:  # an unknown name or a bad option is a config error, found before any run exists
            create_method(method.name, label=method.resolved_label, options=method.options)
        except ConfigError as exc:
            raise ConfigError(f"{path}: methods[{index}]: {exc}") from None
    base = path.parent
    backbones = dict(config.backbones)
    if config.backbones_file:
        shared = load_backbones_file((base / config.backbones_file).resolve())
        wanted = config.use or tuple(shared)
        missing = [name for name in wanted if name not in shared]
        if missing:
            raise ConfigError(f"{path}: use names backbones not in {config.backbones_file}: {missing}")
        for name in wanted:
            if name in backbones:
                raise ConfigError(f"{path}: backbone {name!r} defined inline and in {config.backbones_file}")
            backbones[name] = shared[name]
    elif config.use:
        raise ConfigError(f"{path}: 'use' needs a backbones_file")
    if not backbones:
        raise ConfigError(f"{path}: no backbones (define [backbones.NAME] or backbones_file + use)")
    sweep_update = {"dataset": str((base / config.sweep.dataset).resolve())}
    if config.sweep.manifest is not None and config.sweep.manifest != LONGRCA_MINI:
        sweep_update["manifest"] = str((base / config.sweep.manifest).resolve())
    return config.model_copy(
        update={"backbones": backbones, "sweep": config.sweep.model_copy(update=sweep_update)}
    )
