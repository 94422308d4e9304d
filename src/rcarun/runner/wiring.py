"""Config → runtime: the methods, prices, budgets, backends and gates a sweep's configuration asks for, checked
and built before the first call (a config that cannot run is refused before the run row exists)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import time

from rcarun.backends import (
    Backend,
    BackendSettings,
    CallProgress,
    ChatRequest,
    ChatResult,
    Usage,
    get_preset,
)
from rcarun.budgets import (
    BackboneGate,
    BackboneLimits,
    Budget,
    Price,
    PriceTable,
    PriceWindow,
    RetryPolicy,
    SpendLedger,
    TokenEstimator,
)
from rcarun.errors import ConfigError, FatalCallError
from rcarun.methods import Method, create_method, home_backbone
from rcarun.methods.base import ModelReadingMethod
from rcarun.runner.config import BackboneConfig, SweepConfig
from rcarun.runner.local_model import LocalModel
from rcarun.runner.runtime import BackboneRuntime
from rcarun.store import BackboneSummary

__all__ = [
    "BackendFactory",
    "backend_settings",
    "build_ledger",
    "build_prices",
    "build_runtimes",
    "check_backbones_ready",
    "check_method_backbones",
    "create_methods",
    "methods_run_by",
    "stage_budget_notes",
]

BackendFactory = Callable[[BackendSettings], Backend]

_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# A managed backbone's URLs exist once its replicas are up; checking its key variable needs none of them.
_NOT_SERVED_YET = ("http://127.0.0.1/v1",)


def create_methods(config: SweepConfig) -> list[Method]:
    """The sweep's methods, checked against its backbones (`check_method_backbones`) and for unique labels."""
    methods = [create_method(m.name, label=m.resolved_label, options=m.options) for m in config.methods]
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"method labels must be unique within a sweep, got {labels}")
    check_method_backbones(methods, config)
    return methods


def check_method_backbones(methods: Sequence[Method], config: SweepConfig) -> None:
    """Every method has a backbone that can run it, and every backbone a method it can run.

    A method naming its own backbones (a judge panel) may name only chat backbones the sweep defines. A method
    that reads a model (``reads_model``, SOAP) runs only on ``provider = "local"`` backbones, a chat method only
    on the others: a sweep that would silently run nothing on one side is refused.

    Raises:
        ConfigError: one line naming the methods or backbones.
    """
    for method in methods:
        unknown = [name for name in method.backbones if name not in config.backbones]
        if unknown:
            raise ConfigError(
                f"method {method.label!r} names backbones the sweep does not define: {unknown} "
                f"(defined: {sorted(config.backbones)})"
            )
        local = [name for name in method.backbones if config.backbones[name].is_local]
        if local:
            raise ConfigError(
                f"method {method.label!r} names local backbones {local}, which run forward passes, not chat"
            )
        if method.reads_model and not isinstance(method, ModelReadingMethod):
            raise ConfigError(f"method {method.label!r} says it reads a model but has no prepare step")
    local_backbones = sorted(name for name, backbone in config.backbones.items() if backbone.is_local)
    chat_backbones = sorted(name for name, backbone in config.backbones.items() if not backbone.is_local)
    stranded = [m.label for m in methods if not (local_backbones if m.reads_model else chat_backbones)]
    if stranded:
        raise ConfigError(
            f"no backbone of the sweep can run {stranded}: a method that reads a model's internals (SOAP) "
            f"runs on a backbone with provider = 'local' (here: {local_backbones or 'none'}), a chat method "
            f"on the others (here: {chat_backbones or 'none'})"
        )
    if local_backbones and not any(m.reads_model for m in methods):
        raise ConfigError(
            f"local backbones {local_backbones} have no method to run: only methods that read a model (soap) "
            "run on provider = 'local'"
        )


def stage_budget_notes(methods: Sequence[Method], config: SweepConfig) -> list[str]:
    """One line per method whose own settings fix a stage's budget where the sweep's stage table sets another:
    the method's wins (`StageConfig.first_budget`), and the line says so, so the override is never silent."""
    notes = []
    for method in methods:
        for stage, budget in method.stage_budgets.items():
            table = config.stages.get(stage)
            if table is not None and table.max_tokens is not None and table.max_tokens != budget:
                notes.append(
                    f"[stages.{stage}] max_tokens = {table.max_tokens} does not apply to method {method.label!r}, "
                    f"whose own settings give {stage} {budget:,} tokens (they win; change the method's options "
                    "to change it)"
                )
    return notes


def methods_run_by(runtime: BackboneRuntime, methods: Sequence[Method]) -> list[Method]:
    """The methods whose items this backbone's workers run: those of its kind (model-reading methods on a local
    backbone, chat methods elsewhere), except those homed on another backbone."""
    local = runtime.local is not None
    return [m for m in methods if m.reads_model == local and home_backbone(m) in (None, runtime.name)]


def check_backbones_ready(config: SweepConfig) -> None:
    """Every key variable is set and the ``local`` extra installed where needed (else one ConfigError line)."""
    for name, backbone in config.backbones.items():
        if not backbone.is_local:
            backend_settings(name, backbone, pool_size=backbone.limits.concurrency).read_api_key()
    if any(backbone.is_local for backbone in config.backbones.values()):
        from rcarun.backends.local import require_local_extra

        require_local_extra()


