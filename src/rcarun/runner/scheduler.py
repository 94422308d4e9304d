"""The sweep loop: expand method × backbone × trajectory × realization lazily and run each item once.

Each backbone gets its own producer and its own pool of workers, so a slow or rate-limited backbone never holds
back the others. Items are generated on demand from the dataset and pushed through a small bounded queue — no task
per item up front — so memory grows with the work in flight, not with the size of the sweep. Items that already
have a prediction (or failed for good) in results.db are skipped, which is all resume needs: calls that finished
inside an interrupted item are served from the call cache by the session.

Graceful stop: `StopController.stop_admission` stops producers and new calls; calls in flight finish and are
recorded; unfinished items are marked ``interrupted`` and run again on resume. A backbone can also stop on its
own (a provider asking to wait longer than ``max_pause_s``), and so can the whole run when results.db stops
taking writes: the same path, so nothing that was answered is dropped on the way out.

The process always ends: workers are told there is no more work only on the producer's normal way out (never
from a ``finally`` that could wait on a queue nobody reads), an error in one backbone's loop cancels the others
through their task group, and one sweep holds its run's lease (`rcarun.store.LeaseKeeper`) so a second process
on the same run is refused instead of paying for everything twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import time
from pathlib import Path
from typing import Any

from rcarun.backends import (
    Backend,
    BackendSettings,
    CallProgress,
    ChatRequest,
    ChatResult,
    Usage,
    create_backend,
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
from rcarun.data import (
    Manifest,
    Record,
    count_entries,
    iter_dataset,
    load_manifest,
    task_key,
)
from rcarun.errors import (
    BudgetExhausted,
    ConfigError,
    DataError,
    FatalCallError,
    RcarunError,
    StopRequested,
    StoreError,
)
from rcarun.methods import Attribution, Method, create_method, home_backbone
from rcarun.methods.base import ModelReadingMethod, Preparation, TrajectorySet
from rcarun.runner.config import BackboneConfig, SweepConfig
from rcarun.runner.drift import answer_changes
from rcarun.runner.forward_session import (
    FORWARD_STAGE,
    ForwardCache,
    ForwardSession,
    LocalModel,
    forward_cache_dir,
)
from rcarun.runner.managed import managed_backbones, replica_balancing
from rcarun.runner.progress import ProgressBoard
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
from rcarun.serving import replica_log_dir
from rcarun.store import (
    METHOD_PREPARED,
    EventRow,
    ItemRow,
    ItemStatus,
    LeaseKeeper,
    PredictionRow,
    RunStatus,
    StoreWriter,
    TrajectoryRow,
    open_store,
    take_up_spill,
    this_process,
    utc_timestamp,
)
from rcarun.text import repair_surrogates

__all__ = [
    "SweepOutcome",
    "build_prices",
    "check_method_backbones",
    "run_sweep",
    "stage_budget_notes",
]


BackendFactory = Callable[[BackendSettings], Backend]

_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# `json.dumps(output, ensure_ascii=False, default=str)` for every prediction, without an encoder built per call.
_OUTPUT_JSON = json.JSONEncoder(ensure_ascii=False, default=str)
# SQLite's INTEGER range: a step beyond it is no step of any trajectory.
_INT64 = range(-(2**63), 2**63)


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


# A managed backbone's URLs exist once its replicas are up; checking its key variable needs none of them.
_NOT_SERVED_YET = ("http://127.0.0.1/v1",)


def _backend_settings(
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


def _load_sweep_manifest(config: SweepConfig) -> Manifest | None:
    name = config.sweep.manifest
    if name is None:
        return None
    return load_manifest(name)


def _iter_records(
    config: SweepConfig, manifest: Manifest | None, on_problem: Callable[[DataError], None]
) -> Iterator[Record]:
    """The dataset's records, or only those a manifest lists with the SHA-256 it pins.

    A listed record whose bytes differ is a data problem and is left out (the manifest promises those exact
    bytes); a listed qid the dataset lacks is reported once the dataset has been read.
    """
    records = iter_dataset(Path(config.sweep.dataset), strict=config.sweep.strict_data, on_problem=on_problem)
    if manifest is None:
        yield from records
        return
    # The listed records not met yet: shrinks as the dataset is read (no second set of the qids met).
    listed = manifest.by_qid()
    for record in records:
        entry = listed.pop(record.trajectory.qid, None)
        if entry is None:
            continue
        if entry.sha256 != record.trajectory.sha256:
            on_problem(
                DataError(
                    f"SHA-256 {record.trajectory.sha256} differs from the manifest's {entry.sha256}; left out",
                    path=record.origin,
                    record=entry.qid,
                )
            )
            continue
        yield record
    for entry in manifest.records:
        if entry.qid in listed:
            on_problem(DataError("listed in the manifest but not in the dataset", record=entry.qid))


# A producer loads this many records (or records holding this many characters of steps, whichever comes first)
# back to back before it queues their items, instead of one record each time a queue slot frees. The loader's
# code and data are then warm: in the bench's latency-bound run, where every call is a trajectory of its own,
# a call takes 0.945 of the CPU it took (median of 10 paired runs; batches of 16 and 64 gave about 0.975 and
# 0.955: docs/performance.md, "Reading ahead"). The records wait in memory until their items are queued, so
# both bounds cap what the read-ahead adds to a producer's memory.
_READ_AHEAD_RECORDS = 256
_READ_AHEAD_CHARS = 4 * 2**20


def _read_ahead(
    config: SweepConfig, manifest: Manifest | None, limit: int | None
) -> Iterator[Record | DataError]:
    """`_iter_records` (at most ``limit`` records) and the problems it meets, in the order met, loaded a batch at
    a time (`_READ_AHEAD_RECORDS` records or `_READ_AHEAD_CHARS` characters of steps, whichever comes first).

    Every walk of the dataset sees the same events in the same order, as `_TrajectoryRecorder` needs. An error
    (a strict dataset's first problem) is raised once the events met before it are delivered.
    """
    met: list[Record | DataError] = []
    records = itertools.islice(_iter_records(config, manifest, met.append), limit)
    while True:
        chars = 0
        exhausted = True
        try:
            for record in records:
                met.append(record)
                chars += sum(len(step.content) for step in record.trajectory.steps)
                if len(met) >= _READ_AHEAD_RECORDS or chars >= _READ_AHEAD_CHARS:
                    exhausted = False
                    break
        except Exception:
            yield from met
            raise
        # The walk is paused while the batch is handed on: nothing is added to it meanwhile.
        yield from met
        met.clear()
        if exhausted:
            return


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

    Resume skips items with a prediction and items that failed for good; ``retry_failed`` runs the failed
    ones again (after a key, a quota or a config was fixed). ``limit`` runs only the first N usable
    trajectories of the dataset (its order), for a smoke run that a later full run resumes. A resume whose
    answer-deciding settings differ from the run's is refused (`rcarun.runner.drift`) unless
    ``accept_config_change``.

    Raises:
        ConfigError: the config cannot be run (unknown method, duplicate labels, missing key variable, settings
            that would mix two configurations in one run).
        DataError: the dataset is unusable (or a record is bad and ``strict_data`` is set).
        RunBusy: another live process sweeps this run.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    return await _run_sweep(
        config,
        db_path=Path(db_path),
        run_name=run_name,
        stop=stop or StopController(),
        show_progress=show_progress,
        retry_failed=retry_failed,
        backend_factory=backend_factory,
        limit=limit,
        accept_config_change=accept_config_change,
    )


async def _run_sweep(
    config: SweepConfig,
    *,
    db_path: Path,
    run_name: str,
    stop: StopController,
    show_progress: bool,
    retry_failed: bool,
    backend_factory: BackendFactory,
    limit: int | None,
    accept_config_change: bool,
) -> SweepOutcome:
    methods = [create_method(m.name, label=m.resolved_label, options=m.options) for m in config.methods]
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"method labels must be unique within a sweep, got {labels}")

    check_method_backbones(methods, config)
    for note in stage_budget_notes(methods, config):
        announce_line(note)
    if not Path(config.sweep.dataset).exists():
        raise ConfigError(f"sweep.dataset: {config.sweep.dataset}: no such file or directory")
    manifest = _load_sweep_manifest(config)
    entries = len(manifest.records) if manifest is not None else count_entries(config.sweep.dataset)
    if entries == 0:
        raise DataError("no trajectories found", path=config.sweep.dataset)
    if limit is not None:
        entries = min(entries, limit)
    # A missing key would otherwise surface when the backends are built, after the run row exists.
    for name, backbone in config.backbones.items():
        if not backbone.is_local:
            _backend_settings(name, backbone, pool_size=backbone.limits.concurrency).read_api_key()
    if any(backbone.is_local for backbone in config.backbones.values()):
        from rcarun.backends.local import require_local_extra

        require_local_extra()  # one ConfigError line naming the extra, before the run exists
    store = open_store(db_path)
    keeper: LeaseKeeper | None = None
    try:
        existing = store.run_by_name(run_name)
        changes = answer_changes(existing.config_json, config) if existing is not None else []
        if changes and not accept_config_change:
            raise ConfigError(
                f"run {run_name!r} was started with other settings that decide its answers ({'; '.join(changes)}); "
                "resuming would mix two configurations in one run. Start a new run (--run ANOTHER_NAME), or "
                "pass --accept-config-change to resume it with the new settings knowingly"
            )
        me = this_process()
        # Claimed in the same transaction that opens the run: a second sweep of the run is refused unchanged.
        run_id = store.get_or_create_run(
            run_name,
            config.model_dump_json(),
            lease=me,
            lease_stale_s=config.sweep.lease_stale_s,
            answer_changes=changes,
        )
        loop = asyncio.get_running_loop()
        announce = announce_line

        def lease_lost(why: str) -> None:
            announce(f"run {run_name!r}: {why}")
            stop.stop_admission(why)

        keeper = LeaseKeeper(
            db_path,
            run_id=run_id,
            me=me,
            stale_after_s=config.sweep.lease_stale_s,
            on_lost=lambda why: _call_soon(loop, lease_lost, why),
        )
        keeper.start()
        stop.on_exit(lambda: keeper.release(timeout_s=2.0) if keeper is not None else None)
        # Rows a full disk left in a spill file are the run's before anything reads what it has done.
        for line in await asyncio.to_thread(take_up_spill, db_path, run_id):
            announce(line)
        ledger = SpendLedger(
            overall=Budget(max_usd=config.budget.max_usd, max_tokens=config.budget.max_tokens),
            per_backbone={
                name: Budget(max_usd=backbone.budget.max_usd, max_tokens=backbone.budget.max_tokens)
                for name, backbone in config.backbones.items()
            },
        )
        # Budgets are per run: what earlier sessions of this run spent counts against them.
        for spent in store.backbone_summary(run_id):
            ledger.record_prior_spend(
                spent.backbone,
                usd=spent.cost_usd,
                usage=Usage(
                    prompt_tokens=spent.prompt_tokens,
                    cached_prompt_tokens=spent.cached_tokens,
                    completion_tokens=spent.completion_tokens,
                    reasoning_tokens=spent.reasoning_tokens,
                ),
            )

        # Nothing new is sent while answers cannot be kept; what is in flight still lands in the writer.
        write_pause = WritePause(stop, announce, config.sweep.write_wait_s)

        def writes_failing(error: StoreError) -> None:
            write_pause.failing(error)

        def writes_recovered() -> None:
            paused_s = write_pause.recovered()
            if paused_s is None:
                return
            with contextlib.suppress(StoreError):  # recovered while closing: the writer takes no more rows
                writer.add_event(
                    EventRow(
                        run_id=run_id,
                        kind="writes_paused",
                        detail_json=json.dumps({"seconds": round(paused_s, 3)}),
                    )
                )

        def serving_event(kind: str, detail: dict[str, Any]) -> None:
            if kind != "replicas_started":  # deaths and restarts are news; the start was announced already
                announce(f"backbone {detail.get('backbone')!r}: {kind.replace('_', ' ')}: {_short(detail)}")
            with contextlib.suppress(StoreError):
                writer.add_event(
                    EventRow(
                        run_id=run_id, kind=kind, detail_json=json.dumps(detail, sort_keys=True, default=str)
                    )
                )

        async with (
            StoreWriter(
                db_path, on_trouble=writes_failing, on_recovered=writes_recovered, spill_run_id=run_id
            ) as writer,
            managed_backbones(
                config,
                log_dir=replica_log_dir(db_path),
                on_event=serving_event,
                on_exit=stop.on_exit,
                announce=announce,
            ) as fleets,
        ):
            scope = run_id if config.sweep.cache == "run" else None
            context = RunContext(
                config=config,
                run_id=run_id,
                store=store,
                writer=writer,
                stop=stop,
                cache_lookups=store.has_calls(scope),
                limit=limit,
                forward_cache=ForwardCache(forward_cache_dir(db_path), config.sweep.forward_cache),
                write_pause=write_pause,
            )
            recorder = _TrajectoryRecorder(context)
            served = {name: fleet.base_urls for name, fleet in fleets.items()}
            runtimes = _build_runtimes(config, ledger, backend_factory, served)
            context.runtimes.update(runtimes)
            stop.on_stop(lambda reason: _stop_all(runtimes, reason))

            def note_interrupt(reason: str) -> None:
                with contextlib.suppress(StoreError):  # a writer that failed for good says so itself
                    writer.add_event(
                        EventRow(
                            run_id=run_id, kind="interrupted", detail_json=json.dumps({"reason": reason})
                        )
                    )

            stop.on_stop(note_interrupt)
            for runtime in runtimes.values():
                runtime.counters.items_total = (
                    entries * len(_methods_run_by(runtime, methods)) * config.sweep.realizations
                )
                runtime.counters.items_finished_before = store.count_finished_items(
                    run_id, runtime.name, include_failed=not retry_failed
                )
            board = ProgressBoard(runtimes, enabled=show_progress)
            balanced = {name: (runtime.config, runtime.backend) for name, runtime in runtimes.items()}
            try:
                async with replica_balancing(balanced, fleets), asyncio.TaskGroup() as group:
                    group.create_task(board.run())
                    drivers = [
                        group.create_task(
                            (_drive_local_backbone if runtime.local is not None else _drive_backbone)(
                                context, runtime, methods, recorder, manifest, retry_failed
                            )
                        )
                        for runtime in runtimes.values()
                    ]
                    await asyncio.gather(*drivers)
                    board.finish()
            except BaseExceptionGroup as group:
                # One line for the user: rcarun's own error, not a tree of the tasks it went through.
                error = _first_rcarun_error(group)
                if error is None:
                    raise
                raise error from None
            finally:
                for runtime in runtimes.values():
                    await runtime.backend.aclose()
                    if runtime.local is not None:
                        await asyncio.to_thread(runtime.local.close)
        status = _final_status(stop, runtimes)
        store.set_run_status(run_id, status)
        return SweepOutcome(
            run_id=run_id,
            run_name=run_name,
            status=status,
            trajectories=recorder.trajectories,
            data_problems=recorder.problems,
            counters={name: runtime.counters for name, runtime in runtimes.items()},
            stop_reasons=_stop_reasons(stop, runtimes),
        )
    except BaseException:
        with contextlib.suppress(Exception):
            run = store.run_by_name(run_name)
            if run is not None and keeper is not None:  # a refused second sweep leaves the run as it was
                store.set_run_status(run.run_id, "stopped")
        raise
    finally:
        if keeper is not None:
            keeper.release()
        store.close()


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


def _first_rcarun_error(group: BaseExceptionGroup[BaseException]) -> RcarunError | None:
    return next((error for error in _leaves(group) if isinstance(error, RcarunError)), None)


def stage_budget_notes(methods: Sequence[Method], config: SweepConfig) -> list[str]:
    """One line per method whose own settings fix a stage's budget where the sweep's stage table sets another:
    the method's wins (`StageConfig.first_budget`); the line says so, so the override is never silent."""
    notes = []
    for method in methods:
        budgets = method.stage_budgets
        for stage, budget in budgets.items():
            table = config.stages.get(stage)
            if table is not None and table.max_tokens is not None and table.max_tokens != budget:
                notes.append(
                    f"[stages.{stage}] max_tokens = {table.max_tokens} does not apply to method {method.label!r}, "
                    f"whose own settings give {stage} {budget:,} tokens (they win; change the method's options "
                    "to change it)"
                )
    return notes


def check_method_backbones(methods: Sequence[Method], config: SweepConfig) -> None:
    """Every method has a backbone that can run it, and every backbone a method it can run.

    A method that names its own backbones (a judge panel) may name only chat backbones the sweep defines. A
    method that reads a model (``reads_model``, SOAP) runs only on local backbones (``provider = "local"``), a
    chat method only on the others: a sweep where some method has no backbone of its kind, or a local backbone
    has no method to run, is refused, since it would silently run nothing.

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
    if stop.admission_stopped or any(runtime.stopped is not None for runtime in runtimes.values()):
        return "stopped"
    if any(r.counters.items_skipped_budget or r.counters.items_interrupted for r in runtimes.values()):
        return "stopped"
    return "finished"


class _TrajectoryRecorder:
    """Stores each trajectory's row and each data problem once, whichever backbone's producer meets it first.

    Every producer walks the dataset on its own (so a slow backbone never holds back a fast one); this keeps the
    walk single-pass: the trajectories table is filled as records are read, not by a separate pass. Every walk
    meets the same records and problems in the same order (`iter_dataset` reads in a fixed order, a manifest
    filters it the same way each time), so the recorder needs no memory of what it stored — a set of every qid
    would grow with the dataset — only how far the furthest walk has come: a walk's n-th event (a record or a
    problem) is stored when no walk has passed n yet.
    """

    __slots__ = ("_context", "_furthest", "problems", "trajectories")

    def __init__(self, context: RunContext) -> None:
        self._context = context
        # Events (records and problems) stored so far, in walk order: the furthest any walk has come.
        self._furthest = 0
        self.trajectories = 0
        self.problems = 0

    def walk(self) -> _Walk:
        """A new walk of the dataset (one per producer), at its start."""
        return _Walk(self)

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


class _Walk:
    """One producer's way through the dataset: how many records and problems it has met (its position)."""

    __slots__ = ("_position", "_recorder")

    def __init__(self, recorder: _TrajectoryRecorder) -> None:
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


