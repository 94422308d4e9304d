"""A sweep keeps nothing per finished item or trajectory: what it holds is bounded by the work in flight.

Memory that grows with a sweep shows only after tens of thousands of items (`benchmarks/memory.py` measures it);
these tests look at its causes instead. During the last calls of a sweep of a few hundred items, fresh and
resumed, they walk every object the sweep's tasks can reach — frames, closures, attributes, container
elements — and size every container found. A set of trajectory ids, a dict of per-item state never pruned, a
list of results or the run's finished keys would each hold hundreds of entries here; what the sweep needs (the
items in flight, a trajectory's steps, the config) holds a few dozen at most. The store writer is left out of the
walk: its queue and its memory of recent blobs have bounds of their own, tested in tests/store. Two structures
do grow with the sweep and are named below with the reason they may (`_GROWS_BY_DESIGN`). Nothing is timed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import sqlite3
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.sweeps import make_config, rows
from rcarun.backends import Backend, BackendSettings, CallProgress, ChatRequest, ChatResult, create_backend
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, records, run_sweep
from rcarun.store import StoreWriter

_TRAJECTORIES = 80
_REALIZATIONS = 3
_CONCURRENCY = 4
# Items in flight are concurrency + 2 here; anything per item or per trajectory done has hundreds of entries.
_MOST_ENTRIES = 40
_CONTAINERS = (list, tuple, dict, set, frozenset, deque)
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview)
# Not the sweep's: the interpreter and the modules (their caches are shared by everything), the event loop (its
# ready queue and timers hold what is in flight), SQLite's connections (sqlite3 bounds their statement cache and
# prunes their cursor list) and the in-process simulator the sweep talks to.
_OUTSIDE = (types.ModuleType, type, types.CodeType, asyncio.AbstractEventLoop, sqlite3.Connection)
_OUTSIDE_MODULES = ("rcarun.mock", "aiohttp.web")
_SKIPPED = (*_LEAVES, *_OUTSIDE, StoreWriter)
# Containers that grow with the sweep and may: each one's path (its end) and why.
_GROWS_BY_DESIGN = {
    # rcarun.data.loaders: a source directory is read in natural order, so its file names are listed first.
    "_iter_source_dir:names": "the listing of the source directory being read (a name per file)",
    # rcarun.data.loaders: a duplicate qid can come at any point of the walk, and its message names the first.
    "_deliver:first_seen": "the qids the dataset walk has met (a qid per trajectory read)",
}
# A producer loads a batch of records before it queues their items (`records._READ_AHEAD_RECORDS`, 256). Here
# the batch is set below `_MOST_ENTRIES` and the dataset's size, so that a read-ahead overrunning its bound shows
# as unexplained, and midway the dataset walk is still going and its own structures are seen.
_READ_AHEAD = 16
# Tasks that are not the sweep's: the simulator's, and the store writer's (its batch has its own bound).
_NOT_THE_SWEEPS = ("rcarun/store/writer.py",)


@pytest.fixture(autouse=True)
def _small_read_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    assert records._READ_AHEAD_RECORDS > _READ_AHEAD
    monkeypatch.setattr(records, "_READ_AHEAD_RECORDS", _READ_AHEAD)


@dataclass(frozen=True, slots=True)
class _Container:
    entries: int
    path: str


def _children(obj: object) -> Iterator[tuple[str, object]]:
    """What ``obj`` holds, each with a name for the path to it; a function's globals are not its own."""
    if isinstance(obj, asyncio.Task):
        yield "coro", obj.get_coro()
        return
    if isinstance(obj, _Inspector):
        yield "backend", obj.backend  # the rest is this test's own
        return
    if isinstance(obj, types.CoroutineType | types.GeneratorType | types.AsyncGeneratorType):
        frame = (
            getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None) or getattr(obj, "ag_frame", None)
        )
        if frame is not None:
            yield from ((f"{frame.f_code.co_name}:{name}", value) for name, value in frame.f_locals.items())
        awaited = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
        if awaited is not None:
            yield "await", awaited
        yield from _stack(obj)
        return
    if isinstance(obj, types.FrameType):
        yield from ((f"{obj.f_code.co_name}:{name}", value) for name, value in obj.f_locals.items())
        yield from _stack(obj)
        return
    if isinstance(obj, types.FunctionType):
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or (), strict=True):
            try:
                yield f"{obj.__name__}:{name}", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        return
    if isinstance(obj, types.MethodType):
        yield "self", obj.__self__
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield "[key]", key
            yield f"[{key!r:.30}]", value
        return
    if isinstance(obj, _CONTAINERS):
        yield from (("[]", value) for value in obj)
        return
    named = False
    if hasattr(obj, "__dict__"):
        named = True
        yield from vars(obj).items()
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                named = True
                yield slot, getattr(obj, slot)
    if not named:
        yield from ((type(child).__name__, child) for child in gc.get_referents(obj))


