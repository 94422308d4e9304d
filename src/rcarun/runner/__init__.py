"""The sweep engine: config, work items, the per-item `LLM` session, call cache, scheduler, progress, resume."""

from rcarun.errors import StopRequested  # exported here too: the runner raises it
from rcarun.runner.answers import parse_json_answer
from rcarun.runner.cache import call_cache_key
from rcarun.runner.config import (
    BackboneConfig,
    LimitsConfig,
    MethodConfig,
    PricesConfig,
    SpendBudgetConfig,
    StageConfig,
    SweepConfig,
    SweepSection,
)
from rcarun.runner.loading import load_backbones_file, load_sweep_config, narrow_sweep
from rcarun.runner.runtime import BackboneCounters, StopController, WorkItem
from rcarun.runner.scheduler import SweepOutcome, run_sweep
from rcarun.runner.session import ItemSession
from rcarun.runner.wiring import build_prices

__all__ = [
    "BackboneConfig",
    "BackboneCounters",
    "ItemSession",
    "LimitsConfig",
    "MethodConfig",
    "PricesConfig",
    "SpendBudgetConfig",
    "StageConfig",
    "StopController",
    "StopRequested",
    "SweepConfig",
    "SweepOutcome",
    "SweepSection",
    "WorkItem",
    "build_prices",
    "call_cache_key",
    "load_backbones_file",
    "load_sweep_config",
    "narrow_sweep",
    "parse_json_answer",
    "run_sweep",
]