def _build_runtimes(
    config: SweepConfig,
    ledger: SpendLedger,
    backend_factory: BackendFactory,
    served: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, BackboneRuntime]:
    runtimes: dict[str, BackboneRuntime] = {}
    for name, backbone in config.backbones.items():
        if backbone.is_local:
            runtimes[name] = _local_runtime(name, backbone, ledger)
            continue
        limits = backbone.limits
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
                    else get_preset(backbone.provider).meters_output_budget
                ),
                learns_from_refusals=get_preset(backbone.provider).refusals_count_a_window,
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
        runtimes[name] = BackboneRuntime(
            name=name,
            config=backbone,
            backend=backend_factory(
                _backend_settings(
                    name, backbone, pool_size=limits.concurrency, base_urls=(served or {}).get(name, ())
                )
            ),
            gate=gate,
        )
    return runtimes


class _NoChat:
    """The backend of a local backbone: it runs forward passes, never chat (`check_method_backbones` makes sure
    no chat method is run on it, so this answer would be a bug of the runner)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def chat(self, request: ChatRequest, progress: CallProgress | None = None) -> ChatResult:
        raise FatalCallError(f"backbone {self.name!r} is local: it runs forward passes, not chat")

    async def aclose(self) -> None:
        return None


def _local_runtime(name: str, backbone: BackboneConfig, ledger: SpendLedger) -> BackboneRuntime:
    """A local backbone's runtime: its model (loaded on first use) and a gate that never limits anything (no
    provider, no rate limits, no prices; forward passes run one at a time on the model's thread)."""
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


