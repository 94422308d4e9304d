"""The drive of a local backbone (``provider = "local"``): per model-reading method (SOAP) and realization,
prepare once, then answer the items the preparation returns, through `ForwardSession`s."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rcarun.data import Manifest, Record
from rcarun.errors import ConfigError, RcarunError, StopRequested
from rcarun.methods import Method
from rcarun.methods.base import ModelReadingMethod, Preparation, TrajectorySet
from rcarun.runner.forward_session import FORWARD_STAGE, ForwardSession
from rcarun.runner.local_model import ForwardCache
from rcarun.runner.recording import TrajectoryRecorder, add_event, settle_item
from rcarun.runner.records import iter_records
from rcarun.runner.runtime import BackboneRuntime, RunContext, WorkItem
from rcarun.runner.wiring import methods_run_by
from rcarun.store import METHOD_PREPARED, ItemRow

__all__ = ["drive_local_backbone"]

# Items in flight on a local backbone: passes run one at a time on the model's thread; a second item ranks its
# steps (numpy) while the next pass runs.
_LOCAL_ITEMS_IN_FLIGHT = 2


async def drive_local_backbone(
    context: RunContext,
    runtime: BackboneRuntime,
    methods: list[Method],
    recorder: TrajectoryRecorder,
    manifest: Manifest | None,
    retry_failed: bool,
) -> None:
    """Prepare each model-reading method's realizations and answer their items.

    The dataset is walked once for the ids (recording trajectories as every producer does); a preparation and
    the items stream the records they need through `TrajectorySet.load`. Only the ids a preparation returns
    become items: a trajectory it learnt from (SOAP's reference and validation splits) is never predicted. A
    realization whose items were all finished in an earlier session is not prepared again.
    """
    local = runtime.local
    assert local is not None, "a local backbone has a model"
    readers = [m for m in methods_run_by(runtime, methods) if isinstance(m, ModelReadingMethod)]
    trajectories = await _walk_ids(context, recorder, manifest)
    if not trajectories.ids or not readers:
        return
    try:
        model = await local.get()
    except ConfigError as error:
        reason = f"{error}; its items are left for a resume (rerun the same sweep command)"
        if runtime.stop(reason):
            context.announce(reason)
            add_event(context, "backbone_stopped", backbone=runtime.name, message=str(error)[:600])
        return
    cache = context.forward_cache or ForwardCache(Path(), "off")

    def session(item: WorkItem, stage: str) -> ForwardSession:
        return ForwardSession(
            context, runtime, model, fingerprint=local.fingerprint, cache=cache, item=item, stage=stage
        )

    for method in readers:
        for realization in range(context.config.sweep.realizations):
            if context.stop.admission_stopped or runtime.stopped is not None:
                return
            cell = _Cell(context, runtime, method, realization, session)
            finished = _finished_qids(cell, trajectories.ids, retry_failed)
            prepared = _prepared_items(cell)
            if prepared is not None and prepared <= finished:
                continue  # every item of this realization is finished: nothing to prepare for
            try:
                preparation = await method.prepare(trajectories, cell.session_for, realization)
            except StopRequested:
                return
            except Exception as error:  # one line for every item of the realization; the sweep goes on
                _preparation_failed(cell, trajectories.ids, finished, error)
                continue
            _record_preparation(cell, preparation, len(trajectories.ids))
            pending = [qid for qid in preparation.items if qid not in finished]
            await _answer_local_items(cell, preparation, pending, trajectories.load)


@dataclass(frozen=True, slots=True)
class _Cell:
    """One model-reading method's realization on a local backbone: what its preparation and items share."""

    context: RunContext
    runtime: BackboneRuntime
    method: ModelReadingMethod
    realization: int
    session: Callable[[WorkItem, str], ForwardSession]

    def item(self, qid: str) -> WorkItem:
        return WorkItem(self.runtime.name, self.method.label, qid, self.realization)

    def session_for(self, qid: str, stage: str) -> ForwardSession:
        return self.session(self.item(qid), stage)


async def _walk_ids(
    context: RunContext, recorder: TrajectoryRecorder, manifest: Manifest | None
) -> TrajectorySet:
    """One walk of the dataset for its ids and sources; the records themselves are loaded again when needed."""
    walk = recorder.walk()
    ids: list[str] = []
    sources: list[str] = []
    records = iter_records(context.config, manifest, walk.problem)
    for walked, record in enumerate(itertools.islice(records, context.limit), start=1):
        walk.record(record)
        ids.append(record.trajectory.qid)
        sources.append(record.trajectory.source)
        if walked % 64 == 0:
            await asyncio.sleep(0)

    def load(wanted: Collection[str]) -> Iterator[Record]:
        chosen = frozenset(wanted)
        records = iter_records(context.config, manifest, lambda _problem: None)
        return (r for r in itertools.islice(records, context.limit) if r.trajectory.qid in chosen)

    return TrajectorySet(ids=tuple(ids), sources=tuple(sources), load=load)


async def _answer_local_items(
    cell: _Cell,
    preparation: Preparation,
    pending: Sequence[str],
    load: Callable[[Collection[str]], Iterator[Record]],
) -> None:
    if not pending:
        return
    context, runtime = cell.context, cell.runtime
    queue: asyncio.Queue[Record | None] = asyncio.Queue(maxsize=_LOCAL_ITEMS_IN_FLIGHT)
    workers = context.config.sweep.items_in_flight or _LOCAL_ITEMS_IN_FLIGHT

    async def produce() -> None:
        for record in load(pending):
            if context.stop.admission_stopped or runtime.stopped is not None:
                break
            await queue.put(record)
        for _ in range(workers):
            await queue.put(None)

    async def answer(record: Record) -> None:
        item = cell.item(record.trajectory.qid)
        forward = cell.session(item, FORWARD_STAGE)
        await settle_item(
            context,
            runtime,
            item,
            lambda: preparation.attribute(record.trajectory, forward),
            lambda: forward.passes,
        )

    async def work() -> None:
        while (record := await queue.get()) is not None:
            if context.stop.admission_stopped or runtime.stopped is not None:
                continue  # no row: the item runs on resume
            await answer(record)
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        group.create_task(produce())
        for _ in range(workers):
            group.create_task(work())


def _finished_qids(cell: _Cell, ids: Sequence[str], retry_failed: bool) -> frozenset[str]:
    store, run_id, backbone = cell.context.store, cell.context.run_id, cell.runtime.name
    if store.count_finished_items(run_id, backbone, include_failed=not retry_failed) == 0:
        return frozenset()
    return frozenset(
        qid
        for qid in ids
        if cell.realization
        in store.finished_realizations(
            run_id, backbone, cell.method.label, qid, include_failed=not retry_failed
        )
    )


def _prepared_items(cell: _Cell) -> frozenset[str] | None:
    """The items an earlier session's preparation of this realization returned, None when there was none."""
    found: frozenset[str] | None = None
    wanted = (cell.runtime.name, cell.method.label, cell.realization)
    for event in cell.context.store.events(cell.context.run_id):
        if event.kind != METHOD_PREPARED:
            continue
        detail = json.loads(event.detail_json)
        if (detail.get("backbone"), detail.get("method"), detail.get("realization")) == wanted:
            found = frozenset(str(qid) for qid in detail.get("items", ()))
    return found


def _record_preparation(cell: _Cell, preparation: Preparation, n_ids: int) -> None:
    """The preparation as a ``method_prepared`` event (its items: what the report scores this cell on), and the
    progress total less the trajectories that are not items."""
    add_event(
        cell.context,
        METHOD_PREPARED,
        backbone=cell.runtime.name,
        method=cell.method.label,
        realization=cell.realization,
        items=list(preparation.items),
        **preparation.detail,
    )
    cell.runtime.counters.items_total -= n_ids - len(preparation.items)


def _preparation_failed(cell: _Cell, ids: Sequence[str], finished: Collection[str], error: Exception) -> None:
    """Every unfinished item of the realization fails with the reason, in one line (its split is unknown, so
    every trajectory is one of its items); ``--retry-failed`` prepares it again."""
    context, label = cell.context, cell.method.label
    kind = type(error).__name__ if isinstance(error, RcarunError) else f"unexpected {type(error).__name__}"
    message = (
        f"{label} could not prepare realization {cell.realization}: {kind}: {' '.join(str(error).split())}"
    )
    context.announce(message[:600])
    add_event(
        context,
        "method_prepare_failed",
        backbone=cell.runtime.name,
        method=label,
        realization=cell.realization,
        message=message[:2000],
    )
    for qid in ids:
        if qid not in finished:
            cell.runtime.counters.items_failed += 1
            row_keys = cell.item(qid).row_keys(context.run_id)
            context.writer.set_item(ItemRow(**row_keys, status="failed", error=message[:2000], attempts=0))
