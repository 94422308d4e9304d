"""Peak memory of a large sweep: it must stay bounded by the work in flight, not by the size of the sweep.

Runs rcarun's real runner (all-at-once, one simulated backbone served by the mock server in its own process,
fast latency) over a synthetic dataset of TRAJECTORIES x REALIZATIONS work items, then prints the process's
peak RSS and what was recorded. Usage:

    .venv/bin/python benchmarks/memory.py [--trajectories 1000] [--realizations 100] [--latency 0.002]

The default is 100,000 items. Peak RSS is ``ru_maxrss`` of this process (the simulator's own process is not
counted), imports and the interpreter included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

from rcarun.mock import MockConfig, MockProcess
from rcarun.runner import SweepConfig, run_sweep

_AGENTS = ("Planner", "Coder", "Computer_terminal", "Verifier")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--realizations", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rcarun-memory-") as tmp:
        root = Path(tmp)
        dataset = write_dataset(root / "dataset", args.trajectories)
        db = root / "results.db"
        with MockProcess(MockConfig(latency_s=args.latency, seed=1)) as mock:
            config = SweepConfig.model_validate(
                {
                    "sweep": {"dataset": str(dataset), "realizations": args.realizations},
                    "methods": [{"name": "all-at-once"}],
                    "backbones": {
                        "sim": {
                            "provider": "simulated",
                            "model": "sim-model",
                            "base_url": mock.base_url,
                            "limits": {"concurrency": args.concurrency},
                        }
                    },
                    "stages": {"attribution": {"max_tokens": 512}},
                }
            )
            started = time.perf_counter()
            outcome = asyncio.run(run_sweep(config, db_path=db, run_name="memory", show_progress=False))
            wall = time.perf_counter() - started
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with sqlite3.connect(db) as connection:
            predictions = connection.execute("SELECT count(*) FROM predictions").fetchone()[0]
            calls = connection.execute("SELECT count(*) FROM calls").fetchone()[0]
        items = args.trajectories * args.realizations
        print(
            json.dumps(
                {
                    "items": items,
                    "status": outcome.status,
                    "predictions": predictions,
                    "calls": calls,
                    "wall_s": round(wall, 1),
                    "items_per_s": round(items / wall, 1),
                    "peak_rss_mb": round(peak_mb, 1),
                    "db_mb": round(db.stat().st_size / 2**20, 1),
                }
            )
        )


if __name__ == "__main__":
    main()