def build_prices(config: BackboneConfig) -> PriceTable:
    prices = config.prices

    def price(input_: float, cached: float | None, output: float) -> Price:
        return Price(
            input_per_mtok=input_,
            cached_input_per_mtok=input_ if cached is None else cached,
            output_per_mtok=output,
        )

    windows = tuple(
        PriceWindow(
            start=time.fromisoformat(window.start),
            end=time.fromisoformat(window.end),
            weekdays=(
                frozenset(_WEEKDAYS.index(day) for day in window.weekdays)
                if window.weekdays is not None
                else None
            ),
            price=price(window.input_per_mtok, window.cached_input_per_mtok, window.output_per_mtok),
        )
        for window in prices.windows
    )
    return PriceTable(
        default=price(prices.input_per_mtok, prices.cached_input_per_mtok, prices.output_per_mtok),
        windows=windows,
    )


def build_ledger(config: SweepConfig, spent: Iterable[BackboneSummary]) -> SpendLedger:
    """The run's budgets, charged with what earlier sessions of the run spent (budgets are per run)."""
    ledger = SpendLedger(
        overall=Budget(max_usd=config.budget.max_usd, max_tokens=config.budget.max_tokens),
        per_backbone={
            name: Budget(max_usd=backbone.budget.max_usd, max_tokens=backbone.budget.max_tokens)
            for name, backbone in config.backbones.items()
        },
    )
    for summary in spent:
        ledger.record_prior_spend(
            summary.backbone,
            usd=summary.cost_usd,
            usage=Usage(
                prompt_tokens=summary.prompt_tokens,
                cached_prompt_tokens=summary.cached_tokens,
                completion_tokens=summary.completion_tokens,
                reasoning_tokens=summary.reasoning_tokens,
            ),
        )
    return ledger


def backend_settings(
    name: str, config: BackboneConfig, pool_size: int, base_urls: tuple[str, ...] = ()
) -> BackendSettings:
    return BackendSettings(
        name=name,
        provider=config.provider,
        model=config.model,
        base_urls=base_urls or config.endpoints or _NOT_SERVED_YET,
        api_key_env=config.api_key_env,
        transport=config.transport,
        timeout_s=config.timeout_s,
        max_call_s=config.max_call_s,
        max_response_bytes=round(config.max_response_mb * 2**20),
        stream=config.stream,
        pool_size=pool_size,
        thinking=config.thinking,
        reasoning_effort=config.reasoning_effort,
        extra_body=config.extra_body,
        extra_headers=config.extra_headers,
        supports_response_format=config.supports_response_format,
    )


def build_runtimes(
    config: SweepConfig,
    ledger: SpendLedger,
    backend_factory: BackendFactory,
    served: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, BackboneRuntime]:
    """Each backbone's backend and gate; ``served`` gives a managed backbone's replica URLs."""
    runtimes: dict[str, BackboneRuntime] = {}
    for name, backbone in config.backbones.items():
        if backbone.is_local:
            runtimes[name] = _local_runtime(name, backbone, ledger)
            continue
        limits = backbone.limits
        preset = get_preset(backbone.provider)
        gate = BackboneGate(
            name,
            BackboneLimits(
                concurrency=limits.concurrency,
                rpm=limits.rpm,
                tpm=limits.tpm,
                burst_s=limits.burst_s,
                min_concurrency=limits.min_concurrency,
                arrival_jitter_s=limits.arrival_jitter_s,
                meters_output_budget=(
                    limits.meters_output_budget
                    if limits.meters_output_budget is not None
                    else preset.meters_output_budget
                ),
                learns_from_refusals=preset.refusals_count_a_window,
                window_s=limits.window_s,
            ),
            retry=RetryPolicy(
                max_attempts=backbone.retry.max_attempts,
                base_s=backbone.retry.base_s,
                cap_s=backbone.retry.cap_s,
                max_pause_s=backbone.retry.max_pause_s,
            ),
            ledger=ledger,
            prices=build_prices(backbone),
            # The declared characters per token start the bytes-per-token ratio: the same on ASCII text.
            estimator=TokenEstimator(backbone.chars_per_token),
        )
        settings = backend_settings(
            name, backbone, pool_size=limits.concurrency, base_urls=(served or {}).get(name, ())
        )
        runtimes[name] = BackboneRuntime(
            name=name, config=backbone, backend=backend_factory(settings), gate=gate
        )
    return runtimes


class _NoChat:
    """The backend of a local backbone, which runs forward passes, never chat (`check_method_backbones` makes
    sure of it, so this answer would be a bug of the runner)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def chat(self, request: ChatRequest, progress: CallProgress | None = None) -> ChatResult:
        raise FatalCallError(f"backbone {self.name!r} is local: it runs forward passes, not chat")

    async def aclose(self) -> None:
        return None


def _local_runtime(name: str, backbone: BackboneConfig, ledger: SpendLedger) -> BackboneRuntime:
    """A local backbone's runtime: its model (loaded on first use) and a gate that limits nothing (no provider,
    no prices; passes run one at a time on the model's thread)."""
    gate = BackboneGate(
        name,
        BackboneLimits(concurrency=1),
        retry=RetryPolicy(max_attempts=1),
        ledger=ledger,
        prices=build_prices(backbone),
        estimator=TokenEstimator(backbone.chars_per_token),
    )
    return BackboneRuntime(
        name=name, config=backbone, backend=_NoChat(name), gate=gate, local=LocalModel(name, backbone)
    )