def _methods_run_by(runtime: BackboneRuntime, methods: Sequence[Method]) -> list[Method]:
    """The methods whose items this backbone's workers run: those of its kind (model-reading methods on a local
    backbone, chat methods elsewhere), except those homed on another backbone."""
    local = runtime.local is not None
    return [m for m in methods if m.reads_model == local and home_backbone(m) in (None, runtime.name)]


def _default_items_in_flight(concurrency: int) -> int:
    """A few more items than call slots, so the next prompts are built while the slots are busy.

    With exactly one item per slot, a slot idles while its item renders the next prompt or records the last
    answer; the gate still caps calls in flight at ``concurrency``.
    """
    return concurrency + max(2, concurrency // 4)


async def _drive_backbone(
    context: RunContext,
    runtime: BackboneRuntime,
    methods: list[Method],
    recorder: _TrajectoryRecorder,
    manifest: Manifest | None,
    retry_failed: bool,
) -> None:
    workers = context.config.sweep.items_in_flight or _default_items_in_flight(
        runtime.config.limits.concurrency
    )
    queue: asyncio.Queue[tuple[WorkItem, Method, Record] | None] = asyncio.Queue(maxsize=workers)
    methods = _methods_run_by(runtime, methods)

    # Which items earlier sessions finished is asked of results.db one trajectory at a time (and only when
    # there are any), never held for the whole run: a key per finished item would grow with the sweep.
    resuming = runtime.counters.items_finished_before > 0

    async def produce() -> None:
        walk = recorder.walk()
        walked = 0
        for record in _read_ahead(context.config, manifest, context.limit):
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


# Items in flight on a local backbone: passes run one at a time on the model's thread; a second item ranks its
# steps (numpy) while the next pass runs.
_LOCAL_ITEMS_IN_FLIGHT = 2


async def _drive_local_backbone(
    context: RunContext,
    runtime: BackboneRuntime,
    methods: list[Method],
    recorder: _TrajectoryRecorder,
    manifest: Manifest | None,
    retry_failed: bool,
) -> None:
    """A local backbone: per model-reading method and realization, prepare once, then answer its items.

    The dataset is walked once for the ids (recording trajectories as every producer does); a preparation
    streams the records it needs through `TrajectorySet.load`, and so do the items. Only the ids a preparation
    returns become items: a trajectory it learnt from (SOAP's reference and validation splits) is never
    predicted. A realization whose items were all finished in an earlier session is not prepared again.
    """
    local = runtime.local
    assert local is not None, "a local backbone has a model"
    readers = [m for m in _methods_run_by(runtime, methods) if isinstance(m, ModelReadingMethod)]
    walk = recorder.walk()
    ids: list[str] = []
    sources: list[str] = []
    for walked, record in enumerate(
        itertools.islice(_iter_records(context.config, manifest, walk.problem), context.limit), start=1
    ):
        walk.record(record)
        ids.append(record.trajectory.qid)
        sources.append(record.trajectory.source)
        if walked % 64 == 0:
            await asyncio.sleep(0)

    def load(wanted: Collection[str]) -> Iterator[Record]:
        chosen = frozenset(wanted)
        records = _iter_records(context.config, manifest, lambda _problem: None)
        return (r for r in itertools.islice(records, context.limit) if r.trajectory.qid in chosen)

    trajectories = TrajectorySet(ids=tuple(ids), sources=tuple(sources), load=load)
    if not ids or not readers:
        return
    try:
        model = await local.get()
    except ConfigError as error:
        reason = f"{error}; its items are left for a resume (rerun the same sweep command)"
        if runtime.stop(reason):
            context.announce(reason)
            _add_event(context, "backbone_stopped", backbone=runtime.name, message=str(error)[:600])
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
            finished = _finished_qids(context, runtime.name, method.label, realization, ids, retry_failed)
            prepared = _prepared_items(context, runtime.name, method.label, realization)
            if prepared is not None and prepared <= finished:
                continue  # every item of this realization is finished: nothing to prepare for

            def model_for(
                qid: str, stage: str, label: str = method.label, r: int = realization
            ) -> ForwardSession:
                return session(WorkItem(runtime.name, label, qid, r), stage)

            try:
                preparation = await method.prepare(trajectories, model_for, realization)
            except StopRequested:
                return
            except Exception as error:  # one line for every item of the realization; the sweep goes on
                _preparation_failed(context, runtime, method, realization, ids, finished, error)
                continue
            _record_preparation(context, runtime, method, realization, preparation, len(ids))
            pending = [qid for qid in preparation.items if qid not in finished]
            await _answer_local_items(
                context, runtime, method, realization, preparation, pending, load, session
            )


async def _answer_local_items(
    context: RunContext,
    runtime: BackboneRuntime,
    method: ModelReadingMethod,
    realization: int,
    preparation: Preparation,
    pending: Sequence[str],
    load: Callable[[Collection[str]], Iterator[Record]],
    session: Callable[[WorkItem, str], ForwardSession],
) -> None:
    if not pending:
        return
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
        item = WorkItem(runtime.name, method.label, record.trajectory.qid, realization)
        forward = session(item, FORWARD_STAGE)
        await _settle_item(
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


def _finished_qids(
    context: RunContext, backbone: str, method: str, realization: int, ids: Sequence[str], retry_failed: bool
) -> frozenset[str]:
    if context.store.count_finished_items(context.run_id, backbone, include_failed=not retry_failed) == 0:
        return frozenset()
    return frozenset(
        qid
        for qid in ids
        if realization
        in context.store.finished_realizations(
            context.run_id, backbone, method, qid, include_failed=not retry_failed
        )
    )


def _prepared_items(
    context: RunContext, backbone: str, method: str, realization: int
) -> frozenset[str] | None:
    """The items an earlier session's preparation of this realization returned, None when there was none."""
    found: frozenset[str] | None = None
    for event in context.store.events(context.run_id):
        if event.kind != METHOD_PREPARED:
            continue
        detail = json.loads(event.detail_json)
        if (detail.get("backbone"), detail.get("method"), detail.get("realization")) == (
            backbone,
            method,
            realization,
        ):
            found = frozenset(str(qid) for qid in detail.get("items", ()))
    return found


def _add_event(context: RunContext, kind: str, **detail: Any) -> None:
    context.writer.add_event(
        EventRow(
            run_id=context.run_id, kind=kind, detail_json=json.dumps(detail, sort_keys=True, default=str)
        )
    )


def _record_preparation(
    context: RunContext,
    runtime: BackboneRuntime,
    method: ModelReadingMethod,
    realization: int,
    preparation: Preparation,
    n_ids: int,
) -> None:
    """The preparation as a ``method_prepared`` event (its items: what the report scores this cell on), and the
    progress total less the trajectories that are not items."""
    _add_event(
        context,
        METHOD_PREPARED,
        backbone=runtime.name,
        method=method.label,
        realization=realization,
        items=list(preparation.items),
        **preparation.detail,
    )
    runtime.counters.items_total -= n_ids - len(preparation.items)


def _preparation_failed(
    context: RunContext,
    runtime: BackboneRuntime,
    method: ModelReadingMethod,
    realization: int,
    ids: Sequence[str],
    finished: Collection[str],
    error: Exception,
) -> None:
    """Every unfinished item of the realization fails with the reason, in one line (its split is unknown, so
    every trajectory is one of its items); ``--retry-failed`` prepares it again."""
    kind = type(error).__name__ if isinstance(error, RcarunError) else f"unexpected {type(error).__name__}"
    message = (
        f"{method.label} could not prepare realization {realization}: {kind}: {' '.join(str(error).split())}"
    )
    context.announce(message[:600])
    _add_event(
        context,
        "method_prepare_failed",
        backbone=runtime.name,
        method=method.label,
        realization=realization,
        message=message[:2000],
    )
    for qid in ids:
        if qid in finished:
            continue
        item = WorkItem(runtime.name, method.label, qid, realization)
        runtime.counters.items_failed += 1
        context.writer.set_item(
            ItemRow(**item.row_keys(context.run_id), status="failed", error=message[:2000], attempts=0)
        )


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
    await _settle_item(
        context, runtime, item, lambda: method.attribute(record.trajectory, session), lambda: session.attempts
    )


async def _settle_item(
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
            writer.add_event(
                EventRow(
                    run_id=context.run_id,
                    kind="budget_stop",
                    detail_json=json.dumps({"backbone": runtime.name, "message": str(exc)}),
                )
            )
        return
    except StopRequested as exc:
        counters.items_interrupted += 1
        set_item("interrupted", f"stopped before the item finished: {exc}"[:2000])
        return
    except asyncio.CancelledError:
        counters.items_interrupted += 1
        set_item("interrupted", "cancelled")
        raise
    except RcarunError as exc:
        counters.items_failed += 1
        set_item("failed", f"{type(exc).__name__}: {exc}"[:2000])
        return
    except Exception as exc:  # a method bug must not stop the sweep; it is stored as the item's failure
        counters.items_failed += 1
        set_item("failed", f"unexpected {type(exc).__name__}: {exc}"[:2000])
        return
    _record_prediction(context, item, attribution)
    set_item("done")
    counters.items_done += 1


async def _unwrapped(attribution: Awaitable[Attribution]) -> Attribution:
    """``attribution``, with a task group's errors (a method that fans out: self-consistency, judge panels)
    turned into the one error that decides the item's fate: a stop interrupts it, a spent budget skips it, and
    only otherwise does a call error fail it. One Ctrl-C raises a stop in every voter at once."""
    try:
        return await attribution
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        for kind in (asyncio.CancelledError, StopRequested, BudgetExhausted, RcarunError):
            chosen = next((leaf for leaf in leaves if isinstance(leaf, kind)), None)
            if chosen is not None:
                raise chosen from group
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def _record_prediction(context: RunContext, item: WorkItem, attribution: Attribution) -> None:
    """The method's answer as results.db can hold it: the step column takes only what SQLite's INTEGER can
    (an absurd step is no step of any trajectory, so it is stored as none, marked invalid; the full output keeps
    the number as written), and text is free of unpaired surrogates. Why an answer could not be read, and which
    published fallback decided it, go to ``predictions.error`` and ``predictions.fallback``."""
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
