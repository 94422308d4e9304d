"""Run the chaos sweep once and print its reconciliation table (see tests/chaos/harness.py for what it proves).

    .venv/bin/python scripts/chaos_sweep.py --seed 7 [--kills 5] [--json] [--keep DIR]

Exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

# The harness lives with the tests, which import it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from chaos.harness import render_table, run_chaos_sweep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=1, help="drives fault draws, kill moments and the sweep")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs before the final resume (default 5)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep results.db there")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        report = run_chaos_sweep(args.keep, args.seed, args.kills)
    else:
        with tempfile.TemporaryDirectory(prefix="rcarun-chaos-") as workdir:
            report = run_chaos_sweep(Path(workdir), args.seed, args.kills)
    print(json.dumps(report.to_dict(), indent=2) if args.json else render_table(report))
    return 0 if not report.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
