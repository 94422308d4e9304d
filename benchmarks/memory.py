"""Peak memory against sweep size: a sweep must be bounded by the work in flight, not by how many items it has.

Runs rcarun's real runner (all-at-once, one simulated backbone served by the mock server in its own process,
2 ms latency, 64 calls in flight) over synthetic datasets of 10,000, 30,000 and 100,000 work items
(items / REALIZATIONS trajectories x REALIZATIONS, as `rcarun bench throughput --scenario large-scale` has
1,000 x 100). Each size runs in a fresh process, twice: once for the peak resident set (``VmHWM``: interpreter,
imports and SQLite's page caches included; the simulator's process is not counted), once under ``tracemalloc``
for the peak of the Python heap and for what it still holds per finished item (the traced memory between the
moments 20 % and 90 % of the items were recorded, over those items). Usage:

    .venv/bin/python benchmarks/memory.py                      # 10k, 30k, 100k items: about 6 minutes
    .venv/bin/python benchmarks/memory.py --sizes 2000 6000    # a quick look
    .venv/bin/python benchmarks/memory.py --realizations 1     # grow the trajectories instead (10k-100k files)
    .venv/bin/python benchmarks/memory.py --top 12             # and the lines whose allocations grew most
    .venv/bin/python benchmarks/memory.py --json               # one JSON object per size on stdout

The table ends with the largest size's figures over the smallest's; flat means within 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from rcarun.mock import MockConfig, MockProcess
from rcarun.runner import SweepConfig, run_sweep
from rcarun.store import StoreWriter

_AGENTS = ("Planner", "Coder", "Computer_terminal", "Verifier")
# When the tracemalloc run compares the heap: after the start-up (imports, first batches) and before the drain.
_EARLY, _LATE = 0.2, 0.9
_POLL_S = 0.25
_WRITER_POLL_S = 0.01
_FIND_WRITER_S = 0.05


def write_dataset(root: Path, count: int, seed: int = 7) -> Path:
    """Who&When-shaped trajectories of 6-12 steps with a few hundred characters each."""
    rng = random.Random(seed)
    source = root / "synthetic"
    source.mkdir(parents=True)
    for index in range(count):
        steps = rng.randint(6, 12)
        history = [
            {
                "name": _AGENTS[i % len(_AGENTS)],
                "role": "assistant",
                "content": f"step {i} " + "x" * rng.randint(80, 400),
            }
            for i in range(steps)
        ]
        record = {
            "question": f"task {index}",
            "history": history,
            "mistake_agent": history[1]["name"],
            "mistake_step": "1",
        }
        (source / f"{index}.json").write_text(json.dumps(record))
    return root


def _vm_hwm_mb() -> float:
    """This process's peak resident set in MiB (``VmHWM`` starts afresh at exec, unlike ``ru_maxrss``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _items_recorded(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1)) as connection:
            return int(connection.execute("SELECT count(*) FROM items").fetchone()[0])
    except sqlite3.Error:
        return 0


class _WriterWatch:
    """The most rows the store writer had waiting at once (`StoreWriter.uncommitted`), read every 10 ms: the
    queue is bounded, but how full it gets shows whether the writer keeps up as results.db grows."""

    def __init__(self) -> None:
        self.most_uncommitted = 0

    async def run(self) -> None:
        writer: StoreWriter | None = None
        while writer is None:
            await asyncio.sleep(_FIND_WRITER_S)
            writer = next((o for o in gc.get_objects() if isinstance(o, StoreWriter)), None)
        while True:
            self.most_uncommitted = max(self.most_uncommitted, writer.uncommitted)
            await asyncio.sleep(_WRITER_POLL_S)


