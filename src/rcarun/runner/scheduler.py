"""The sweep: expand method × backbone × trajectory × realization lazily and run each item once.

Each backbone has its own producer and workers, so a slow one never holds back the others, and a bounded queue,
so memory grows with the work in flight, not with the sweep. Finished items are skipped: that is all resume
needs (calls inside an interrupted item are served from the call cache). A stop (Ctrl-C, a backbone's own, or
results.db refusing writes) ends admission; calls in flight finish and are recorded, unfinished items are marked
``interrupted``. The run's lease (`rcarun.store.LeaseKeeper`) refuses a second process on the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rcarun.backends import create_backend
from rcarun.budgets import SpendLedger
from rcarun.data import Manifest, Record, count_entries
from rcarun.errors import ConfigError, DataError, RcarunError, StoreError
from rcarun.methods import Method
from rcarun.runner.config import SweepConfig
from rcarun.runner.drift import answer_changes
from rcarun.runner.local_drive import drive_local_backbone
from rcarun.runner.local_model import ForwardCache, forward_cache_dir
from rcarun.runner.managed import managed_backbones, replica_balancing
from rcarun.runner.progress import ProgressBoard
from rcarun.runner.recording import TrajectoryRecorder, error_leaves, settle_item
from rcarun.runner.records import load_sweep_manifest, read_ahead
from rcarun.runner.runtime import (
    BackboneCounters,
    BackboneRuntime,
    RunContext,
    StopController,
    WorkItem,
    WritePause,
    announce_line,
)
from rcarun.runner.session import ItemSession
from rcarun.runner.wiring import (
    BackendFactory,
    build_ledger,
    build_runtimes,
    check_backbones_ready,
    create_methods,
    methods_run_by,
    stage_budget_notes,
)
from rcarun.serving import ManagedReplicas, replica_log_dir
from rcarun.store import (
    EventRow,
    LeaseHolder,
    LeaseKeeper,
    RunStatus,
    Store,
    StoreWriter,
    open_store,
    take_up_spill,
    this_process,
)

__all__ = ["SweepOutcome", "run_sweep"]


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    run_id: int
    run_name: str
    status: str
    trajectories: int
    data_problems: int
    counters: dict[str, BackboneCounters]
    # Why the run stopped early, when it did: the run-wide reason (Ctrl-C, writes failing) or per backbone.
    stop_reasons: tuple[str, ...] = ()


async def run_sweep(
    config: SweepConfig,
    *,
    db_path: Path | str,
    run_name: str,
    stop: StopController | None = None,
    show_progress: bool = True,
    retry_failed: bool = False,
    backend_factory: BackendFactory = create_backend,
    limit: int | None = None,
    accept_config_change: bool = False,
) -> SweepOutcome:
    """Run (or resume) the sweep named ``run_name`` into ``db_path``.

    ``retry_failed`` runs failed items again; ``limit`` runs only the first N usable trajectories (a smoke run
    that a later full run resumes). A resume whose answer-deciding settings differ from the run's is refused
    (`rcarun.runner.drift`) unless ``accept_config_change``.

    Raises:
        ConfigError: the config cannot be run (unknown method, duplicate labels, missing key variable, settings
            that would mix two configurations in one run).
        DataError: the dataset is unusable (or a record is bad and ``strict_data`` is set).
        RunBusy: another live process sweeps this run.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    methods = create_methods(config)
    for note in stage_budget_notes(methods, config):
        announce_line(note)
    manifest, entries = _count_entries(config, limit)
    check_backbones_ready(config)
    sweep = _Sweep(
        config=config,
        db_path=Path(db_path),
        run_name=run_name,
        stop=stop or StopController(),
        methods=methods,
        manifest=manifest,
        entries=entries,
        limit=limit,
        retry_failed=retry_failed,
        show_progress=show_progress,
        backend_factory=backend_factory,
    )
    return await sweep.run(accept_config_change)


