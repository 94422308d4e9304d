"""The live objects of one sweep: what every item shares (`RunContext`) and what each backbone owns, apart from
the scheduler so that the session (the `LLM` a method sees) depends on plain state, not on the loop."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypedDict

from tqdm import tqdm

from rcarun.backends import Backend, CallProgress, ChatResult
from rcarun.budgets import BackboneGate
from rcarun.errors import CallError, RateLimited, StopRequested
from rcarun.runner.config import BackboneConfig, SweepConfig
from rcarun.runner.local_model import ForwardCache, LocalModel
from rcarun.store import Store, StoreWriter
from rcarun.text import terminal_safe

__all__ = [
    "BackboneCounters",
    "BackboneRuntime",
    "RowKeys",
    "RunContext",
    "SharedCalls",
    "StopController",
    "StopGuard",
    "WorkItem",
    "WritePause",
    "announce_line",
]


def announce_line(line: str) -> None:
    """Say one line to the user on stderr without breaking the progress bars. Never raises: a reader gone away
    (a ``| tee`` killed by Ctrl-C) must not fail an item; the same facts are in results.db's events."""
    with contextlib.suppress(OSError, ValueError):
        tqdm.write(terminal_safe(f"rcarun: {line}"), file=sys.stderr)


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
    """Graceful stop: the first request stops admission (calls in flight drain), a later one cancels. The
    scheduler listens (`on_stop`) and stops every backbone, which ends the waits of calls not yet admitted."""

    def __init__(self) -> None:
        self.admission_stopped = False
        self.reason = ""
        self._listeners: list[Callable[[str], None]] = []
        self._exit_hooks: list[Callable[[], None]] = []

    def on_exit(self, hook: Callable[[], None]) -> None:
        """Register ``hook`` for `run_exit_hooks`: what must still happen if the process is made to exit now."""
        self._exit_hooks.append(hook)

    def run_exit_hooks(self) -> None:
        """Run the exit hooks (each at most once, errors ignored): called from a thread about to end the process."""
        hooks, self._exit_hooks = self._exit_hooks, []
        for hook in hooks:
            with contextlib.suppress(Exception):
                hook()

    def on_stop(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when admission stops (at once if it already has)."""
        self._listeners.append(listener)
        if self.admission_stopped:
            listener(self.reason)

    def stop_admission(self, reason: str) -> None:
        if not self.admission_stopped:
            self.admission_stopped = True
            self.reason = reason
            for listener in self._listeners:
                listener(reason)


class WritePause:
    """While results.db refuses writes (another tool holds its lock, the disk is full), no new call is sent: what
    is answered meanwhile waits in the writer, and calls resume once it commits again. Past ``wait_s`` without
    recovery admission stops for good (the run ends resumable), as it would for Ctrl-C."""

    def __init__(self, stop: StopController, announce: Callable[[str], None], wait_s: float) -> None:
        self._stop = stop
        self._announce = announce
        self._wait_s = wait_s
        self._open = asyncio.Event()
        self._open.set()
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.pauses = 0

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def wait(self) -> None:
        """Return once writes go through (at once when they do)."""
        await self._open.wait()

    def failing(self, error: Exception) -> None:
        """The writer's first failure (or a new one after a recovery): pause admission, stop it after ``wait_s``."""
        if self.paused or self._stop.admission_stopped:
            return
        self._open.clear()
        self.pauses += 1
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        self._timer = loop.call_later(self._wait_s, self._give_up)
        self._announce(
            f"{error}; no new calls are sent until it takes writes again (up to {self._wait_s:g} s, "
            "sweep.write_wait_s), the calls in flight finish"
        )

    def recovered(self) -> float | None:
        """Every pending row committed: resume admission; the seconds it was paused (None if it was not)."""
        if not self.paused:
            return None
        if self._timer is not None:
            self._timer.cancel()
        self._open.set()
        paused_s = asyncio.get_running_loop().time() - self._since
        if not self._stop.admission_stopped:
            self._announce(f"results.db takes writes again after {paused_s:.0f} s: calls resume")
        return paused_s

    def _give_up(self) -> None:
        if self.paused:
            self._stop.stop_admission("results.db is not taking writes")


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
    # Answers charged an estimate because their usage was missing or could not be a bill.
    usage_estimated: int = 0
    # Generations cut short (silence, a disconnect, max_call_s, the size cap, Ctrl-C) and charged an estimate.
    cut_calls: int = 0
    # Completion tokens of the streamed answers received in full (the bar adds those of the calls in flight).
    streamed_tokens: int = 0

    def record_error(self, error: CallError) -> None:
        if isinstance(error, RateLimited):
            self.rate_limited += 1
        else:
            self.errors += 1


@dataclass(slots=True)
class BackboneRuntime:
    """One backbone's live parts. Once `stop`ped (for this session) it admits nothing more; items that were
    only waiting to be admitted end as interrupted at once, calls in flight finish and are recorded."""

    name: str
    config: BackboneConfig
    backend: Backend
    gate: BackboneGate
    counters: BackboneCounters = field(default_factory=BackboneCounters)
    stopped: str | None = None
    # Calls in a row that met an error about the backbone rather than the request (`rcarun.errors.BACKBONE_FAULTS`).
    consecutive_faults: int = 0
    # Tasks that are only waiting (for room in the writer, admission, a pause, a retry's backoff): a stop
    # interrupts them. A task leaves this set before its request is sent, so a stop never cuts a call short.
    waiting: dict[asyncio.Task[object], StopGuard] = field(default_factory=dict)
    # A local backbone's model (provider "local"): its items run forward passes, never ``backend.chat``.
    local: LocalModel | None = None
    # What each call in flight has received so far (the progress bar counts the tokens streamed).
    in_flight: set[CallProgress] = field(default_factory=set)
    # Said once per backbone, the first time it happens: a cut generation charged, a server refusing to stream.
    announced: set[str] = field(default_factory=set)
    # Why the last item left for a resume by an error about the backbone was left, while the backbone went on.
    left_because: str | None = None

    def stop(self, reason: str) -> bool:
        """Stop admitting calls on this backbone for the rest of the session; True if it was not stopped yet."""
        first = self.stopped is None
        if first:
            self.stopped = reason
        for task, guard in list(self.waiting.items()):
            if not guard.stopped:
                guard.stopped = True
                task.cancel()
        return first

    def stop_guard(self) -> StopGuard:
        """Arm a `StopGuard` for the current task (raises `StopRequested` at once when already stopped)."""
        if self.stopped is not None:
            raise StopRequested(self.stopped)
        return StopGuard(self)


class StopGuard:
    """While armed (``with runtime.stop_guard() as guard: ... guard.disarm()`` before sending), a stop of the
    backbone cancels the task's wait and the guard turns its own cancellation into `StopRequested` (`uncancel`),
    unless someone else cancelled the task too."""

    __slots__ = ("_runtime", "_task", "stopped")

    def __init__(self, runtime: BackboneRuntime) -> None:
        self._runtime = runtime
        task = asyncio.current_task()
        assert task is not None, "a StopGuard needs a running task"
        self._task = task
        self.stopped = False

    def __enter__(self) -> StopGuard:
        self._runtime.waiting[self._task] = self
        return self

    def disarm(self) -> None:
        self._runtime.waiting.pop(self._task, None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.disarm()
        if self.stopped and exc_type is asyncio.CancelledError and self._task.cancelling() == 1:
            self._task.uncancel()
            raise StopRequested(self._runtime.stopped or "stopped") from None


class SharedCalls:
    """Answers of shareable stages by cache key, in flight and shortly after: ablation conditions (RCTA and
    rcta/no-aK) send identical Stage I requests at about the same moment, and only the first is paid. The last
    ``keep_finished`` answers bridge the writer's commit delay, after which the stored row serves them."""

    def __init__(self, keep_finished: int = 512) -> None:
        self._in_flight: dict[str, asyncio.Future[ChatResult | None]] = {}
        self._finished: OrderedDict[str, ChatResult] = OrderedDict()
        self._keep_finished = keep_finished

    def finished(self, key: str) -> ChatResult | None:
        return self._finished.get(key)

    def in_flight(self, key: str) -> asyncio.Future[ChatResult | None] | None:
        return self._in_flight.get(key)

    def lead(self, key: str) -> asyncio.Future[ChatResult | None]:
        """Register the caller as the one sending ``key``; others await the returned future."""
        future: asyncio.Future[ChatResult | None] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        return future

    def settle(self, key: str, result: ChatResult | None) -> None:
        """The leader's outcome: an answer, or None when it failed (waiters then send their own)."""
        future = self._in_flight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(result)
        if result is not None:
            self._finished[key] = result
            self._finished.move_to_end(key)
            while len(self._finished) > self._keep_finished:
                self._finished.popitem(last=False)


@dataclass(slots=True)
class RunContext:
    config: SweepConfig
    run_id: int
    store: Store
    writer: StoreWriter
    stop: StopController
    # False when no earlier attempt could be served (a fresh run): every lookup would miss, so none is made
    # (shareable stages look anyway: another condition of the same run may have answered already).
    cache_lookups: bool = True
    shared: SharedCalls = field(default_factory=SharedCalls)
    # Every backbone of the sweep by name, so an item may address more than its own (a judge panel).
    runtimes: dict[str, BackboneRuntime] = field(default_factory=dict)
    # Only the first N usable trajectories of the dataset (a smoke run), or all when None.
    limit: int | None = None
    # How the runner says something the user must read now (a backbone stopped, writes failing): one line.
    announce: Callable[[str], None] = announce_line
    # Where local backbones keep their forward passes (`rcarun.runner.local_model`); None: no local backbone.
    forward_cache: ForwardCache | None = None
    # Admission waits here while results.db refuses writes; None: never (a caller without a writer's trouble).
    write_pause: WritePause | None = None
