"""Set `rcarun estimate` against many draws of the demo's sweep (see tests/calibration/harness.py for why).

    .venv/bin/python scripts/estimate_calibration.py [--draws 30] [--method step-by-step ...] [--keep DIR]

Each draw is the demo's sweep against simulated models of other names (draw 0 is the demo itself); the table
gives, per method, the estimate, its 95% chance range, the draws' mean ± standard error, the estimate's error
against that mean, the demo's own figure, and how many draws fall inside the range and within 15%.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

# The harness lives with the tests, which import it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from calibration.harness import render_table, run_calibration


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--draws", type=int, default=30, help="sweeps to run (default 30; draw 0 is the demo)"
    )
    parser.add_argument(
        "--method", action="append", dest="methods", help="a method label (repeatable; default: step-by-step)"
    )
    parser.add_argument(
        "--samples", type=int, default=16, help="the estimate's dry runs per item (default 16)"
    )
    parser.add_argument("--keep", type=Path, help="run in this directory and keep results.db there")
    args = parser.parse_args()
    methods = args.methods or ["step-by-step"]
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        rows, _ = run_calibration(args.keep, args.draws, methods, args.samples)
    else:
        with tempfile.TemporaryDirectory(prefix="rcarun-calibration-") as workdir:
            rows, _ = run_calibration(Path(workdir), args.draws, methods, args.samples)
    print(render_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