def _count_entries(config: SweepConfig, limit: int | None) -> tuple[Manifest | None, int]:
    """The manifest (if any) and how many trajectories the sweep will read at most."""
    if not Path(config.sweep.dataset).exists():
        raise ConfigError(f"sweep.dataset: {config.sweep.dataset}: no such file or directory")
    manifest = load_sweep_manifest(config)
    entries = len(manifest.records) if manifest is not None else count_entries(config.sweep.dataset)
    if entries == 0:
        raise DataError("no trajectories found", path=config.sweep.dataset)
    return manifest, entries if limit is None else min(entries, limit)


@dataclass(slots=True)
class _Sweep:
    """One session of a run as a sequence of steps, holding what they and the writer's, the lease's and the
    replicas' callbacks share."""

    config: SweepConfig
    db_path: Path
    run_name: str
    stop: StopController
    methods: list[Method]
    manifest: Manifest | None
    entries: int
    limit: int | None
    retry_failed: bool
    show_progress: bool
    backend_factory: BackendFactory
    me: LeaseHolder = field(default_factory=this_process)
    run_id: int = 0
    writer: StoreWriter | None = None
    # Nothing new is sent while answers cannot be kept; what is in flight still lands in the writer.
    write_pause: WritePause = field(init=False)

    def __post_init__(self) -> None:
        self.write_pause = WritePause(self.stop, announce_line, self.config.sweep.write_wait_s)

    async def run(self, accept_config_change: bool) -> SweepOutcome:
        store = open_store(self.db_path)
        keeper: LeaseKeeper | None = None
        try:
            self.run_id = self._open_run(store, accept_config_change)
            keeper = self._lease_keeper()
            keeper.start()
            self.stop.on_exit(lambda: keeper.release(timeout_s=2.0) if keeper is not None else None)
            # Rows a full disk left in a spill file are the run's before anything reads what it has done.
            for line in await asyncio.to_thread(take_up_spill, self.db_path, self.run_id):
                announce_line(line)
            ledger = build_ledger(self.config, store.backbone_summary(self.run_id))
            runtimes, recorder = await self._sweep(store, ledger)
            status = _final_status(self.stop, runtimes)
            store.set_run_status(self.run_id, status)
            return SweepOutcome(
                run_id=self.run_id,
                run_name=self.run_name,
                status=status,
                trajectories=recorder.trajectories,
                data_problems=recorder.problems,
                counters={name: runtime.counters for name, runtime in runtimes.items()},
                stop_reasons=_stop_reasons(self.stop, runtimes),
            )
        except BaseException:
            with contextlib.suppress(Exception):
                run = store.run_by_name(self.run_name)
                if run is not None and keeper is not None:  # a refused second sweep leaves the run as it was
                    store.set_run_status(run.run_id, "stopped")
            raise
        finally:
            if keeper is not None:
                keeper.release()
            store.close()

    def _open_run(self, store: Store, accept_config_change: bool) -> int:
        existing = store.run_by_name(self.run_name)
        changes = answer_changes(existing.config_json, self.config) if existing is not None else []
        if changes and not accept_config_change:
            raise ConfigError(
                f"run {self.run_name!r} was started with other settings that decide its answers "
                f"({'; '.join(changes)}); resuming would mix two configurations in one run. Start a new run "
                "(--run ANOTHER_NAME), or pass --accept-config-change to resume it with the new settings knowingly"
            )
        # Claimed in the same transaction that opens the run: a second sweep of the run is refused unchanged.
        return store.get_or_create_run(
            self.run_name,
            self.config.model_dump_json(),
            lease=self.me,
            lease_stale_s=self.config.sweep.lease_stale_s,
            answer_changes=changes,
        )

    def _lease_keeper(self) -> LeaseKeeper:
        loop = asyncio.get_running_loop()
        return LeaseKeeper(
            self.db_path,
            run_id=self.run_id,
            me=self.me,
            stale_after_s=self.config.sweep.lease_stale_s,
            on_lost=lambda why: _call_soon(loop, self._lease_lost, why),
        )

    async def _sweep(
        self, store: Store, ledger: SpendLedger
    ) -> tuple[dict[str, BackboneRuntime], TrajectoryRecorder]:
        """Open the writer and the managed replicas, build the runtimes, and drive every backbone."""
        config, stop = self.config, self.stop
        async with StoreWriter(
            self.db_path,
            on_trouble=self.write_pause.failing,
            on_recovered=self._writes_recovered,
            spill_run_id=self.run_id,
        ) as writer:
            self.writer = writer  # before the replicas start: their events are written
            async with managed_backbones(
                config,
                log_dir=replica_log_dir(self.db_path),
                on_event=self._serving_event,
                on_exit=stop.on_exit,
                announce=announce_line,
            ) as fleets:
                context = RunContext(
                    config=config,
                    run_id=self.run_id,
                    store=store,
                    writer=writer,
                    stop=stop,
                    cache_lookups=store.has_calls(self.run_id if config.sweep.cache == "run" else None),
                    limit=self.limit,
                    forward_cache=ForwardCache(forward_cache_dir(self.db_path), config.sweep.forward_cache),
                    write_pause=self.write_pause,
                )
                recorder = TrajectoryRecorder(context)
                served = {name: fleet.base_urls for name, fleet in fleets.items()}
                runtimes = build_runtimes(config, ledger, self.backend_factory, served)
                context.runtimes.update(runtimes)
                stop.on_stop(lambda reason: _stop_all(runtimes, reason))
                stop.on_stop(lambda reason: self._add_event("interrupted", reason=reason))
                self._count_items(store, runtimes)
                await self._drive(context, runtimes, recorder, fleets)
        return runtimes, recorder

    def _count_items(self, store: Store, runtimes: dict[str, BackboneRuntime]) -> None:
        for runtime in runtimes.values():
            runtime.counters.items_total = (
                self.entries * len(methods_run_by(runtime, self.methods)) * self.config.sweep.realizations
            )
            runtime.counters.items_finished_before = store.count_finished_items(
                self.run_id, runtime.name, include_failed=not self.retry_failed
            )

    async def _drive(
        self,
        context: RunContext,
        runtimes: dict[str, BackboneRuntime],
        recorder: TrajectoryRecorder,
        fleets: Mapping[str, ManagedReplicas],
    ) -> None:
        """Every backbone's drive and the progress board, in one task group; the backends closed after."""
        board = ProgressBoard(runtimes, enabled=self.show_progress)
        balanced = {name: (runtime.config, runtime.backend) for name, runtime in runtimes.items()}
        try:
            async with replica_balancing(balanced, fleets), asyncio.TaskGroup() as group:
                group.create_task(board.run())
                drivers = [
                    group.create_task(
                        (drive_local_backbone if runtime.local is not None else _drive_backbone)(
                            context, runtime, self.methods, recorder, self.manifest, self.retry_failed
                        )
                    )
                    for runtime in runtimes.values()
                ]
                await asyncio.gather(*drivers)
                board.finish()
        except BaseExceptionGroup as group:
            # One line for the user: rcarun's own error, not a tree of the tasks it went through.
            error = next((e for e in error_leaves(group) if isinstance(e, RcarunError)), None)
            if error is None:
                raise
            raise error from None
        finally:
            for runtime in runtimes.values():
                await runtime.backend.aclose()
                if runtime.local is not None:
                    await asyncio.to_thread(runtime.local.close)

    def _add_event(self, kind: str, **detail: Any) -> None:
        # A writer that failed for good says so itself; one closing takes no more rows.
        with contextlib.suppress(StoreError):
            if self.writer is not None:
                self.writer.add_event(
                    EventRow(
                        run_id=self.run_id,
                        kind=kind,
                        detail_json=json.dumps(detail, sort_keys=True, default=str),
                    )
                )

    def _lease_lost(self, why: str) -> None:
        announce_line(f"run {self.run_name!r}: {why}")
        self.stop.stop_admission(why)

    def _writes_recovered(self) -> None:
        paused_s = self.write_pause.recovered()
        if paused_s is not None:
            self._add_event("writes_paused", seconds=round(paused_s, 3))

    def _serving_event(self, kind: str, detail: dict[str, Any]) -> None:
        if kind != "replicas_started":  # deaths and restarts are news; the start was announced already
            announce_line(f"backbone {detail.get('backbone')!r}: {kind.replace('_', ' ')}: {_short(detail)}")
        self._add_event(kind, **detail)