def _stack(frame_holder: object) -> Iterator[tuple[str, object]]:
    """What only a frame's value stack holds (the iterator of a `for` loop, say); the dict of its locals, which
    reading ``f_locals`` leaves behind, is not the frame's own."""
    yield from (("stack", child) for child in gc.get_referents(frame_holder) if not isinstance(child, dict))


def _reachable_containers(roots: list[asyncio.Task[Any]]) -> list[_Container]:
    """Every container reachable from ``roots`` (each once, by the first path found), largest first."""
    seen: set[int] = set()
    found: list[_Container] = []
    queue: deque[tuple[object, str]] = deque((root, root.get_name()) for root in roots)
    while queue:
        obj, path = queue.popleft()
        if id(obj) in seen or isinstance(obj, _SKIPPED):
            continue
        if type(obj).__module__.startswith(_OUTSIDE_MODULES):
            continue
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS):
            found.append(_Container(len(obj), path))
        queue.extend((child, f"{path}.{name}") for name, child in _children(obj))
    return sorted(found, key=lambda container: -container.entries)


def _sweep_tasks() -> list[asyncio.Task[Any]]:
    """The tasks the sweep started (producers, workers, progress board): those running rcarun's own code."""
    tasks = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        where = code.co_filename if code is not None else ""
        if "/rcarun/" in where and "/rcarun/mock/" not in where and not where.endswith(_NOT_THE_SWEEPS):
            tasks.append(task)
    return tasks


