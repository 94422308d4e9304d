"""The live objects of one sweep: what every work item shares (run context) and what each backbone owns.

Kept apart from the scheduler so that the session — the `LLM` a method sees — depends on plain state, not on the
loop that feeds items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from rcarun.backends import Backend
from rcarun.budgets import BackboneGate
from rcarun.errors import CallError, RateLimited
from rcarun.runner.config import BackboneConfig, SweepConfig
from rcarun.store import Store, StoreWriter

__all__ = ["BackboneCounters", "BackboneRuntime", "RowKeys", "RunContext", "StopController", "WorkItem"]


class RowKeys(TypedDict):
    run_id: int
    item_id: str
    backbone: str
    method: str
    qid: str
    realization: int


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One unit of a sweep: method × backbone × trajectory × realization."""

    backbone: str
    method: str
    qid: str
    realization: int

    @property
    def item_id(self) -> str:
        return f"{self.backbone}|{self.method}|{self.qid}|r{self.realization}"

    def row_keys(self, run_id: int) -> RowKeys:
        """The columns that name this item in every results.db row about it (calls, items, predictions)."""
        return {
            "run_id": run_id,
            "item_id": self.item_id,
            "backbone": self.backbone,
            "method": self.method,
            "qid": self.qid,
            "realization": self.realization,
        }


class StopController:
    """Graceful stop: the first request stops admission (in-flight calls drain), a later one cancels."""

    def __init__(self) -> None:
        self.admission_stopped = False
        self.reason = ""

    def stop_admission(self, reason: str) -> None:
        if not self.admission_stopped:
            self.admission_stopped = True
            self.reason = reason


@dataclass(slots=True)
class BackboneCounters:
    """What the progress bar and the end-of-run table show for one backbone (this session only)."""

    items_total: int = 0
    # Items earlier sessions of the run finished (resume skips them); the counts below are this session's.
    items_finished_before: int = 0
    items_done: int = 0
    items_failed: int = 0
    items_skipped_budget: int = 0
    items_interrupted: int = 0
    cached_calls: int = 0
    rate_limited: int = 0
    errors: int = 0
    length_retries: int = 0

    def record_error(self, error: CallError) -> None:
        if isinstance(error, RateLimited):
            self.rate_limited += 1
        else:
            self.errors += 1


@dataclass(slots=True)
class BackboneRuntime:
    name: str
    config: BackboneConfig
    backend: Backend
    gate: BackboneGate
    counters: BackboneCounters = field(default_factory=BackboneCounters)


@dataclass(slots=True)
class RunContext:
    config: SweepConfig
    run_id: int
    store: Store
    writer: StoreWriter
    stop: StopController
    # False when no earlier attempt could be served (a fresh run): every lookup would miss, so none is made.
    cache_lookups: bool = True