class _HeapWatch:
    """The traced heap when ``_EARLY`` and ``_LATE`` of the items are recorded in results.db, and its peak.

    With ``top``, also how much each line had allocated then: a snapshot is taken, reduced to its lines and
    dropped, and the peak is read before it and reset after it; the per-line table it leaves is subtracted from
    what is read later, so that neither is counted as the sweep's.
    """

    def __init__(self, db: Path, items: int, top: int) -> None:
        self._db = db
        self._marks = [int(items * _EARLY), int(items * _LATE)]
        self._top = top
        self.peak = 0
        # Traced bytes of the per-line tables kept so far (not the sweep's).
        self.tables = 0
        # (items recorded, traced bytes) at each mark, and with ``top`` the bytes and blocks of every line.
        self.current: list[tuple[int, int]] = []
        self.lines: list[dict[tuple[str, int], tuple[int, int]]] = []

    async def run(self) -> None:
        while self._marks:
            await asyncio.sleep(_POLL_S)
            recorded = _items_recorded(self._db)
            if recorded < self._marks[0]:
                continue
            self._marks.pop(0)
            current, peak = tracemalloc.get_traced_memory()
            self.peak = max(self.peak, peak - self.tables)
            self.current.append((recorded, current - self.tables))
            if self._top:
                snapshot = tracemalloc.take_snapshot().filter_traces(
                    (
                        tracemalloc.Filter(False, tracemalloc.__file__),
                        tracemalloc.Filter(False, "<frozen importlib._bootstrap*"),
                        tracemalloc.Filter(False, __file__),
                    )
                )
                self.lines.append(
                    {
                        (stat.traceback[0].filename, stat.traceback[0].lineno): (stat.size, stat.count)
                        for stat in snapshot.statistics("lineno")
                    }
                )
                del snapshot
                self.tables = tracemalloc.get_traced_memory()[0] - (current - self.tables)
                tracemalloc.reset_peak()


def run_one(
    items: int, realizations: int, latency_s: float, concurrency: int, trace: bool, top: int
) -> dict[str, Any]:
    """One sweep of ``items`` work items in this process; its figures as a dict."""
    if items % realizations:
        raise SystemExit(f"--sizes: {items} is not a multiple of --realizations {realizations}")
    trajectories = items // realizations
    with tempfile.TemporaryDirectory(prefix="rcarun-memory-") as tmp:
        root = Path(tmp)
        dataset = write_dataset(root / "dataset", trajectories)
        db = root / "results.db"
        with MockProcess(MockConfig(latency_s=latency_s, seed=1)) as mock:
            config = SweepConfig.model_validate(
                {
                    "sweep": {"dataset": str(dataset), "realizations": realizations},
                    "methods": [{"name": "all-at-once"}],
                    "backbones": {
                        "sim": {
                            "provider": "simulated",
                            "model": "sim-model",
                            "base_url": mock.base_url,
                            "limits": {"concurrency": concurrency},
                        }
                    },
                    "stages": {"attribution": {"max_tokens": 512}},
                }
            )
            watch = _HeapWatch(db, items, top)
            queue = _WriterWatch()

            async def sweep() -> str:
                # The RSS run watches the writer's queue (finding it walks the heap, which the traced run must
                # not count); the traced run watches the heap.
                watchers = [asyncio.create_task(watch.run() if trace else queue.run())]
                try:
                    outcome = await run_sweep(config, db_path=db, run_name="memory", show_progress=False)
                finally:
                    for watcher in watchers:
                        watcher.cancel()
                return outcome.status

            if trace:
                tracemalloc.start()
            started = time.perf_counter()
            status = asyncio.run(sweep())
            wall = time.perf_counter() - started
            traced_peak = (
                max(watch.peak, tracemalloc.get_traced_memory()[1] - watch.tables) if trace else None
            )
            tracemalloc.stop()
        with contextlib.closing(sqlite3.connect(db)) as connection:
            predictions = connection.execute("SELECT count(*) FROM predictions").fetchone()[0]
            calls = connection.execute("SELECT count(*) FROM calls").fetchone()[0]
        result: dict[str, Any] = {
            "items": items,
            "trajectories": trajectories,
            "realizations": realizations,
            "status": status,
            "predictions": predictions,
            "calls": calls,
            "wall_s": round(wall, 1),
            "db_mb": round(db.stat().st_size / 2**20, 1),
        }
        if trace:
            result["tracemalloc_peak_mb"] = round((traced_peak or 0) / 2**20, 2)
            result.update(_growth(watch, top))
        else:
            result["peak_rss_mb"] = round(_vm_hwm_mb(), 1)
            result["writer_queue_peak_rows"] = queue.most_uncommitted
        return result