@dataclass
class _Inspector:
    """The real backend, except that at some of its calls it sizes what the sweep can reach."""

    backend: Backend
    at_calls: frozenset[int]
    calls: int = 0
    # At each inspected call: the containers with more than a handful of entries.
    found: dict[int, list[_Container]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def chat(self, request: ChatRequest, progress: CallProgress | None = None) -> ChatResult:
        self.calls += 1
        if self.calls in self.at_calls:
            self.found[self.calls] = [c for c in _reachable_containers(_sweep_tasks()) if c.entries > 8]
        return await self.backend.chat(request, progress)


def _write_dataset(root: Path, count: int) -> Path:
    """Who&When-shaped trajectories of 4-8 steps, one file each."""
    rng = random.Random(3)
    source = root / "synthetic"
    source.mkdir(parents=True)
    agents = ("Planner", "Coder", "Verifier")
    for index in range(count):
        history = [
            {"name": agents[i % 3], "role": "assistant", "content": f"step {i} " + "x" * rng.randint(20, 80)}
            for i in range(rng.randint(4, 8))
        ]
        record = {
            "question": f"task {index}",
            "history": history,
            "mistake_agent": "Coder",
            "mistake_step": "1",
        }
        (source / f"{index}.json").write_text(json.dumps(record))
    return root


async def _sweep(
    config: SweepConfig, db: Path, *, at_calls: frozenset[int], limit: int | None = None
) -> _Inspector:
    inspectors: list[_Inspector] = []

    def factory(settings: BackendSettings) -> Backend:
        inspector = _Inspector(create_backend(settings), at_calls)
        inspectors.append(inspector)
        return inspector  # type: ignore[return-value]

    outcome = await run_sweep(
        config, db_path=db, run_name="bounded", show_progress=False, backend_factory=factory, limit=limit
    )
    (inspector,) = inspectors
    assert (outcome.status, outcome.counters["sim"].items_failed) == ("finished", 0)
    assert sorted(inspector.found) == sorted(at_calls)
    return inspector


def _unexplained(found: list[_Container]) -> list[_Container]:
    return [c for c in found if c.entries > _MOST_ENTRIES and not c.path.endswith(tuple(_GROWS_BY_DESIGN))]


def _entries_of(found: list[_Container], path_end: str) -> int:
    return max((c.entries for c in found if c.path.endswith(path_end)), default=0)


def _config(base_url: str, dataset: Path) -> SweepConfig:
    return make_config(
        {"sim": {"base_url": base_url, "limits": {"concurrency": _CONCURRENCY}}},
        dataset=dataset,
        realizations=_REALIZATIONS,
    )


async def test_a_sweep_holds_no_entry_per_finished_item_or_trajectory(tmp_path: Path) -> None:
    items = _TRAJECTORIES * _REALIZATIONS
    dataset = _write_dataset(tmp_path / "data", _TRAJECTORIES)
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        inspector = await _sweep(
            _config(server.base_url, dataset), db, at_calls=frozenset({items // 2, items})
        )

    for calls, found in inspector.found.items():
        assert _unexplained(found) == [], calls
    # The walk reaches deep enough to see a per-trajectory structure: the dataset walk's own, midway.
    assert _entries_of(inspector.found[items // 2], "_deliver:first_seen") >= items // 2 // _REALIZATIONS
    assert rows(db, "SELECT count(*) FROM predictions") == [(items,)]
    assert rows(db, "SELECT count(*), count(DISTINCT qid) FROM trajectories") == [(_TRAJECTORIES,) * 2]


async def test_a_resumed_sweep_asks_results_db_what_is_done_instead_of_holding_every_key(
    tmp_path: Path,
) -> None:
    first = _TRAJECTORIES // 2
    dataset = _write_dataset(tmp_path / "data", _TRAJECTORIES)
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = _config(server.base_url, dataset)
        await _sweep(config, db, at_calls=frozenset(), limit=first)
        left = (_TRAJECTORIES - first) * _REALIZATIONS
        inspector = await _sweep(config, db, at_calls=frozenset({left // 2, left}))

    for calls, found in inspector.found.items():
        assert _unexplained(found) == [], calls
    # Resume skipped exactly the items the first session finished and ran the rest once.
    assert inspector.calls == left
    assert rows(db, "SELECT count(*), count(DISTINCT item_id) FROM calls") == [
        (_TRAJECTORIES * _REALIZATIONS,) * 2
    ]


async def test_each_trajectory_and_data_problem_is_stored_once_whichever_backbone_meets_it_first(
    tmp_path: Path,
) -> None:
    """Two backbones walk the dataset at their own pace; the rows of what they meet are stored by the first."""
    dataset = _write_dataset(tmp_path / "data", 12)
    for bad in ("4.json", "9.json"):
        (dataset / "synthetic" / bad).write_text("{not json")
    db = tmp_path / "results.db"
    async with (
        MockServer(MockConfig(latency_s=0.001)) as fast,
        MockServer(MockConfig(latency_s=0.02)) as slow,
    ):
        config = make_config(
            {"fast": {"base_url": fast.base_url}, "slow": {"base_url": slow.base_url}},
            dataset=dataset,
            realizations=2,
        )
        outcome = await run_sweep(config, db_path=db, run_name="both", show_progress=False)

    assert (outcome.status, outcome.trajectories, outcome.data_problems) == ("finished", 10, 2)
    assert rows(db, "SELECT count(*), count(DISTINCT qid) FROM trajectories") == [(10, 10)]
    problems = rows(db, "SELECT detail_json FROM run_events WHERE kind = 'data_problem'")
    assert sorted(json.loads(detail)["record"] for (detail,) in problems) == ["synthetic/4", "synthetic/9"]
    assert rows(db, "SELECT backbone, count(*) FROM predictions GROUP BY backbone") == [
        ("fast", 20),
        ("slow", 20),
    ]
