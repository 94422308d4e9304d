"""The demo's sweep made reproducible, to compare two versions of rcarun answer for answer.

The simulator draws sampled answers (temperature above 0 or unset) and faults in the order requests arrive, so
two runs of the concurrent demo give different predictions. Here every backbone sends one call at a time, one
item at a time, and the judge panel (whose calls reach other backbones' servers in between) is left out: each
simulator then sees the same requests in the same order, and a version that sends the same requests gets the
same answers. Compare two results with `scripts/compare_runs.sql`.

    python scripts/demo_sequential.py DB [--run NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rcarun.demo import demo_sweep_config, simulated_backbones
from rcarun.runner import run_sweep

LEFT_OUT = "judge-panel"


async def _sweep(db: Path, run: str) -> int:
    async with simulated_backbones() as backbones:
        config = demo_sweep_config(backbones)
        sequential = {
            name: backbone.model_copy(
                update={"limits": backbone.limits.model_copy(update={"concurrency": 1, "min_concurrency": 1})}
            )
            for name, backbone in config.backbones.items()
        }
        config = config.model_copy(
            update={
                "backbones": sequential,
                "methods": tuple(method for method in config.methods if method.name != LEFT_OUT),
                "sweep": config.sweep.model_copy(update={"items_in_flight": 1}),
            }
        )
        outcome = await run_sweep(config, db_path=db, run_name=run, show_progress=False)
    print(f"{run}: {outcome.status}")
    return 0 if outcome.status == "finished" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--run", default="sequential")
    args = parser.parse_args(argv)
    return asyncio.run(_sweep(args.db, args.run))


if __name__ == "__main__":
    sys.exit(main())