def _growth(watch: _HeapWatch, top: int) -> dict[str, Any]:
    """What the heap gained between the two marks, per item recorded in between, and (``top``) where."""
    if len(watch.current) < 2:
        return {}
    (early_items, early), (late_items, late) = watch.current
    result: dict[str, Any] = {
        "heap_growth_bytes_per_item": round((late - early) / max(1, late_items - early_items), 1),
        "heap_growth_between_items": [early_items, late_items],
    }
    if top and len(watch.lines) == 2:
        before, after = watch.lines
        diffs = {
            line: (
                after.get(line, (0, 0))[0] - before.get(line, (0, 0))[0],
                after.get(line, (0, 0))[1] - before.get(line, (0, 0))[1],
            )
            for line in before.keys() | after.keys()
        }
        largest = sorted(diffs.items(), key=lambda entry: -abs(entry[1][0]))[:top]
        result["top_growth"] = [
            {
                "where": f"{filename.split('/site-packages/')[-1].split('/src/')[-1]}:{lineno}",
                "grew_kb": round(size / 1024, 1),
                "blocks": count,
            }
            for (filename, lineno), (size, count) in largest
        ]
    return result


def _child(size: int, args: argparse.Namespace, trace: bool) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--one",
        str(size),
        "--realizations",
        str(args.realizations),
        "--latency",
        str(args.latency),
        "--concurrency",
        str(args.concurrency),
        "--top",
        str(args.top),
    ]
    if trace:
        command.append("--trace")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--realizations", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.002, help="the simulator's latency per call (s)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--top", type=int, default=0, help="print the N lines whose allocations grew most")
    parser.add_argument("--no-trace", action="store_true", help="peak RSS only (no tracemalloc runs)")
    parser.add_argument("--json", action="store_true", help="one JSON object per size on stdout")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size, one JSON line
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(
            json.dumps(
                run_one(args.one, args.realizations, args.latency, args.concurrency, args.trace, args.top)
            )
        )
        return
    rows = []
    for size in args.sizes:
        row = _child(size, args, trace=False)
        if not args.no_trace:
            traced = _child(size, args, trace=True)
            row.update(
                {
                    key: value
                    for key, value in traced.items()
                    if key.startswith(("tracemalloc", "heap", "top"))
                }
            )
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"{row['items']:>8,} items ({row['trajectories']:,} x {row['realizations']}): "
                f"peak RSS {row['peak_rss_mb']:6.1f} MB"
                + (
                    f", tracemalloc peak {row['tracemalloc_peak_mb']:6.2f} MB, "
                    f"heap growth {row.get('heap_growth_bytes_per_item', float('nan')):6.1f} B/item"
                    if "tracemalloc_peak_mb" in row
                    else ""
                )
                + f"  [{row['status']}, {row['predictions']:,} predictions, {row['wall_s']} s, "
                f"writer queue peak {row['writer_queue_peak_rows']:,} rows]",
                flush=True,
            )
            for line in row.get("top_growth", []):
                print(f"           {line['grew_kb']:>9.1f} KB {line['blocks']:>+8} blocks  {line['where']}")
    if len(rows) > 1 and not args.json:
        first, last = rows[0], rows[-1]
        ratios = [f"peak RSS {last['peak_rss_mb'] / first['peak_rss_mb']:.3f}"]
        if "tracemalloc_peak_mb" in first:
            ratios.append(
                f"tracemalloc peak {last['tracemalloc_peak_mb'] / first['tracemalloc_peak_mb']:.3f}"
            )
        print(f"{last['items']:,} / {first['items']:,} items: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
