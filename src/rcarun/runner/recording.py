"""What a sweep writes about its work: trajectory rows and data problems (once, whichever walk meets them
first), run events, and each item's fate (a prediction, or why there is none)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from rcarun.data import Record, task_key
from rcarun.errors import BudgetExhausted, DataError, RcarunError, StopRequested
from rcarun.methods import Attribution
from rcarun.runner.runtime import BackboneRuntime, RunContext, WorkItem
from rcarun.store import EventRow, ItemRow, ItemStatus, PredictionRow, TrajectoryRow, utc_timestamp
from rcarun.text import repair_surrogates

__all__ = ["TrajectoryRecorder", "Walk", "add_event", "error_leaves", "settle_item"]

# `json.dumps(output, ensure_ascii=False, default=str)` for every prediction, without an encoder built per call.
_OUTPUT_JSON = json.JSONEncoder(ensure_ascii=False, default=str)
# SQLite's INTEGER range: a step beyond it is no step of any trajectory.
_INT64 = range(-(2**63), 2**63)


def add_event(context: RunContext, kind: str, **detail: Any) -> None:
    context.writer.add_event(
        EventRow(
            run_id=context.run_id, kind=kind, detail_json=json.dumps(detail, sort_keys=True, default=str)
        )
    )


class TrajectoryRecorder:
    """Stores each trajectory's row and each data problem once, whichever backbone's producer meets it first.

    Every producer walks the dataset on its own, and every walk meets the same records and problems in the same
    order (`iter_dataset` reads in a fixed order, a manifest filters it the same way each time). So the recorder
    keeps no set of qids, which would grow with the dataset, only how far the furthest walk has come: a walk's
    n-th event is stored when no walk has passed n yet.
    """

    __slots__ = ("_context", "_furthest", "problems", "trajectories")

    def __init__(self, context: RunContext) -> None:
        self._context = context
        self._furthest = 0
        self.trajectories = 0
        self.problems = 0

    def walk(self) -> Walk:
        """A new walk of the dataset (one per producer), at its start."""
        return Walk(self)

    def claim(self, position: int) -> bool:
        """Whether a walk's event at ``position`` (1-based) is the first to get there, claiming it if so."""
        if position <= self._furthest:
            return False
        self._furthest = position
        return True

    def store_trajectory(self, record: Record) -> None:
        self.trajectories += 1
        trajectory = record.trajectory
        reference = record.reference
        self._context.writer.add_trajectory(
            TrajectoryRow(
                run_id=self._context.run_id,
                qid=trajectory.qid,
                source=trajectory.source,
                n_steps=trajectory.n_steps,
                roles_json=json.dumps(list(trajectory.agents)),
                ref_role=reference.role if reference else None,
                ref_step=reference.step if reference else None,
                sha256=trajectory.sha256,
                task_sha256=task_key(trajectory.task),
            )
        )

    def store_problem(self, error: DataError) -> None:
        self.problems += 1
        self._context.writer.add_event(
            EventRow(
                run_id=self._context.run_id,
                at=utc_timestamp(),
                kind="data_problem",
                detail_json=json.dumps(
                    {"path": error.path, "record": error.record, "field": error.field, "message": str(error)}
                ),
            )
        )


class Walk:
    """One producer's way through the dataset: how many records and problems it has met (its position)."""

    __slots__ = ("_position", "_recorder")

    def __init__(self, recorder: TrajectoryRecorder) -> None:
        self._recorder = recorder
        self._position = 0

    def record(self, record: Record) -> None:
        self._position += 1
        if self._recorder.claim(self._position):
            self._recorder.store_trajectory(record)

    def problem(self, error: DataError) -> None:
        self._position += 1
        if self._recorder.claim(self._position):
            self._recorder.store_problem(error)


async def settle_item(
    context: RunContext,
    runtime: BackboneRuntime,
    item: WorkItem,
    attribute: Callable[[], Awaitable[Attribution]],
    attempts: Callable[[], int],
) -> None:
    """Run one item's attribution and store what became of it: a prediction, or why there is none."""
    counters = runtime.counters
    writer = context.writer

    def set_item(status: ItemStatus, error: str | None = None) -> None:
        writer.set_item(
            ItemRow(**item.row_keys(context.run_id), status=status, error=error, attempts=attempts())
        )

    try:
        attribution = await _unwrapped(attribute())
    except BudgetExhausted as exc:
        counters.items_skipped_budget += 1
        set_item("skipped_budget", str(exc))
        if counters.items_skipped_budget == 1:
            context.announce(
                f"budget reached on backbone {runtime.name!r}: {exc}; its items left are skipped (skipped_budget): "
                "raise the budget and rerun the same sweep command to run them"
            )
            add_event(context, "budget_stop", backbone=runtime.name, message=str(exc))
        return
    except StopRequested as exc:
        counters.items_interrupted += 1
        set_item("interrupted", f"stopped before the item finished: {exc}"[:2000])
        return
    except asyncio.CancelledError:
        counters.items_interrupted += 1
        set_item("interrupted", "cancelled")
        raise
    except Exception as exc:  # a call's error, or a method's bug: the item's failure, never the sweep's
        counters.items_failed += 1
        kind = type(exc).__name__ if isinstance(exc, RcarunError) else f"unexpected {type(exc).__name__}"
        set_item("failed", f"{kind}: {exc}"[:2000])
        return
    _record_prediction(context, item, attribution)
    set_item("done")
    counters.items_done += 1


async def _unwrapped(attribution: Awaitable[Attribution]) -> Attribution:
    """``attribution``, with a task group's errors (a method that fans out: self-consistency, judge panels)
    turned into the one that decides the item's fate: a stop interrupts it, a spent budget skips it, and only
    otherwise does a call error fail it. One Ctrl-C raises a stop in every voter at once."""
    try:
        return await attribution
    except BaseExceptionGroup as group:
        leaves = list(error_leaves(group))
        for kind in (asyncio.CancelledError, StopRequested, BudgetExhausted, RcarunError):
            chosen = next((leaf for leaf in leaves if isinstance(leaf, kind)), None)
            if chosen is not None:
                raise chosen from group
        raise


def error_leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    """The errors of ``group`` and of the groups inside it, depth first."""
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from error_leaves(error)
        else:
            yield error


def _record_prediction(context: RunContext, item: WorkItem, attribution: Attribution) -> None:
    """The method's answer as results.db can hold it: text free of unpaired surrogates, and a step SQLite's
    INTEGER cannot hold stored as none, marked invalid (``output_json`` keeps the number as written)."""
    step = attribution.pred_step
    storable_step = step if step is None or step in _INT64 else None
    context.writer.add_prediction(
        PredictionRow(
            **item.row_keys(context.run_id),
            pred_role=repair_surrogates(attribution.pred_role) if attribution.pred_role is not None else None,
            pred_step=storable_step,
            role_valid=attribution.role_valid,
            step_valid=attribution.step_valid and storable_step is not None,
            abstained=attribution.abstained,
            output_json=repair_surrogates(_OUTPUT_JSON.encode(attribution.output)),
            error=repair_surrogates(attribution.error[:2000]) if attribution.error is not None else None,
            fallback=repair_surrogates(attribution.fallback[:2000])
            if attribution.fallback is not None
            else None,
        )
    )