def _short(detail: dict[str, Any]) -> str:
    """A serving event's detail as one short line (the log tail last, cut)."""
    parts = [
        f"{key} {value}" for key, value in detail.items() if key not in ("backbone", "log_tail", "message")
    ]
    for key in ("message", "log_tail"):
        if key in detail:
            parts.append(f"{key}: {str(detail[key])[:300]}")
    return ", ".join(parts)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[str], None], argument: str) -> None:
    """From another thread: run ``callback(argument)`` on ``loop``, unless the loop is already closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, argument)


def _stop_all(runtimes: dict[str, BackboneRuntime], reason: str) -> None:
    for runtime in runtimes.values():
        runtime.stop(reason)


def _stop_reasons(stop: StopController, runtimes: dict[str, BackboneRuntime]) -> tuple[str, ...]:
    if stop.admission_stopped:
        return (stop.reason,)
    return tuple(
        reason
        for runtime in runtimes.values()
        if (
            reason := runtime.stopped
            or (runtime.left_because if runtime.counters.items_interrupted else None)
        )
    )


def _final_status(stop: StopController, runtimes: dict[str, BackboneRuntime]) -> RunStatus:
    stopped = stop.admission_stopped or any(r.stopped is not None for r in runtimes.values())
    left = any(r.counters.items_skipped_budget or r.counters.items_interrupted for r in runtimes.values())
    return "stopped" if stopped or left else "finished"


def _default_items_in_flight(concurrency: int) -> int:
    """A few more items than call slots, so that the next prompts are built while the slots are busy (the gate
    still caps calls in flight at ``concurrency``)."""
    return concurrency + max(2, concurrency // 4)


async def _drive_backbone(
    context: RunContext,
    runtime: BackboneRuntime,
    methods: list[Method],
    recorder: TrajectoryRecorder,
    manifest: Manifest | None,
    retry_failed: bool,
) -> None:
    """A chat backbone: one producer walks the dataset and queues its unfinished items; workers run them."""
    workers = context.config.sweep.items_in_flight or _default_items_in_flight(
        runtime.config.limits.concurrency
    )
    queue: asyncio.Queue[tuple[WorkItem, Method, Record] | None] = asyncio.Queue(maxsize=workers)
    methods = methods_run_by(runtime, methods)

    # Which items earlier sessions finished is asked of results.db one trajectory at a time (and only when
    # there are any), never held for the whole run: a key per finished item would grow with the sweep.
    resuming = runtime.counters.items_finished_before > 0

    async def produce() -> None:
        walk = recorder.walk()
        walked = 0
        for record in read_ahead(context.config, manifest, context.limit):
            if isinstance(record, DataError):
                walk.problem(record)
                continue
            walked += 1
            walk.record(record)
            if walked % 64 == 0:
                # Skipping finished items never awaits the queue; let the other backbones run meanwhile.
                await asyncio.sleep(0)
            if context.stop.admission_stopped or runtime.stopped is not None:
                break
            qid = record.trajectory.qid
            for method in methods:
                finished = (
                    context.store.finished_realizations(
                        context.run_id, runtime.name, method.label, qid, include_failed=not retry_failed
                    )
                    if resuming
                    else frozenset()
                )
                for realization in range(context.config.sweep.realizations):
                    if realization in finished:
                        continue
                    item = WorkItem(runtime.name, method.label, qid, realization)
                    await queue.put((item, method, record))
        # Only on the normal way out: from a `finally` this could wait forever on a full queue whose workers
        # were cancelled. When the producer fails, the task group cancels the workers instead.
        for _ in range(workers):
            await queue.put(None)

    async def work() -> None:
        while (entry := await queue.get()) is not None:
            item, method, record = entry
            if context.stop.admission_stopped or runtime.stopped is not None:
                continue  # no row: the item runs on resume
            await _run_item(context, runtime, item, method, record)
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        group.create_task(produce())
        for _ in range(workers):
            group.create_task(work())


async def _run_item(
    context: RunContext, runtime: BackboneRuntime, item: WorkItem, method: Method, record: Record
) -> None:
    session = ItemSession(
        context,
        runtime,
        item,
        shareable_stages=method.shareable_stages,
        budgeted_stages=frozenset(method.stage_budgets),
    )
    await settle_item(
        context, runtime, item, lambda: method.attribute(record.trajectory, session), lambda: session.attempts
    )
